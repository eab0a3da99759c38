"""Small tensor helpers shared by the dLLM step policies.

All run on device without host synchronisation, so a step can be compiled whole.
"""
from __future__ import annotations

import torch


def gumbel_max(logits: torch.Tensor, temperature: float, generator: torch.Generator | None) -> torch.Tensor:
    """Draw tokens from softmax(logits / T) by the Gumbel-max trick, in float64.

    Float64 because low-precision Gumbel noise measurably shifts the sampled distribution
    (LLaDA, ALGORITHMS 1.2). `temperature == 0` is argmax.

    Args: logits `[B, L, V]`. Returns: `[B, L]` long.
    """
    if temperature == 0:
        return logits.argmax(dim=-1)
    u = torch.rand(logits.shape, dtype=torch.float64, device=logits.device, generator=generator)
    gumbel = -torch.log(-torch.log(u.clamp_min(1e-300)))
    return (logits.to(torch.float64) / temperature + gumbel).argmax(dim=-1)


def token_probs(logits: torch.Tensor) -> torch.Tensor:
    """Softmax in float32 whatever the model's dtype. `[B, L, V]` -> `[B, L, V]`."""
    return torch.softmax(logits.float(), dim=-1)


def gather_prob(probs: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """`probs [B, L, V]`, `tokens [B, L]` -> probability of each token, `[B, L]`."""
    return probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def masked_scores(scores: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
    """Scores with non-candidates set to -inf, in float64 so ties stay ordered. `[B, L]`."""
    return torch.where(candidates, scores.to(torch.float64), torch.full_like(scores, float("-inf"), dtype=torch.float64))


def top_k_mask(scores: torch.Tensor, candidates: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Select, per row, the `k[b]` candidates with the highest score.

    Args: scores `[B, L]`, candidates `[B, L]` bool, k `[B]` long.
    Returns: `[B, L]` bool, never selecting a non-candidate, at most `k[b]` per row.
    """
    ranked = masked_scores(scores, candidates)
    order = ranked.argsort(dim=-1, descending=True, stable=True)
    rank = torch.empty_like(order)
    rank.scatter_(-1, order, torch.arange(order.shape[-1], device=order.device).expand_as(order))
    return (rank < k.unsqueeze(-1)) & candidates


def commit(x: torch.Tensor, proposal: torch.Tensor, selected: torch.Tensor) -> torch.Tensor:
    """Write `proposal` into `x` at `selected` positions. All `[B, L]`."""
    return torch.where(selected, proposal, x)


def propose(logits: torch.Tensor, ctx) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The common first half of a step: sample x0 and its probability.

    Returns: proposal `[B, L]` long, confidence p(x0) `[B, L]` float32, probs `[B, L, V]` float32.
    """
    proposal = gumbel_max(logits, ctx.temperature, ctx.generator)
    probs = token_probs(logits)
    return proposal, gather_prob(probs, proposal), probs
