"""Hierarchical decoding (dInfer, Ma et al., 2025, "dInfer: An Efficient Inference Framework for
Diffusion Language Models", arXiv:2510.08666).

Tokens decoded in the same step are sampled independently; neighbours depend on each other most, so
committing two adjacent masks together is the riskiest parallel move. Hierarchical decoding spreads
each step's commits over the block: it splits the block's masks into contiguous runs and, per run,
commits the run's most confident position if its confidence c = p(x0) is above `low` (0.4). On
top of that it commits every masked position with c > `tau` (threshold decoding) and the block's
global top-1, and never fewer than the schedule's `num_transfer` (the most confident), so the block
ends inside the driver's budget.

Ties inside a run go to the leftmost position (dInfer commits every tied position; one per run is
what the rule intends and what makes it deterministic).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from samplers.base import Sampler, SamplerConfig, StepContext, StepResult
from samplers.registry import register
from samplers.unmasking._common import commit, masked_scores, step_stats, top_k_mask


@dataclass(frozen=True)
class HierarchicalConfig(SamplerConfig):
    """tau: commit any mask with c > tau, in (0, 1] (0.9). low: a run's best is committed if c > low,
    in [0, tau] (published 0.4)."""

    tau: float = 0.9
    low: float = 0.4

    def validate(self) -> None:
        if not 0 < self.tau <= 1:
            raise ValueError(f"tau must be in (0, 1], got {self.tau}")
        if not 0 <= self.low <= self.tau:
            raise ValueError(f"low must be in [0, tau={self.tau}] (published: 0.4), got {self.low}")


def run_ids(candidates: torch.Tensor) -> torch.Tensor:
    """`[B, Lb]` bool -> `[B, Lb]` long: index of the contiguous run of candidates each position is in.

    Runs are numbered 0, 1, ... from the left; non-candidates get the spare index Lb.
    """
    before = torch.nn.functional.pad(candidates[:, :-1], (1, 0), value=False)
    starts = candidates & ~before
    ids = starts.long().cumsum(dim=-1) - 1
    return torch.where(candidates, ids, torch.full_like(ids, candidates.shape[-1]))


def best_of_each_run(confidence: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
    """`[B, Lb]` bool: the most confident position of every run of candidates (leftmost on ties)."""
    b, lb = candidates.shape
    ids = run_ids(candidates)
    score = masked_scores(confidence, candidates)
    run_max = torch.full((b, lb + 1), float("-inf"), dtype=score.dtype, device=score.device)
    run_max = run_max.scatter_reduce(1, ids, score, reduce="amax")
    at_max = candidates & (score == run_max.gather(1, ids))
    pos = torch.arange(lb, device=candidates.device).expand(b, lb)
    first = torch.full((b, lb + 1), lb, dtype=torch.long, device=candidates.device)
    first = first.scatter_reduce(1, ids, torch.where(at_max, pos, torch.full_like(pos, lb)), reduce="amin")
    return candidates & (pos == first.gather(1, ids))


@register
class HierarchicalSampler(Sampler):
    name = "hierarchical"
    Config = HierarchicalConfig
    deterministic = True
    adaptive = True

    def step(self, logits: torch.Tensor, ctx: StepContext) -> StepResult:
        cfg = self.config
        s = step_stats(logits, ctx)
        c = s.confidence
        selected = best_of_each_run(c, ctx.candidates) & (c > cfg.low)
        selected = selected | (ctx.candidates & (c > cfg.tau))
        # The global top-1, and the schedule's floor (the top-1 when the budget is ample).
        selected = selected | top_k_mask(c, ctx.candidates, ctx.num_transfer)
        return StepResult(commit(ctx.x, s.proposal, selected), s.proposal, c)
