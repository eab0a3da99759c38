"""`kv_cache="elastic"`: keep cached K/V until a drift test says they are stale (after Elastic-Cache,
Nguyen-Tri et al., 2025, arXiv:2510.14973).

Fast-dLLM's prefix and dual caches refresh on a fixed schedule: a full forward at every block start
(and every `cache_refresh_every` steps). Elastic-Cache refreshes only when attention has drifted. Here:

- the cache holds every position's K/V (the prompt, finished blocks, the masked suffix), and every
  step recomputes the current block against it, as the dual cache does; a block starts by extending the
  cache (recomputing the block just finished and what follows it), as `cache_across_blocks` does, not by
  a full forward;
- the drift test: each of those calls also recomputes the `probe` cached positions just before the
  window (the end of what was finished last, or of the prompt in the first block: the cached positions
  nearest the tokens decoded since they were cached, where a bidirectional model's K/V move most; never
  the prompt of a model whose prompt is blind to the response, whose K/V cannot drift), at no extra
  pass, and compares their fresh
  keys with the cached ones layer by layer. When the smallest cosine similarity (over rows, heads and
  probe positions) of any layer's keys or values falls below `threshold` (0.999 by default: the
  paper's gamma of 0.9 is a similarity of attention weights, and K/V similarities sit far closer to 1,
  see `dlm.decoding_config.DEFAULT_DRIFT_THRESHOLD`), the next step is a
  full forward that refreshes every position; meanwhile the fresh K/V of the window and the probes
  replace the cached ones.

What differs from the paper, and why: its test compares the attention of a few most-attended tokens
under the old and new queries, which needs the attention probabilities from inside every layer (no
fused attention); the K/V of the probe positions come out of the model contract every windowed-cache
model already has (`past_key_values` of the call), and K/V are what attention reads. Its refresh
recomputes from the first drifted layer on, reusing cached hidden states of the layers below; our cache
holds K/V only, so a refresh is a full forward (the layer it would start from is not kept).

Exactness: `threshold` above 1 refreshes at every step (every step a full forward, no test needed),
the uncached engine's tokens; below that it is an approximation of the same kind as the prefix and dual caches, whose
quality and forward tokens are measured against them (docs/benchmarks.md).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DriftTest:
    """threshold: refresh when a layer's smallest key cosine similarity on the probes is below it.
    probe: cached positions recomputed (and tested) before each window."""

    threshold: float = 0.999
    probe: int = 4

    @property
    def always_refresh(self) -> bool:
        """A threshold above 1 marks every cache stale (no cosine similarity exceeds 1): every step
        is a full forward, the uncached engine's computation."""
        return self.threshold > 1

    def probe_start(self, window_start: int, first_allowed: int) -> int:
        """Where a window that starts at `window_start` begins once it takes the probes: at most
        `probe` positions earlier, never before `first_allowed` (0, or the response's first position
        for a prompt blind to the response, which must not be queried against it)."""
        return max(first_allowed, window_start - self.probe)

    def stale(self, cached, fresh, lo: int, hi: int) -> torch.Tensor:
        """0-d bool: whether the keys or values of positions `[lo, hi)` drifted between `cached` and
        `fresh` (tuples over layers of `(K, V)`, each `[R, H, L, Dh]`, the same rows). False when `lo == hi`."""
        if hi <= lo:
            return torch.zeros((), dtype=torch.bool, device=fresh[0][0].device)
        worst = torch.stack([_min_cosine(old[i][:, :, lo:hi], new[i][:, :, lo:hi])
                             for old, new in zip(cached, fresh) for i in (0, 1)])
        return (worst < self.threshold).any()


def _min_cosine(old: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    """0-d: the smallest cosine similarity between matching key vectors of `old` and `new`
    (`[R, H, P, Dh]`), in float32."""
    return torch.nn.functional.cosine_similarity(old.float(), new.float(), dim=-1).min()
