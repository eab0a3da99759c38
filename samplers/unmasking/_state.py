"""Per-row scratch tensors for stateful step policies (Saber's confidence history, dInfer's credits).

The driver passes only the rows still being decoded, with `ctx.rows` mapping them to the caller's
full batch; a sampler keeps its history in full-batch tensors inside `ctx.state` and reads or writes
the rows of this step through these helpers. Tensors are created on first use, because some sizes
(the vocabulary) are only known once logits arrive. No host synchronisation: sizes come from
`init_state` (or from the context when a test builds one by hand).
"""
from __future__ import annotations

import torch

from samplers.base import StepContext


def sizes_state(batch_size: int, seq_len: int) -> dict:
    """What `Sampler.init_state` of a stateful sampler records: the full batch and sequence sizes."""
    return {"batch_size": batch_size, "seq_len": seq_len}


def step_rows(ctx: StepContext) -> torch.Tensor:
    """`[B]` long: full-batch indices of the rows in this step (all rows when the driver gave none)."""
    if ctx.rows is not None:
        return ctx.rows
    return torch.arange(ctx.x.shape[0], device=ctx.x.device)


def row_buffer(ctx: StepContext, key: str, tail: tuple[int, ...], fill: float, dtype=torch.float32) -> torch.Tensor:
    """The full-batch buffer `ctx.state[key]` of shape `[N, *tail]`, created filled with `fill`.

    N is the batch size recorded by `init_state`, or this step's row count for a hand-built context.
    """
    buf = ctx.state.get(key)
    if buf is None or tuple(buf.shape[1:]) != tuple(tail):
        n = ctx.state.get("batch_size", ctx.x.shape[0])
        buf = torch.full((n, *tail), fill, dtype=dtype, device=ctx.x.device)
        ctx.state[key] = buf
    return buf


def seq_len(ctx: StepContext) -> int:
    """Length of the full sequence, as recorded by `init_state` (else the end of this block)."""
    return ctx.state.get("seq_len", ctx.block_start + ctx.x.shape[1])
