"""Uniform-noise block diffusion (DiffusionGemma): the canvas loop and its two step rules.

transformers' `DiffusionGemmaForBlockDiffusion` (Google's DiffusionGemma) has no mask token. A causal
encoder reads the prompt and every finished canvas into a KV cache; a bidirectional decoder denoises
one canvas of `canvas_length` tokens at a time against that cache, fed its previous step's logits
(self-conditioning, Chen et al. 2022). A canvas starts as uniformly random tokens; each step accepts
some positions and renoises the rest (Austin et al. 2021; Schiff et al. 2024; Sahoo et al. 2025).

The loop below reads in the numbered phases of transformers' own `generate`:

    0. prepare: resolve the generation config, masks, positions, the cache
    1. per canvas:
       a. encode: the prompt (first canvas) or the previous canvas into the KV cache
       b. start: a canvas of random tokens, the rule's per-canvas state
       c. per step: forward (decoder, live rows only) -> score, accept, renoise, stop (the rule)
       d. append the canvas's tokens; e. EOS / pad bookkeeping, stop when every row is done
    2. finalize: the `GenerateOutput`

What differs between decoding policies lives in a *rule* object (`EntropyBoundRule`, transformers'
rule; `AcceptRule`, any masked-diffusion sampler of ours with "commit" read as "accept"), and what
is particular to the model in `DiffusionGemmaCanvasModel`; the loop has no branch on either.

Exactness with transformers (same `torch.manual_seed`, same tokens and shape): the per-canvas
preparation calls transformers' own helpers (config resolution, encoder masks, finalisation), the
per-step arithmetic is the same operations (`samplers.unmasking.entropy_bound`), and the random
stream is drawn in the same order and amounts: one `randint` per canvas, one multinomial-sized
exponential draw and one `randint` per step, over every row of the batch, even for rows that
stopped denoising (transformers keeps computing them; we only keep drawing their random numbers).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch

from dlm.engine.schedule import block_budget
from dlm.engine.uniform.canvas_model import DiffusionGemmaCanvasModel, _LiveDecoder
from dlm.engine.uniform.rules import AcceptRule, EntropyBoundRule
from dlm.outputs import GenerateOutput, StepTrace, nonfinite_positions, raise_nonfinite
from samplers.unmasking.entropy_bound import EntropyBoundConfig


@dataclass
class CanvasPlan:
    """What the loop needs besides the model and the rule: lengths, ids, budgets.

    max_new_tokens: tokens to generate (rounded up to whole canvases). eos_token_id: list or None.
    pad_token_id: int or None. steps: total forward budget over all canvases (None: each canvas runs
    its rule's own budget, transformers' `max_denoising_steps`)."""

    max_new_tokens: int
    eos_token_id: list[int] | None
    pad_token_id: int | None
    steps: int | None = None


def _finalize_canvas(input_ids, finished, plan: CanvasPlan, canvas_length: int):
    """Phase 1.e: which rows ended (EOS in the new canvas), and pad after EOS / in ended rows, with
    transformers' own bookkeeping so the returned shape and padding are identical."""
    from transformers.generation import EosTokenCriteria, StoppingCriteriaList

    criteria = StoppingCriteriaList()
    if plan.eos_token_id is not None:
        criteria.append(EosTokenCriteria(plan.eos_token_id))
    eos = None if plan.eos_token_id is None else torch.tensor(plan.eos_token_id, device=input_ids.device)
    holder = _GC(plan.pad_token_id, plan.eos_token_id)
    from transformers import DiffusionGemmaForBlockDiffusion

    return DiffusionGemmaForBlockDiffusion._finalize_canvas(input_ids, finished, holder, criteria, canvas_length, eos)


@dataclass
class _GC:
    """The two generation-config fields transformers' canvas finalisation reads."""

    pad_token_id: int | None
    eos_token_id: Any


