"""Shared shape of the 'score every masked position, commit the best k' samplers."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from samplers.unmasking._common import commit, top_k_mask
from samplers.base import SamplerConfig, StepContext


@dataclass(frozen=True)
class ScoredConfig(SamplerConfig):
    """Options shared by the top-k-by-score samplers.

    alg_temp: 0 (off) picks the top-k scores; > 0 draws the k positions without replacement
        from softmax(score / alg_temp) (Dream's `alg_temp`), via Gumbel top-k.
    """

    alg_temp: float = 0.0

    def validate(self) -> None:
        if self.alg_temp < 0:
            raise ValueError(f"alg_temp must be >= 0 (0 turns it off), got {self.alg_temp}")


def choose_positions(scores: torch.Tensor, ctx: StepContext, alg_temp: float) -> torch.Tensor:
    """`[B, L]` bool: which candidates to commit, `ctx.num_transfer` per row."""
    if alg_temp > 0:
        u = torch.rand(scores.shape, dtype=torch.float64, device=scores.device, generator=ctx.generator)
        scores = scores.to(torch.float64) / alg_temp - torch.log(-torch.log(u.clamp_min(1e-300)))
    return top_k_mask(scores, ctx.candidates, ctx.num_transfer)


def commit_top_k(scores: torch.Tensor, proposal: torch.Tensor, ctx: StepContext, alg_temp: float) -> torch.Tensor:
    """New `x [B, L]` with the chosen candidates filled from `proposal`."""
    return commit(ctx.x, proposal, choose_positions(scores, ctx, alg_temp))
