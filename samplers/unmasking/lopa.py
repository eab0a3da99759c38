"""LoPA: lookahead parallel decoding, a search over token-filling orders (Xu et al., 2025).

Paper: "LoPA: Scaling dLLM Inference via Lookahead Parallel Decoding", arXiv:2512.16229.

How many tokens a threshold decoder commits per forward pass depends on the order in which it
fills the block: some orders leave the rest of the block confident (many tokens pass the
threshold next time), others do not. LoPA searches over orders cheaply. One round:

1. anchor = the current block after a normal threshold fill (Fast-dLLM: every mask whose
   confidence is >= tau, never fewer than the schedule's `num_transfer`);
2. k-1 lookahead branches: for each of the k-1 most confident masks still left in the anchor,
   a copy of the anchor with that one extra position filled from the same logits;
3. all k branches (anchor first) run in ONE batched forward (`ctx.forward`, on the block's KV
   cache), counted as one NFE and k branch forwards;
4. each branch is scored by how ready the rest of it is to be filled: the mean confidence of its
   remaining masks, confidence = negative entropy (the released scripts' setting: a = 0, q = 1);
   the best branch (ties go to the anchor) becomes the block, and its logits from step 3 serve the
   next round's threshold fill (`StepResult.next_logits`), so each round costs one forward.

Published setting: D2F's multi-block window (`dlm.generate(window_blocks=..., window_open_at=...)`,
see `dlm.block_window`): the block seen here is then the window's open blocks, the branches' extra
tokens and the readiness score span all of them (only masks the step may fill count). With per-row
EOS stop, a row whose anchor is finished (an EOS with no mask before it) leaves the lookahead call.

Choices here (not fixed by the paper, which runs on D2F-distilled models): the threshold fill uses
this project's `threshold` sampler unchanged, so with `branches=1` LoPA commits exactly what
`threshold` commits with the same number of forward passes (the anchor's own logits come from the
lookahead call instead of the driver's); a branch with no mask left scores 0, the best possible
mean negative entropy; when the driver has no pass to spare (`ctx.forward` is None, the block's
last step) the step is a plain threshold fill.

Shapes: B rows, k branches, Lb block length, V vocabulary.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from samplers.base import Sampler, SamplerConfig, StepContext, StepResult
from samplers.registry import register
from samplers.unmasking._common import masked_scores, negative_entropy, token_probs
from samplers.unmasking.threshold import ThresholdSampler


@dataclass(frozen=True)
class LopaConfig(SamplerConfig):
    """branches: k, the anchor plus k-1 lookahead branches (the paper uses 2-4; 1 is plain
    threshold decoding through the lookahead path). tau: threshold of the fill, in (0, 1].
    branch_min_confidence: a branch's extra token needs at least this confidence, else that branch
    is not tried (it repeats the anchor); 0, the default, tries every one (the paper's rule)."""

    branches: int = 3
    tau: float = 0.9
    branch_min_confidence: float = 0.0

    def validate(self) -> None:
        if not isinstance(self.branches, int) or not 1 <= self.branches <= 16:
            raise ValueError(f"branches must be an integer in [1, 16] (the paper uses 2-4), got {self.branches!r}")
        if not 0 < self.tau <= 1:
            raise ValueError(f"tau must be in (0, 1], got {self.tau}")
        m = self.branch_min_confidence
        if not isinstance(m, (int, float)) or isinstance(m, bool) or not 0 <= m <= 1:
            raise ValueError(f"branch_min_confidence must be in [0, 1] (0 is off: every branch's extra token is "
                             f"tried), got {m!r}")


def lookahead_branches(anchor: torch.Tensor, proposal: torch.Tensor, confidence: torch.Tensor,
                       remaining: torch.Tensor, k: int, min_confidence: float = 0.0) -> torch.Tensor:
    """The anchor plus k-1 copies, copy j with the j-th most confident remaining mask filled.

    Args: anchor, proposal `[B, Lb]` long; confidence `[B, Lb]` float; remaining `[B, Lb]` bool
    (masks left in the anchor); min_confidence: an extra token below it is not tried. Returns
    `[B, k, Lb]` long, branch 0 = anchor. A row with fewer than k-1 remaining masks (at or above
    `min_confidence`) repeats the anchor in its spare branches (they score like it, and ties go to
    the anchor).
    """
    B, Lb = anchor.shape
    branches = anchor.unsqueeze(1).repeat(1, k, 1)
    extra = min(k - 1, Lb)
    if extra == 0:
        return branches
    top = masked_scores(confidence, remaining).topk(extra, dim=-1)
    valid = torch.isfinite(top.values) & (top.values >= min_confidence)  # [B, extra]
    pos = top.indices
    fill = torch.zeros(B, extra, Lb, dtype=torch.bool, device=anchor.device)
    fill.scatter_(2, pos.unsqueeze(-1), valid.unsqueeze(-1))
    branches[:, 1:extra + 1] = torch.where(fill, proposal.unsqueeze(1), branches[:, 1:extra + 1])
    return branches


def readiness(logits: torch.Tensor, branches: torch.Tensor, mask_id: int,
              eligible: torch.Tensor | None = None) -> torch.Tensor:
    """Mean negative entropy over each branch's remaining masks; 0 for a branch with none.

    Args: logits `[B, k, Lb, V]`, branches `[B, k, Lb]`; eligible `[B, Lb]` bool, the positions
    that may be filled (the step's candidates: in a multi-block window, the open blocks' masks),
    None for every mask. Returns `[B, k]` float (<= 0)."""
    negent = negative_entropy(token_probs(logits))
    left = branches == mask_id
    if eligible is not None:
        left = left & eligible.unsqueeze(1)
    total = torch.where(left, negent, torch.zeros_like(negent)).sum(dim=-1)
    return total / left.sum(dim=-1).clamp_min(1)


@register
class LopaSampler(Sampler):
    name = "lopa"
    Config = LopaConfig
    adaptive = True
    looks_ahead = True

    def __init__(self, config: LopaConfig | None = None, **overrides):
        super().__init__(config, **overrides)
        self._fill = ThresholdSampler(tau=self.config.tau)

    def step(self, logits: torch.Tensor, ctx: StepContext) -> StepResult:
        filled = self._fill.step(logits, ctx)
        anchor, proposal, confidence = filled.x, filled.proposal, filled.confidence
        remaining = ctx.candidates & (anchor == ctx.mask_token_id)
        # One host sync: a finished block needs no lookahead pass (this keeps branches=1 equal
        # to `threshold` in forward passes too).
        if ctx.forward is None or not bool(remaining.any()):
            return filled
        branches = lookahead_branches(anchor, proposal, confidence, remaining, self.config.branches,
                                      self.config.branch_min_confidence)
        branch_logits = ctx.forward(branches)  # [B, k, Lb, V], one NFE
        score = readiness(branch_logits, branches, ctx.mask_token_id, ctx.candidates)
        best = score.argmax(dim=1)  # first max: anchor wins ties
        rows = torch.arange(anchor.shape[0], device=anchor.device)
        return StepResult(branches[rows, best], proposal, confidence, next_logits=branch_logits[rows, best])