def run_canvases(canvas_model: DiffusionGemmaCanvasModel, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                 plan: CanvasPlan, make_rule: Callable[[int | None], Any], *, callback=None, return_trace: bool = False,
                 progress: bool = False, nonfinite_check: Callable[[int, int, int], None]) -> GenerateOutput:
    """The canvas loop (phases in the module docstring). `make_rule(budget)` gives the rule for
    each canvas (`budget` is that canvas's share of `plan.steps`, or None).

    Shapes: input_ids `[B, P]`, attention_mask `[B, P]` (1 real, 0 left padding) or None. Returns
    `GenerateOutput.sequences [B, P + n*C]` with n canvases generated (fewer than the requested
    number when every row has ended), `nfe` decoder calls (batched), `nfe_per_sequence [B]` decoder
    forwards each row took part in (transformers' count). `nonfinite_check(count, canvas_index, step)`
    gets each step's number of undecodable positions (read with the live rows, no extra host sync)."""
    from transformers import DynamicCache
    from tqdm.auto import tqdm

    # 0. prepare
    model = canvas_model.model
    C = canvas_model.canvas_length
    device = input_ids.device
    batch, prompt_length = input_ids.shape
    n_canvases = math.ceil(plan.max_new_tokens / C)
    cur_len = prompt_length
    mask2d = (attention_mask.bool() if attention_mask is not None
              else torch.ones((batch, prompt_length), dtype=torch.bool, device=device))
    decoder_mask2d = torch.nn.functional.pad(mask2d, (0, C), value=True)
    enc_positions = torch.arange(0, cur_len, dtype=torch.int32, device=device).unsqueeze(0)
    dec_positions = torch.arange(cur_len, cur_len + C, dtype=torch.int32, device=device).unsqueeze(0)
    cache = DynamicCache(config=model.config.get_text_config(decoder=True))
    sequences = input_ids.clone()
    finished = torch.zeros(batch, dtype=torch.bool, device=device)
    finished_rows = [False] * batch  # the host's copy, read once per canvas
    per_row_nfe = torch.zeros(batch, dtype=torch.long, device=device)
    every_row = torch.arange(batch, device=device)
    nfe = forward_tokens = branch_forwards = 0
    steps_left = plan.steps
    steps_per_block: list[int] = []
    trace: list[StepTrace] = []
    bar = tqdm(total=plan.steps or n_canvases, desc="dlm canvases", unit="nfe" if plan.steps else "canvas",
               disable=not progress, leave=False)
    started = time.perf_counter()

    for index in range(n_canvases):
        # 1.a encode the prompt or the previous canvas
        cache = canvas_model.encode(sequences, mask2d, cache, enc_positions, is_prefill=index == 0)
        forward_tokens += batch * (prompt_length if index == 0 else C)
        # 1.b a canvas of random tokens and the rule's state
        budget = None if steps_left is None else block_budget(steps_left, n_canvases - index)
        rule = make_rule(budget)
        rule.block_start = cur_len
        live = rule.start(batch, device, finished, finished_rows)  # host list of rows (None: all)
        decoder = _LiveDecoder(canvas_model, cache, decoder_mask2d, dec_positions, batch)
        used = 0
        # 1.c denoising steps; the host reads the device once per step (which rows go on, and
        # whether the logits were finite), so it can queue the next step without waiting otherwise
        for step in range(rule.budget()):
            if live == [] or used >= rule.budget():
                break
            rows = every_row if live is None else torch.tensor(live, dtype=torch.long, device=device)
            per_row_nfe[rows] += (~finished[rows]).long()  # rows whose sequence ended count nothing (transformers)
            canvas = rule.canvas if live is None else rule.canvas[rows]
            sc = rule.soft if live is None or rule.soft is None else rule.soft[rows]
            logits = decoder(canvas, sc, rows, live)
            bad = nonfinite_positions(logits)
            extra, extra_branches = rule.step(logits, rows, step, decoder, live)
            del logits, sc
            status = torch.cat([bad.view(1), rule.live_mask().long()]).tolist()  # the step's one host read
            nonfinite_check(status.pop(0), index, step)
            live = rule.next_live([row for row, on in enumerate(status) if on])
            if live is not None and len(live) == batch:
                live = None
            used += 1 + extra
            nfe += 1 + extra
            branch_forwards += 1 + extra_branches
            bar.update(1 + extra if plan.steps else 0)
            if callback is not None or return_trace:
                accepted_now, left = rule.last_trace
                record = StepTrace(index, step, nfe, rows, accepted_now, left, True, 1 + extra, 1 + extra_branches,
                                   rule.tokens()[rows].clone() if return_trace else None,
                                   rule.accepted_positions(rows) if return_trace else None)
                if callback is not None:
                    callback(record)
                if return_trace:
                    trace.append(record)
        forward_tokens += decoder.forward_tokens
        steps_per_block.append(used)
        if steps_left is not None:
            steps_left -= used
        # 1.d append the canvas; 1.e EOS and pad
        sequences = torch.cat([sequences, rule.tokens()], dim=-1)
        sequences, finished = _finalize_canvas(sequences, finished, plan, C)
        finished_rows = finished.tolist()
        if not plan.steps:
            bar.update(1)
        if all(finished_rows):
            break
        # 1.f the next canvas's masks and positions (transformers' helper: same padding semantics)
        cur_len, decoder_mask2d, mask2d, enc_positions, dec_positions = model._prepare_kwargs_for_next_canvas(
            attention_mask=mask2d, decoder_attention_mask=decoder_mask2d, decoder_position_ids=dec_positions,
            canvas_length=C, cur_len=cur_len)
    bar.close()

    # 2. finalize
    generated = sequences.shape[1] - prompt_length
    return GenerateOutput(
        sequences=sequences, nfe=nfe, tpf=generated / max(nfe, 1), seconds=time.perf_counter() - started,
        forward_tokens=forward_tokens, steps_per_block=steps_per_block, trace=trace,
        branch_forwards=branch_forwards, nfe_per_sequence=per_row_nfe)


