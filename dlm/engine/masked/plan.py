"""Phase 0 of the masked loop: one call's options resolved and checked into a frozen `MaskedPlan`.

Every refusal of a masked call happens here, before the model runs, in a fixed order (lengths,
inputs, cache mode, EOS, ids, prompt, context length, the sampler's layer, compile, window); the
loop (`dlm.engine.masked.loop`) reads the plan and decides nothing about options.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from dlm.adapters import DLMAdapter
from dlm.decoding_config import DEFAULT_GEN_LENGTH, DecodingConfig, default_block_length
from dlm.engine.masked.forward import resolve_kv_cache
from dlm.engine.masked.inputs import check_prompt_ids, check_special_ids
from dlm.engine.schedule import validate_lengths
from samplers import Sampler


@dataclass(frozen=True)
class MaskedPlan:
    """What one masked call decodes with (see `dlm.generate` for each option's meaning).

    Shapes: `attention_mask` `[B, P]` (after `check_prompt_ids`: None when there is no padding to
    hide, or a mask derived from leading pad ids). `kv_cache` and `eos_early_stop` are resolved
    ("auto" and None never appear). `sampler_step` is `policy.step`, or its compiled form."""

    adapter: DLMAdapter
    policy: Sampler
    sampler_step: Callable
    gen_length: int
    block_length: int
    steps: int
    num_blocks: int
    batch: int
    prompt_length: int
    attention_mask: torch.Tensor | None
    kv_cache: str
    cache_refresh_every: int
    cache_across_blocks: bool
    cut_trailing_masks: bool
    cache_drift_threshold: float
    cache_drift_probe: int
    cfg_scale: float
    eos_early_stop: bool
    temperature: float
    generator: torch.Generator | None
    window_blocks: int
    window_open_at: float
    progress: bool

    @property
    def mask_id(self) -> int:
        return self.adapter.mask_token_id

    @property
    def model_dtype(self) -> torch.dtype | None:
        """The model's parameter dtype where it says (names the likely cause of non-finite logits)."""
        dtype = getattr(self.adapter.model, "dtype", None)
        return dtype if isinstance(dtype, torch.dtype) else None

    @property
    def total_length(self) -> int:
        return self.prompt_length + self.gen_length

    @property
    def skip_finished(self) -> bool:
        """Per-step EOS stop: rows with a fixed answer leave the model's batch (and lookahead calls).
        Needs committed tokens to stay, so never with a remasking sampler."""
        return self.eos_early_stop and not self.policy.remasks

    @property
    def windowed(self) -> bool:
        return self.window_blocks > 1 and self.num_blocks > 1


def plan_masked(model, input_ids: torch.Tensor, config: DecodingConfig, policy: Sampler,
                attention_mask: torch.Tensor | None) -> MaskedPlan:
    """Resolve and check `config` for `model` (raises ValueError naming the option and the fix)."""
    if policy.ensemble:
        raise ValueError(f"sampler {policy.name!r} is an ensemble: call dlm.generate, which runs its experts")
    gen_length = DEFAULT_GEN_LENGTH if config.gen_length is None else config.gen_length
    steps = gen_length if config.steps is None else config.steps
    block_length = default_block_length(gen_length) if config.block_length is None else config.block_length
    num_blocks = validate_lengths(gen_length, block_length, steps)
    adapter = DLMAdapter.wrap(model, mask_token_id=config.mask_token_id, eos_token_id=config.eos_token_id,
                              shift_logits=config.shift_logits)
    kv_cache = _resolved_cache(config, adapter, policy)
    eos_early_stop = _resolved_eos_stop(config, adapter)
    check_special_ids(adapter)
    attention_mask = check_prompt_ids(adapter, input_ids, attention_mask)
    batch, prompt_length = input_ids.shape
    _check_context(adapter, prompt_length, gen_length)
    _check_sampler_layer(policy, adapter, kv_cache, config.cfg_scale)
    sampler_step = _sampler_step(policy, input_ids.device, config)
    if config.window_blocks > 1 and num_blocks > 1 and policy.remasks:
        raise ValueError(f"window_blocks > 1 needs a sampler that does not remask ({policy.name!r} does): "
                         "its window commits across blocks; use window_blocks=1")
    if policy.drafts_and_verifies:
        _check_reproducible(policy, config)
    return MaskedPlan(
        adapter=adapter, policy=policy, sampler_step=sampler_step, gen_length=gen_length, block_length=block_length,
        steps=steps, num_blocks=num_blocks, batch=batch, prompt_length=prompt_length, attention_mask=attention_mask,
        kv_cache=kv_cache, cache_refresh_every=config.cache_refresh_every,
        cache_across_blocks=config.cache_across_blocks, cut_trailing_masks=config.cut_trailing_masks,
        cache_drift_threshold=config.cache_drift_threshold, cache_drift_probe=config.cache_drift_probe,
        cfg_scale=config.cfg_scale, eos_early_stop=eos_early_stop, temperature=config.temperature,
        generator=config.generator, window_blocks=config.window_blocks, window_open_at=config.window_open_at,
        progress=config.progress)


def _resolved_cache(config: DecodingConfig, adapter: DLMAdapter, policy: Sampler) -> str:
    kv_cache = resolve_kv_cache(config.kv_cache, adapter, cfg_scale=config.cfg_scale,
                                needs_hidden_states=policy.needs_hidden_states)
    if kv_cache != "none" and not adapter.supports_kv_cache:
        raise ValueError(f"kv_cache={kv_cache!r} needs a model with KV-cache support (supports_dlm_kv_cache); use kv_cache='none'")
    return kv_cache


def _resolved_eos_stop(config: DecodingConfig, adapter: DLMAdapter) -> bool:
    if config.eos_early_stop is None:
        return adapter.eos_token_id is not None
    if config.eos_early_stop and adapter.eos_token_id is None:
        raise ValueError("eos_early_stop=True needs eos_token_id (pass it or use a model whose config has it)")
    return config.eos_early_stop


def _check_context(adapter: DLMAdapter, prompt_length: int, gen_length: int) -> None:
    total_length = prompt_length + gen_length
    if adapter.max_length is not None and total_length > adapter.max_length:
        raise ValueError(
            f"prompt ({prompt_length} tokens) + gen_length ({gen_length}) = {total_length} exceeds the "
            f"model's context of {adapter.max_length} tokens; shorten the prompt or gen_length")


def _check_sampler_layer(policy: Sampler, adapter: DLMAdapter, kv_cache: str, cfg_scale: float) -> None:
    # Hidden-state hook (joint sampler): the policy checks its trained layer against the model.
    policy.prepare(adapter.model)
    if policy.needs_hidden_states and (kv_cache != "none" or cfg_scale > 0):
        raise ValueError(f"sampler {policy.name!r} reads the model's hidden states, which need kv_cache='none' "
                         f"and cfg_scale=0")


def _check_reproducible(policy: Sampler, config: DecodingConfig) -> None:
    """A draft-and-verify sampler reproduces its base's forwards through the lookahead call: refuse
    what that call cannot reproduce."""
    if config.temperature > 0:
        raise ValueError(f"sampler {policy.name!r} reproduces a greedy decode: pass temperature=0")
    if config.window_blocks > 1:
        raise ValueError(f"sampler {policy.name!r} decodes one block at a time: use window_blocks=1")
    if config.kv_cache == "elastic":
        raise ValueError(f"sampler {policy.name!r} cannot reproduce the elastic cache (its drift tests refresh the "
                         "cache between the steps it verifies at once): use kv_cache 'none', 'prefix', 'dual' or "
                         "'prompt'")
    if config.cache_refresh_every > 1:
        raise ValueError(f"sampler {policy.name!r} cannot reproduce a cache refresh every "
                         f"{config.cache_refresh_every} steps (its verification pass reuses the block's cache): "
                         "use cache_refresh_every=0 or 1")


def _sampler_step(policy: Sampler, device: torch.device, config: DecodingConfig) -> Callable:
    if not config.compile:
        return policy.step
    from dlm.compiled import compiled_sampler_step

    return compiled_sampler_step(policy, device, config.temperature)
