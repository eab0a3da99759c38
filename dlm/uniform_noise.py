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

import copy
import inspect
import math
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch

from dlm.outputs import GenerateOutput, StepTrace, nonfinite_positions, raise_nonfinite
from dlm.masked_loop import check_lookahead_call
from dlm.schedule import block_budget, tokens_this_step
from samplers import Sampler, StepContext
from samplers.unmasking._common import rows_per_chunk
from samplers.unmasking.entropy_bound import (EntropyBoundConfig, StableConfidentStop, entropy_bound_accept,
                                              linear_temperature, race_entropy_argmax, stream_segments)

UNIFORM_MODEL_TYPES = ("diffusion_gemma",)
# The "mask" id our masked samplers see for a position not accepted yet: DiffusionGemma has no mask
# token (transformers' diffusers pipeline uses -1 too), and -1 can never be a real token.
UNACCEPTED = -1


def is_uniform_noise_model(model: Any) -> bool:
    """True for a transformers `DiffusionGemmaForBlockDiffusion` (or any model of that config type
    with an encoder/decoder pair)."""
    config = getattr(model, "config", None)
    return getattr(config, "model_type", None) in UNIFORM_MODEL_TYPES and hasattr(getattr(model, "model", None), "encoder")


# --------------------------------------------------------------------------------------------------
# The model: encoder/decoder calls of DiffusionGemma, row subsets of its cache
# --------------------------------------------------------------------------------------------------
class DiffusionGemmaCanvasModel:
    """The calls the canvas loop makes on a `DiffusionGemmaForBlockDiffusion`.

    Attributes: canvas_length C, vocab_size V, embed_dtype (the self-conditioning logits' dtype)."""

    def __init__(self, model):
        self.model = model
        self.canvas_length = int(model.config.canvas_length)
        self.vocab_size = int(model.config.text_config.vocab_size)
        decoder = model.model.decoder
        self.embed_dtype = decoder.embed_tokens.weight.dtype
        # The decoder reads its previous step's logits only through `softmax(logits) @ E * scale`
        # (the soft embedding, `[C, H]` per row) fed to its `self_conditioning` block: the loop keeps
        # that instead of the `[C, V]` logits (a 262k vocabulary: 1 KB instead of 1 MB per position).
        self.self_conditioning_block = getattr(decoder, "self_conditioning", None)
        if not isinstance(self.self_conditioning_block, torch.nn.Module):
            raise ValueError("this DiffusionGemma decoder has no `self_conditioning` block; dlm's engine needs "
                             "transformers >= 5.19 (pip install -U transformers)")
        # transformers 5.24 renamed the cache keyword `past_key_values` -> `cache` (and the encoder
        # output's field); read the installed name once instead of pinning one release.
        params = inspect.signature(model._prepare_encoder_inputs).parameters
        self.cache_kw = "cache" if "cache" in params else "past_key_values"

    def encode(self, input_ids, attention_mask, cache, position_ids, is_prefill: bool):
        """Phase 1.a: the unseen tokens (all of `input_ids` at prefill, else its last canvas) into
        `cache`, with transformers' own mask construction. input_ids `[B, T]`, attention_mask `[B, T]`."""
        m, kw = self.model, self.cache_kw
        new_ids, mask_mapping = m._prepare_encoder_inputs(
            input_ids=input_ids, attention_mask=attention_mask, encoder_position_ids=position_ids, **{kw: cache},
            is_prefill=is_prefill, canvas_length=self.canvas_length, batch_size=input_ids.shape[0])
        out = m.model.encoder(input_ids=new_ids, attention_mask=mask_mapping, position_ids=position_ids, **{kw: cache})
        return getattr(out, kw)

    def decoder_masks(self, decoder_attention_mask, cache, canvas):
        """The decoder's attention masks for `canvas [R, C]` against `cache` (the same rows)."""
        return self.model.model.decoder.create_diffusion_decoder_attention_mask(
            config=self.model.config, inputs_embeds=canvas.unsqueeze(-1), decoder_attention_mask=decoder_attention_mask,
            **{self.cache_kw: cache})

    def soft_embeddings(self, logits: torch.Tensor, divide_by: torch.Tensor | None = None) -> torch.Tensor:
        """The decoder's self-conditioning input for the previous step's `logits [N, V]` (divided by
        `divide_by` first when given): `softmax(logits.to(embed dtype), float32).to(W) @ W * scale`,
        the operations of transformers' decoder, in chunks of positions (`rows_per_chunk`) so that no
        `[N, V]` probability table exists. Returns `[N, H]` in the embedding dtype."""
        embed = self.model.model.decoder.embed_tokens
        weight = embed.weight
        scale = embed.embed_scale.to(weight.dtype)
        out = torch.empty((logits.shape[0], weight.shape[1]), dtype=weight.dtype, device=logits.device)
        k = rows_per_chunk(logits.shape[0], logits.shape[1])
        for start in range(0, logits.shape[0], k):
            chunk = logits[start:start + k]
            if divide_by is not None:
                chunk = chunk / divide_by
            probs = chunk.to(self.embed_dtype).softmax(dim=-1, dtype=torch.float32).to(weight.dtype)
            out[start:start + k] = torch.matmul(probs, weight) * scale
        return out

    def decode(self, canvas, soft_embeddings, masks, cache, positions) -> torch.Tensor:
        """One decoder forward: logits `[R, C, V]` float32 for `canvas [R, C]`, self-conditioned on
        `soft_embeddings [R, C, H]` (`soft_embeddings` of the previous step; None at a canvas's first
        step, where transformers' decoder uses zeros).

        The decoder and the head called directly, with the operations of
        `DiffusionGemmaForBlockDiffusion.forward` (head, float32, tanh soft-capping, here in place on
        our own tensor: the same values, two vocabulary tables fewer): the same logits without two
        wrapper layers per step. The soft embeddings reach the decoder's `self_conditioning` block
        through a forward pre-hook in place of the zeros it computes when given no logits."""
        m = self.model
        hook = None
        if soft_embeddings is not None:
            def feed(module, args):
                return args[0], soft_embeddings
            hook = self.self_conditioning_block.register_forward_pre_hook(feed)
        try:
            hidden = m.model.decoder(decoder_input_ids=canvas, self_conditioning_logits=None,
                                     decoder_attention_mask=masks, decoder_position_ids=positions,
                                     **{self.cache_kw: cache}).last_hidden_state
        finally:
            if hook is not None:
                hook.remove()
        logits = m.lm_head(hidden).to(torch.float32)
        cap = m.final_logit_softcapping
        return logits.div_(cap).tanh_().mul_(cap)


