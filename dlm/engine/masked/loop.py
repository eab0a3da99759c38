"""The masked-diffusion decoding loop: semi-autoregressive blocks, step budget, KV cache, EOS stop.

Follows LLaDA's reference `generate` (Nie et al., 2025) with the prefix and dual KV caches of
Fast-dLLM (Wu et al., 2025) and dInfer's EOS early stop. The step policy is a `samplers.Sampler`;
what a step does around it is the shared driver's (`dlm.engine.driver`).

    0. prepare            `plan_masked` (options, checks) and `MaskedRun.start` (canvas, masks, window)
    1. per block:
       a. open            `open_block`: its rows, its budget, the forward that owns its KV cache
       b. steps           `run_step` until the block has no mask (or no row needs the model):
                          view -> status (one host read) -> logits -> decide -> commit -> count
       c. close           `close_block`: counts, the cache handed on, EOS stop of finished rows
    2. finalize           `Tally.output`

Shapes: B rows of the batch, R rows decoded in a block, P prompt length, Lb the block (or the open
window's span), V vocabulary.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from dlm.decoding_config import DecodingConfig
from dlm.engine.driver import Rows, Tally, decide, fill_when_spent, read_step_status, same_rows, subset_index
from dlm.engine.masked.elastic import DriftTest
from dlm.engine.masked.eos import rows_needing_model, stop_at_eos
from dlm.engine.masked.forward import KVCachedForward
from dlm.engine.masked.inputs import full_attention_mask
from dlm.engine.masked.kv_cache import carry_cache
from dlm.engine.masked.lookahead import BlockLookahead
from dlm.engine.masked.plan import MaskedPlan, plan_masked
from dlm.engine.masked.window import BlockWindow, fit_logits
from dlm.engine.schedule import block_budget, tokens_this_step
from dlm.outputs import GenerateOutput, StepTrace, nonfinite_positions, raise_nonfinite
from samplers import Sampler, StepContext


@torch.no_grad()
def run_masked(model, input_ids: torch.Tensor, config: DecodingConfig, policy: Sampler, *,
               attention_mask: torch.Tensor | None = None, callback: Callable[[StepTrace], None] | None = None,
               return_trace: bool = False) -> GenerateOutput:
    """The masked loop for one validated `DecodingConfig` and its sampler (`dlm.generate` documents
    every option); the phases are in the module docstring."""
    plan = plan_masked(model, input_ids, config, policy, attention_mask)
    run = MaskedRun.start(plan, input_ids, Tally(
        total=plan.steps, desc=f"dlm {policy.name}", unit="nfe", progress=plan.progress, callback=callback,
        keep_trace=return_trace))
    for index in range(plan.num_blocks):
        block = run.open_block(index)
        if block is None:
            break
        while run.run_step(block):
            pass
        run.close_block(block)
    return run.tally.output(run.x, plan.gen_length)


@dataclass
class Block:
    """One block being decoded (phase 1): positions `[start, end)`, its `budget` of forward passes
    (`used` so far, `step` index), its `rows` (batch rows decoded), the `forward` that owns its KV
    cache, and what the last step left for the next: `reuse` (logits a lookahead call already
    computed for the current block state) and `nonfinite` (`[]` count of the last forward).
    `schedule` counts the steps of the budget's schedule taken: the forward passes, unless a sampler
    reports its own (a lossless sampler takes several of its base's steps per pass); the next
    block's budget rolls over by it."""

    index: int
    start: int
    end: int
    budget: int
    rows: Rows
    forward: KVCachedForward
    reuse: object = None
    used: int = 0
    step: int = 0
    nonfinite: torch.Tensor | None = None
    schedule: int | torch.Tensor = 0  # steps of the budget's schedule taken (`StepResult.schedule_steps`)


@dataclass
class StepView:
    """What a step sees before its forward: `x_rows [R, T]`, the block (or window span) `block_x
    [R, Lb]`, its `candidates [R, Lb]` bool, `head_left [R]` masks left in the block proper, and
    `span_end` (the span's end; the block's end without a window)."""

    x_rows: torch.Tensor
    block_x: torch.Tensor
    candidates: torch.Tensor
    head_left: torch.Tensor
    span_end: int


class MaskedRun:
    """The state of one masked call between its phases: the sequences `x [B, P + gen_length]`, the
    rows still decoded (`decoding`, host flags updated once per block), the sampler's state, the
    block window, and what one block hands the next (`last_block_cache`, the window's `carried`
    logits); `tally` counts everything."""

    def __init__(self, plan: MaskedPlan, x: torch.Tensor, tally: Tally):
        self.plan, self.x, self.tally = plan, x, tally
        self.full_mask, self.positions = full_attention_mask(plan.attention_mask, plan.gen_length)
        model_positions = getattr(plan.adapter.model, "dlm_position_ids", None)
        if model_positions is not None:
            # The model defines its own position scheme; computed once, since the prompt never changes.
            self.positions = model_positions(x, self.full_mask)
        self.decoding = [True] * plan.batch
        self.window = _window(plan, x.device)
        self.state = plan.policy.init_state(plan.batch, plan.total_length, x.device)
        self.steps_left = plan.steps
        self.last_block_cache = None  # (forward, rows, start) of the last block, whose cache the next extends
        self.carried = None  # window only: (logits, rows, start) a lookahead left for the next head's first step

    @classmethod
    def start(cls, plan: MaskedPlan, input_ids: torch.Tensor, tally: Tally) -> "MaskedRun":
        """Phase 0: the prompt followed by `gen_length` masks."""
        masks = torch.full((plan.batch, plan.gen_length), plan.mask_id, dtype=torch.long, device=input_ids.device)
        return cls(plan, torch.cat([input_ids, masks], dim=1), tally)

    # ---------------------------------------------------------------------------------- 1.a open
    def open_block(self, index: int) -> Block | None:
        """The block `index` over the rows still decoded, or None when every row has finished."""
        plan = self.plan
        start = plan.prompt_length + index * plan.block_length
        budget = block_budget(self.steps_left, plan.num_blocks - index)
        if not any(self.decoding):
            return None
        rows = Rows.from_flags(self.decoding, self.x.device)
        carried, refresh_due = None, False
        if self.last_block_cache is not None:
            carried = carry_cache(*self.last_block_cache, rows.index)
            refresh_due = self.last_block_cache[0].refresh_due  # the elastic cache's last drift test
        drift = DriftTest(plan.cache_drift_threshold, plan.cache_drift_probe) if plan.kv_cache == "elastic" else None
        forward = KVCachedForward(
            plan.adapter, plan.kv_cache, plan.cache_refresh_every, plan.cfg_scale, plan.prompt_length,
            None if self.full_mask is None else self.full_mask[rows.index],
            None if self.positions is None else self.positions[rows.index], cut=plan.cut_trailing_masks,
            want_hidden=plan.policy.needs_hidden_states, carried=carried, drift=drift, refresh_due=refresh_due)
        block = Block(index, start, start + plan.block_length, budget, rows, forward, reuse=self.carried)
        self.carried = None
        return block

    # ---------------------------------------------------------------------------------- 1.b steps
    def run_step(self, block: Block) -> bool:
        """One step of `block`; False when the block is done (nothing was run)."""
        view = self._view(block)
        open_, in_model = self._status(block, view)
        if not open_:
            return False
        logits, was_full, forwards = self._logits(block, view, in_model)
        plan = self.plan
        last = block.used >= block.budget
        if last and self.window is not None:
            view.candidates[:, plan.block_length:] = False  # the head's last pass: fill the head only
        lookahead = None
        if plan.policy.looks_ahead and not last:
            lookahead = BlockLookahead(block.forward, view.x_rows, block.start, view.span_end, plan.mask_id,
                                          block.budget - block.used, like=logits,
                                          eos_id=plan.adapter.eos_token_id if plan.skip_finished else None)
        ctx = self._context(block, view, last, lookahead)
        result, new_block = decide(plan.sampler_step, logits, ctx, remasks=plan.policy.remasks,
                                   fillable=None if self.window is None else view.candidates)
        del logits  # a [R, Lb, V] table: gone before the next forward makes another
        calls, branches = (0, 0) if lookahead is None else (lookahead.calls, lookahead.branches)
        block.used += calls
        taken = result.schedule_steps
        block.schedule = block.schedule + (forwards + calls if taken is None else taken)
        block.reuse = _reusable_logits(result, new_block, lookahead)
        if block.reuse is None and block.used >= block.budget:
            new_block = fill_when_spent(new_block, result, plan.mask_id, self._head_only(view))
        if block.reuse is not None and self.window is not None:
            block.reuse = (block.reuse, block.rows.index, block.start)
        self.x[block.rows.index, block.start:view.span_end] = new_block
        self._count(block, view, new_block, in_model, was_full, forwards + calls, forwards + branches, lookahead)
        block.step += 1
        return True

    def _view(self, block: Block) -> StepView:
        """Phase "view": the block's tokens and candidates (the window's span when one is open)."""
        plan, rows = self.plan, block.rows.index
        x_rows = self.x[rows]
        span_end, eligible = block.end, None
        if self.window is not None:
            self.window.advance(x_rows, rows, block.index)
            span_end = self.window.span_end(rows, block.index)
            eligible = self.window.eligible(rows, block.index, span_end - block.start)
        block_x = x_rows[:, block.start:span_end]
        candidates = block_x == plan.mask_id
        if eligible is not None:
            candidates &= eligible
        head_left = (block_x[:, :plan.block_length] == plan.mask_id).sum(dim=1)
        return StepView(x_rows, block_x, candidates, head_left, span_end)

    def _status(self, block: Block, view: StepView) -> tuple[bool, torch.Tensor | None]:
        """Phase "status", the step's one host read: whether the block still has masks, the last
        forward's non-finite count (raises), and which rows still need the model. Returns `(open,
        in_model)`: `in_model` `[R']` indices into the block's rows (None: all of them)."""
        plan = self.plan
        needs = rows_needing_model(view.block_x, plan.adapter.eos_token_id, plan.mask_id) if plan.skip_finished else None
        stale = block.forward.stale  # the elastic cache's drift test, read with the rest
        counts = [view.head_left.sum()] + ([] if block.nonfinite is None else [block.nonfinite])
        (masks_left, *rest), flags = read_step_status(counts + ([] if stale is None else [stale]), needs)
        if stale is not None:
            block.forward.stale, block.forward.refresh_due = None, bool(rest.pop())
        if rest and rest[0]:
            raise_nonfinite(int(rest[0]), block=block.index, step=block.step - 1, dtype=self.plan.model_dtype)
        if masks_left <= 0:
            return False, None
        if flags is None:
            return True, None
        if not any(flags):
            return False, None  # every row is finished: the EOS fill at the block's end completes it
        return True, subset_index(flags, self.x.device)

    def _logits(self, block: Block, view: StepView, in_model) -> tuple[torch.Tensor, bool, int]:
        """Phase "forward": `(logits [R, Lb, V], full forward?, forwards spent)`, reusing the logits a
        lookahead call already computed for this block state when there are any."""
        plan = self.plan
        if block.reuse is not None:
            logits = block.reuse
            if self.window is not None:
                logits = fit_logits(*block.reuse, block.rows.index, block.start, view.span_end - block.start,
                                    plan.mask_id)
            return logits, False, 0
        if block.used >= block.budget:  # unreachable: the step that spent the budget filled every mask
            raise RuntimeError("internal error: block has masks left but no forward passes")
        logits, was_full = block.forward(view.x_rows, block.step, block.start, view.span_end, in_model)
        block.nonfinite = nonfinite_positions(logits)
        # The mask token is never a valid answer; an untrained or off-distribution model may still
        # rank it first, which would "commit" a mask.
        logits[..., plan.mask_id] = float("-inf")
        block.used += 1
        return logits, was_full, 1

    def _context(self, block: Block, view: StepView, last: bool, lookahead) -> StepContext:
        """Phase "score": what the sampler is told (the head's quota, at least one token wherever a
        row has candidates)."""
        plan = self.plan
        masks_left = view.candidates.sum(dim=1)
        quota = torch.maximum(tokens_this_step(view.head_left, block.budget - block.used + 1), (masks_left > 0).long())
        return StepContext(
            x=view.block_x, candidates=view.candidates, num_transfer=quota, step=block.step,
            steps_in_block=block.budget, last_step=last, temperature=plan.temperature, generator=plan.generator,
            mask_token_id=plan.mask_id, block_start=block.start, state=self.state, rows=block.rows.index,
            forward=lookahead, forwards_left=0 if lookahead is None else lookahead.left,
            hidden=block.forward.hidden, output_fixed=self._output_fixed if plan.skip_finished else None)

    def _output_fixed(self, blocks: torch.Tensor) -> torch.Tensor:
        """`[N]` bool: rows of `blocks [N, Lb]` whose output is fixed (EOS stop; see `StepContext`)."""
        return ~rows_needing_model(blocks, self.plan.adapter.eos_token_id, self.plan.mask_id)

    def _head_only(self, view: StepView) -> torch.Tensor | None:
        """With a window, the budget's last fill is confined to the head block's candidates."""
        if self.window is None:
            return None
        head = torch.arange(view.block_x.shape[1], device=self.x.device) < self.plan.block_length
        return view.candidates & head

    def _count(self, block: Block, view: StepView, new_block, in_model, was_full: bool, forwards: int,
               branches: int, lookahead) -> None:
        """Phase "count": the tally and the step's trace records."""
        self.tally.forwards(forwards, branches)
        if self.tally.observed:
            self.tally.emit(_step_records(block, self.tally.nfe, in_model, view.block_x, new_block,
                                          self.plan.mask_id, was_full, forwards, branches, lookahead,
                                          self.tally.keep_trace))

    # ---------------------------------------------------------------------------------- 1.c close
    def close_block(self, block: Block) -> None:
        """The block's counts; the cache the next block extends; rows that hold EOS stop (dInfer)."""
        plan = self.plan
        if self.window is not None:
            self.carried = block.reuse  # the next head starts from these logits when the lookahead left some
        schedule = int(block.schedule)  # a host read only when a sampler reported its own steps
        self.tally.unit_done(block.used, block.forward.forward_tokens, schedule)
        if plan.kv_cache in ("prompt", "elastic") or (plan.cache_across_blocks and not block.forward.cut):
            self.last_block_cache = (block.forward, block.rows.index, block.start)  # a cut forward's cache ends at `end`
        self.steps_left -= schedule
        if plan.eos_early_stop:
            finished = stop_at_eos(self.x, block.rows.index, plan.prompt_length, block.end,
                                    plan.adapter.eos_token_id).tolist()  # once per block
            for row, done in zip(block.rows.host, finished):
                if done:
                    self.decoding[row] = False


def _window(plan: MaskedPlan, device) -> BlockWindow | None:
    if not plan.windowed:
        return None
    return BlockWindow(size=plan.window_blocks, open_at=plan.window_open_at, num_blocks=plan.num_blocks,
                       block_length=plan.block_length, prompt_length=plan.prompt_length, batch=plan.batch,
                       device=device, mask_id=plan.mask_id,
                       eos_id=plan.adapter.eos_token_id if plan.eos_early_stop else None)


def _step_records(block: Block, nfe: int, in_model, block_x: torch.Tensor, new_block: torch.Tensor, mask_id: int,
                  was_full: bool, forwards: int, branches: int, lookahead, keep_tokens: bool) -> list[StepTrace]:
    """The `StepTrace` records of one step: one record, unless a lookahead call ran on fewer rows than
    the step's own forward (rows that finished inside the step leave the call). Then the first record
    holds the step's own pass (`forwards` 0 or 1) and each call adds a record of its rows
    (`forwards` 1, `branch_forwards` k, nothing committed), so summing a row's records gives the
    passes that row took part in, and all records together still sum to `nfe`."""
    rows = block.rows.index
    before = (block_x == mask_id).sum(dim=1)
    left = (new_block == mask_id).sum(dim=1)
    seen = slice(None) if in_model is None else in_model
    tokens = new_block[seen].clone() if keep_tokens else None
    calls = [] if lookahead is None else lookahead.row_sets

    def record(sel, committed, masks_left, full, passes, branch_passes, kept):
        return StepTrace(block=block.index, step=block.step, nfe=nfe, rows=rows[sel], committed=committed,
                         masks_left=masks_left, full_forward=full, forwards=passes, branch_forwards=branch_passes,
                         tokens=kept)

    if all(same_rows(r, in_model) for r, _ in calls):
        return [record(seen, (before - left)[seen], left[seen], was_full, forwards, branches, tokens)]
    own = forwards - len(calls)  # the step's own forward pass: 0 when it reused lookahead logits
    records = [record(seen, (before - left)[seen], left[seen], was_full, own, own, tokens)]
    for r, k in calls:
        sel = slice(None) if r is None else r
        records.append(record(sel, torch.zeros_like(left[sel]), left[sel], False, 1, k, None))
    return records


def _reusable_logits(result, new_block: torch.Tensor, lookahead) -> torch.Tensor | None:
    """The logits a sampler returned for its new block (`StepResult.next_logits`, `[R, Lb, V]`),
    when the next step may use them instead of a forward pass: only logits from this step's own
    `ctx.forward` calls, and only if the driver kept the block exactly as the sampler returned it."""
    nxt = getattr(result, "next_logits", None)
    if nxt is None:
        return None
    if lookahead is None or lookahead.calls + lookahead.free_calls == 0:
        raise RuntimeError("StepResult.next_logits must come from this step's ctx.forward call; "
                           "return next_logits=None otherwise")
    if nxt.shape[:2] != new_block.shape:
        raise RuntimeError(f"StepResult.next_logits has shape {tuple(nxt.shape)}, expected "
                           f"{tuple(new_block.shape)} + (vocab,)")
    return nxt if torch.equal(new_block, result.x) else None
