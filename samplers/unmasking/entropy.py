"""Entropy unmasking: commit the k masked positions with the lowest predictive entropy.

Dream's 'entropy' variant: score c = sum_v p log p (negative entropy; higher = more certain).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from samplers.unmasking._common import negative_entropy, step_stats  # noqa: F401 (negative_entropy re-exported)
from samplers.unmasking._scored import ScoredConfig, commit_top_k
from samplers.base import Sampler, StepContext, StepResult
from samplers.registry import register


@dataclass(frozen=True)
class EntropyConfig(ScoredConfig):
    pass


@register
class EntropySampler(Sampler):
    name = "entropy"
    Config = EntropyConfig
    deterministic = True

    def step(self, logits: torch.Tensor, ctx: StepContext) -> StepResult:
        s = step_stats(logits, ctx, entropy=True)
        return StepResult(commit_top_k(-s.entropy, s.proposal, ctx, self.config.alg_temp), s.proposal, s.confidence)
