"""Row and position operations on a masked model's KV cache (nested tuples/lists of `[B, H, L, D]`
tensors, the windowed-cache contract of `dlm.tiny.TinyDLMModel`): repeat rows for lookahead
candidates, keep the prompt's positions, select rows, hand a block's cache to the next block."""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from dlm.engine.masked.forward import KVCachedForward


def repeat_cache_rows(cache, k: int):
    """Each batch row of a KV cache repeated k times (row-major), as new tensors.

    Handles caches made of nested tuples/lists of `[B, ...]` tensors (the windowed-cache models of
    this project); anything else cannot be shared by lookahead candidates."""
    if isinstance(cache, torch.Tensor):
        return cache.repeat_interleave(k, dim=0)
    if isinstance(cache, (tuple, list)):
        return type(cache)(repeat_cache_rows(c, k) for c in cache)
    raise ValueError(
        f"a lookahead sampler cannot share a {type(cache).__name__} KV cache between its candidates "
        f"(needs nested tuples of tensors); use kv_cache='none' with this model")


def slice_cache(cache, length: int):
    """The first `length` positions of a KV cache of nested tuples/lists of `[B, H, L, D]` tensors
    (the windowed-cache contract of `dlm.tiny.TinyDLMModel`)."""
    if isinstance(cache, torch.Tensor):
        return cache[:, :, :length]
    if isinstance(cache, (tuple, list)):
        return type(cache)(slice_cache(c, length) for c in cache)
    raise ValueError(f"kv_cache='prompt' cannot slice a {type(cache).__name__} cache; use 'prefix' or 'dual'")


def carry_cache(forward: KVCachedForward, rows: torch.Tensor, start: int, next_rows: torch.Tensor):
    """The cache a finished block hands to the next one, or None when it has none.

    `rows` `[R]` are the finished block's batch rows and `next_rows` `[R']` the next block's: rows
    only leave, and a row the cache dropped inside the block had finished, so `next_rows` is a subset
    of the rows the cache holds. Returns `(cache for next_rows, start)`."""
    if forward.cache is None:
        return None
    held = rows if forward.cache_rows is None else rows[forward.cache_rows]
    idx = torch.searchsorted(held, next_rows)
    cache = forward.cache if idx.numel() == held.numel() else index_cache(forward.cache, idx)
    return cache, start


def index_cache(cache, rows: torch.Tensor):
    """Select batch rows of a legacy cache (nested tuples/lists of `[B, ...]` tensors)."""
    if isinstance(cache, torch.Tensor):
        return cache[rows]
    if isinstance(cache, (tuple, list)):
        return type(cache)(index_cache(c, rows) for c in cache)
    raise RuntimeError(f"cannot select rows of a {type(cache).__name__} cache; pass eos_early_stop=False")
