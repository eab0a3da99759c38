"""Position-aware confidence: commit the k masked positions with the best confidence discounted by
their distance from the block's start.

The position-weighting part of PC-Sampler (Huang et al., 2025, "PC-Sampler: Position-Aware
Calibration of Decoding Bias in Masked Diffusion Models", arXiv:2508.13021): the score of position
j of the block (0-based) is ``p(x0_j) * exp(-decay * j)``, ranked as ``log p - decay * j``. PC-Sampler
also calibrates the confidence by a token-frequency prior; that part is not implemented here.

Why: plain confidence ordering commits the easy tokens first wherever they are (layout symbols,
padding), and on tasks where later tokens are computed from earlier ones (worked arithmetic steps) it
commits results before their operands. ``decay = 0`` is exactly ``confidence``; a large decay is
left to right inside each block.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from samplers.unmasking._common import step_stats
from samplers.unmasking._scored import ScoredConfig, commit_top_k
from samplers.base import Sampler, StepContext, StepResult
from samplers.registry import register


@dataclass(frozen=True)
class PositionAwareConfig(ScoredConfig):
    """decay: log-confidence discount per position from the block's start (>= 0; 0 = confidence)."""

    decay: float = 0.1

    def validate(self) -> None:
        super().validate()
        if not (math.isfinite(self.decay) and self.decay >= 0):
            raise ValueError(f"decay must be a finite number >= 0 (0 is plain confidence), got {self.decay}")


@register
class PositionAwareSampler(Sampler):
    name = "position"
    Config = PositionAwareConfig
    deterministic = True

    def step(self, logits: torch.Tensor, ctx: StepContext) -> StepResult:
        s = step_stats(logits, ctx)
        offset = torch.arange(s.confidence.shape[-1], device=s.confidence.device, dtype=torch.float32)
        score = s.confidence.float().clamp_min(1e-30).log() - self.config.decay * offset
        return StepResult(commit_top_k(score, s.proposal, ctx, self.config.alg_temp), s.proposal, s.confidence)
