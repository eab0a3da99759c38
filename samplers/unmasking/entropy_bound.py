"""The DiffusionGemma decoding rule: entropy-bound acceptance with renoising and adaptive stopping.

Uniform-noise block diffusion (Austin et al. 2021, D3PM; Schiff et al. 2024, UDLM; Sahoo et al.
2025, "The Diffusion Duality") decodes a canvas that always holds tokens. Google's DiffusionGemma
(transformers' `DiffusionGemmaForBlockDiffusion.generate`) runs, per step:

1. logits of the whole canvas, divided by a linear temperature `t_max -> t_min` over the
   `N` steps (at the step with `n` steps remaining, `t = t_min + (t_max - t_min) * n / N`);
2. one token drawn per position from `softmax(logits / t)`;
3. acceptance by the entropy bound of the EB-sampler (Ben-Hamu et al. 2025, arXiv 2505.24857):
   sort positions by entropy `H` ascending and accept the longest prefix with
   `sum_{i<=k} H_i - max_{i<=k} H_i <= entropy_bound`;
4. every position not accepted gets a fresh uniformly random token (renoise);
5. a row stops when its argmax canvas has been the same for `stability_threshold` steps and its
   mean entropy is below `confidence_threshold`; the canvas's output is its argmax.

This file holds the rule once, in pure torch, for every place that runs it: the engine's exact
reproduction of transformers' generate (`dlm.engine.uniform`, global torch RNG), the engine's
sampler mode (`sampler="entropy_bound"`, a `torch.Generator`), and the masked engine (commit the
accepted masked positions; the masked `eb` sampler is the same bound without the temperature
schedule). Bit-exactness with transformers matters here: acceptance compares a float sum against
the bound, so the entropy is computed with the same operations as `torch.distributions.Categorical`
and the temperature with the same int32/float32 tensor arithmetic as transformers' processor.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from samplers.base import Sampler, SamplerConfig, StepContext, StepResult
from samplers.registry import register
from samplers.unmasking._common import commit, gather_prob, rows_per_chunk


@dataclass(frozen=True)
class EntropyBoundConfig(SamplerConfig):
    """Defaults are transformers' `DiffusionGemmaGenerationConfig` defaults (the keyword names are
    diffusers' `EntropyBoundScheduler` and transformers' config names).

    entropy_bound: the EB bound in nats (> 0). t_max / t_min: temperature at the first / last step.
    stability_threshold: steps the argmax canvas must stay the same before a row may stop (0: no
    stability condition). confidence_threshold: mean-entropy bound for stopping; None turns adaptive
    stopping off (the canvas runs its whole budget).
    """

    entropy_bound: float = 0.1
    t_max: float = 0.8
    t_min: float = 0.4
    stability_threshold: int = 1
    confidence_threshold: float | None = 0.005

    def validate(self) -> None:
        if not isinstance(self.entropy_bound, (int, float)) or self.entropy_bound <= 0:
            raise ValueError(f"entropy_bound must be a number > 0, got {self.entropy_bound!r}")
        if self.t_min < 0 or self.t_max <= self.t_min:
            raise ValueError(f"need 0 <= t_min < t_max, got t_min={self.t_min}, t_max={self.t_max}")
        if not isinstance(self.stability_threshold, int) or self.stability_threshold < 0:
            raise ValueError(f"stability_threshold must be an integer >= 0, got {self.stability_threshold!r}")
        if self.confidence_threshold is not None and self.confidence_threshold <= 0:
            raise ValueError(f"confidence_threshold must be > 0 (or None to turn adaptive stopping off), "
                             f"got {self.confidence_threshold}")


def linear_temperature(steps_remaining: int, total_steps: int, t_min: float, t_max: float,
                       device: torch.device | None = None) -> torch.Tensor:
    """0-dim float32 temperature at the step with `steps_remaining` steps left (N..1).

    Computed as transformers does it (an int32 step tensor divided by the Python int `N`, so the
    arithmetic runs in float32): a float64 computation can differ in the last bit, and that can
    flip an acceptance decision downstream."""
    step = torch.tensor(steps_remaining, dtype=torch.int32, device=device)
    return t_min + ((t_max - t_min) * (step / total_steps))


def categorical_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of `softmax(logits)` along the last axis, `[..., V] -> [...]`, float as the input.

    The same operations as `torch.distributions.Categorical(logits=...).entropy()` (normalise by
    logsumexp, clamp at the dtype's minimum, sum p log p), so the result is bit-identical to what
    transformers' sampler and stopping criterion compute, at one pass less: they compute it twice."""
    normalized = logits - logits.logsumexp(dim=-1, keepdim=True)
    probs = torch.softmax(normalized, dim=-1)
    # In place on our own temporaries: the same elementwise operations (same bits), two fewer
    # vocabulary-sized tensors alive at the peak.
    p_log_p = normalized.clamp_(min=torch.finfo(normalized.dtype).min).mul_(probs)
    del probs
    return -p_log_p.sum(-1)


