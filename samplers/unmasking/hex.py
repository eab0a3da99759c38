"""HEX: an ensemble of block-length experts with a majority vote (Lee et al., 2025).

Paper: "Test-Time Scaling in Diffusion LLMs via Hidden Semi-Autoregressive Experts", arXiv:2510.05040.

A masked diffusion LM trained on random masks has implicitly learnt many generation orders; the
block length of semi-autoregressive decoding picks one. HEX runs the same prompt under several
block lengths ("experts"), extracts each expert's answer, and returns the majority answer.

HEX is not a per-step policy: it decides over whole generations. This file holds what is pure
(the config, which experts fit a budget, the vote); the driver-level ensemble that runs the experts
is `dlm.ensemble.hex_generate`, and `dlm.generate(..., sampler="hex")` dispatches to it, so the
name works from the pipeline, the CLI and the benchmark like any sampler.

Published setting: gen_length 256 -> blocks [8, 16, 32, 64, 128] (gen/32 ... gen/2), each expert
with gen/2 steps (2 tokens per step), low-confidence remasking, T = 0; answers are extracted, None
votes dropped, ties go to the first answer seen (the smallest block).

Choices here: `steps` stays a hard budget for the whole ensemble (the experts' forward passes are
summed, DESIGN.md), so each expert gets `min(steps // experts, gen_length / tokens_per_step)`
passes; with the default ladder, experts whose blocks do not fit that share (a block needs at least
one pass) are dropped from the smallest block up. Without a task extractor (plain `generate`) the
vote is on the generated tokens up to the first EOS (exact-match voting).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Hashable, Sequence

import torch

from samplers.base import Sampler, SamplerConfig, StepContext, StepResult
from samplers.registry import register


@dataclass(frozen=True)
class HexConfig(SamplerConfig):
    """block_lengths: the experts' block lengths (empty: gen/32, ..., gen/2 of the lengths that
    divide gen_length, as published; on the command line `hex:block_lengths=4/8/16`). expert: each expert's step policy (registry
    name; the published experts use low-confidence remasking = `confidence`). tokens_per_step:
    each expert's pass budget is gen_length / tokens_per_step (2 as published), or its share of
    `steps` when that is smaller."""

    block_lengths: tuple = ()
    expert: str = "confidence"
    tokens_per_step: int = 2

    def __post_init__(self):
        # JSON gives a list back and the CLI a string ("4/8/16", since commas separate samplers):
        # keep one hashable form so the config is equal after a round trip.
        value = self.block_lengths
        if value is None:
            value = ()
        elif isinstance(value, int):
            value = (value,)
        elif isinstance(value, str):
            try:
                value = tuple(int(v) for v in value.replace("/", " ").split())
            except ValueError:
                raise ValueError(f"block_lengths {value!r}: give integers separated by '/', e.g. 4/8/16") from None
        object.__setattr__(self, "block_lengths", tuple(value))

    def validate(self) -> None:
        if any(not isinstance(b, int) or b <= 0 for b in self.block_lengths):
            raise ValueError(f"block_lengths must be positive integers, got {self.block_lengths}")
        if len(set(self.block_lengths)) != len(self.block_lengths):
            raise ValueError(f"block_lengths has duplicates: {self.block_lengths}; give each expert once")
        if not isinstance(self.tokens_per_step, int) or self.tokens_per_step <= 0:
            raise ValueError(f"tokens_per_step must be a positive integer, got {self.tokens_per_step!r}")
        from samplers.registry import SAMPLERS

        inner = SAMPLERS.get(self.expert)
        if inner is None or getattr(inner, "ensemble", False):
            raise ValueError(f"expert={self.expert!r} cannot run a HEX expert; give a step policy such as "
                             f"'confidence' or 'threshold'")


def published_ladder(gen_length: int) -> list[int]:
    """gen/32, gen/16, ..., gen/2 (those that are whole divisors of gen_length), smallest first."""
    out = [gen_length // d for d in (32, 16, 8, 4, 2) if gen_length % d == 0]
    return out or [gen_length]


def plan_experts(gen_length: int, steps: int, config: HexConfig) -> list[tuple[int, int]]:
    """`[(block_length, steps)]` per expert, smallest block first; the steps sum to at most `steps`.

    Raises ValueError (naming the fix) when a given block length does not divide gen_length or the
    budget cannot give every expert one pass per block."""
    explicit = bool(config.block_lengths)
    blocks = sorted(config.block_lengths) if explicit else published_ladder(gen_length)
    bad = [b for b in blocks if gen_length % b]
    if bad:
        raise ValueError(f"hex block_lengths {bad} do not divide gen_length {gen_length}; use divisors of it")
    cap = -(-gen_length // config.tokens_per_step)
    while blocks:
        share = min(steps // len(blocks), cap)
        if all(gen_length // b <= share for b in blocks):
            return [(b, share) for b in blocks]
        if explicit:
            break
        blocks = blocks[1:]  # the smallest block needs the most passes
    raise ValueError(
        f"steps={steps} cannot run hex experts {sorted(config.block_lengths) or published_ladder(gen_length)} "
        f"(each expert gets steps // experts passes and needs gen_length / block_length of them); raise steps "
        f"or pass fewer / longer block_lengths")


def majority_vote(answers: Sequence[Hashable | None]) -> int | None:
    """Index of the expert whose answer wins: the most frequent non-None answer, ties to the one
    seen first; None when every answer is None."""
    counts = Counter(a for a in answers if a is not None)
    if not counts:
        return None
    best = max(counts.values())
    for i, a in enumerate(answers):
        if a is not None and counts[a] == best:
            return i
    return None  # unreachable


@register
class HexSampler(Sampler):
    name = "hex"
    Config = HexConfig
    adaptive = True  # the experts may use fewer passes than `steps` in total
    ensemble = True  # runs whole generations (dlm.ensemble), not one step

    def step(self, logits: torch.Tensor, ctx: StepContext) -> StepResult:
        raise RuntimeError("hex is an ensemble over whole generations, not a step policy; run it with "
                           "dlm.generate(..., sampler='hex') or dlm.ensemble.hex_generate")
