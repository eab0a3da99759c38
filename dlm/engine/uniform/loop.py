"""Uniform-noise block diffusion (DiffusionGemma): the canvas loop.

transformers' `DiffusionGemmaForBlockDiffusion` (Google's DiffusionGemma) has no mask token. A causal
encoder reads the prompt and every finished canvas into a KV cache; a bidirectional decoder denoises
one canvas of `canvas_length` tokens at a time against that cache, fed its previous step's logits
(self-conditioning, Chen et al. 2022). A canvas starts as uniformly random tokens; each step accepts
some positions and renoises the rest (Austin et al. 2021; Schiff et al. 2024; Sahoo et al. 2025).

The loop below reads in the numbered phases of transformers' own `generate`:

    0. prepare    `plan_uniform` (generation config, lengths, the rule) and `CanvasRun.start`
                  (masks, positions, the cache)
    1. per canvas:
       a. encode  `encode`: the prompt (first canvas) or the previous canvas into the KV cache
       b. start   `start_canvas`: a canvas of random tokens, the rule's per-canvas state
       c. steps   `run_step`: forward (decoder, live rows only) -> score, accept, renoise, stop
                  (the rule), then the step's one host read (which rows go on) and the tally
       d. append  `append_canvas`: the canvas's tokens; e. EOS / pad bookkeeping (`finalize_canvas`)
       f. next    `next_canvas`: the next canvas's masks and positions
    2. finalize   `Tally.output`

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

from dataclasses import dataclass
from typing import Any

import torch

from dlm.engine.driver import Rows, Tally, read_step_status
from dlm.engine.schedule import block_budget
from dlm.engine.uniform.canvas_model import RowSubsetDecoder
from dlm.engine.uniform.plan import UniformPlan, plan_uniform
from dlm.outputs import GenerateOutput, StepTrace, nonfinite_positions, raise_nonfinite
from samplers import Sampler


def run_uniform(model, input_ids: torch.Tensor, config, policy: Sampler | None, *, attention_mask=None,
                callback=None, return_trace: bool = False) -> GenerateOutput:
    """One `DecodingConfig` on a DiffusionGemma model (`policy` None: transformers' rule, see
    `dlm.engine.uniform.plan`); the phases are in the module docstring.

    Shapes: input_ids `[B, P]`, attention_mask `[B, P]` (1 real, 0 left padding) or None. Returns
    `GenerateOutput.sequences [B, P + n*C]` with n canvases generated (fewer than the requested
    number when every row has ended), `nfe` decoder calls (batched), `nfe_per_sequence [B]` decoder
    forwards each row took part in (transformers' count)."""
    plan = plan_uniform(model, input_ids, config, policy, attention_mask)
    with torch.no_grad():
        run = CanvasRun.start(plan, input_ids, attention_mask, Tally(
            total=plan.steps or plan.canvases, desc="dlm canvases", unit="nfe" if plan.steps else "canvas",
            progress=plan.progress, callback=callback, keep_trace=return_trace, per_unit=not plan.steps))
        for index in range(plan.canvases):
            run.encode(index)
            canvas = run.start_canvas(index)
            while run.run_step(canvas):
                pass
            if run.append_canvas(canvas):
                break
            run.next_canvas()
        return run.tally.output(run.sequences, run.sequences.shape[1] - run.prompt_length, run.per_row_nfe)


@dataclass
class Canvas:
    """One canvas being denoised: its `index`, the `rule` deciding its steps, the `decoder` over its
    live rows, the rows the next step decodes (`in_model`, batch rows on the host; None: every row),
    forward passes `used` and the step index `step`."""

    index: int
    rule: Any
    decoder: RowSubsetDecoder
    in_model: list[int] | None
    used: int = 0
    step: int = 0


class CanvasRun:
    """The state of one call between canvases: the sequences so far `[B, P + n*C]`, the encoder's KV
    cache, the masks and positions of the next canvas, which rows have ended (device and host),
    per-row decoder forwards, the budget left; `tally` counts everything."""

    def __init__(self, plan: UniformPlan, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, tally: Tally):
        from transformers import DynamicCache

        self.plan, self.tally, self.cm = plan, tally, plan.canvas_model
        C, device = self.cm.canvas_length, input_ids.device
        self.batch, self.prompt_length = input_ids.shape
        self.cur_len = self.prompt_length
        self.mask2d = (attention_mask.bool() if attention_mask is not None
                       else torch.ones((self.batch, self.prompt_length), dtype=torch.bool, device=device))
        self.decoder_mask2d = torch.nn.functional.pad(self.mask2d, (0, C), value=True)
        self.enc_positions = torch.arange(0, self.cur_len, dtype=torch.int32, device=device).unsqueeze(0)
        self.dec_positions = torch.arange(self.cur_len, self.cur_len + C, dtype=torch.int32, device=device).unsqueeze(0)
        self.cache = DynamicCache(config=self.cm.model.config.get_text_config(decoder=True))
        self.sequences = input_ids.clone()
        self.finished = torch.zeros(self.batch, dtype=torch.bool, device=device)
        self.finished_rows = [False] * self.batch  # the host's copy, read once per canvas
        self.per_row_nfe = torch.zeros(self.batch, dtype=torch.long, device=device)
        self.every_row = torch.arange(self.batch, device=device)
        self.steps_left = plan.steps
        self.encoded_tokens = 0  # encoder positions of the canvas being decoded

    @classmethod
    def start(cls, plan: UniformPlan, input_ids, attention_mask, tally: Tally) -> "CanvasRun":
        return cls(plan, input_ids, attention_mask, tally)

    def encode(self, index: int) -> None:
        """Phase 1.a: the prompt (first canvas) or the previous canvas into the KV cache."""
        self.cache = self.cm.encode(self.sequences, self.mask2d, self.cache, self.enc_positions, is_prefill=index == 0)
        self.encoded_tokens = self.batch * (self.prompt_length if index == 0 else self.cm.canvas_length)

    def start_canvas(self, index: int) -> Canvas:
        """Phase 1.b: the rule's fresh canvas (random tokens) with this canvas's share of the budget."""
        budget = None if self.steps_left is None else block_budget(self.steps_left, self.plan.canvases - index)
        rule = self.plan.make_rule(budget)
        rule.block_start = self.cur_len
        live = rule.start(self.batch, self.sequences.device, self.finished, self.finished_rows)  # None: all
        decoder = RowSubsetDecoder(self.cm, self.cache, self.decoder_mask2d, self.dec_positions, self.batch)
        return Canvas(index, rule, decoder, live)

    def run_step(self, canvas: Canvas) -> bool:
        """Phase 1.c, one denoising step; False when the canvas is done (nothing was run). The host
        reads the device once (which rows go on, whether the logits were finite), so it can queue
        the next step without waiting otherwise."""
        rule = canvas.rule
        if canvas.step >= rule.budget() or canvas.in_model == [] or canvas.used >= rule.budget():
            return False
        rows = Rows.of(canvas.in_model, self.batch, self.sequences.device, every_index=self.every_row)
        self.per_row_nfe[rows.index] += (~self.finished[rows.index]).long()  # ended rows count nothing (transformers)
        every = canvas.in_model is None
        logits = canvas.decoder(rule.canvas if every else rule.canvas[rows.index],
                                rule.soft if every or rule.soft is None else rule.soft[rows.index],
                                rows.index, canvas.in_model)
        bad = nonfinite_positions(logits)
        extra, extra_branches = rule.step(logits, rows.index, canvas.step, canvas.decoder, canvas.in_model)
        del logits
        (bad_count,), flags = read_step_status([bad], rule.live_mask())
        if bad_count:
            raise_nonfinite(bad_count, block=canvas.index, step=canvas.step, what="canvas",
                            dtype=getattr(self.cm.model, "dtype", None))
        live = rule.next_live([row for row, on in enumerate(flags) if on])
        canvas.in_model = None if live is not None and len(live) == self.batch else live
        canvas.used += 1 + extra
        self.tally.forwards(1 + extra, 1 + extra_branches)
        if self.tally.observed:
            self.tally.emit([self._record(canvas, rows.index, 1 + extra, 1 + extra_branches)])
        canvas.step += 1
        return True

    def _record(self, canvas: Canvas, rows: torch.Tensor, forwards: int, branches: int) -> StepTrace:
        accepted_now, left = canvas.rule.last_trace
        keep = self.tally.keep_trace
        return StepTrace(block=canvas.index, step=canvas.step, nfe=self.tally.nfe, rows=rows, committed=accepted_now,
                         masks_left=left, full_forward=True, forwards=forwards, branch_forwards=branches,
                         tokens=canvas.rule.tokens()[rows].clone() if keep else None,
                         accepted=canvas.rule.accepted_positions(rows) if keep else None)

    def append_canvas(self, canvas: Canvas) -> bool:
        """Phases 1.d-e: the canvas's tokens appended, EOS / pad bookkeeping; True when every row ended."""
        self.tally.unit_done(canvas.used, self.encoded_tokens + canvas.decoder.forward_tokens)
        if self.steps_left is not None:
            self.steps_left -= canvas.used
        self.sequences = torch.cat([self.sequences, canvas.rule.tokens()], dim=-1)
        self.sequences, self.finished = finalize_canvas(self.sequences, self.finished, self.plan, self.cm.canvas_length)
        self.finished_rows = self.finished.tolist()
        return all(self.finished_rows)

    def next_canvas(self) -> None:
        """Phase 1.f: the next canvas's masks and positions (transformers' helper: same padding semantics)."""
        (self.cur_len, self.decoder_mask2d, self.mask2d, self.enc_positions,
         self.dec_positions) = self.cm.model._prepare_kwargs_for_next_canvas(
            attention_mask=self.mask2d, decoder_attention_mask=self.decoder_mask2d,
            decoder_position_ids=self.dec_positions, canvas_length=self.cm.canvas_length, cur_len=self.cur_len)


def finalize_canvas(input_ids, finished, plan: UniformPlan, canvas_length: int):
    """Phase 1.e: which rows ended (EOS in the new canvas), and pad after EOS / in ended rows, with
    transformers' own bookkeeping so the returned shape and padding are identical."""
    from transformers import DiffusionGemmaForBlockDiffusion
    from transformers.generation import EosTokenCriteria, StoppingCriteriaList

    criteria = StoppingCriteriaList()
    if plan.eos_token_id is not None:
        criteria.append(EosTokenCriteria(plan.eos_token_id))
    eos = None if plan.eos_token_id is None else torch.tensor(plan.eos_token_id, device=input_ids.device)
    holder = _GC(plan.pad_token_id, plan.eos_token_id)
    return DiffusionGemmaForBlockDiffusion._finalize_canvas(input_ids, finished, holder, criteria, canvas_length, eos)


@dataclass
class _GC:
    """The two generation-config fields transformers' canvas finalisation reads."""

    pad_token_id: int | None
    eos_token_id: Any