def select_cache_rows(cache, rows: torch.Tensor, repeat: int = 1):
    """A cache holding only `rows` of `cache` (each repeated `repeat` times, row-major), sharing
    nothing mutable with it: the layers are shallow copies whose K/V are new tensors."""
    out = copy.copy(cache)
    out.layers = []
    for layer in cache.layers:
        new = copy.copy(layer)
        new.keys, new.values = layer.keys[rows], layer.values[rows]
        if repeat > 1:
            new.keys = new.keys.repeat_interleave(repeat, dim=0)
            new.values = new.values.repeat_interleave(repeat, dim=0)
        out.layers.append(new)
    return out


class _LiveDecoder:
    """Runs the decoder on a subset of the batch, rebuilding the row-selected cache and masks only
    when the subset changes (rows only ever leave within a canvas). The subset is known on the host
    (`live`, the loop's list of batch rows; None for every row), so no device read decides it."""

    def __init__(self, canvas_model: DiffusionGemmaCanvasModel, cache, decoder_attention_mask, positions, batch: int):
        self.cm, self.cache, self.mask2d, self.positions = canvas_model, cache, decoder_attention_mask, positions
        self.batch = batch
        self._rows_key, self._cache, self._masks, self._full_masks = None, None, None, None
        self.forward_tokens = 0

    def _prepared(self, rows: torch.Tensor, canvas: torch.Tensor, live: list[int] | None):
        key = None if live is None else tuple(live)  # rows leave, and come back at a new sub-block
        if self._rows_key != key or self._cache is None:
            every = live is None
            self._cache = self.cache if every else select_cache_rows(self.cache, rows)
            self._masks = self._masks_for(rows, canvas, every)
            self._rows_key = key
        return self._cache, self._masks

    def _masks_for(self, rows: torch.Tensor, canvas: torch.Tensor, every: bool):
        """The decoder's masks for `rows`: the whole batch's (built once per canvas by transformers'
        helper, as transformers' generate uses them for every row) indexed by row, so a change of the
        live set reads nothing from the device; transformers' helper itself for mask kinds that are
        not batch-first tensors."""
        if self._full_masks is None:
            full_canvas = canvas if every else canvas.new_zeros((self.batch, canvas.shape[1]))
            self._full_masks = self.cm.decoder_masks(self.mask2d, self.cache, full_canvas)
        if every:
            return self._full_masks
        if all(m is None or (isinstance(m, torch.Tensor) and m.shape[0] == self.batch)
               for m in self._full_masks.values()):
            return {kind: None if m is None else m[rows] for kind, m in self._full_masks.items()}
        return self.cm.decoder_masks(self.mask2d[rows], self._cache, canvas)

    def __call__(self, canvas: torch.Tensor, self_conditioning, rows: torch.Tensor, live: list[int] | None) -> torch.Tensor:
        cache, masks = self._prepared(rows, canvas, live)
        self.forward_tokens += canvas.numel()
        return self.cm.decode(canvas, self_conditioning, masks, cache, self.positions)

    def branches(self, canvases: torch.Tensor, self_conditioning, rows: torch.Tensor, k: int) -> torch.Tensor:
        """Logits `[R*k, C, V]` for `canvases [R*k, C]`: each of `rows` repeated k times."""
        cache = select_cache_rows(self.cache, rows, repeat=k)
        masks = self.cm.decoder_masks(self.mask2d[rows].repeat_interleave(k, dim=0), cache, canvases)
        sc = None if self_conditioning is None else self_conditioning.repeat_interleave(k, dim=0)
        self.forward_tokens += canvases.numel()
        return self.cm.decode(canvases, sc, masks, cache, self.positions)


