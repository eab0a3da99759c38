"""What both families' loops share: live-row index helpers, the lookahead call's checks and the
step contract's enforcement."""
from __future__ import annotations

import torch

from samplers.contract import enforce_step_contract


def _same_rows(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    """Whether two row selections (None: every row) are the same."""
    if a is None or b is None:
        return a is None and b is None
    return a.shape == b.shape and torch.equal(a, b)


def check_lookahead_call(candidates: torch.Tensor, rows: int, block_length: int, left: int, unit: str) -> None:
    """What every driver's `ctx.forward` refuses: candidates not `[rows, k, block_length]` long, or a
    call past the `unit`'s step budget."""
    shape_ok = candidates.dim() == 3 and candidates.shape[0] == rows and candidates.shape[2] == block_length
    if not shape_ok or candidates.dtype != torch.long:
        raise ValueError(f"ctx.forward needs candidates of shape [{rows}, k, {block_length}] (torch.long), got "
                         f"{tuple(candidates.shape)} {candidates.dtype}")
    if left <= 0:
        raise RuntimeError(f"ctx.forward: the {unit}'s step budget is spent; check ctx.forwards_left before calling")


def _live_index(needs: torch.Tensor) -> torch.Tensor | None:
    """Sorted indices of the rows to forward, or None when every row needs the model (no copy)."""
    if bool(needs.all()):
        return None
    return needs.nonzero().squeeze(1)


def _host_index(flags: list, device) -> torch.Tensor | None:
    """`_live_index` from flags already on the host (no device read): None when all are set."""
    if all(flags):
        return None
    return torch.tensor([i for i, on in enumerate(flags) if on], dtype=torch.long, device=device)


def _enforce_contract(result, block_x, candidates, masks_left, remasks: bool, last: bool, mask_id: int,
                      fillable: torch.Tensor | None = None) -> torch.Tensor:
    """The driver's guarantees (`samplers.contract.enforce_step_contract`), `[R, Lb]`; `fillable`
    (the window's candidates) keeps them off masks that are not candidates."""
    return enforce_step_contract(result, block_x, candidates, remasks=remasks, last=last, mask_id=mask_id,
                                 fillable=fillable)
