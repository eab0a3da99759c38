"""Low-confidence remasking: commit the k masked positions whose sampled token is most probable.

LLaDA's 'low_confidence' (Nie et al., 2025) and Dream's 'maskgit_plus' (top-prob). Score c = p(x0).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from samplers.unmasking._common import step_stats
from samplers.unmasking._scored import ScoredConfig, commit_top_k
from samplers.base import Sampler, StepContext, StepResult
from samplers.registry import register


@dataclass(frozen=True)
class ConfidenceConfig(ScoredConfig):
    pass


@register
class ConfidenceSampler(Sampler):
    name = "confidence"
    Config = ConfidenceConfig
    deterministic = True

    def step(self, logits: torch.Tensor, ctx: StepContext) -> StepResult:
        s = step_stats(logits, ctx)
        return StepResult(commit_top_k(s.confidence, s.proposal, ctx, self.config.alg_temp), s.proposal, s.confidence)