# --------------------------------------------------------------------------------------------------
# Rules: score, accept, renoise, stop
# --------------------------------------------------------------------------------------------------
class EntropyBoundRule:
    """DiffusionGemma's rule (see `samplers.unmasking.entropy_bound`), for one canvas at a time.

    `generator=None` draws from the global torch RNG in transformers' order and amounts (exact mode);
    with a generator, only the live rows' randomness is drawn (sampler mode). The canvas output is
    the last argmax. State per row is O(C) plus the soft embeddings `[C, H]` the decoder is
    self-conditioned on; a step's vocabulary-wide work runs in chunks of positions
    (`race_entropy_argmax`), so no probability table of the whole canvas exists."""

    def __init__(self, config: EntropyBoundConfig, max_steps: int, vocab_size: int, canvas_length: int,
                 embed_dtype: torch.dtype, generator: torch.Generator | None = None, full_stream: bool = True):
        self.config, self.max_steps, self.V, self.C = config, max_steps, vocab_size, canvas_length
        self.embed_dtype, self.generator, self.full_stream = embed_dtype, generator, full_stream
        self.stop = (StableConfidentStop(config.stability_threshold, config.confidence_threshold)
                     if config.confidence_threshold is not None else None)
        self.chunk_stats = None  # compiled (race, entropy_argmax) pair with compile=True (`dlm.compiled`)

    def start(self, batch: int, device: torch.device, finished_sequences: torch.Tensor,
              finished_rows: list[bool]) -> list[int] | None:
        """A new canvas; `finished_sequences [B]` bool (and the same on the host, `finished_rows`)
        marks rows whose sequence ended. Returns the rows the first step decodes (None: all)."""
        self.batch = batch
        self.canvas = torch.randint(0, self.V, (batch, self.C), device=device, generator=self.generator)
        self.argmax = self.canvas.clone()  # its own tensor: per-row updates below write in place
        self.soft = None  # [B, C, H] self-conditioning input after the first step
        self.done = torch.zeros(batch, dtype=torch.bool, device=device)
        if self.stop is not None:
            self.stop.reset(batch, self.C, device)
        # transformers keeps running rows whose sequence already ended (their canvas becomes pad):
        # they decide how many steps the batch runs, so they stay here too.
        self.skip = torch.zeros_like(self.done) if self.full_stream else finished_sequences.clone()
        if self.full_stream or not any(finished_rows):
            return None
        return [row for row, ended in enumerate(finished_rows) if not ended]

    def budget(self) -> int:
        return self.max_steps

    def live_mask(self) -> torch.Tensor:
        """`[B]` bool: rows still denoising (read by the loop in its one host read per step)."""
        return ~(self.done | self.skip)

    def next_live(self, live: list[int]) -> list[int]:
        """The rows the next step decodes, given the host copy of `live_mask()` as row indices."""
        return live

    def self_conditioning_for(self, rows: torch.Tensor):
        return None if self.soft is None else self.soft[rows]

    def step(self, logits: torch.Tensor, rows: torch.Tensor, step: int, decoder: _LiveDecoder,
             live: list[int] | None = None) -> tuple[int, int]:
        """Phases score/accept/renoise/stop for `rows` (`[R]`, on the host `live`; None: every row),
        logits `[R, C, V]`. Returns the forwards and branch forwards spent beyond the loop's own
        (none here)."""
        R, C, V = logits.shape
        # in place: the raw logits are ours and not needed after this (one vocabulary table fewer)
        processed = logits.div_(linear_temperature(self.max_steps - step, self.max_steps, self.config.t_min,
                                                   self.config.t_max, device=logits.device))
        every = R == self.batch
        flat = processed.view(R * C, V)
        segments = stream_segments(self.batch, None if every else live) if self.full_stream else [(R, 0)]
        sampled, entropy, new_argmax = race_entropy_argmax(flat, C, segments, self.generator, self.chunk_stats)
        sampled, entropy, new_argmax = sampled.view(R, C), entropy.view(R, C), new_argmax.view(R, C)
        accepted = entropy_bound_accept(entropy, self.config.entropy_bound)
        noise_rows = self.batch if self.full_stream else R
        noise = torch.randint(0, V, (noise_rows, C), device=logits.device, generator=self.generator)
        if self.full_stream and not every:
            noise = noise[rows]
        new_canvas = torch.where(accepted, sampled, noise)
        soft = decoder.cm.soft_embeddings(flat).view(R, C, -1)
        if self.soft is None:
            self.soft = soft.new_zeros((self.batch, C, soft.shape[-1]))
        if every:
            self.canvas, self.argmax, self.soft = new_canvas, new_argmax, soft
        else:
            self.canvas[rows], self.argmax[rows], self.soft[rows] = new_canvas, new_argmax, soft
        if self.stop is not None:
            self.done[rows] |= self.stop(new_argmax, entropy, None if every else rows)
        self.last_trace = (accepted.sum(dim=1), (~accepted).sum(dim=1))  # accepted, renoised
        return 0, 0

    def tokens(self) -> torch.Tensor:
        return self.argmax

    def accepted_positions(self, rows: torch.Tensor) -> None:
        return None  # every step re-decides every position: nothing is accepted before the canvas ends


