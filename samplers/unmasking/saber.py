"""Saber: adaptive acceleration with backtracking remasking (Dong et al., 2025, arXiv:2510.18165).

Each step, over the current block:
1. Adaptive acceleration. The threshold is the running mean of the confidences that the row's
   committed tokens had when they were committed (1.0 before any token is committed). Every masked
   position whose confidence p(x0) exceeds it is committed, and never fewer than
   `max(n, num_transfer)` (the most confident ones). As the context firms up, confidences rise above
   the mean and more tokens pass at once.
2. Backtracking. For tokens committed at earlier steps, delta = c_now - c_prev, the change of the
   position's confidence since the previous step (see `measure`). Up to
   `r = min(max(n // 2, ceil(fix / remask_divisor)), fix - num_transfer)` of them, those with the
   most negative delta, are masked again (`fix`: tokens committed this step). The cap keeps the net
   progress at least `num_transfer >= 1` per step, so the block still ends inside the driver's budget.
   No backtracking on the block's last step, nor on a step that fills the block (Saber then moves on
   to the next block), so no mask is ever left.

The trap (the project's algorithm notes, 1.7): the reference code remasks `r` tokens every step once
two are committed, even when every delta is positive, i.e. it throws away tokens the model has grown
*more* sure of and pays forward passes to redo them. `backtrack` chooses:
- "drop" (default): remask only tokens whose confidence actually fell (delta < -min_drop);
- "always": the reference behaviour (the r smallest deltas, whatever their sign);
- "off": no backtracking (adaptive threshold only; an ablation).
Default "drop" because a token whose confidence rose under the new context is, by Saber's own
argument, not one the new context contradicts. Any fall counts by default (`min_drop` = 0), even
one of 1e-6 that is numerical noise on a token held with p ~ 1; `min_drop` sets a margin.

What "confidence" means at a committed position (`measure`):
- "top1" (default, the reference): the top-1 probability of the model's output there;
- "token": the probability of the token that sits there, which falls when another token overtakes it.
The default is the reference's because masked diffusion LMs are trained with the loss on masked
positions only (LLaDA, the built-in tiny model), so their output at a committed position is not a
trained prediction of that position's own token. On the built-in model, "token" remasks spaces of a
sudoku answer that the model predicts with p ~ 1 while masked and then, once committed, outputs the
end-of-text token there with p ~ 1 (p(space) ~ 0): the same two positions are remasked and
recommitted step after step. With greedy decoding both readings agree at commit time.

Other reading choices where the reference is loose, written down as the project's notes ask:
- the running mean covers the tokens the row holds now (a remasked token leaves it); the reference
  keeps a remasked token's old confidence in the mean.
- only tokens committed at earlier steps may be remasked (the reference may commit and remask the
  same token in one step, a wasted commit).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from samplers.base import Sampler, SamplerConfig, StepContext, StepResult
from samplers.registry import register
from samplers.unmasking._common import commit, gather_prob, propose, top_k_mask
from samplers.unmasking._state import row_buffer, seq_len, sizes_state, step_rows

BACKTRACK_MODES = ("drop", "always", "off")
MEASURES = ("top1", "token")


@dataclass(frozen=True)
class SaberConfig(SamplerConfig):
    """Saber's options.

    n: the least tokens committed per step (Saber's `n`, published 2); half of it, rounded down, is
        the least number of tokens backtracked per step.
    backtrack: "drop" (remask only on an actual confidence drop; default), "always" (the reference's
        unconditional remasking) or "off".
    remask_divisor: tokens backtracked grow as ceil(committed this step / remask_divisor) (published 8).
    min_drop: with backtrack="drop", a token is remasked only if its confidence fell by more than
        this (0 counts any drop).
    measure: the confidence of a committed position: "top1" (the reference; default) or "token"
        (the probability of the committed token).
    """

    n: int = 2
    backtrack: str = "drop"
    remask_divisor: int = 8
    min_drop: float = 0.0
    measure: str = "top1"

    def validate(self) -> None:
        if not isinstance(self.n, int) or self.n < 1:
            raise ValueError(f"n must be an integer >= 1 (tokens committed per step at least), got {self.n!r}")
        if self.backtrack not in BACKTRACK_MODES:
            raise ValueError(f"backtrack must be one of {BACKTRACK_MODES}, got {self.backtrack!r}")
        if not isinstance(self.remask_divisor, int) or self.remask_divisor < 1:
            raise ValueError(f"remask_divisor must be an integer >= 1 (published: 8), got {self.remask_divisor!r}")
        if self.measure not in MEASURES:
            raise ValueError(f"measure must be one of {MEASURES}, got {self.measure!r}")
        if self.min_drop < 0:
            raise ValueError(f"min_drop must be >= 0 (0 counts any drop), got {self.min_drop}")


def running_mean_threshold(commit_conf: torch.Tensor) -> torch.Tensor:
    """`[B, L]` commit-time confidences (NaN where nothing is committed) -> `[B]` their mean, 1.0 if none."""
    held = ~torch.isnan(commit_conf)
    total = torch.where(held, commit_conf, torch.zeros_like(commit_conf)).sum(dim=-1)
    count = held.sum(dim=-1)
    return torch.where(count > 0, total / count.clamp_min(1), torch.ones_like(total))


def backtrack_count(fix: torch.Tensor, num_transfer: torch.Tensor, n: int, divisor: int) -> torch.Tensor:
    """`[B]` tokens to remask: min(max(n // 2, ceil(fix / divisor)), fix - num_transfer), at least 0.

    `fix [B]`: tokens committed this step; `num_transfer [B]`: the schedule's net progress floor.
    """
    wanted = torch.clamp(torch.div(fix + divisor - 1, divisor, rounding_mode="floor"), min=n // 2)
    return torch.minimum(wanted, fix - num_transfer).clamp_min(0)


@register
class SaberSampler(Sampler):
    name = "saber"
    Config = SaberConfig
    remasks = True
    adaptive = True

    def init_state(self, batch_size: int, seq_len: int, device: torch.device) -> dict:
        return sizes_state(batch_size, seq_len)

    def step(self, logits: torch.Tensor, ctx: StepContext) -> StepResult:
        cfg = self.config
        proposal, p_x0, probs = propose(logits, ctx)
        mask_id = ctx.mask_token_id
        row_active = ctx.candidates.any(dim=-1, keepdim=True)
        held = ~ctx.candidates & row_active  # tokens committed at earlier steps of this block
        # Confidence at every position: p(x0) at a mask; at a committed token, per `measure`.
        if cfg.measure == "token":
            token_conf = torch.where(held, gather_prob(probs, torch.where(held, ctx.x, proposal)), p_x0)
        else:
            token_conf = probs.max(dim=-1).values

        rows, lb = step_rows(ctx), ctx.x.shape[1]
        cols = torch.arange(ctx.block_start, ctx.block_start + lb, device=ctx.x.device)
        total = seq_len(ctx)
        prev_buf = row_buffer(ctx, "prev_conf", (total,), float("nan"))
        commit_buf = row_buffer(ctx, "commit_conf", (total,), float("nan"))
        prev = prev_buf[rows][:, cols]
        row_commits = commit_buf[rows]

        # 1. Adaptive acceleration: commit above the running mean, at least max(n, num_transfer).
        threshold = running_mean_threshold(row_commits)
        floor = torch.clamp(ctx.num_transfer, min=cfg.n) * row_active.squeeze(-1)
        chosen = top_k_mask(p_x0, ctx.candidates, floor) | (ctx.candidates & (p_x0 > threshold.unsqueeze(-1)))
        if ctx.last_step:
            chosen = ctx.candidates.clone()
        fix = chosen.sum(dim=-1)

        # 2. Backtracking: remask the committed tokens whose probability dropped most.
        remask = self._backtrack(token_conf - prev, held & ~torch.isnan(prev), fix, chosen, ctx)

        new_x = commit(ctx.x, proposal, chosen)
        new_x = torch.where(remask, torch.full_like(new_x, mask_id), new_x)

        block_commits = row_commits[:, cols]
        block_commits = torch.where(chosen, p_x0, block_commits)
        block_commits = torch.where(remask, torch.full_like(block_commits, float("nan")), block_commits)
        row_commits[:, cols] = block_commits
        commit_buf[rows] = row_commits
        prev_rows = prev_buf[rows]
        prev_rows[:, cols] = token_conf
        prev_buf[rows] = prev_rows
        return StepResult(new_x, proposal, p_x0)

    def _backtrack(self, delta: torch.Tensor, eligible: torch.Tensor, fix: torch.Tensor,
                   chosen: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        """`[B, Lb]` bool: committed tokens to mask again (none on the last step or when the block fills)."""
        cfg = self.config
        if cfg.backtrack == "off" or ctx.last_step:
            return torch.zeros_like(eligible)
        if cfg.backtrack == "drop":
            eligible = eligible & (delta < -cfg.min_drop)
        block_fills = (ctx.candidates & ~chosen).sum(dim=-1) == 0
        r = backtrack_count(fix, ctx.num_transfer, cfg.n, cfg.remask_divisor)
        r = torch.where(block_fills, torch.zeros_like(r), r)
        return top_k_mask(-delta, eligible, r)
