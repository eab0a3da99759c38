"""`ctx.forward` of the masked loop: a lookahead sampler's candidate blocks, one batched call."""
from __future__ import annotations

import torch

from dlm.engine.driver import Lookahead, rows_needing_model_index
from dlm.engine.masked.eos import candidates_needing_model
from dlm.engine.masked.forward import KVCachedForward


class BlockLookahead(Lookahead):
    """`ctx.forward` of one step: logits of k candidate blocks per row, one batched model call each.

    Counted by the driver: each call is one NFE and `k` branch forwards per row; calls stop at the
    block's remaining share of the step budget (a further call raises). With `eos_id` (per-row EOS
    stop on), rows whose output no candidate can change (`candidates_needing_model`) leave the
    call: their logits come back as zeros, and a call that leaves no row runs no model and costs
    nothing (`free_calls`). `row_sets` records, per call that ran, the block rows it ran (None: all)."""

    def __init__(self, forward: KVCachedForward, x_rows: torch.Tensor, start: int, end: int, mask_id: int, allowance: int,
                 eos_id: int | None = None, like: torch.Tensor | None = None):
        super().__init__(x_rows.shape[0], end - start, allowance)
        self.forward, self.x_rows, self.start, self.end = forward, x_rows, start, end
        self.mask_id, self.eos_id, self.like = mask_id, eos_id, like

    def run(self, candidates: torch.Tensor) -> torch.Tensor:
        """candidates: `[R, k, Lb]` long block tokens (checked). Returns aligned logits `[R, k, Lb, V]`."""
        R, Lb = self.x_rows.shape[0], self.end - self.start
        k = candidates.shape[1]
        in_model = None
        if self.eos_id is not None:
            in_model = rows_needing_model_index(candidates_needing_model(candidates, self.eos_id, self.mask_id))
        if in_model is not None and in_model.numel() == 0:
            self.free_calls += 1  # every row is finished: no model call, nothing to count
            out = self.like.new_zeros((R * k, Lb, self.like.shape[-1]))
        else:
            sub = candidates if in_model is None else candidates[in_model]
            x = (self.x_rows if in_model is None else self.x_rows[in_model]).repeat_interleave(k, dim=0)
            x[:, self.start:self.end] = sub.reshape(-1, Lb)
            logits = self.forward.branches(x, k, self.start, self.end, in_model)
            if in_model is None:
                out = logits
            else:
                out = logits.new_zeros((R, k, *logits.shape[1:]))
                out[in_model] = logits.view(in_model.numel(), k, *logits.shape[1:])
            self.counted(k, in_model)
        out[..., self.mask_id] = float("-inf")  # as for the driver's own logits
        return out.reshape(R, k, Lb, -1)