# --------------------------------------------------------------------------------------------------
# Entry point from `dlm.engine.families.UniformNoiseFamily`


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


def _id_list(value) -> list[int] | None:
    if value is None:
        return None
    return [int(v) for v in value] if isinstance(value, (list, tuple)) else [int(value)]


def _check_prompt(input_ids, attention_mask, vocab_size: int) -> None:
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 or input_ids.dtype != torch.long:
        raise ValueError("input_ids must be a [batch, prompt_length] torch.long tensor")
    if input_ids.shape[1] == 0:
        raise ValueError("input_ids is empty: give a prompt of at least one token")
    low, high = int(input_ids.min()), int(input_ids.max())
    if low < 0 or high >= vocab_size:
        raise ValueError(f"input_ids contains token id {low if low < 0 else high}, outside the model's vocabulary "
                         f"(0..{vocab_size - 1}); encode the prompt with the model's tokenizer")
    if attention_mask is not None:
        if not isinstance(attention_mask, torch.Tensor) or attention_mask.shape != input_ids.shape:
            raise ValueError(f"attention_mask must be a tensor of input_ids' shape {tuple(input_ids.shape)}")
        if not bool(attention_mask.bool().any(dim=1).all()):
            raise ValueError("a row of attention_mask is all zeros: give every row at least one prompt token")