class AcceptRule:
    """Any masked-diffusion sampler of ours on a uniform-noise model: "commit" reads "accept".

    Per canvas, positions start not accepted (the sampler sees them as `UNACCEPTED`, its mask id);
    each step the sampler decides from the logits which to accept (and, if it remasks, which to
    un-accept), the driver's contract applies (progress every step, everything accepted by the last
    step of the budget), and every position not accepted gets a fresh random token from the
    generator before the next forward. Accepted positions keep their token; the canvas output is
    the accepted tokens. `block_length` < C splits the canvas into sub-blocks decoded in order (the
    semi-autoregressive schedule HEX's experts vary). The decoder's self-conditioning input is the
    logits at the model's own temperature schedule (`t_max -> t_min` over the canvas's budget), the
    signal DiffusionGemma was trained with; the sampler's `temperature` only shapes its own draws.

    Look-ahead samplers (`lopa`): `ctx.forward` runs the decoder on k candidate canvases per row
    (their unaccepted positions renoised) against the shared cache, one forward of the budget per
    call; its logits are not reused for the next step, since the next canvas is renoised afresh.
    """

    def __init__(self, policy: Sampler, steps: int, canvas_length: int, block_length: int, vocab_size: int,
                 embed_dtype: torch.dtype, temperature: float, generator: torch.Generator | None,
                 t_min: float, t_max: float, state: dict, enforce: Callable):
        self.policy, self.C, self.block, self.V = policy, canvas_length, block_length, vocab_size
        self.embed_dtype, self.temperature, self.generator = embed_dtype, temperature, generator
        self.t_min, self.t_max, self.state, self.enforce = t_min, t_max, state, enforce
        self.steps = steps  # this canvas's budget
        self.block_start = 0  # absolute position of the canvas, set by the loop
        self.sampler_step = policy.step  # `dlm.compiled.compiled_sampler_step` with compile=True

    def start(self, batch: int, device: torch.device, finished_sequences: torch.Tensor,
              finished_rows: list[bool]) -> list[int] | None:
        """A new canvas (see `EntropyBoundRule.start`). Returns the rows the first step decodes."""
        self.batch = batch
        self.canvas = torch.randint(0, self.V, (batch, self.C), device=device, generator=self.generator)
        self.accepted = torch.zeros(batch, self.C, dtype=torch.bool, device=device)
        self.soft = None  # [B, C, H] self-conditioning input after the first step
        self.skip = finished_sequences.clone()  # rows whose sequence ended leave the decoder batch
        self.open_rows = [row for row, ended in enumerate(finished_rows) if not ended]
        self.sub_blocks = self.C // self.block
        self.sub, self.sub_used, self.spent_before_sub = 0, 0, 0
        self.sub_budget = block_budget(self.steps, self.sub_blocks)
        self.last_trace = None
        return None if len(self.open_rows) == batch else list(self.open_rows)

    def budget(self) -> int:
        return self.steps

    def _window(self) -> tuple[int, int]:
        return self.sub * self.block, (self.sub + 1) * self.block

    def live_mask(self) -> torch.Tensor:
        """`[B]` bool: rows with positions left to accept in the current sub-block."""
        lo, hi = self._window()
        return ~self.accepted[:, lo:hi].all(dim=1) & ~self.skip

    def next_live(self, live: list[int]) -> list[int]:
        """The rows the next step decodes, given the host copy of `live_mask()` as row indices: those,
        or, once every row has accepted the whole sub-block, every open row at the next sub-block
        (nothing is accepted there yet); [] when the canvas is done. Its budget is the fair share of
        what the canvas has left (unused passes roll over)."""
        if live or self.sub >= self.sub_blocks - 1 or not self.open_rows:
            return live
        self.spent_before_sub += self.sub_used
        self.sub += 1
        self.sub_used = 0
        self.sub_budget = block_budget(self.steps - self.spent_before_sub, self.sub_blocks - self.sub)
        return list(self.open_rows)

    def self_conditioning_for(self, rows):
        return None if self.soft is None else self.soft[rows]

    def _renoise(self, tokens: torch.Tensor, accepted: torch.Tensor) -> torch.Tensor:
        noise = torch.randint(0, self.V, tokens.shape, device=tokens.device, generator=self.generator)
        return torch.where(accepted, tokens, noise)

    def step(self, logits: torch.Tensor, rows: torch.Tensor, step: int, decoder: _LiveDecoder,
             live: list[int] | None = None) -> tuple[int, int]:
        """One step for `rows` (`[R]`), logits `[R, C, V]`: the sampler decides on the current
        sub-block, the contract is enforced, the rest renoised. Returns the look-ahead forwards and
        branch forwards the sampler spent beyond the loop's own forward."""
        lo, hi = self._window()
        left_in_budget = self.sub_budget - self.sub_used
        x_full = torch.where(self.accepted[rows], self.canvas[rows], torch.full_like(self.canvas[rows], UNACCEPTED))
        block_x = x_full[:, lo:hi]
        candidates = block_x == UNACCEPTED
        masks_left = candidates.sum(dim=1)
        last = left_in_budget <= 1
        lookahead = None
        if self.policy.looks_ahead and not last:
            lookahead = _CanvasLookahead(self, decoder, rows, x_full, lo, hi, left_in_budget - 1)
        ctx = StepContext(
            x=block_x, candidates=candidates, num_transfer=tokens_this_step(masks_left, left_in_budget),
            step=self.sub_used, steps_in_block=self.sub_budget, last_step=last, temperature=self.temperature,
            generator=self.generator, mask_token_id=UNACCEPTED, block_start=self.block_start + lo, state=self.state,
            rows=rows, forward=lookahead, forwards_left=0 if lookahead is None else lookahead.left)
        block_logits = logits[:, lo:hi]
        result = self.sampler_step(block_logits, ctx)
        new_block = self.enforce(result, block_x, candidates, masks_left, self.policy.remasks, last, UNACCEPTED)
        extra = 0 if lookahead is None else lookahead.calls
        if extra and self.sub_used + 1 + extra >= self.sub_budget:
            new_block = torch.where(new_block == UNACCEPTED, result.proposal, new_block)
        self.sub_used += 1 + extra
        x_full[:, lo:hi] = new_block
        accepted = x_full != UNACCEPTED
        tokens = torch.where(accepted, x_full, self.canvas[rows])
        self.accepted[rows] = accepted
        self.canvas[rows] = self._renoise(tokens, accepted)
        temperature = linear_temperature(self.steps - step, max(self.steps, 1), self.t_min, self.t_max,
                                         device=logits.device)
        R = logits.shape[0]
        soft = decoder.cm.soft_embeddings(logits.view(R * self.C, self.V), divide_by=temperature)
        if self.soft is None:
            self.soft = soft.new_zeros((self.batch, self.C, soft.shape[-1]))
        self.soft[rows] = soft.view(R, self.C, -1)
        left = (new_block == UNACCEPTED).sum(dim=1)
        self.last_trace = (masks_left - left, left)  # accepted this step, left in the sub-block
        return extra, (0 if lookahead is None else lookahead.branches)

    def tokens(self) -> torch.Tensor:
        return self.canvas

    def accepted_positions(self, rows: torch.Tensor) -> torch.Tensor:
        return self.accepted[rows].clone()  # `[R, C]` bool, for the trace


