"""Small tensor helpers shared by the dLLM step policies.

All run on device without host synchronisation, so a step can be compiled whole.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch

FUSED_MODES = ("auto", "on", "off")

# Vocabulary-wide temporaries (softmax tables, exponential draws, Gumbel noise) are made for at most
# this many bytes of positions at a time: at Gemma's 262,144-token vocabulary one float32 table of a
# 256-token canvas is 268 MB, so a step that made three of them per row would hold four times the
# logits (issue 40). Rows of these operations are independent, so chunking changes no value.
CHUNK_BYTES = 64 * 2**20
# Chunks are a multiple of this many rows: a matrix product of fewer rows may take another BLAS path
# (a matrix-vector kernel for one row) whose rounding differs from the whole product's.
CHUNK_MULTIPLE = 16


def rows_per_chunk(rows: int, vocab: int, itemsize: int = 4, divides: int | None = None) -> int:
    """Rows of a `[rows, vocab]` table to process at a time so that one temporary of `itemsize`-byte
    elements stays within `CHUNK_BYTES`: `rows` itself when the whole table fits, else a multiple of
    `CHUNK_MULTIPLE` (at least that many). With `divides=n`, the chunk also divides `n` (so chunks
    never straddle a canvas of n positions); when no such multiple exists, `n`."""
    fit = CHUNK_BYTES // max(1, vocab * itemsize)
    if fit >= rows:
        return rows
    k = max(CHUNK_MULTIPLE, fit - fit % CHUNK_MULTIPLE)
    if divides is None:
        return k
    while k >= CHUNK_MULTIPLE and divides % k:
        k -= CHUNK_MULTIPLE
    return k if k >= CHUNK_MULTIPLE else divides


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


def negative_entropy(probs: torch.Tensor) -> torch.Tensor:
    """`[B, L, V]` probabilities -> `[B, L]` sum p log p (0 log 0 = 0)."""
    return torch.special.xlogy(probs, probs).sum(dim=-1)


@dataclass
class StepStats:
    """Per-position statistics a scoring sampler needs, all `[B, L]`.

    proposal: long, the token x0. confidence: float32 p(x0). margin: float32 p(top1) - p(top2).
    entropy: float32 predictive entropy in nats. `margin`/`entropy` are None when not requested
    on the softmax path (the fused path always has them).
    """

    proposal: torch.Tensor
    confidence: torch.Tensor
    margin: torch.Tensor | None = None
    entropy: torch.Tensor | None = None


def fused_stats_wanted(logits: torch.Tensor, temperature: float) -> bool:
    """Whether `step_stats` takes the fused path (kernels.decode_stats) for these logits.

    Only greedy steps qualify (a sampled x0 needs the full distribution). The environment variable
    `DLM_FUSED_DECODE` = auto (default) | on | off decides. "auto" keeps the softmax path on every
    device for now: on CPU the vocabulary-chunked reference holds 5.7-9.7x less memory than the
    softmax path in a `confidence` step at a 126k vocabulary but takes 1.9-3.4x its time
    (scripts/bench_kernels.py, two runs), and the Triton kernel has not yet been compiled or timed on
    a GPU: the GPU report's kernels section (docs/gpu.md) measures it against the softmax path, and
    "auto" turns it on for CUDA once that measurement says it pays. "on" opts in today.
    """
    mode = os.environ.get("DLM_FUSED_DECODE", "auto").strip().lower()
    if mode not in FUSED_MODES:
        raise ValueError(f"DLM_FUSED_DECODE must be one of {FUSED_MODES}, got {mode!r}; unset it for 'auto'")
    if temperature != 0 or logits.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        return False
    return mode == "on"


def step_stats(logits: torch.Tensor, ctx, margin: bool = False, entropy: bool = False) -> StepStats:
    """Proposal, its probability and, on request, top-2 margin and entropy for every position.

    The fused path reduces each position in one pass over the vocabulary without materialising
    softmax(logits) `[B, L, V]` (kernels.decode_stats: Triton on GPU, a vocabulary-chunked online
    softmax on CPU); it chooses the same tokens as the softmax path (argmax ties go to the smallest
    id in both). Args: logits `[B, L, V]`. Returns StepStats with `[B, L]` fields.
    """
    if fused_stats_wanted(logits, ctx.temperature):
        from kernels.decode_stats import decode_stats

        s = decode_stats(logits if logits.stride(-1) == 1 else logits.contiguous())
        return StepStats(s.token, s.prob, s.margin, s.entropy)
    lead, V = logits.shape[:-1], logits.shape[-1]
    flat = logits.reshape(-1, V)
    N = flat.shape[0]
    # Gumbel noise is float64: twice the bytes of a float32 table
    k = rows_per_chunk(N, V, itemsize=8 if ctx.temperature else 4)
    if k >= N:
        return _stats_of(logits, ctx, margin, entropy)
    # Positions in chunks: each chunk's softmax (and float64 Gumbel noise, drawn in row order, so a
    # CPU generator gives the same draws as one call) is made and dropped before the next.
    parts = [_stats_of(flat[start:start + k], ctx, margin, entropy) for start in range(0, N, k)]

    def joined(name):
        if getattr(parts[0], name) is None:
            return None
        return torch.cat([getattr(part, name) for part in parts]).view(lead)
    return StepStats(joined("proposal"), joined("confidence"), joined("margin"), joined("entropy"))


def _stats_of(logits: torch.Tensor, ctx, margin: bool, entropy: bool) -> StepStats:
    """`step_stats`' softmax path on one table `[..., V]` (a whole step, or a chunk of positions)."""
    proposal, confidence, probs = propose(logits, ctx)
    stats = StepStats(proposal, confidence)
    if margin:
        top2 = probs.topk(2, dim=-1).values
        stats.margin = top2[..., 0] - top2[..., 1]
    if entropy:
        stats.entropy = -negative_entropy(probs)
    return stats
