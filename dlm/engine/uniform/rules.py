"""The canvas loop's step rules: transformers' DiffusionGemma rule (`EntropyBoundRule`) and any
masked sampler of ours in accept/renoise mode (`AcceptRule`, with its lookahead call)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from dlm.engine.driver import Lookahead, decide, fill_when_spent
from dlm.engine.schedule import block_budget, tokens_this_step
from dlm.engine.uniform.canvas_model import UNACCEPTED, RowSubsetDecoder
from samplers import Sampler, StepContext
from samplers.unmasking.entropy_bound import (EntropyBoundConfig, StableConfidentStop, entropy_bound_accept,
                                              linear_temperature, race_entropy_argmax, stream_segments)


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

    def step(self, logits: torch.Tensor, rows: torch.Tensor, step: int, decoder: RowSubsetDecoder,
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


@dataclass(frozen=True)
class AcceptSettings:
    """What every canvas's `AcceptRule` of one call shares: the canvas and sub-block lengths, the
    vocabulary and embedding dtype, the sampler's temperature and generator, the model's
    self-conditioning temperature schedule (`t_max -> t_min`) and the sampler's step function."""

    canvas_length: int
    block_length: int
    vocab_size: int
    embed_dtype: torch.dtype
    temperature: float
    generator: torch.Generator | None
    t_min: float
    t_max: float
    sampler_step: Callable


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

    def __init__(self, policy: Sampler, steps: int, settings: AcceptSettings, state: dict):
        s = settings
        self.policy, self.steps, self.state = policy, steps, state  # `steps`: this canvas's budget
        self.C, self.block, self.V, self.embed_dtype = s.canvas_length, s.block_length, s.vocab_size, s.embed_dtype
        self.temperature, self.generator, self.t_min, self.t_max = s.temperature, s.generator, s.t_min, s.t_max
        self.block_start = 0  # absolute position of the canvas, set by the loop
        self.sampler_step = s.sampler_step  # `dlm.compiled.compiled_sampler_step` with compile=True

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

    def step(self, logits: torch.Tensor, rows: torch.Tensor, step: int, decoder: RowSubsetDecoder,
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
            lookahead = CanvasLookahead(self, decoder, rows, x_full, lo, hi, left_in_budget - 1)
        ctx = StepContext(
            x=block_x, candidates=candidates, num_transfer=tokens_this_step(masks_left, left_in_budget),
            step=self.sub_used, steps_in_block=self.sub_budget, last_step=last, temperature=self.temperature,
            generator=self.generator, mask_token_id=UNACCEPTED, block_start=self.block_start + lo, state=self.state,
            rows=rows, forward=lookahead, forwards_left=0 if lookahead is None else lookahead.left)
        block_logits = logits[:, lo:hi]
        result, new_block = decide(self.sampler_step, block_logits, ctx, remasks=self.policy.remasks)
        extra = 0 if lookahead is None else lookahead.calls
        if self.sub_used + 1 + extra >= self.sub_budget:  # spent: a lookahead took the last pass
            new_block = fill_when_spent(new_block, result, UNACCEPTED)
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


class CanvasLookahead(Lookahead):
    """`ctx.forward` for a look-ahead sampler on a canvas: candidates `[R, k, Lb]` (the sub-block,
    `UNACCEPTED` where not accepted) -> logits `[R, k, Lb, V]`, one batched decoder call."""

    unit = "canvas"

    def __init__(self, rule: AcceptRule, decoder: RowSubsetDecoder, rows, x_full, lo, hi, allowance: int):
        super().__init__(x_full.shape[0], hi - lo, allowance)
        self.rule, self.decoder, self.rows, self.x_full, self.lo, self.hi = rule, decoder, rows, x_full, lo, hi

    def run(self, candidates: torch.Tensor) -> torch.Tensor:
        R, Lb = self.x_full.shape[0], self.hi - self.lo
        k = candidates.shape[1]
        x = self.x_full.repeat_interleave(k, dim=0)
        x[:, self.lo:self.hi] = candidates.reshape(R * k, Lb)
        accepted = x != UNACCEPTED
        canvases = self.rule._renoise(torch.where(accepted, x, torch.zeros_like(x)), accepted)
        sc = self.rule.self_conditioning_for(self.rows)
        logits = self.decoder.branches(canvases, sc, self.rows, k)[:, self.lo:self.hi]
        self.counted(k, None)
        return logits.reshape(R, k, Lb, -1)
