"""dInfer's EOS stop on the masked loop: which rows (and lookahead candidates) can still change,
and the fill after the first EOS of a finished row."""
from __future__ import annotations

import torch


def rows_needing_model(block_x: torch.Tensor, eos_id: int, mask_id: int) -> torch.Tensor:
    """`[R]` bool: rows whose output can still change (dInfer's EOS stop, applied at every step).

    `block_x` `[R, Lb]` is the current block of rows still decoded (their earlier blocks are fully
    committed and hold no EOS). A row is finished once the block holds an EOS with no mask before
    it: the tokens before that EOS are committed and stay (the sampler does not remask) and
    `stop_at_eos` overwrites everything after it at the block's end, so another forward of that
    row cannot change the output.
    """
    is_mask = (block_x == mask_id).long()
    masks_before = is_mask.cumsum(dim=1) - is_mask  # masks strictly before each position
    return ~((block_x == eos_id) & (masks_before == 0)).any(dim=1)


def candidates_needing_model(candidates: torch.Tensor, eos_id: int, mask_id: int) -> torch.Tensor:
    """`[R]` bool: rows of a lookahead call whose output still depends on the call's logits.

    `candidates` `[R, k, Lb]`. A row does not, when every one of its k candidates is finished (an
    EOS with no mask before it, see `rows_needing_model`) and all k agree up to that EOS: whichever
    candidate the sampler keeps, the row's output is then the same (`stop_at_eos` overwrites what
    follows the EOS). LoPA's branches of a finished anchor are such rows: each fills one mask, and
    the anchor has none before its EOS."""
    R, k, Lb = candidates.shape
    finished = ~rows_needing_model(candidates.reshape(R * k, Lb), eos_id, mask_id).view(R, k).any(dim=1)
    first = candidates[:, 0]
    index = torch.arange(Lb, device=candidates.device)
    eos_at = torch.where(first == eos_id, index, Lb).min(dim=1).values  # [R]
    upto = index.unsqueeze(0) <= eos_at.unsqueeze(1)  # [R, Lb]
    agree = ((candidates == first.unsqueeze(1)) | ~upto.unsqueeze(1)).all(dim=2).all(dim=1)
    return ~(finished & agree)


def stop_at_eos(x: torch.Tensor, rows: torch.Tensor, prompt_length: int, block_end: int, eos_id: int) -> torch.Tensor:
    """Fill everything after the first EOS of finished rows with EOS. Returns `[R]` bool: row finished."""
    generated = x[rows, prompt_length:block_end]
    has_eos = (generated == eos_id).any(dim=1)
    # no `if has_eos.any()`: the fill is a few small tensor ops, a device read would stall the host
    length = x.shape[1] - prompt_length
    first = torch.where(generated == eos_id, torch.arange(generated.shape[1], device=x.device), generated.shape[1]).min(dim=1).values
    after = torch.arange(length, device=x.device).unsqueeze(0) > first.unsqueeze(1)
    tail = x[rows, prompt_length:]
    x[rows, prompt_length:] = torch.where(after & has_eos.unsqueeze(1), torch.full_like(tail, eos_id), tail)
    return has_eos
