"""Random-order unmasking: commit k masked positions chosen uniformly at random.

The 'random' remasking of LLaDA (Nie et al., 2025, "Large Language Diffusion Models"). With one
token per step and temperature 1 it samples the model's exact joint distribution when the model's
conditionals are exact, which is what the oracle tests check.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from samplers.unmasking._common import propose
from samplers.unmasking._scored import ScoredConfig, commit_top_k
from samplers.base import Sampler, StepContext, StepResult
from samplers.registry import register


@dataclass(frozen=True)
class RandomConfig(ScoredConfig):
    pass


@register
class RandomSampler(Sampler):
    name = "random"
    Config = RandomConfig

    def step(self, logits: torch.Tensor, ctx: StepContext) -> StepResult:
        proposal, confidence, _ = propose(logits, ctx)
        order = torch.rand(ctx.x.shape, dtype=torch.float64, device=ctx.x.device, generator=ctx.generator)
        return StepResult(commit_top_k(order, proposal, ctx, 0.0), proposal, confidence)
