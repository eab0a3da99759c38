"""Top-prob-margin unmasking: commit the k masked positions where the model is most decided.

Kim et al., 2025, "Train for the Worst, Plan for the Best" (Dream's 'topk_margin'):
score c = p(top1) - p(top2) of the step's distribution.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from samplers.unmasking._common import step_stats
from samplers.unmasking._scored import ScoredConfig, commit_top_k
from samplers.base import Sampler, StepContext, StepResult
from samplers.registry import register


@dataclass(frozen=True)
class MarginConfig(ScoredConfig):
    pass


@register
class MarginSampler(Sampler):
    name = "margin"
    Config = MarginConfig
    deterministic = True

    def step(self, logits: torch.Tensor, ctx: StepContext) -> StepResult:
        s = step_stats(logits, ctx, margin=True)
        return StepResult(commit_top_k(s.margin, s.proposal, ctx, self.config.alg_temp), s.proposal, s.confidence)
