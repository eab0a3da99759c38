"""The dLLM decoding loop: semi-autoregressive blocks, step budget, KV cache, EOS handling.

Follows LLaDA's reference `generate` (Nie et al., 2025) with the prefix and dual KV caches of
Fast-dLLM (Wu et al., 2025) and dInfer's EOS early stop. The step policy is a `samplers.Sampler`.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import torch
from tqdm.auto import tqdm

from dlm.adapters import DLMAdapter
from dlm.schedule import block_budget, tokens_this_step, validate_lengths
from samplers import Sampler, StepContext, get_sampler

KV_CACHE_MODES = ("none", "prefix", "dual")


@dataclass
class StepTrace:
    """One forward pass of the loop.

    Attributes:
        block: block index. step: step index inside the block. nfe: forward passes so far.
        rows: `[R]` batch rows decoded by this step. committed: `[R]` tokens committed (net of remasking).
        masks_left: `[R]` masks left in the block after the step. full_forward: False for a cached window.
    """

    block: int
    step: int
    nfe: int
    rows: torch.Tensor
    committed: torch.Tensor
    masks_left: torch.Tensor
    full_forward: bool


@dataclass
class GenerateOutput:
    """Result of `generate`.

    Attributes:
        sequences: `[B, P + gen_length]` long, prompt (unchanged) followed by the generation.
        nfe: model forward passes (a batched call counts once; a cached window call counts once).
        tpf: tokens per forward, `gen_length / nfe` (per sequence).
        seconds: wall time of the loop.
        forward_tokens: query positions processed over all calls and rows (compute proxy).
        steps_per_block: forward passes each block actually used.
        trace: per-step records when `return_trace=True`.
    """

    sequences: torch.Tensor
    nfe: int
    tpf: float
    seconds: float
    forward_tokens: int
    steps_per_block: list[int]
    trace: list[StepTrace] = field(default_factory=list)


def _check_inputs(input_ids, attention_mask, temperature, kv_cache, cfg_scale, cache_refresh_every):
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 or input_ids.dtype != torch.long:
        raise ValueError("input_ids must be a [batch, prompt_length] torch.long tensor")
    if input_ids.shape[1] == 0:
        raise ValueError("input_ids is empty: give a prompt of at least one token")
    if attention_mask is not None and attention_mask.shape != input_ids.shape:
        raise ValueError(f"attention_mask shape {tuple(attention_mask.shape)} must equal input_ids shape {tuple(input_ids.shape)}")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0 (0 is greedy), got {temperature}")
    if kv_cache not in KV_CACHE_MODES:
        raise ValueError(f"kv_cache must be one of {KV_CACHE_MODES}, got {kv_cache!r}")
    if cfg_scale < 0:
        raise ValueError(f"cfg_scale must be >= 0 (0 turns guidance off), got {cfg_scale}")
    if cfg_scale > 0 and kv_cache != "none":
        raise ValueError("classifier-free guidance (cfg_scale > 0) is not supported with a KV cache; use kv_cache='none'")
    if cache_refresh_every < 0:
        raise ValueError(f"cache_refresh_every must be >= 0 (0 refreshes only at block starts), got {cache_refresh_every}")


class _BlockForward:
    """Produces aligned block logits for one block, owning the KV cache of that block."""

    def __init__(self, adapter: DLMAdapter, mode: str, refresh_every: int, cfg_scale: float,
                 prompt_length: int, attention_mask, position_ids):
        self.adapter, self.mode, self.refresh_every = adapter, mode, refresh_every
        self.cfg_scale, self.prompt_length = cfg_scale, prompt_length
        self.attention_mask, self.position_ids = attention_mask, position_ids
        self.cache = None
        self.forward_tokens = 0
        # Hidden-state hook (joint sampler): when on, full forwards ask for the last hidden state.
        self.want_hidden, self.hidden = False, None

    def __call__(self, x: torch.Tensor, step: int, start: int, end: int) -> tuple[torch.Tensor, bool]:
        """Logits `[R, end-start, V]` for the block, and whether a full forward ran."""
        a = self.adapter
        full = self.mode == "none" or step == 0 or (self.refresh_every and step % self.refresh_every == 0)
        if full:
            raw = self._full(x)
            if self.hidden is not None:
                self.hidden = a.align(self.hidden, 0, start, end)
            return a.align(raw, 0, start, end), True
        shift = 1 if a.shift_logits else 0
        lo, hi = start - shift, (x.shape[1] if self.mode == "prefix" else end)
        raw = a.window(x, self.cache, lo, hi, self.attention_mask, self.position_ids)
        self.forward_tokens += x.shape[0] * (hi - lo)
        return a.align(raw, lo, start, end), False

    def _full(self, x: torch.Tensor) -> torch.Tensor:
        a = self.adapter
        self.forward_tokens += x.numel()
        if self.cfg_scale > 0:
            # LLaDA's CFG: the unconditional input masks the prompt; one batched call.
            uncond = x.clone()
            uncond[:, : self.prompt_length] = a.mask_token_id
            both_mask = None if self.attention_mask is None else self.attention_mask.repeat(2, 1)
            both_pos = None if self.position_ids is None else self.position_ids.repeat(2, 1)
            logits, _ = a.full(torch.cat([x, uncond]), both_mask, both_pos)
            self.forward_tokens += x.numel()
            cond, un = logits.chunk(2)
            return un + (self.cfg_scale + 1) * (cond - un)
        if self.want_hidden:  # kv_cache is "none" here (checked in generate)
            raw, self.hidden = a.full_with_hidden(x, self.attention_mask, self.position_ids)
            return raw
        raw, cache = a.full(x, self.attention_mask, self.position_ids, use_cache=self.mode != "none")
        if self.mode != "none":
            if cache is None:
                raise RuntimeError("the model returned no past_key_values although it declares KV-cache support")
            self.cache = cache
        return raw


def _full_attention(attention_mask, gen_length):
    """Extend a prompt attention mask over the generation; None when nothing is padded.

    LLaDA was trained without an attention mask, so an all-ones mask is dropped rather than passed
    (passing it could change results on some remote-code models)."""
    if attention_mask is None or bool(attention_mask.all()):
        return None, None
    mask = torch.cat([attention_mask.long(), attention_mask.new_ones(attention_mask.shape[0], gen_length).long()], dim=1)
    positions = (mask.cumsum(dim=1) - 1).clamp_min(0)
    return mask, positions


def _stop_at_eos(x: torch.Tensor, rows: torch.Tensor, prompt_length: int, block_end: int, eos_id: int) -> torch.Tensor:
    """Fill everything after the first EOS of finished rows with EOS. Returns `[R]` bool: row finished."""
    generated = x[rows, prompt_length:block_end]
    has_eos = (generated == eos_id).any(dim=1)
    if has_eos.any():
        length = x.shape[1] - prompt_length
        first = torch.where(generated == eos_id, torch.arange(generated.shape[1], device=x.device), generated.shape[1]).min(dim=1).values
        after = torch.arange(length, device=x.device).unsqueeze(0) > first.unsqueeze(1)
        tail = x[rows, prompt_length:]
        x[rows, prompt_length:] = torch.where(after & has_eos.unsqueeze(1), torch.full_like(tail, eos_id), tail)
    return has_eos


@torch.no_grad()
def generate(
    model,
    input_ids: torch.Tensor,
    *,
    gen_length: int = 64,
    block_length: int | None = None,
    steps: int | None = None,
    sampler: str | Sampler = "confidence",
    temperature: float = 0.0,
    mask_token_id: int | None = None,
    eos_token_id: int | None = None,
    attention_mask: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    kv_cache: str = "none",
    cache_refresh_every: int = 0,
    cfg_scale: float = 0.0,
    eos_early_stop: bool = False,
    shift_logits: bool | None = None,
    callback: Callable[[StepTrace], None] | None = None,
    return_trace: bool = False,
    progress: bool = False,
    sampler_config: dict | None = None,
) -> GenerateOutput:
    """Generate `gen_length` tokens after each prompt with a masked diffusion LM.

    Args:
        model: callable `model(input_ids, attention_mask=None, **kw)` returning logits `[B, L, V]`
            or an object with `.logits`; or a `DLMAdapter`.
        input_ids: `[B, P]` long prompts, left-padded when lengths differ (give `attention_mask`).
        gen_length: tokens to generate; a multiple of `block_length`.
        block_length: semi-autoregressive block size (default: `gen_length`, one block).
        steps: budget of forward passes for the whole generation (default: `gen_length`, one token
            per step). Blocks get `ceil(steps_left / blocks_left)` passes each, unused passes roll
            over, and within a block each step commits `ceil(masks_left / steps_left)` tokens, so
            the budget is never exceeded and every step commits at least one token.
        sampler: registry name or `Sampler` object; `sampler_config` overrides its config by name.
        temperature: 0 is greedy; > 0 samples with Gumbel-max in float64 using `generator`.
        mask_token_id / eos_token_id: taken from the model config when not given.
        attention_mask: `[B, P]`, 1 for real prompt tokens, 0 for left padding.
        kv_cache: "none", "prefix" or "dual" (Fast-dLLM); needs a model with
            `supports_dlm_kv_cache`. The cache is rebuilt by a full forward at every block start and
            every `cache_refresh_every` steps inside a block (0: block starts only; 1: every step,
            which reproduces the no-cache output exactly).
        cfg_scale: LLaDA classifier-free guidance weight (0 is off).
        eos_early_stop: once a finished block holds EOS, fill the rest of that row with EOS and stop
            decoding it (dInfer); the other rows go on.
        shift_logits: True for Dream-style models (`logits[:, i-1]` predicts token i); inferred from
            the config when None.
        callback / return_trace: observe each step as a `StepTrace`.
        progress: show a progress bar over the budget on stderr.

    Returns:
        `GenerateOutput` with `.sequences [B, P + gen_length]`, `.nfe`, `.tpf`, `.seconds`.
    """
    steps = gen_length if steps is None else steps
    block_length = gen_length if block_length is None else block_length
    num_blocks = validate_lengths(gen_length, block_length, steps)
    _check_inputs(input_ids, attention_mask, temperature, kv_cache, cfg_scale, cache_refresh_every)
    adapter = DLMAdapter.wrap(model, mask_token_id=mask_token_id, eos_token_id=eos_token_id, shift_logits=shift_logits)
    if kv_cache != "none" and not adapter.supports_kv_cache:
        raise ValueError(f"kv_cache={kv_cache!r} needs a model with KV-cache support (supports_dlm_kv_cache); use kv_cache='none'")
    if eos_early_stop and adapter.eos_token_id is None:
        raise ValueError("eos_early_stop=True needs eos_token_id (pass it or use a model whose config has it)")
    batch, prompt_length = input_ids.shape
    total_length = prompt_length + gen_length
    if adapter.max_length is not None and total_length > adapter.max_length:
        raise ValueError(
            f"prompt ({prompt_length} tokens) + gen_length ({gen_length}) = {total_length} exceeds the "
            f"model's context of {adapter.max_length} tokens; shorten the prompt or gen_length")
    policy = get_sampler(sampler, **(sampler_config or {}))
    policy.prepare(adapter.model)
    if policy.needs_hidden_states and (kv_cache != "none" or cfg_scale > 0):
        raise ValueError(f"sampler {policy.name!r} reads the model's hidden states, which need kv_cache='none' "
                         f"and cfg_scale=0")

    mask_id = adapter.mask_token_id
    device = input_ids.device
    x = torch.cat([input_ids, torch.full((batch, gen_length), mask_id, dtype=torch.long, device=device)], dim=1)
    full_mask, positions = _full_attention(attention_mask, gen_length)
    model_positions = getattr(adapter.model, "dlm_position_ids", None)
    if model_positions is not None:
        # The model defines its own position scheme; computed once, since the prompt never changes.
        positions = model_positions(x, full_mask)
    active = torch.ones(batch, dtype=torch.bool, device=device)
    state = policy.init_state(batch, total_length, device)
    trace: list[StepTrace] = []
    steps_per_block: list[int] = []
    nfe, forward_tokens, steps_left = 0, 0, steps
    bar = tqdm(total=steps, desc=f"dlm {policy.name}", unit="nfe", disable=not progress, leave=False)
    started = time.perf_counter()

    for block in range(num_blocks):
        start = prompt_length + block * block_length
        end = start + block_length
        budget = block_budget(steps_left, num_blocks - block)
        rows = active.nonzero().squeeze(1)
        if rows.numel() == 0:
            break
        sub_mask = None if full_mask is None else full_mask[rows]
        sub_pos = None if positions is None else positions[rows]
        forward = _BlockForward(adapter, kv_cache, cache_refresh_every, cfg_scale, prompt_length, sub_mask, sub_pos)
        forward.want_hidden = policy.needs_hidden_states
        used = 0
        for step in range(budget):
            x_rows = x[rows]
            block_x = x_rows[:, start:end]
            candidates = block_x == mask_id
            masks_left = candidates.sum(dim=1)
            if not bool(masks_left.any()):  # one host sync per step: the block may finish early
                break
            last = step == budget - 1
            logits, was_full = forward(x_rows, step, start, end)
            # The mask token is never a valid answer; an untrained or off-distribution model may
            # still rank it first, which would "commit" a mask.
            logits[..., mask_id] = float("-inf")
            nfe, used = nfe + 1, used + 1
            ctx = StepContext(
                x=block_x, candidates=candidates, num_transfer=tokens_this_step(masks_left, budget - step),
                step=step, steps_in_block=budget, last_step=last, temperature=temperature,
                generator=generator, mask_token_id=mask_id, block_start=start, state=state, rows=rows,
                hidden=forward.hidden)
            result = policy.step(logits, ctx)
            new_block = _enforce_contract(result, block_x, candidates, masks_left, policy.remasks, last, mask_id)
            x[rows, start:end] = new_block
            bar.update(1)
            if callback is not None or return_trace:
                left = (new_block == mask_id).sum(dim=1)
                record = StepTrace(block, step, nfe, rows, masks_left - left, left, was_full)
                if callback is not None:
                    callback(record)
                if return_trace:
                    trace.append(record)
        forward_tokens += forward.forward_tokens
        steps_per_block.append(used)
        steps_left -= used
        if eos_early_stop:
            finished = _stop_at_eos(x, rows, prompt_length, end, adapter.eos_token_id)
            active[rows[finished]] = False
    bar.close()
    seconds = time.perf_counter() - started
    return GenerateOutput(
        sequences=x, nfe=nfe, tpf=gen_length / max(nfe, 1), seconds=seconds,
        forward_tokens=forward_tokens, steps_per_block=steps_per_block, trace=trace)


def _enforce_contract(result, block_x, candidates, masks_left, remasks: bool, last: bool, mask_id: int) -> torch.Tensor:
    """The driver's guarantees, whatever the sampler returned. All `[R, Lb]`.

    - rows that had no candidates do not change;
    - a sampler that does not declare `remasks` never changes a committed token;
    - every step makes progress: a row whose mask count did not drop gets its most confident
      candidate committed;
    - on the block's last step every remaining mask is filled with the sampler's proposal, so the
      budget is honoured even by a sampler that commits too little.
    """
    new = result.x
    if new.shape != block_x.shape:
        raise RuntimeError(f"sampler returned x of shape {tuple(new.shape)}, expected {tuple(block_x.shape)}")
    row_active = (masks_left > 0).unsqueeze(1)
    new = torch.where(row_active, new, block_x)
    if not remasks:
        new = torch.where(candidates, new, block_x)
    # Computed unconditionally (no host sync): a no-op for rows that progressed.
    stalled = row_active.squeeze(1) & ((new == mask_id).sum(dim=1) >= masks_left)
    still = candidates & (new == mask_id)
    score = torch.where(still, result.confidence.double(), torch.full_like(result.confidence, -1.0, dtype=torch.float64))
    best = torch.zeros_like(still).scatter_(1, score.argmax(dim=1, keepdim=True), True) & still
    new = torch.where(best & stalled.unsqueeze(1), result.proposal, new)
    if last:
        new = torch.where(new == mask_id, result.proposal, new)
    return new
