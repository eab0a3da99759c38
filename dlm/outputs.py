"""Results of the decoding loops (masked and uniform-noise): dataclasses with their shapes."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class StepTrace:
    """One forward pass of the loop.

    Attributes:
        block: block index. step: step index inside the block. nfe: forward passes so far.
        rows: `[R]` batch rows decoded by this step. committed: `[R]` tokens committed (net of remasking).
        masks_left: `[R]` masks left in the block after the step. full_forward: False for a cached window
        (and for a step that reused the logits a lookahead call returned).
        forwards: forward passes this step cost (0 when it reused lookahead logits, 1 plain, +1 per
        `ctx.forward` call). branch_forwards: per row, the rows of those passes (a lookahead call on
        k candidates counts k).
        tokens: `[R, Lb]` block tokens after the step, kept only when `return_trace=True`.
        accepted: `[R, C]` bool, uniform-noise models in sampler mode, kept with `tokens`: the canvas
        positions accepted after the step (the others hold noise); None elsewhere (a masked model's
        uncommitted positions are its mask id; transformers' own rule re-decides every position at
        every step, and `tokens` is then the argmax canvas).

    When a lookahead call runs on fewer rows than the step's own forward (finished rows leave calls
    under EOS stop), the step gives one record for its own pass (forwards 0 or 1) plus one record per
    call over the rows that call ran (forwards 1, committed 0): summing a row's records gives exactly
    its passes, and all records still sum to `nfe`.
    """

    block: int
    step: int
    nfe: int
    rows: torch.Tensor
    committed: torch.Tensor
    masks_left: torch.Tensor
    full_forward: bool
    forwards: int = 1
    branch_forwards: int = 1
    tokens: torch.Tensor | None = None
    accepted: torch.Tensor | None = None


@dataclass
class GenerateOutput:
    """Result of `generate`.

    Attributes:
        sequences: `[B, P + gen_length]` long, prompt (unchanged) followed by the generation.
        nfe: model forward passes (a batched call counts once; a cached window call counts once;
            a lookahead `ctx.forward` call over k candidates per row counts once).
        branch_forwards: forward passes counted per evaluated branch (per sequence): a plain pass
            adds 1, a lookahead call over k candidates adds k. Equals `nfe` for samplers that do
            not look ahead; the gap is the compute a lookahead sampler spends beyond its NFE.
        tpf: tokens per forward, `gen_length / nfe` (per sequence).
        seconds: wall time of the loop.
        forward_tokens: query positions processed over all calls and rows (compute proxy).
        steps_per_block: forward passes each block actually used.
        trace: per-step records when `return_trace=True`.
        experts: for an ensemble (`sampler="hex"`), a `dlm.ensemble.HexExperts` with every
            expert's output and answer; None otherwise.
        nfe_per_sequence: `[B]` long, forward passes each row took part in (uniform-noise models:
            transformers' DiffusionGemma count of decoder forwards per sequence); None on the
            masked engine, where every row of a call shares `nfe`.
        schedule_steps_per_block: steps of the budget's schedule each block took: its forward
            passes, except for a lossless draft-and-verify sampler, where it is its base's steps
            (equal to the base's own `steps_per_block`); their sum over `nfe` is the steps it
            takes per forward pass.
    """

    sequences: torch.Tensor
    nfe: int
    tpf: float
    seconds: float
    forward_tokens: int
    steps_per_block: list[int]
    trace: list[StepTrace] = field(default_factory=list)
    branch_forwards: int = 0
    experts: Any = None
    nfe_per_sequence: torch.Tensor | None = None
    schedule_steps_per_block: list[int] = field(default_factory=list)


class NonFiniteLogitsError(ValueError):
    """The model produced NaN or infinite logits: decoding from them would return a silent wrong
    answer (argmax of a NaN row is its first column), so the loop stops instead."""


def nonfinite_positions(logits: torch.Tensor) -> torch.Tensor:
    """`[]` long: positions of `logits [..., V]` that cannot be decoded: a NaN or +inf entry, or
    every entry -inf. One reduction and no host sync: the max propagates NaN, is +inf when any
    entry is, and -inf only when all are (single -inf entries are legitimate zero probabilities)."""
    top = logits.amax(dim=-1)
    return (~torch.isfinite(top)).sum()


def raise_nonfinite(count: int, *, block: int, step: int, what: str = "block", dtype: torch.dtype | None = None) -> None:
    """Raise `NonFiniteLogitsError` for `count` undecodable positions at `what` `block`, step `step`.

    `dtype` (the model's parameter dtype, when the caller knows it) picks the likely cause: overflow
    only in float16; in float32 or bfloat16 (float32's range) the weights or the inputs. Unknown: both,
    each under its condition, so that a float32 model is never told it overflowed in float16."""
    where = f"the model returned non-finite logits (NaN or inf) at {count} position(s) in {what} {block}, step {step}; " \
            "decoding them would give wrong tokens."
    if dtype == torch.float16:
        cause = " Likely cause: float16 overflow; run the model in float32 or bfloat16, or check its weights"
    elif dtype is not None:
        name = str(dtype).replace("torch.", "")
        cause = (f" The model runs in {name}, which does not overflow as float16 does: check its weights for NaN or "
                 "inf (a damaged or partly loaded checkpoint) and its inputs")
    else:
        cause = (" Check model.dtype: in float16 the likely cause is overflow (run it in float32 or bfloat16); in "
                 "float32 or bfloat16, NaN or inf in the weights (a damaged or partly loaded checkpoint) or the inputs")
    raise NonFiniteLogitsError(where + cause)
