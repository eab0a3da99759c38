"""The driver both families' loops share (DESIGN.md, "Three layers").

A family's loop decides *what* a unit of decoding is (a block of a masked model, a canvas or
sub-block of a uniform-noise one) and how its model is called; the pieces here decide everything a
step does around the sampler, the same way for both:

- `Rows`: a selection of rows, kept on the host and on the device together, so a loop knows which
  rows run without reading the device;
- `read_step_status`: the one host read of a step (counts, the non-finite check, row flags);
- `Lookahead`: the budget and bookkeeping of a sampler's `ctx.forward` calls (each call one forward of
  the budget, k branch forwards per row, rows that leave a call recorded);
- `decide`: sampler, then the step contract, then the fill on the budget's last pass;
- `Tally`: the counts a call reports (nfe, branch forwards, forward tokens, steps per unit), its
  trace records, callback and progress bar, and the `GenerateOutput` at the end.

Nothing here knows a model family.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import torch
from tqdm.auto import tqdm

from dlm.outputs import GenerateOutput, StepTrace
from samplers.contract import enforce_step_contract


# --------------------------------------------------------------------------------------------------
# Rows
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Rows:
    """A sorted selection of a batch's rows, on the host (`host`, list of ints) and on the device
    (`index`, `[R]` long) together: both are built from host values, so knowing which rows run never
    needs a device read. `every`: the selection is every row."""

    host: list[int]
    index: torch.Tensor
    every: bool

    @classmethod
    def from_flags(cls, flags: list[bool], device) -> "Rows":
        """The rows whose host flag is set."""
        host = [i for i, on in enumerate(flags) if on]
        return cls(host, torch.tensor(host, dtype=torch.long, device=device), len(host) == len(flags))

    @classmethod
    def of(cls, host: list[int] | None, total: int, device, every_index: torch.Tensor | None = None) -> "Rows":
        """`host` rows (None: all `total`), indexing with `every_index` when all are taken."""
        if host is None or len(host) == total:
            index = every_index if every_index is not None else torch.arange(total, device=device)
            return cls(list(range(total)), index, True)
        return cls(list(host), torch.tensor(host, dtype=torch.long, device=device), False)


def subset_index(flags: list[bool], device) -> torch.Tensor | None:
    """`[R']` sorted indices of the set host `flags`, None when all are set (no copy then)."""
    if all(flags):
        return None
    return torch.tensor([i for i, on in enumerate(flags) if on], dtype=torch.long, device=device)


def same_rows(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    """Whether two row selections (None: every row) are the same."""
    if a is None or b is None:
        return a is None and b is None
    return a.shape == b.shape and torch.equal(a, b)


def rows_needing_model_index(needs: torch.Tensor) -> torch.Tensor | None:
    """Sorted indices of the set entries of `needs [R]` bool, or None when all are set (a device
    read: for calls whose row flags are not on the host)."""
    if bool(needs.all()):
        return None
    return needs.nonzero().squeeze(1)


# --------------------------------------------------------------------------------------------------
# The one host read of a step
# --------------------------------------------------------------------------------------------------
def read_step_status(counts: list[torch.Tensor], flags: torch.Tensor | None = None) -> tuple[list[int], list[bool] | None]:
    """Scalar `counts` (0-d or 1-element integer tensors) and per-row `flags` (`[R]` bool) read to
    the host in one transfer; `(counts, flags)` as Python values (flags None when not given).

    Every step of a loop reads the device exactly once, here: whether its unit still has work, the
    previous forward's non-finite count, and which rows go on."""
    dtype = counts[0].dtype
    parts = [c.to(dtype).view(1) for c in counts]
    if flags is not None:
        parts.append(flags.to(dtype))
    values = torch.cat(parts).tolist()
    n = len(counts)
    return values[:n], None if flags is None else [bool(v) for v in values[n:]]


# --------------------------------------------------------------------------------------------------
# ctx.forward: the lookahead budget
# --------------------------------------------------------------------------------------------------
def check_lookahead_call(candidates: torch.Tensor, rows: int, block_length: int, left: int, unit: str) -> None:
    """What every driver's `ctx.forward` refuses: candidates not `[rows, k, block_length]` long, or a
    call past the `unit`'s step budget."""
    shape_ok = candidates.dim() == 3 and candidates.shape[0] == rows and candidates.shape[2] == block_length
    if not shape_ok or candidates.dtype != torch.long:
        raise ValueError(f"ctx.forward needs candidates of shape [{rows}, k, {block_length}] (torch.long), got "
                         f"{tuple(candidates.shape)} {candidates.dtype}")
    if left <= 0:
        raise RuntimeError(f"ctx.forward: the {unit}'s step budget is spent; check ctx.forwards_left before calling")


