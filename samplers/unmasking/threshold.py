"""Confidence-threshold parallel decoding (Wu et al., 2025, Fast-dLLM).

Each step commits every masked position of the block whose confidence is at least `tau`, and
never fewer than the schedule's `num_transfer` positions (the most confident ones), so the block
always finishes inside its share of the forward-pass budget. With a budget of one step per token
the floor is 1, which is Fast-dLLM's "top-1 always" rule; larger budgets then act only as an upper
bound on forward passes.

Factor variant (`factor > 0`): sort confidences c_1 >= c_2 >= ...; accept the largest n with
c_m >= 1 - factor / (m + 1) for every m <= n.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from samplers.unmasking._common import commit, masked_scores, step_stats, top_k_mask
from samplers.base import Sampler, SamplerConfig, StepContext, StepResult
from samplers.registry import register


@dataclass(frozen=True)
class ThresholdConfig(SamplerConfig):
    """tau: confidence threshold in (0, 1]. factor: > 0 switches to the factor rule (tau unused)."""

    tau: float = 0.9
    factor: float = 0.0

    def validate(self) -> None:
        if not 0 < self.tau <= 1:
            raise ValueError(f"tau must be in (0, 1], got {self.tau}")
        if self.factor < 0:
            raise ValueError(f"factor must be >= 0 (0 uses tau), got {self.factor}")


def factor_count(confidence: torch.Tensor, candidates: torch.Tensor, factor: float) -> torch.Tensor:
    """`[B]` long: the largest n such that the n best confidences pass 1 - factor/(m+1), m = 1..n."""
    ranked = masked_scores(confidence, candidates).sort(dim=-1, descending=True).values
    m = torch.arange(1, ranked.shape[-1] + 1, device=ranked.device, dtype=torch.float64)
    passes = ranked >= 1 - factor / (m + 1)
    return passes.to(torch.long).cumprod(dim=-1).sum(dim=-1)


@register
class ThresholdSampler(Sampler):
    name = "threshold"
    Config = ThresholdConfig
    deterministic = True
    adaptive = True

    def step(self, logits: torch.Tensor, ctx: StepContext) -> StepResult:
        s = step_stats(logits, ctx)
        proposal, confidence = s.proposal, s.confidence
        if self.config.factor > 0:
            k = torch.maximum(factor_count(confidence, ctx.candidates, self.config.factor), ctx.num_transfer)
            selected = top_k_mask(confidence, ctx.candidates, k)
        else:
            floor = top_k_mask(confidence, ctx.candidates, ctx.num_transfer)
            selected = floor | (ctx.candidates & (confidence >= self.config.tau))
        return StepResult(commit(ctx.x, proposal, selected), proposal, confidence)
