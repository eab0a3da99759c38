"""Entropy-bounded unmasking for masked diffusion (Ben-Hamu et al., 2025, "EB-sampler").

Sort the block's masked positions by entropy H ascending and accept the largest prefix k with
    sum_{i<=k} H_i - max_{i<=k} H_i <= gamma,
an upper bound on the dependence among tokens decoded together. Never fewer than the schedule's
`num_transfer`, so the block finishes within its budget.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from samplers.unmasking._common import commit, step_stats, top_k_mask
from samplers.base import Sampler, SamplerConfig, StepContext, StepResult
from samplers.registry import register


@dataclass(frozen=True)
class EntropyBoundedConfig(SamplerConfig):
    """gamma: the error budget in nats (0 decodes one token per step beyond the schedule floor)."""

    gamma: float = 0.1

    def validate(self) -> None:
        if self.gamma < 0:
            raise ValueError(f"gamma must be >= 0, got {self.gamma}")


def entropy_bounded_count(entropy: torch.Tensor, candidates: torch.Tensor, gamma: float) -> torch.Tensor:
    """`[B]` long: the accepted prefix length k for entropies `[B, L]` (candidates only)."""
    h = torch.where(candidates, entropy.to(torch.float64), torch.full_like(entropy, float("inf"), dtype=torch.float64))
    h_sorted = h.sort(dim=-1).values
    finite = torch.isfinite(h_sorted)
    cumulative = torch.where(finite, h_sorted, torch.zeros_like(h_sorted)).cumsum(dim=-1)
    # Sorted ascending, so the prefix maximum is the last element of the prefix.
    ok = finite & (cumulative - torch.where(finite, h_sorted, torch.zeros_like(h_sorted)) <= gamma)
    return ok.to(torch.long).cumprod(dim=-1).sum(dim=-1)


@register
class EntropyBoundedSampler(Sampler):
    name = "eb"
    Config = EntropyBoundedConfig
    deterministic = True
    adaptive = True

    def step(self, logits: torch.Tensor, ctx: StepContext) -> StepResult:
        s = step_stats(logits, ctx, entropy=True)
        proposal, confidence, entropy = s.proposal, s.confidence, s.entropy
        k = torch.maximum(entropy_bounded_count(entropy, ctx.candidates, self.config.gamma), ctx.num_transfer)
        selected = top_k_mask(-entropy, ctx.candidates, k)
        return StepResult(commit(ctx.x, proposal, selected), proposal, confidence)
