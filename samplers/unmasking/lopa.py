"""LoPA: lookahead parallel decoding, a search over token-filling orders (Xu et al., 2025).

Paper: "LoPA: Scaling dLLM Inference via Lookahead Parallel Decoding", arXiv:2512.16229.

How many tokens a threshold decoder commits per forward pass depends on the order in which it
fills the block: some orders leave the rest of the block confident (many tokens pass the
threshold next time), others do not. LoPA searches over orders cheaply. One round:

1. anchor = the current block after a normal threshold fill (Fast-dLLM: every mask whose
   confidence is >= tau, never fewer than the schedule's `num_transfer`);
2. k-1 lookahead branches: for each of the k-1 best masks still left in the anchor (ranked by
   `rank`: p(x0), the fill's confidence, by default), a copy of the anchor with that one extra
   position filled from the same logits;
3. all k branches (anchor first) run in ONE batched forward (`ctx.forward`, on the block's KV
   cache), counted as one NFE and k branch forwards;
4. each branch is scored by how ready the rest of it is to be filled: the mean confidence of its
   remaining masks, confidence = negative entropy (the released scripts' setting: a = 0, q = 1);
   the best branch (ties go to the anchor) becomes the block, and its logits from step 3 serve the
   next round's threshold fill (`StepResult.next_logits`), so each round costs one forward.

`branches` = k counts the candidates INCLUDING the anchor: the released scripts' branching factor
2-4 spawns 2-4 branches beside the anchor, i.e. branches 3-5 here.

Published setting: D2F's multi-block window (`dlm.generate(window_blocks=..., window_open_at=...)`,
see `dlm.engine.masked.window`): the block seen here is then the window's open blocks, the branches' extra
tokens and the readiness score span all of them (only masks the step may fill count). With per-row
EOS stop, a row whose anchor is finished (an EOS with no mask before it) leaves the lookahead call.

`published=True` runs the released Dream configuration (zhijie-group/LoPA, scale_dream_d2f:
sampling_strategy neg_entropy, selection_conf_alpha 0, branch_topp 1, the base branch competing),
equal to it token for token and in forward passes (greedy, no cache; tested against a
transcription, tests/samplers/unmasking/test_published_modes.py). Where it departs from the
default: (a) confidence everywhere is the scripts' sum p log(p + 1e-10) of the tempered softmax,
which also ranks the branch positions; (b) the fill commits every mask with p(x0) > tau (strict,
(d)) and, only when none passes, the one mask of highest negative entropy (the driver's quota, 1
whenever `steps >= gen_length`, is honoured when larger); (c) a branch that completes its block is
scored on the next block's masks and, if it wins, its logits start that block: this needs the
next block in view, i.e. `window_blocks=2, window_open_at=1` for one block at a time (without a
window a completing branch wins outright, as one completing the generation does); a branch with
nothing left in view wins without being run (the reference returns it unverified); ties go to the
lookahead branches in order, the anchor last. The D2F window's per-block "must progress" rule
(decoded_token_threshold) is not reproduced: here only the head block's quota forces progress.

Choices here (not fixed by the paper, which runs on D2F-distilled models): the default fill uses
this project's `threshold` sampler unchanged, so with `branches=1` LoPA commits exactly what
`threshold` commits with the same number of forward passes (the anchor's own logits come from the
lookahead call instead of the driver's); a branch with no mask left scores 0, the best possible
mean negative entropy; when the driver has no pass to spare (`ctx.forward` is None, the block's
last step) the step is a plain threshold fill. The default ranks branch positions by p(x0), the
fill's confidence, not by the negative entropy that scores the branches (the released scripts'
choice): ranking by negative entropy was measured worse, 1-3 points lower on each of three
96-prompt tiny-dlm runs at the same forwards and one forward more on the keyed oracle at lower
quality (docs/dlm.md, "Seed samplers as their authors run them").

Shapes: B rows, k branches, Lb block length, V vocabulary.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from samplers.base import Sampler, SamplerConfig, StepContext, StepResult
from samplers.registry import register
from samplers.unmasking._common import (commit, gather_prob, gumbel_max, masked_scores, negative_entropy,
                                        token_probs, top_k_mask)
from samplers.unmasking.threshold import ThresholdSampler


RANKS = ("neg_entropy", "probability")
NEG_ENTROPY_EPS = 1e-10  # the released scripts' confidence: sum p log(p + 1e-10)


@dataclass(frozen=True)
class LopaConfig(SamplerConfig):
    """branches: k, the candidates scored per round INCLUDING the anchor (the anchor plus k-1
    lookahead branches; the released scripts' `branching_factor` 2-4 spawns that many branches
    beside the anchor, i.e. branches 3-5 here; 1 is plain threshold decoding through the lookahead
    path). tau: threshold of the fill, in (0, 1]. rank: the confidence that picks the masks a
    lookahead branch fills, "probability" (p(x0), the fill's) or "neg_entropy" (the score's own, as
    the released Dream scripts); None, the default, is "probability" in the default mode (measured
    better on tiny-dlm and the keyed oracle, docs/dlm.md "Seed samplers as their authors run
    them") and "neg_entropy" when published.
    branch_min_confidence: a branch's extra token needs at least this p(x0), else that branch is not
    tried (it repeats the anchor); 0, the default, tries every one (the paper's rule). published:
    run the released Dream configuration instead (module docstring); it fixes the rank and the
    fill, so rank may only be "neg_entropy" and branch_min_confidence 0."""

    branches: int = 3
    tau: float = 0.9
    branch_min_confidence: float = 0.0
    rank: str | None = None
    published: bool = False

    def validate(self) -> None:
        if not isinstance(self.branches, int) or not 1 <= self.branches <= 16:
            raise ValueError(f"branches must be an integer in [1, 16] (candidates per round including the anchor; "
                             f"the released scripts' branching factor 2-4 is branches 3-5), got {self.branches!r}")
        if not 0 < self.tau <= 1:
            raise ValueError(f"tau must be in (0, 1], got {self.tau}")
        m = self.branch_min_confidence
        if not isinstance(m, (int, float)) or isinstance(m, bool) or not 0 <= m <= 1:
            raise ValueError(f"branch_min_confidence must be in [0, 1] (0 is off: every branch's extra token is "
                             f"tried), got {m!r}")
        if self.rank is not None and self.rank not in RANKS:
            raise ValueError(f"rank must be one of {RANKS} (or None: the mode's own), got {self.rank!r}")
        if not isinstance(self.published, bool):
            raise ValueError(f"published must be True or False, got {self.published!r}")
        if self.published and (self.rank not in (None, "neg_entropy") or m != 0):
            raise ValueError("published=True runs the released configuration, which ranks by negative entropy and "
                             "tries every branch: drop rank and branch_min_confidence, or set published=False")


def lookahead_branches(anchor: torch.Tensor, proposal: torch.Tensor, rank_score: torch.Tensor,
                       remaining: torch.Tensor, k: int, min_confidence: float = 0.0,
                       confidence: torch.Tensor | None = None) -> torch.Tensor:
    """The anchor plus k-1 copies, copy j with the j-th best remaining mask (by `rank_score`) filled.

    Args: anchor, proposal `[B, Lb]` long; rank_score `[B, Lb]` float (higher first; equal scores
    go to the lower position, as a stable sort of the positions); remaining `[B, Lb]` bool (masks
    left in the anchor); min_confidence: an extra token whose `confidence` (`[B, Lb]`, p(x0);
    default `rank_score`) is below it is not tried. Returns `[B, k, Lb]` long, branch 0 = anchor. A
    row with fewer than k-1 remaining masks (at or above `min_confidence`) repeats the anchor in its
    spare branches (they score like it).
    """
    B, Lb = anchor.shape
    branches = anchor.unsqueeze(1).repeat(1, k, 1)
    extra = min(k - 1, Lb)
    if extra == 0:
        return branches
    ranked = masked_scores(rank_score, remaining)
    pos = ranked.argsort(dim=-1, descending=True, stable=True)[:, :extra]  # [B, extra]
    valid = torch.isfinite(ranked.gather(1, pos))
    if min_confidence > 0:
        gate = rank_score if confidence is None else confidence
        valid &= gate.gather(1, pos) >= min_confidence
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
    return _mean_over(negent, left)


def _mean_over(values: torch.Tensor, where: torch.Tensor) -> torch.Tensor:
    """`[B, k, Lb]` values averaged over `where` per branch, `[B, k]` (0 where nothing is selected)."""
    total = torch.where(where, values, torch.zeros_like(values)).sum(dim=-1)
    return total / where.sum(dim=-1).clamp_min(1)


def dream_neg_entropy(logits: torch.Tensor, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The released scripts' confidence: `(sum p log(p + 1e-10), p)` of softmax(logits / T) (T = 0:
    untempered), float32. logits `[..., V]` -> `([...], [..., V])`."""
    scaled = logits.float() / temperature if temperature > 0 else logits.float()
    probs = torch.softmax(scaled, dim=-1)
    return (probs * torch.log(probs + NEG_ENTROPY_EPS)).sum(dim=-1), probs


def published_readiness(logits: torch.Tensor, branches: torch.Tensor, mask_id: int, eligible: torch.Tensor,
                        temperature: float) -> torch.Tensor:
    """The released scripts' branch score, `[B, k]`: the mean `dream_neg_entropy` of the branch's
    masks the step may fill (`eligible [B, Lb]`); for a branch with none left, the mean over its
    other masks in view (the next block, which the reference adds to a branch that completes its
    block; in view with a multi-block window); +inf for a branch with no mask in view at all (the
    reference returns a branch that completes the generation)."""
    negent, _ = dream_neg_entropy(logits, temperature)
    is_mask = branches == mask_id
    now = is_mask & eligible.unsqueeze(1)
    later = is_mask & ~eligible.unsqueeze(1)
    has_now, has_later = now.any(dim=-1), later.any(dim=-1)
    score = torch.where(has_now, _mean_over(negent, now), _mean_over(negent, later))
    return torch.where(has_now | has_later, score, torch.full_like(score, float("inf")))


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
        if self.config.published:
            return self._published_step(logits, ctx)
        filled = self._fill.step(logits, ctx)
        anchor, proposal, confidence = filled.x, filled.proposal, filled.confidence
        remaining = ctx.candidates & (anchor == ctx.mask_token_id)
        # One host sync: a finished block needs no lookahead pass (this keeps branches=1 equal
        # to `threshold` in forward passes too).
        if ctx.forward is None or not bool(remaining.any()):
            return filled
        rank = negative_entropy(token_probs(logits)) if self.config.rank == "neg_entropy" else confidence
        branches = lookahead_branches(anchor, proposal, rank, remaining, self.config.branches,
                                      self.config.branch_min_confidence, confidence)
        branch_logits = ctx.forward(branches)  # [B, k, Lb, V], one NFE
        score = readiness(branch_logits, branches, ctx.mask_token_id, ctx.candidates)
        best = score.argmax(dim=1)  # first max: anchor wins ties
        rows = torch.arange(anchor.shape[0], device=anchor.device)
        return StepResult(branches[rows, best], proposal, confidence, next_logits=branch_logits[rows, best])

    def _published_step(self, logits: torch.Tensor, ctx: StepContext) -> StepResult:
        """The released Dream configuration (module docstring, "published")."""
        mask_id, T = ctx.mask_token_id, ctx.temperature
        negent, probs = dream_neg_entropy(logits, T)
        proposal = gumbel_max(logits, T, ctx.generator)
        top = gather_prob(probs, proposal)
        passing = ctx.candidates & (top > self.config.tau)  # strict, as the reference
        # top-1 by negative entropy only when nothing passes (the schedule's quota, 1 whenever the
        # budget is at least one pass per token, is honoured when it asks for more)
        quota = ctx.num_transfer
        forced_k = torch.where(quota > 1, quota, quota * (~passing.any(dim=1)).long())
        chosen = passing | top_k_mask(negent, ctx.candidates, forced_k)
        anchor = commit(ctx.x, proposal, chosen)
        remaining = ctx.candidates & (anchor == mask_id)
        if ctx.forward is None or not bool(remaining.any()):
            return StepResult(anchor, proposal, top)
        k = self.config.branches
        branches = lookahead_branches(anchor, proposal, negent, remaining, k)
        rows = torch.arange(anchor.shape[0], device=anchor.device)
        done = ~(branches == mask_id).any(dim=-1)  # [B, k]: nothing left in view
        if bool(done.any(dim=1).all()):
            # every row has a branch that completes the generation: the reference returns such a
            # branch without running it (first in its order: lookahead branches, then the anchor)
            return StepResult(branches[rows, done.long().argmax(dim=1)], proposal, top)
        branch_logits = ctx.forward(branches)
        score = published_readiness(branch_logits, branches, mask_id, ctx.candidates, T)
        # ties: the reference scores the lookahead branches in creation order and the anchor last
        order = torch.tensor(list(range(1, k)) + [0], device=score.device)
        best = order[score[:, order].argmax(dim=1)]
        return StepResult(branches[rows, best], proposal, top, next_logits=branch_logits[rows, best])
