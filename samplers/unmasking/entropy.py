"""Entropy unmasking: commit the k masked positions with the lowest predictive entropy.

Dream's 'entropy' variant: score c = sum_v p log p (negative entropy; higher = more certain).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from samplers.unmasking._common import propose
from samplers.unmasking._scored import ScoredConfig, commit_top_k
from samplers.base import Sampler, StepContext, StepResult
from samplers.registry import register


def negative_entropy(probs: torch.Tensor) -> torch.Tensor:
    """`[B, L, V]` probabilities -> `[B, L]` sum p log p (0 log 0 = 0)."""
    return torch.special.xlogy(probs, probs).sum(dim=-1)


@dataclass(frozen=True)
class EntropyConfig(ScoredConfig):
    pass


@register
class EntropySampler(Sampler):
    name = "entropy"
    Config = EntropyConfig

    def step(self, logits: torch.Tensor, ctx: StepContext) -> StepResult:
        proposal, confidence, probs = propose(logits, ctx)
        score = negative_entropy(probs)
        return StepResult(commit_top_k(score, proposal, ctx, self.config.alg_temp), proposal, confidence)
