"""Credit decoding (Wang et al., 2025, "CreditDecoding: Accelerating Parallel Decoding in Diffusion
Large Language Models with Trace Credits", arXiv:2510.06133), as dInfer runs it.

A token the model keeps predicting at a masked position, step after step, earns credit; credit is
added to that token's logit, so a consistently predicted token crosses the threshold earlier than
its single-step confidence would let it. Per row and per block a credit tensor `C [Lb, V]` is kept:

    C *= decay                                   (0.8)
    C[i, top1_i] += p_top1_i ** boost            (boost 0.2; masked positions i only)
    fused = logits + alpha * log(1 + C)          (alpha 0.7)

then dInfer's threshold rule runs on `fused`: commit every masked position whose confidence
c = softmax(fused)[x0] is at least `min(max_c - 1e-5, tau)` (so at least the top-1), and never
fewer than the schedule's `num_transfer`, so the block ends inside the driver's budget. top1 is
the model's own argmax (credit tracks what the model predicts, not a sampled token); x0 is drawn
from `fused`. The credit tensor is reset at the start of every block.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from samplers.base import Sampler, SamplerConfig, StepContext, StepResult
from samplers.registry import register
from samplers.unmasking._common import commit, masked_scores, propose, top_k_mask
from samplers.unmasking._state import row_buffer, sizes_state, step_rows


@dataclass(frozen=True)
class CreditConfig(SamplerConfig):
    """dInfer's credit decoder options (published defaults).

    tau: confidence threshold on the credit-fused distribution, in (0, 1].
    decay: factor applied to the credits each step, in [0, 1) (0.8).
    boost: exponent of the top-1 probability added as credit, in (0, 1] (0.2: small probabilities
        still earn sizeable credit).
    alpha: weight of log(1 + credit) added to the logits, >= 0 (0.7; 0 is plain threshold decoding).
    """

    tau: float = 0.9
    decay: float = 0.8
    boost: float = 0.2
    alpha: float = 0.7

    def validate(self) -> None:
        if not 0 < self.tau <= 1:
            raise ValueError(f"tau must be in (0, 1], got {self.tau}")
        if not 0 <= self.decay < 1:
            raise ValueError(f"decay must be in [0, 1) (published: 0.8), got {self.decay}")
        if not 0 < self.boost <= 1:
            raise ValueError(f"boost must be in (0, 1] (published: 0.2), got {self.boost}")
        if self.alpha < 0:
            raise ValueError(f"alpha must be >= 0 (0 turns credit off; published: 0.7), got {self.alpha}")


def update_credit(credit: torch.Tensor, probs: torch.Tensor, candidates: torch.Tensor,
                  decay: float, boost: float) -> torch.Tensor:
    """One step of the credit recursion. credit `[B, Lb, V]`, probs `[B, Lb, V]`, candidates `[B, Lb]`.

    Returns the new credit: decayed everywhere, plus p_top1 ** boost on each masked position's top-1 token.
    """
    top_p, top_id = probs.max(dim=-1)
    gain = top_p.pow(boost) * candidates.to(top_p.dtype)
    return (credit * decay).scatter_add(-1, top_id.unsqueeze(-1), gain.unsqueeze(-1))


def dinfer_threshold(confidence: torch.Tensor, candidates: torch.Tensor, tau: float) -> torch.Tensor:
    """`[B, Lb]` bool: candidates with c >= min(max_c - 1e-5, tau), max over each row's candidates."""
    ranked = masked_scores(confidence, candidates)
    bar = (ranked.max(dim=-1, keepdim=True).values - 1e-5).clamp_max(tau)
    return candidates & (ranked >= bar)


@register
class CreditSampler(Sampler):
    name = "credit"
    Config = CreditConfig
    adaptive = True

    def init_state(self, batch_size: int, seq_len: int, device: torch.device) -> dict:
        return sizes_state(batch_size, seq_len)

    def step(self, logits: torch.Tensor, ctx: StepContext) -> StepResult:
        cfg = self.config
        rows = step_rows(ctx)
        store = row_buffer(ctx, "credit", tuple(logits.shape[1:]), 0.0)
        credit = torch.zeros_like(logits, dtype=torch.float32) if ctx.step == 0 else store[rows]
        probs = torch.softmax(logits.float(), dim=-1)
        credit = update_credit(credit, probs, ctx.candidates, cfg.decay, cfg.boost)
        store[rows] = credit
        fused = logits.float() + cfg.alpha * torch.log1p(credit)
        proposal, confidence, _ = propose(fused, ctx)
        selected = dinfer_threshold(confidence, ctx.candidates, cfg.tau)
        selected = selected | top_k_mask(confidence, ctx.candidates, ctx.num_transfer)
        return StepResult(commit(ctx.x, proposal, selected), proposal, confidence)
