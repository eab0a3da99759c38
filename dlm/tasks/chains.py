"""`chains`: long, near-deterministic outputs whose every step depends on the step before.

The other suites leave a parallel decoder little to do: a 32-token block of a deterministic list
edit settles in about one forward, and the random edits break at a second token per forward. Here
the answer is long (64-100 tokens, generated in 128) and sequential: token k is determined by the
prompt *and token k-1*, so a decoder that fills token k before k-1 is settled guesses, and a
confidence threshold has to wait for the chain to advance. This is the regime where look-ahead
(LoPA) and backtracking (Saber) are meant to pay, and where a single answer exists, so an ensemble
vote (HEX) means something.

    count 35 from 37 by 13:  -> 50 63 76 89 02 ...   each number = the previous one + the step, mod 100
    walk 40 from cyd by 5:   -> hal mia ...           each name = the one 5 places on, on the ring of
                                                      names in alphabetical order

Both are scored by exact match of the first line (one answer each). Digits and spaces are one token
each in the built-in tokenizer and names one token each: answers are 79-122 tokens.

Why these rules: each is local (the previous item and a constant), which a 1.3M-parameter model
learns in a few thousand steps on CPU; a first version with a prompt-wide lookup (a successor table
given in the prompt) and an aligned running sum learned nothing in 1,200 steps (see
docs/tiny_dlm_training.md). The sequential dependence is the same: item k is cheap given item k-1.
"""
from __future__ import annotations

import random
from typing import Optional

from .base import Example, Task, first_line
from .list_edits import NAMES

CHAIN_GEN_LENGTH = 128  # generation length of the suite: every answer plus its EOS fits


class ChainTask(Task):
    """A task of the `chains` suite: exact match, with its own generation length."""

    gen_length = CHAIN_GEN_LENGTH

    def extract(self, output_text: str) -> Optional[str]:
        return first_line(output_text) or None

    def score(self, example: Example, output_text: str) -> float:
        return 1.0 if first_line(output_text) == example.answer else 0.0


class Count(ChainTask):
    """Count mod 100 from a start by a step: "count 35 from 37 by 13:" -> "50 63 76 89 02 ...".

    Every number is written with two digits; the step is coprime to 100, so the 32-41 numbers never
    repeat. Number k is the previous one plus the step (carry included), a local rule; writing it
    without the previous one means computing start + k * step mod 100 in one forward.
    """

    name = "count"
    min_items, max_items = 32, 41
    steps = tuple(s for s in range(1, 100) if s % 2 and s % 5)

    def _make(self, rng: random.Random) -> Example:
        n, start, step = rng.randint(self.min_items, self.max_items), rng.randrange(100), rng.choice(self.steps)
        values = [(start + step * k) % 100 for k in range(1, n + 1)]
        return Example(f"count {n} from {start:02d} by {step:02d}:", " ".join(f"{v:02d}" for v in values),
                       self.name, {"start": start, "step": step, "n": n})


class Walk(ChainTask):
    """Walk the ring of names in alphabetical order: "walk 40 from cyd by 5:" -> "hal mia ...".

    Each name is the one `step` places after the previous one on the ring of the 24 list-edit names
    (a fixed table the model learns, not given in the prompt); steps 1, 5 and 7 are coprime to 24,
    so the first 24 names never repeat.
    """

    name = "walk"
    min_items, max_items = 40, 60
    steps = (1, 5, 7)
    ring = tuple(sorted(NAMES))

    def _make(self, rng: random.Random) -> Example:
        n, start, step = rng.randint(self.min_items, self.max_items), rng.randrange(len(self.ring)), rng.choice(self.steps)
        names = [self.ring[(start + step * k) % len(self.ring)] for k in range(1, n + 1)]
        return Example(f"walk {n} from {self.ring[start]} by {step}:", " ".join(names), self.name,
                       {"start": self.ring[start], "step": step, "n": n})


CHAIN_TASKS = (Count, Walk)