def entropy_bound_accept(entropy: torch.Tensor, bound: float, candidates: torch.Tensor | None = None) -> torch.Tensor:
    """`[B, C]` bool: the positions the entropy bound accepts.

    Sort ascending; accept position i of the sorted order when the sum of the entropies before it
    (the cumulative sum minus its own, i.e. minus the prefix maximum) is <= `bound`. The lowest
    entropy is always accepted. With `candidates` (masked mode), only those compete: the others
    get +inf entropy and are never accepted.
    """
    if candidates is not None:
        entropy = torch.where(candidates, entropy, torch.full_like(entropy, float("inf")))
    sorted_entropy, order = torch.sort(entropy, dim=-1, descending=False)
    cumulative = torch.cumsum(sorted_entropy, dim=-1)
    accepted_sorted = cumulative - sorted_entropy <= bound
    accepted = torch.scatter(torch.zeros_like(accepted_sorted), -1, order, accepted_sorted)
    return accepted if candidates is None else accepted & candidates


def exponential_race(probs: torch.Tensor, generator: torch.Generator | None = None,
                     rows: torch.Tensor | None = None, total_rows: int | None = None) -> torch.Tensor:
    """One draw per row of `probs [R, V]` (float32), exactly as `torch.multinomial(p, 1)` draws it.

    torch's single-sample multinomial is an exponential race: `q ~ Exp(1)` of the shape of the
    whole probability table, then `argmax(p / q)`. Drawing `q` for `total_rows` rows and using only
    the `rows` that are still denoising keeps the random stream identical to a call over every row
    (the amount of randomness does not depend on the probabilities), while the division and argmax
    run on the live rows only. Returns `[R]` long.
    """
    vocab = probs.shape[-1]
    shape = (total_rows if total_rows is not None else probs.shape[0], vocab)
    q = torch.empty(shape, dtype=probs.dtype, device=probs.device).exponential_(1, generator=generator)
    if rows is not None:
        q = q[rows]
    return torch.argmax(torch.div(probs, q, out=q), dim=-1)  # torch's own `div_out(q, p, q)`: no third table


def stream_invariant(device: torch.device) -> bool:
    """Whether drawing a table of exponentials in consecutive row chunks gives the numbers one call
    over the whole table gives (tested in tests/samplers/unmasking/test_entropy_bound_chunks.py).
    True for CPU generators (sequential streams); not for CUDA's Philox, whose per-call offsets depend
    on the launch shape, so there the table is drawn in one call, as transformers draws it."""
    return torch.device(device).type == "cpu"


