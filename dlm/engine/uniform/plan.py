"""Phase 0 of the canvas loop ("prepare"): one call on a DiffusionGemma model resolved into a
frozen `UniformPlan` (lengths, ids, the budget, the rule each canvas runs), every refusal before
the model runs.

Two modes: `sampler=None` runs transformers' own rule from the generation config
(`EntropyBoundRule` over the global torch RNG, token-equal to `model.generate` from the same
`torch.manual_seed`); a sampler runs in accept/renoise mode (`AcceptRule`, or `EntropyBoundRule` for
`entropy_bound`), drawing only from `config.generator`, within `config.steps` decoder forwards.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import torch

from dlm.engine.uniform.canvas_model import DiffusionGemmaCanvasModel
from dlm.engine.uniform.rules import AcceptRule, AcceptSettings, EntropyBoundRule
from samplers import Sampler
from samplers.unmasking.entropy_bound import EntropyBoundConfig


@dataclass(frozen=True)
class UniformPlan:
    """What the canvas loop needs besides the prompt.

    max_new_tokens: tokens to generate (rounded up to whole canvases). eos_token_id: list or None.
    pad_token_id: int or None. steps: total forward budget over all canvases (None: each canvas runs
    its rule's own budget, transformers' `max_denoising_steps`). make_rule: `budget -> rule` for each
    canvas (`budget` is the canvas's share of `steps`, or None)."""

    canvas_model: DiffusionGemmaCanvasModel
    max_new_tokens: int
    eos_token_id: list[int] | None
    pad_token_id: int | None
    make_rule: Callable[[int | None], Any]
    steps: int | None = None
    progress: bool = False

    @property
    def canvases(self) -> int:
        return math.ceil(self.max_new_tokens / self.canvas_model.canvas_length)


def plan_uniform(model, input_ids: torch.Tensor, config, policy: Sampler | None, attention_mask) -> UniformPlan:
    """Resolve and check one `DecodingConfig` (and its sampler, None for transformers' rule) on a
    DiffusionGemma model; raises ValueError naming the option and the fix."""
    cm = DiffusionGemmaCanvasModel(model)
    _check_prompt(input_ids, attention_mask, cm.vocab_size)
    overrides = {} if config.eos_token_id is None else {"eos_token_id": config.eos_token_id}
    gc = resolve_generation_config(model, config.generation_config, **overrides)
    _, max_new = model._prepare_generated_length(gc, input_ids.shape[1])
    if config.gen_length is not None:
        max_new = config.gen_length
    if max_new <= 0:
        raise ValueError(f"nothing to generate: max_new_tokens resolves to {max_new}; raise max_new_tokens or gen_length")
    if policy is None:
        plan = _transformers_rule_plan(cm, gc, max_new)
    else:
        plan = _sampler_plan(model, cm, gc, max_new, input_ids, config, policy)
    if config.compile:
        plan = _compiled(plan, input_ids.device, config.temperature)
    return _with(plan, progress=config.progress)


def _with(plan: UniformPlan, **changes) -> UniformPlan:
    from dataclasses import replace

    return replace(plan, **changes)


def _transformers_rule_plan(cm: DiffusionGemmaCanvasModel, gc, max_new: int) -> UniformPlan:
    eb = EntropyBoundConfig(entropy_bound=float(gc.sampler_config.entropy_bound), t_max=gc.t_max, t_min=gc.t_min,
                            stability_threshold=gc.stability_threshold, confidence_threshold=gc.confidence_threshold)

    def make_rule(budget):
        return EntropyBoundRule(eb, gc.max_denoising_steps, cm.vocab_size, cm.canvas_length, cm.embed_dtype)
    return UniformPlan(cm, max_new, _id_list(gc.eos_token_id), gc.pad_token_id, make_rule)


def _sampler_plan(model, cm: DiffusionGemmaCanvasModel, gc, max_new: int, input_ids, config, policy: Sampler) -> UniformPlan:
    C, V = cm.canvas_length, cm.vocab_size
    n_canvases = math.ceil(max_new / C)
    block = C if config.block_length is None else config.block_length
    if C % block:
        raise ValueError(f"block_length ({block}) must divide the model's canvas_length ({C}) on a uniform-noise "
                         "model: blocks are sub-blocks of a canvas")
    steps = n_canvases * C if config.steps is None else config.steps
    if steps < n_canvases * (C // block):
        raise ValueError(f"steps ({steps}) must be at least {n_canvases * (C // block)}: {n_canvases} canvas(es) of "
                         f"{C // block} block(s), each needs a forward pass")
    text = model.config.text_config
    eos = _id_list(gc.eos_token_id if gc.eos_token_id is not None else getattr(text, "eos_token_id", None))
    pad = gc.pad_token_id if gc.pad_token_id is not None else getattr(text, "pad_token_id", None)
    if getattr(policy, "uniform_native", False):
        def make_rule(budget):
            return EntropyBoundRule(policy.config, budget, V, C, cm.embed_dtype, generator=config.generator,
                                    full_stream=False)
        return UniformPlan(cm, max_new, eos, pad, make_rule, steps=steps)
    if policy.drafts_and_verifies:
        raise ValueError(f"sampler {policy.name!r} does not run on a uniform-noise model: every step's input holds "
                         "fresh noise and the previous step's logits (self-conditioning), so later steps cannot be "
                         "drafted from one forward; use its base sampler")
    policy.prepare(model)
    if policy.needs_hidden_states:
        raise ValueError(f"sampler {policy.name!r} with a layer that reads hidden states does not run on a "
                         "uniform-noise model; use a sampler without a trained layer")
    state = policy.init_state(input_ids.shape[0], input_ids.shape[1] + n_canvases * C, input_ids.device)
    settings = AcceptSettings(canvas_length=C, block_length=block, vocab_size=V, embed_dtype=cm.embed_dtype,
                              temperature=config.temperature, generator=config.generator, t_min=gc.t_min,
                              t_max=gc.t_max, sampler_step=policy.step)

    def make_rule(budget):
        return AcceptRule(policy, budget, settings, state)
    return UniformPlan(cm, max_new, eos, pad, make_rule, steps=steps)


def _compiled(plan: UniformPlan, device, temperature: float) -> UniformPlan:
    """`compile=True`: the rules' vocabulary-wide statistics or the sampler's step compiled."""
    from dlm.compiled import compiled, compiled_sampler_step
    from samplers.unmasking.entropy_bound import chunk_entropy_argmax, chunk_race

    base_rule = plan.make_rule
    stats = (compiled(chunk_race, device, draws=False), compiled(chunk_entropy_argmax, device, draws=False))

    def make_rule(budget):
        rule = base_rule(budget)
        if isinstance(rule, AcceptRule):
            rule.sampler_step = compiled_sampler_step(rule.policy, device, temperature)
        else:
            rule.chunk_stats = stats
        return rule
    return _with(plan, make_rule=make_rule)


def resolve_generation_config(model, generation_config, **overrides):
    """transformers' own resolution (call > model > global defaults, deep-copied, validated): the
    caller's object is never changed. Refuses what this engine does not implement."""
    from transformers.models.diffusion_gemma.generation_diffusion_gemma import (DiffusionGemmaGenerationConfig,
                                                                               EntropyBoundSamplerConfig)

    if generation_config is not None and not isinstance(generation_config, DiffusionGemmaGenerationConfig):
        raise ValueError(f"generation_config must be a DiffusionGemmaGenerationConfig, got {type(generation_config).__name__}")
    gc, unused = model._prepare_generation_config(generation_config, **overrides)
    if unused:
        raise ValueError(f"unknown generation options {sorted(unused)}")
    if gc.cache_implementation is not None:
        raise ValueError(f"generation_config.cache_implementation={gc.cache_implementation!r} is not implemented by "
                         "dlm's engine (it keeps transformers' dynamic cache and never compiles); set it to None, or use "
                         "model.generate for a static or quantized cache")
    if not isinstance(gc.sampler_config, EntropyBoundSamplerConfig):
        raise ValueError(f"generation_config.sampler_config must be an EntropyBoundSamplerConfig, "
                         f"got {type(gc.sampler_config).__name__}")
    return gc


def planned_canvases(model, config, prompt_length: int) -> tuple[int, int]:
    """`(canvas_length, canvases)` a call with `config` plans for (before any early EOS stop)."""
    gc = resolve_generation_config(model, config.generation_config)
    _, max_new = model._prepare_generated_length(gc, prompt_length)
    if config.gen_length is not None:
        max_new = config.gen_length
    canvas = int(model.config.canvas_length)
    return canvas, max(1, math.ceil(max_new / canvas))


def _id_list(value) -> list[int] | None:
    if value is None:
        return None
    return [int(v) for v in value] if isinstance(value, (list, tuple)) else [int(value)]


def _check_prompt(input_ids, attention_mask, vocab_size: int) -> None:
    """Token ids inside the vocabulary (the shapes, dtypes and mask values: `dlm.inputs`)."""
    low, high = int(input_ids.min()), int(input_ids.max())
    if low < 0 or high >= vocab_size:
        raise ValueError(f"input_ids contains token id {low if low < 0 else high}, outside the model's vocabulary "
                         f"(0..{vocab_size - 1}); encode the prompt with the model's tokenizer")