def run_uniform(model, input_ids: torch.Tensor, config, *, attention_mask=None, callback=None,
                return_trace: bool = False) -> GenerateOutput:
    """One `DecodingConfig` on a DiffusionGemma model. `config.sampler` None: transformers' rule from
    the generation config, token-equal to `model.generate` from the same global seed. A sampler name:
    that sampler in uniform-noise mode (`AcceptRule`, or `EntropyBoundRule` for `entropy_bound`),
    drawing only from `config.generator`, within `config.steps` decoder forwards."""
    from dlm.engine.driver import _enforce_contract
    from samplers import get_sampler

    cm = DiffusionGemmaCanvasModel(model)
    _check_prompt(input_ids, attention_mask, cm.vocab_size)
    overrides = {} if config.eos_token_id is None else {"eos_token_id": config.eos_token_id}
    gc = resolve_generation_config(model, config.generation_config, **overrides)
    _, max_new = model._prepare_generated_length(gc, input_ids.shape[1])
    if config.gen_length is not None:
        max_new = config.gen_length
    if max_new <= 0:
        raise ValueError(f"nothing to generate: max_new_tokens resolves to {max_new}; raise max_new_tokens or gen_length")
    C, V = cm.canvas_length, cm.vocab_size
    n_canvases = math.ceil(max_new / C)
    text = model.config.text_config
    if config.sampler is None:
        eb = EntropyBoundConfig(entropy_bound=float(gc.sampler_config.entropy_bound), t_max=gc.t_max, t_min=gc.t_min,
                                stability_threshold=gc.stability_threshold, confidence_threshold=gc.confidence_threshold)
        plan = CanvasPlan(max_new, _id_list(gc.eos_token_id), gc.pad_token_id)

        def make_rule(budget):
            return EntropyBoundRule(eb, gc.max_denoising_steps, V, C, cm.embed_dtype)
    else:
        policy = get_sampler(config.sampler, **(config.sampler_config or {}))
        block = C if config.block_length is None else config.block_length
        if C % block:
            raise ValueError(f"block_length ({block}) must divide the model's canvas_length ({C}) on a uniform-noise "
                             "model: blocks are sub-blocks of a canvas")
        steps = n_canvases * C if config.steps is None else config.steps
        if steps < n_canvases * (C // block):
            raise ValueError(f"steps ({steps}) must be at least {n_canvases * (C // block)}: {n_canvases} canvas(es) of "
                             f"{C // block} block(s), each needs a forward pass")
        eos = _id_list(gc.eos_token_id if gc.eos_token_id is not None else getattr(text, "eos_token_id", None))
        pad = gc.pad_token_id if gc.pad_token_id is not None else getattr(text, "pad_token_id", None)
        plan = CanvasPlan(max_new, eos, pad, steps=steps)
        if getattr(policy, "uniform_native", False):
            def make_rule(budget):
                return EntropyBoundRule(policy.config, budget, V, C, cm.embed_dtype, generator=config.generator,
                                        full_stream=False)
        else:
            policy.prepare(model)
            if policy.needs_hidden_states:
                raise ValueError(f"sampler {policy.name!r} with a layer that reads hidden states does not run on a "
                                 "uniform-noise model; use a sampler without a trained layer")
            state = policy.init_state(input_ids.shape[0], input_ids.shape[1] + n_canvases * C, input_ids.device)

            def make_rule(budget):
                return AcceptRule(policy, budget, C, block, V, cm.embed_dtype, config.temperature, config.generator,
                                  gc.t_min, gc.t_max, state, _enforce_contract)

    if config.compile:
        from dlm.compiled import compiled, compiled_sampler_step
        from samplers.unmasking.entropy_bound import chunk_entropy_argmax, chunk_race

        base_rule = make_rule
        stats = (compiled(chunk_race, input_ids.device, draws=False),
                 compiled(chunk_entropy_argmax, input_ids.device, draws=False))

        def make_rule(budget):
            rule = base_rule(budget)
            if isinstance(rule, AcceptRule):
                rule.sampler_step = compiled_sampler_step(rule.policy, input_ids.device, config.temperature)
            else:
                rule.chunk_stats = stats
            return rule

    def check(bad: int, canvas, step):
        if bad:
            raise_nonfinite(bad, block=canvas, step=step, what="canvas")

    with torch.no_grad():
        return run_canvases(cm, input_ids, attention_mask, plan, make_rule, callback=callback,
                            return_trace=return_trace, progress=config.progress, nonfinite_check=check)


def planned_canvases(model, config, prompt_length: int) -> tuple[int, int]:
    """`(canvas_length, canvases)` a call with `config` plans for (before any early EOS stop)."""
    gc = resolve_generation_config(model, config.generation_config)
    _, max_new = model._prepare_generated_length(gc, prompt_length)
    if config.gen_length is not None:
        max_new = config.gen_length
    canvas = int(model.config.canvas_length)
    return canvas, max(1, math.ceil(max_new / canvas))