def chunk_race(chunk: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """The exponential race's draw for one chunk of positions: `chunk [k, V]` tempered logits,
    `q [k, V]` float32 exponentials (overwritten). Returns `[k]` long."""
    probs = torch.softmax(chunk, dim=-1, dtype=torch.float32)
    return torch.argmax(torch.div(probs, q, out=q), dim=-1)


def chunk_entropy_argmax(chunk: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Entropy (`categorical_entropy`) and argmax of one chunk of positions `[k, V]`: two `[k]`."""
    return categorical_entropy(chunk), chunk.argmax(dim=-1)


def race_entropy_argmax(scaled: torch.Tensor, canvas_length: int, segments: list[tuple[int, int | None]],
                        generator: torch.Generator | None = None,
                        statistics: tuple | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per position of `scaled [N, V]` (float32 tempered logits, N = live rows x canvas_length): a
    token drawn from softmax (the exponential race of `exponential_race`), the entropy
    (`categorical_entropy`) and the argmax, without a vocabulary-sized table per position.

    The random stream is the one of `exponential_race(probs, rows=..., total_rows=...)`: one
    exponential per vocabulary entry of every row of the stream, in order. `segments` lists the
    stream's runs in order as `(canvases, first)`: `canvases` canvases of the stream whose positions
    are `scaled`'s rows from `first * canvas_length` on, or `first=None` for canvases drawn and
    discarded (rows that stopped denoising: transformers keeps drawing for them). Work runs in chunks
    of positions bounded by `rows_per_chunk`; on a device whose stream is not chunk-invariant
    (`stream_invariant`) the exponentials are drawn in one call. Returns `[N]` long, `[N]` float32,
    `[N]` long: the same values as the unchunked computation. `statistics` replaces the pair
    `(chunk_race, chunk_entropy_argmax)` (by their compiled versions, `dlm.compiled`)."""
    race, entropy_argmax = (chunk_race, chunk_entropy_argmax) if statistics is None else statistics
    N, V = scaled.shape
    device = scaled.device
    sampled = torch.empty(N, dtype=torch.long, device=device)
    entropy = torch.empty(N, dtype=scaled.dtype, device=device)
    argmax = torch.empty(N, dtype=torch.long, device=device)
    k = rows_per_chunk(sum(n for n, _ in segments) * canvas_length, V, divides=canvas_length)
    whole = None
    if not stream_invariant(device):
        total = sum(n for n, _ in segments) * canvas_length
        whole = torch.empty((total, V), dtype=torch.float32, device=device).exponential_(1, generator=generator)
    stream_row = 0
    for canvases, first in segments:
        rows = canvases * canvas_length
        for offset in range(0, rows, k):
            size = min(k, rows - offset)
            if whole is None:
                q = torch.empty((size, V), dtype=torch.float32, device=device).exponential_(1, generator=generator)
            else:
                q = whole[stream_row + offset: stream_row + offset + size]
            if first is None:
                continue
            at = slice(first * canvas_length + offset, first * canvas_length + offset + size)
            sampled[at] = race(scaled[at], q)
            del q  # before the entropy's two temporaries: at most two chunk tables at a time
            entropy[at], argmax[at] = entropy_argmax(scaled[at])
        stream_row += rows
    return sampled, entropy, argmax


def stream_segments(batch: int, live: list[int] | None) -> list[tuple[int, int | None]]:
    """The runs of a stream over `batch` canvases, in order, for `race_entropy_argmax`: live canvases
    (`live`, sorted batch rows whose positions are computed, in that order; None: every row) and
    the others, drawn and discarded. E.g. batch 4, live [1, 2] -> [(1, None), (2, 0), (1, None)]."""
    if live is None:
        return [(batch, 0)]
    index = {row: i for i, row in enumerate(live)}
    runs: list[tuple[int, int | None]] = []
    for row in range(batch):
        first = index.get(row)
        if runs:
            count, start = runs[-1]
            contiguous = (first is None and start is None) or (
                first is not None and start is not None and first == start + count)
            if contiguous:
                runs[-1] = (count + 1, start)
                continue
        runs.append((1, first))
    return runs


class StableConfidentStop:
    """Per-row adaptive stopping: the argmax canvas equals each of the last `stability_threshold`
    argmax canvases, and the mean token entropy is below `confidence_threshold`.

    Rows are addressed by index in the full batch, so a caller that only runs some rows can update
    just those (their history stays what it was: a stopped row never resumes)."""

    def __init__(self, stability_threshold: int, confidence_threshold: float):
        self.stability_threshold = stability_threshold
        self.confidence_threshold = confidence_threshold
        self.history: torch.Tensor | None = None  # [S, B, C] long, -1 before any step

    def reset(self, batch: int, canvas_length: int, device: torch.device) -> None:
        self.history = torch.full((self.stability_threshold, batch, canvas_length), -1, dtype=torch.long,
                                  device=device)

    def __call__(self, argmax_canvas: torch.Tensor, entropy: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
        """argmax_canvas / entropy: `[R, C]` for the batch `rows` (None: all). Returns `[R]` bool."""
        if self.stability_threshold == 0:
            stable = torch.ones(argmax_canvas.shape[0], dtype=torch.bool, device=argmax_canvas.device)
        else:
            past = self.history if rows is None else self.history[:, rows]
            stable = (past == argmax_canvas.unsqueeze(0)).all(dim=-1).all(dim=0)
            shifted = torch.roll(past, shifts=-1, dims=0)
            shifted[-1] = argmax_canvas
            if rows is None:
                self.history = shifted
            else:
                self.history[:, rows] = shifted
        return stable & (entropy.mean(dim=-1) < self.confidence_threshold)


@register
class EntropyBoundSampler(Sampler):
    """`entropy_bound`: DiffusionGemma's rule. On a uniform-noise model the engine runs it natively
    (accept by the bound over the whole canvas, renoise the rest, adaptive stopping, output the
    argmax; `dlm.engine.uniform`). On a masked model it commits the masked positions the bound
    accepts (entropies at the scheduled temperature), each with the argmax token at the engine's
    greedy default (`temperature=0`) or a token drawn at the scheduled temperature when
    `temperature > 0` (the masked `eb` sampler uses the same bound on the untempered
    distribution)."""

    name = "entropy_bound"
    Config = EntropyBoundConfig
    adaptive = True
    uniform_native = True

    def step(self, logits: torch.Tensor, ctx: StepContext) -> StepResult:
        c = self.config
        temperature = linear_temperature(ctx.steps_in_block - ctx.step, ctx.steps_in_block, c.t_min, c.t_max,
                                         device=logits.device)
        scaled = logits.float() / temperature
        probs = torch.softmax(scaled, dim=-1, dtype=torch.float32)
        B, L, V = probs.shape
        if ctx.temperature == 0:  # the engine's greedy default: argmax proposals, the same acceptance
            proposal = scaled.argmax(dim=-1)
        else:
            proposal = exponential_race(probs.reshape(B * L, V), ctx.generator).view(B, L)
        accepted = entropy_bound_accept(categorical_entropy(scaled), c.entropy_bound, ctx.candidates)
        return StepResult(commit(ctx.x, proposal, accepted), proposal, gather_prob(probs, proposal))
