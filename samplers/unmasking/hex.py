"""HEX: an ensemble of block-length experts with a majority vote (Lee et al., 2025).

Paper: "Test-Time Scaling in Diffusion LLMs via Hidden Semi-Autoregressive Experts", arXiv:2510.05040.

A masked diffusion LM trained on random masks has implicitly learnt many generation orders; the
block length of semi-autoregressive decoding picks one. HEX runs the same prompt under several
block lengths ("experts"), extracts each expert's answer, and returns the majority answer. It gains
where single schedules fail in *different* ways (the paper's case: one full-length block with
top-k confidence/margin collapses into end-of-text padding, small blocks do not).

HEX is not a per-step policy: it decides over whole generations. This file holds what is pure
(the config, each expert's pass budget, the vote); the driver-level ensemble that runs the experts
is `dlm.ensemble.hex_generate`, and `dlm.generate(..., sampler="hex")` dispatches to it, so the
name works from the pipeline, the CLI and the benchmark like any sampler.

Published setting (the default here, `budget="published"`): gen_length 256 -> blocks
[8, 16, 32, 64, 128] (gen/32 ... gen/2; gen 64 -> [2, 4, 8, 16, 32]), EVERY expert with gen/2
passes (2 tokens per pass), low-confidence remasking (`confidence`), T = 0; answers are extracted,
None votes dropped, ties go to the first answer seen (the smallest block), as in the authors'
`most_frequent_elements_exclude_None_and_tie_lownll(..., 'frequency')`. A ladder block that cannot
take 2 tokens per pass (block 1 at gen 32) is left out. `tests/samplers/unmasking/test_hex_schedules.py`
decodes the failure HEX repairs with an analytic model.

Budget (`steps`): as for every sampler, `steps` is a hard cap on forward passes, here on the
ensemble's TOTAL (the experts' passes summed; what `GenerateOutput.nfe` and `dlm bench` report).
- `budget="published"`: each expert gets `ceil(gen_length / tokens_per_step)` passes, so the
  ensemble needs `experts * ceil(gen_length / tokens_per_step)` (5 * 32 = 160 at gen 64). `steps=None`
  means exactly that; a larger `steps` is a cap the experts do not reach; a smaller one cannot be
  honoured and raises ValueError (naming `steps` and `budget="split"`).
- `budget="split"` (the pre-published behaviour, kept because it is one function): `steps`
  (default gen_length) is shared evenly, each expert gets `min(steps // experts, ceil(gen_length /
  tokens_per_step))` passes, and with the default ladder the experts whose blocks cannot each get a
  pass are dropped, smallest block first.

When (not) to use it: the vote compares answers for exact equality, so it only means something on
tasks with ONE right answer (arithmetic, multiple choice, a deterministic edit). On tasks with many
valid answers (random edits such as shuffle or insert_random, open-ended text) the experts' answers
rarely coincide, the vote falls to the tie rule (the smallest block) and the ensemble costs
`experts` times the passes for nothing; do not use HEX there.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Hashable, Sequence

import torch

from samplers.base import Sampler, SamplerConfig, StepContext, StepResult
from samplers.registry import register


BUDGETS = ("published", "split")


@dataclass(frozen=True)
class HexConfig(SamplerConfig):
    """block_lengths: the experts' block lengths (empty: the published ladder gen/32, ..., gen/2 of
    the lengths that divide gen_length and can take `tokens_per_step` tokens per pass; on the command
    line `hex:block_lengths=4/8/16`). expert: each expert's step policy (registry name; the published
    experts use low-confidence remasking = `confidence`). tokens_per_step: each expert decodes with
    `ceil(gen_length / tokens_per_step)` passes (2 as published). budget: `"published"` (every expert
    gets those passes; `steps` caps the ensemble's total and must cover it) or `"split"` (the total
    `steps` is shared evenly and experts that do not fit are dropped); see the module docstring."""

    block_lengths: tuple = ()
    expert: str = "confidence"
    tokens_per_step: int = 2
    budget: str = "published"

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
        if self.budget not in BUDGETS:
            raise ValueError(f"budget must be one of {BUDGETS} ('published': every expert gets gen_length / "
                             f"tokens_per_step passes; 'split': steps is shared among the experts), got {self.budget!r}")
        from samplers.registry import SAMPLERS

        inner = SAMPLERS.get(self.expert)
        if inner is None or getattr(inner, "ensemble", False):
            raise ValueError(f"expert={self.expert!r} cannot run a HEX expert; give a step policy such as "
                             f"'confidence' or 'threshold'")


def published_ladder(gen_length: int) -> list[int]:
    """gen/32, gen/16, ..., gen/2 (those that are whole divisors of gen_length), smallest first."""
    out = [gen_length // d for d in (32, 16, 8, 4, 2) if gen_length % d == 0]
    return out or [gen_length]


def expert_passes(gen_length: int, tokens_per_step: int) -> int:
    """Passes of one published expert: `ceil(gen_length / tokens_per_step)` (gen/2 as published)."""
    return -(-gen_length // tokens_per_step)


def plan_experts(gen_length: int, steps: int | None, config: HexConfig, canvases: int = 1) -> list[tuple[int, int]]:
    """`[(block_length, passes)]` per expert, smallest block first; the passes sum to at most `steps`.

    Args:
        gen_length: tokens each expert generates (per canvas on a uniform-noise model).
        steps: the ensemble's TOTAL forward-pass budget (over every expert and canvas), or None for
            the default of `config.budget` (published: `experts * ceil(gen_length / tokens_per_step)`
            per canvas; split: gen_length per canvas).
        config: the `HexConfig`.
        canvases: how many times the plan runs (a uniform-noise model decodes canvas after canvas);
            the returned passes are each expert's total over all of them.

    Raises ValueError (naming the option and the fix) when a given block length does not divide
    gen_length, a block cannot get a pass, or `steps` is below what the published setting needs."""
    explicit = bool(config.block_lengths)
    blocks = sorted(config.block_lengths) if explicit else published_ladder(gen_length)
    bad = [b for b in blocks if gen_length % b]
    if bad:
        raise ValueError(f"hex block_lengths {bad} do not divide gen_length {gen_length}; use divisors of it")
    if config.budget == "split":
        share = gen_length if steps is None else steps // canvases
        plan = _split_plan(gen_length, share, blocks, explicit, config)
    else:
        plan = _published_plan(gen_length, blocks, explicit, config)
        total = canvases * sum(p for _, p in plan)
        if steps is not None and steps < total:
            per_canvas = f" per canvas x {canvases} canvases" if canvases > 1 else ""
            raise ValueError(
                f"steps={steps} cannot run HEX's published setting: {len(plan)} experts {[b for b, _ in plan]} x "
                f"{plan[0][1]} passes (gen_length {gen_length} / tokens_per_step {config.tokens_per_step}){per_canvas} "
                f"= {total} forward passes in total; leave steps unset (or give steps >= {total}; dlm bench: "
                f"--steps {total}), or pass budget='split' (hex:budget=split) to share a smaller total")
    return [(b, p * canvases) for b, p in plan]


def _published_plan(gen_length: int, blocks: list[int], explicit: bool, config: HexConfig) -> list[tuple[int, int]]:
    """Every expert gets `ceil(gen_length / tokens_per_step)` passes; a default-ladder block that
    cannot get one pass per block at that rate is left out (block 1 at 2 tokens per pass)."""
    passes = expert_passes(gen_length, config.tokens_per_step)
    fits = [b for b in blocks if gen_length // b <= passes]
    if explicit and fits != blocks:
        raise ValueError(
            f"hex block_lengths {[b for b in blocks if b not in fits]} need more than {passes} passes "
            f"(one per block) at tokens_per_step={config.tokens_per_step}; give block_lengths >= "
            f"{config.tokens_per_step} or a smaller tokens_per_step")
    return [(b, passes) for b in fits or [gen_length]]  # a tiny gen_length: one full-length expert


def _split_plan(gen_length: int, steps: int, blocks: list[int], explicit: bool,
                config: HexConfig) -> list[tuple[int, int]]:
    """`steps` shared evenly; with the default ladder, experts that cannot get a pass per block are
    dropped, smallest block first (it needs the most passes)."""
    cap = expert_passes(gen_length, config.tokens_per_step)
    tried = list(blocks)
    while blocks:
        share = min(steps // len(blocks), cap)
        if all(gen_length // b <= share for b in blocks):
            return [(b, share) for b in blocks]
        if explicit:
            break
        blocks = blocks[1:]
    raise ValueError(
        f"steps={steps} cannot run hex experts {tried} with budget='split' (each expert gets steps // experts "
        f"passes and needs gen_length / block_length of them); raise steps or pass fewer / longer block_lengths")


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