class _CanvasLookahead:
    """`ctx.forward` for a look-ahead sampler on a canvas: candidates `[R, k, Lb]` (the sub-block,
    `UNACCEPTED` where not accepted) -> logits `[R, k, Lb, V]`, one batched decoder call."""

    def __init__(self, rule: AcceptRule, decoder: _LiveDecoder, rows, x_full, lo, hi, allowance: int):
        self.rule, self.decoder, self.rows, self.x_full, self.lo, self.hi = rule, decoder, rows, x_full, lo, hi
        self.allowance, self.calls, self.branches = allowance, 0, 0

    @property
    def left(self) -> int:
        return self.allowance - self.calls

    def __call__(self, candidates: torch.Tensor) -> torch.Tensor:
        R, Lb = self.x_full.shape[0], self.hi - self.lo
        check_lookahead_call(candidates, R, Lb, self.left, "canvas")
        k = candidates.shape[1]
        x = self.x_full.repeat_interleave(k, dim=0)
        x[:, self.lo:self.hi] = candidates.reshape(R * k, Lb)
        accepted = x != UNACCEPTED
        canvases = self.rule._renoise(torch.where(accepted, x, torch.zeros_like(x)), accepted)
        sc = self.rule.self_conditioning_for(self.rows)
        logits = self.decoder.branches(canvases, sc, self.rows, k)[:, self.lo:self.hi]
        self.calls += 1
        self.branches += k
        return logits.reshape(R, k, Lb, -1)


# --------------------------------------------------------------------------------------------------
# The loop
# --------------------------------------------------------------------------------------------------
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
# Entry point from `dlm.families.UniformNoiseFamily`
# --------------------------------------------------------------------------------------------------
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
    from dlm.masked_loop import _enforce_contract
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
