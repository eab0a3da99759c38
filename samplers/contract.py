"""What every driver of a step policy guarantees, whatever the policy returned: written once for the
engine's loops (`dlm`), our diffusers schedulers and our SGLang algorithms.

- `tokens_this_step`: the per-step quota, `ceil(masks_left / steps_left)`, at least 1 where masks remain;
- `enforce_step_contract`: rows without candidates do not change; a policy that does not remask never
  changes a committed token; every step commits at least one token (the most confident proposal);
  the budget's last step fills every remaining mask.
"""
from __future__ import annotations

import torch

from samplers.base import StepResult


def tokens_this_step(masks_left: torch.Tensor, steps_left_in_block: int) -> torch.Tensor:
    """`[B]` tokens to commit now: ceil(masks_left / steps_left), at least 1 where masks remain.

    Spreads n masks over S steps as n//S with the first n%S steps one larger (LLaDA's
    `get_num_transfer_tokens`), and stays correct when a sampler commits more or remasks.
    """
    k = torch.div(masks_left + steps_left_in_block - 1, steps_left_in_block, rounding_mode="floor")
    return torch.where(masks_left > 0, k.clamp_min(1), torch.zeros_like(k))


def enforce_step_contract(result: StepResult, x: torch.Tensor, candidates: torch.Tensor, *, remasks: bool,
                          last: bool, mask_id: int, fillable: torch.Tensor | None = None) -> torch.Tensor:
    """The block after the step, `[R, Lb]` long, with the guarantees above applied to `result`.

    x: `[R, Lb]` the block before the step; candidates: `[R, Lb]` bool, its masked positions.
    fillable: `[R, Lb]` bool, the positions the guarantees may fill (None: any mask of the block; SGLang
    passes the candidates, since a prompt token in its block may be the mask id itself and must stay).
    Computed without a host sync: for rows that progressed it is a no-op.
    """
    new = result.x
    if new.shape != x.shape:
        raise RuntimeError(f"sampler returned x of shape {tuple(new.shape)}, expected {tuple(x.shape)}")
    masks_left = candidates.sum(dim=1)
    row_active = (masks_left > 0).unsqueeze(1)
    new = torch.where(row_active, new, x)
    if not remasks:
        new = torch.where(candidates, new, x)
    # A remasking sampler's stall may sit on a position it just masked again, so any mask counts.
    still = new == mask_id if fillable is None else (new == mask_id) & fillable
    stalled = row_active.squeeze(1) & (still.sum(dim=1) >= masks_left)
    score = torch.where(still, result.confidence.double(), torch.full_like(result.confidence, -1.0, dtype=torch.float64))
    best = torch.zeros_like(still).scatter_(1, score.argmax(dim=1, keepdim=True), True) & still
    new = torch.where(best & stalled.unsqueeze(1), result.proposal, new)
    if last:
        left = new == mask_id if fillable is None else (new == mask_id) & fillable
        new = torch.where(left, result.proposal, new)
    return new