class Lookahead:
    """`ctx.forward` of one step, the family-independent part: a budget of `allowance` calls, each
    one forward of the step budget and `k` branch forwards per row; a call that runs no model (every
    row finished) costs nothing (`free_calls`). `row_sets` records, per call that ran, the rows it ran
    (None: all of the step's rows) and its k. A family subclasses it with `run(candidates)`."""

    unit = "block"

    def __init__(self, rows: int, block_length: int, allowance: int):
        self.row_count, self.block_length, self.allowance = rows, block_length, allowance
        self.calls, self.branches, self.free_calls = 0, 0, 0
        self.row_sets: list[tuple[torch.Tensor | None, int]] = []

    @property
    def left(self) -> int:
        return self.allowance - self.calls

    def __call__(self, candidates: torch.Tensor) -> torch.Tensor:
        """candidates: `[R, k, Lb]` long block tokens. Returns aligned logits `[R, k, Lb, V]`."""
        check_lookahead_call(candidates, self.row_count, self.block_length, self.left, self.unit)
        return self.run(candidates)

    def run(self, candidates: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def counted(self, k: int, rows: torch.Tensor | None) -> None:
        """Book one call that ran the model on `rows` (None: all), k candidates each."""
        self.calls += 1
        self.branches += k
        self.row_sets.append((rows, k))


# --------------------------------------------------------------------------------------------------
# Decide, then commit
# --------------------------------------------------------------------------------------------------
def decide(step: Callable, logits: torch.Tensor, ctx, *, remasks: bool, fillable: torch.Tensor | None = None):
    """The sampler's decision with the driver's guarantees (`samplers.contract`): `(result,
    new_block [R, Lb])`. `ctx` is the step's `StepContext`; `fillable` (a window's candidates)
    keeps the guarantees off masks that are not candidates."""
    result = step(logits, ctx)
    new_block = enforce_step_contract(result, ctx.x, ctx.candidates, remasks=remasks, last=ctx.last_step,
                                      mask_id=ctx.mask_token_id, fillable=fillable)
    return result, new_block


def fill_when_spent(new_block: torch.Tensor, result, mask_id: int, restrict: torch.Tensor | None = None) -> torch.Tensor:
    """The unit's last pass went to a lookahead call whose logits cannot serve a next step: nothing
    is left to run, so the sampler's proposal fills the masks left (only where `restrict` is set)."""
    fill = new_block == mask_id
    if restrict is not None:
        fill &= restrict
    return torch.where(fill, result.proposal, new_block)


# --------------------------------------------------------------------------------------------------
# The tally
# --------------------------------------------------------------------------------------------------
class Tally:
    """What one call reports: forward passes (`nfe`), branch forwards, forward tokens, passes per
    unit, the step trace (kept with `return_trace`, handed to `callback` as it is made) and the
    progress bar over `total` (forward passes, or units when `per_unit`)."""

    def __init__(self, *, total: int, desc: str, unit: str, progress: bool, callback: Callable | None,
                 keep_trace: bool, per_unit: bool = False):
        self.callback, self.keep_trace, self.per_unit = callback, keep_trace, per_unit
        self.nfe = self.branch_forwards = self.forward_tokens = 0
        self.steps_per_block: list[int] = []
        self.schedule_steps_per_block: list[int] = []
        self.trace: list[StepTrace] = []
        self.bar = tqdm(total=total, desc=desc, unit=unit, disable=not progress, leave=False)
        self.started = time.perf_counter()

    @property
    def observed(self) -> bool:
        """Whether step records are wanted at all (a callback, or the trace kept)."""
        return self.callback is not None or self.keep_trace

    def forwards(self, forwards: int, branches: int) -> None:
        """A step's forward passes and branch forwards."""
        self.nfe += forwards
        self.branch_forwards += branches
        if not self.per_unit:
            self.bar.update(forwards)

    def unit_done(self, passes: int, forward_tokens: int, schedule_steps: int | None = None) -> None:
        """A block or canvas is finished: its passes, the query positions its model calls read, and
        the steps of the budget's schedule it took (None: its passes)."""
        self.steps_per_block.append(passes)
        self.schedule_steps_per_block.append(passes if schedule_steps is None else schedule_steps)
        self.forward_tokens += forward_tokens
        if self.per_unit:
            self.bar.update(1)

    def emit(self, records: list[StepTrace]) -> None:
        for record in records:
            if self.callback is not None:
                self.callback(record)
            if self.keep_trace:
                self.trace.append(record)

    def output(self, sequences: torch.Tensor, generated: int,
               nfe_per_sequence: torch.Tensor | None = None) -> GenerateOutput:
        """Phase "finalize": the `GenerateOutput` of the call (`generated` tokens per row for TPF)."""
        self.bar.close()
        return GenerateOutput(
            sequences=sequences, nfe=self.nfe, tpf=generated / max(self.nfe, 1),
            seconds=time.perf_counter() - self.started, forward_tokens=self.forward_tokens,
            steps_per_block=self.steps_per_block, trace=self.trace, branch_forwards=self.branch_forwards,
            nfe_per_sequence=nfe_per_sequence, schedule_steps_per_block=self.schedule_steps_per_block)
