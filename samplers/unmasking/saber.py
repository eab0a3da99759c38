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
- "always": the reference's unconditional rule (the r smallest deltas, whatever their sign) inside
  this file's other choices below; NOT the reference's tokens (it differs on 5 of 48 tiny-dlm
  prompts, tests/samplers/unmasking/test_published_modes.py);
- "off": no backtracking (adaptive threshold only; an ablation);
- "published": the reference loop itself, `generate_with_saber` of zhaoyMa/Saber, equal to it token
  for token (greedy, no cache; tested against a transcription of it). Its four differences from
  "always": (a) the previous-step confidence starts at 0, so the first step remasks one of its two
  new tokens, and a step may remask a token it committed in the same step; (b) it backtracks over
  every committed generated token before its block's end, earlier blocks included; (c) its
  threshold is the mean of the commit-time confidences of every token ever committed (a remasked
  token keeps its record until recommitted); (d) it remasks at most `fix - 1`. Because of (b) the
  reference's blocks live inside ONE driver block: run it with `dlm.generate(block_length =
  gen_length)` (the released configs: gen 256, block 256) and give the reference's own block length
  as `block_length` here (0: the whole generation); a multi-block driver raises ValueError. It
  decides row by row with `torch.topk` on the reference's layout (which of equal values `topk`
  returns is part of the tokens), a host sync per row and step: a reproduction mode, not a fast
  path. Where the reference has no budget, the driver has one: with `steps >= gen_length` the
  schedule's quota is 1 and nothing changes; with fewer steps the floor (`n`) and the cap (`fix -
  1`) follow the quota, so the block still ends inside its budget. One quirk is not reproduced,
  unseen on 1.5k calls on tiny-dlm: when fewer than `n` masks are left, the reference's top-n may
  pick a prompt position and then records the model's confidence there in its running mean (the
  sampler has no prompt logits); a pick in the generation (a committed token re-decoded, a later
  block's token committed early) is reproduced.
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

BACKTRACK_MODES = ("drop", "always", "off", "published")
MEASURES = ("top1", "token")


@dataclass(frozen=True)
class SaberConfig(SamplerConfig):
    """Saber's options.

    n: the least tokens committed per step (Saber's `n`, published 2); half of it, rounded down, is
        the least number of tokens backtracked per step.
    backtrack: "drop" (remask only on an actual confidence drop; default), "always" (the reference's
        unconditional remasking, in this file's reading), "off", or "published" (the reference loop,
        token for token; see the module docstring).
    remask_divisor: tokens backtracked grow as ceil(committed this step / remask_divisor) (published 8).
    min_drop: with backtrack="drop", a token is remasked only if its confidence fell by more than
        this (0 counts any drop).
    measure: the confidence of a committed position: "top1" (the reference; default) or "token"
        (the probability of the committed token).
    block_length: with backtrack="published", the reference's block length inside the one driver
        block (0: the whole generation, as the released configs); must divide it.
    """

    n: int = 2
    backtrack: str = "drop"
    remask_divisor: int = 8
    min_drop: float = 0.0
    measure: str = "top1"
    block_length: int = 0

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
        if not isinstance(self.block_length, int) or self.block_length < 0:
            raise ValueError(f"block_length must be an integer >= 0 (0: the driver's block), got {self.block_length!r}")
        if self.backtrack == "published" and (self.measure != "top1" or self.min_drop != 0):
            raise ValueError("backtrack='published' runs the reference's rules (top-1 confidence, any drop): "
                             "drop measure and min_drop, or choose another backtrack mode")
        if self.block_length and self.backtrack != "published":
            raise ValueError(f"block_length={self.block_length} is the reference's block inside one driver block and "
                             f"only applies with backtrack='published'; for other modes set dlm.generate's block_length")


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
        if cfg.backtrack == "published":
            return self._published_step(logits, ctx)
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

    # ------------------------------------------------------------------ backtrack="published"
    def _published_step(self, logits: torch.Tensor, ctx: StepContext) -> StepResult:
        """One step of the reference loop (`generate_with_saber`), row by row; see the module docstring.

        Row by row on purpose: the reference decides each row with `torch.topk` on the whole
        sequence `[P + gen]`, and which of several equal values `torch.topk` returns depends on the
        vector it is given, so the same calls on the same layout are what makes the tokens equal.
        That costs a host sync per row and step; it is a reproduction mode, not the fast path."""
        cfg = self.config
        lb, total = ctx.x.shape[1], seq_len(ctx)
        if ctx.block_start + lb != total:
            raise ValueError(
                "saber backtrack='published' reproduces generate_with_saber, which backtracks into earlier blocks: "
                "run it as one driver block (dlm.generate block_length = gen_length) and give the reference's block "
                "length as sampler_config block_length (saber:backtrack=published:block_length=N)")
        block = cfg.block_length or lb
        if lb % block:
            raise ValueError(f"saber block_length={block} must divide the generation length {lb}")
        proposal, p_x0, _ = propose(logits, ctx)
        rows = step_rows(ctx)
        prev = row_buffer(ctx, "published_prev", (lb,), 0.0)
        record = row_buffer(ctx, "published_record", (lb,), float("-inf"))
        index = row_buffer(ctx, "published_block", (), 0, dtype=torch.long)
        new_x = ctx.x.clone()
        active = ctx.candidates.any(dim=1).tolist()
        quota = ctx.num_transfer.tolist()
        for j, r in enumerate(rows.tolist()):
            if not active[j]:
                continue
            row_prev, row_record = prev[r].clone(), record[r].clone()
            new_x[j], index[r] = self._published_row(new_x[j], proposal[j], p_x0[j], row_prev, row_record,
                                                     int(index[r]), block, ctx.block_start, quota[j], ctx)
            prev[r], record[r] = row_prev, row_record
        return StepResult(new_x, proposal, p_x0)

    def _published_row(self, x: torch.Tensor, x0: torch.Tensor, p: torch.Tensor, prev: torch.Tensor,
                       record: torch.Tensor, block_index: int, block: int, prompt_length: int, quota: int,
                       ctx: StepContext) -> tuple[torch.Tensor, int]:
        """One row `[Lb]`: commit above the running mean (else the top n), then remask the smallest
        deltas. `prev` (p at the previous step, 0 at first) and `record` (p when each position was
        last committed, -inf never) are updated in place. Returns the row and the reference's block."""
        cfg, mask_id, lb = self.config, ctx.mask_token_id, x.shape[0]
        while (block_index + 1) * block < lb and not bool((x[: (block_index + 1) * block] == mask_id).any()):
            block_index += 1  # the reference moves to its next block once everything before its end is committed
        end = (block_index + 1) * block
        p = p.clone()
        p[end:] = float("-inf")
        delta = p - prev
        delta = torch.where(torch.isfinite(delta), delta, torch.full_like(delta, float("inf")))
        prev.copy_(p)
        conf = torch.where(x != mask_id, torch.full_like(p, float("-inf")), p)
        held = record[:end][record[:end] > float("-inf")]
        threshold = held.mean() if held.numel() > 0 else 1.0
        chosen = torch.nonzero(conf > threshold).squeeze(1)
        floor = max(cfg.n, quota)
        fix = max(floor, chosen.numel())
        if chosen.numel() < floor:
            chosen = _topk_in_sequence(conf, prompt_length, floor, float("-inf"), largest=True)
        x[chosen] = x0[chosen]
        record[chosen] = p[chosen]
        is_mask = x == mask_id
        if ctx.last_step or not bool(is_mask[:end].any()):
            return x, block_index  # the block (or the whole generation) is complete: no backtracking
        drop = torch.where(is_mask, torch.full_like(delta, float("inf")), delta)
        drop[end:] = float("inf")
        count = min(max(cfg.n // 2, -(-fix // cfg.remask_divisor)), fix - max(quota, 1))
        if count > 0:
            x[_topk_in_sequence(drop, prompt_length, count, float("inf"), largest=False)] = mask_id
        return x, block_index


def _topk_in_sequence(values: torch.Tensor, prompt_length: int, k: int, prompt_value: float,
                      largest: bool) -> torch.Tensor:
    """`torch.topk` of a row laid out as the reference lays it out (`prompt_length` prompt entries
    holding `prompt_value`, then the generation `values [Lb]`); returns the generation indices
    picked. A pick inside the prompt is dropped. Such picks happen only among equal infinite values
    (fewer candidates than k): a commit there writes the prompt token back (the reference also
    records its confidence in its running mean, not reproduced, see the module docstring) and a
    remask there would mask a prompt token; neither was met in 1.5k calls on tiny-dlm prompts."""
    row = torch.cat([values.new_full((prompt_length,), prompt_value), values])
    picks = torch.topk(row, k=min(k, row.numel()), largest=largest).indices - prompt_length
    return picks[picks >= 0]
