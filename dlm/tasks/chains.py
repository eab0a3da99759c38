"""`chains`: long, near-deterministic outputs whose every step depends on the step before.

The other suites leave a parallel decoder little to do: a 32-token block of a deterministic list
edit settles in about one forward, and the random edits break at a second token per forward. Here
the answer is long (64-100 tokens, generated in 128) and sequential: token k is determined by the
prompt *and token k-1*, so a decoder that fills token k before k-1 is settled guesses, and a
confidence threshold has to wait for the chain to advance. This is the regime where look-ahead
(LoPA) and backtracking (Saber) are meant to pay, and where a single answer exists, so an ensemble
vote (HEX) means something.

    count 40 from 3 by 7:    -> 3 0 7 4 1 8 ...       each digit = the previous one + the step, mod 10
    walk 40 from cyd by 5:   -> cyd hal mia ...       each name = the one 5 places on, on the ring of
                                                      names in alphabetical order

Both are scored by exact match of the first line (one answer each). Digits and spaces are one token
each in the built-in tokenizer and names one token each: answers are 79-111 tokens. Each answer
starts with the start item copied from the prompt, so every later item follows from the one before.

Why these rules: each is local (the previous item and a constant), which a 1.3M-parameter model
learns in a few thousand steps on CPU. Earlier versions (see docs/tiny_dlm_training.md): a
prompt-wide lookup (a successor table in the prompt) and an aligned running sum learned nothing in
1,200 steps; a two-digit counter mod 100 learned its ones digit (87% given the true prefix) but not
its carries (14%) in 2,700 steps. The sequential dependence is the same: item k is cheap given k-1.
"""
from __future__ import annotations

import itertools
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
    """Count mod 10 from a start by a step: "count 40 from 3 by 7:" -> "3 0 7 4 1 8 5 2 9 6 3 ...".

    The answer starts with the start digit and has n digits in all (40-56), each the previous one
    plus the step, mod 10 (steps 1, 3, 7, 9: every digit comes round once per ten). Digit k is the
    previous one plus the step, a local rule; writing it without the previous one means computing
    start + k * step mod 10 from the position alone.
    """

    name = "count"
    min_items, max_items = 40, 56
    steps = (1, 3, 7, 9)

    def _make(self, rng: random.Random) -> Example:
        n, start, step = rng.randint(self.min_items, self.max_items), rng.randrange(10), rng.choice(self.steps)
        values = [(start + step * k) % 10 for k in range(n)]
        return Example(f"count {n} from {start} by {step}:", " ".join(map(str, values)), self.name,
                       {"start": start, "step": step, "n": n})


class Walk(ChainTask):
    """Walk the ring of names in alphabetical order: "walk 40 from cyd by 5:" -> "cyd hal mia ...".

    The answer starts with the start name and has n names in all (40-56), each the one `step` places
    after the previous one on the ring of the 24 list-edit names (a fixed table the model learns, not
    given in the prompt); steps 1, 5 and 7 are coprime to 24, so the first 24 names never repeat.
    """

    name = "walk"
    min_items, max_items = 40, 56
    steps = (1, 5, 7)
    ring = tuple(sorted(NAMES))

    def _make(self, rng: random.Random) -> Example:
        n, start, step = rng.randint(self.min_items, self.max_items), rng.randrange(len(self.ring)), rng.choice(self.steps)
        names = [self.ring[(start + step * k) % len(self.ring)] for k in range(n)]
        return Example(f"walk {n} from {self.ring[start]} by {step}:", " ".join(names), self.name,
                       {"start": self.ring[start], "step": step, "n": n})


class RunningSum(ChainTask):
    """Running sum mod 10 of the prompt's digits: "sum: 3 1 4 1 5" -> "3 4 8 9 4".

    The prompt lists n digits (40-56); answer item k is the sum of the first k, mod 10. Given item
    k-1 it is item k-1 plus prompt digit k (a local rule, the digit found at a fixed offset: positions
    restart at the response); without it, item k needs all k digits summed, which position alone
    cannot give. This is what the periodic rules above lack (see docs/benchmarks.md, "chains").
    """

    name = "sum"
    min_items, max_items = 40, 56

    def _make(self, rng: random.Random) -> Example:
        n = rng.randint(self.min_items, self.max_items)
        digits = [rng.randrange(10) for _ in range(n)]
        sums = [total % 10 for total in itertools.accumulate(digits)]
        return Example("sum: " + " ".join(map(str, digits)), " ".join(map(str, sums)), self.name,
                       {"digits": digits, "n": n})


class Fibonacci(ChainTask):
    """Fibonacci mod 10 from two start digits: "fib 40 from 3 8:" -> "3 8 1 9 0 9 9 8 ...".

    n digits in all (40-56), each the sum of the two before, mod 10; the answer starts with the two
    start digits. The sequence's period is 60 for most starts (Pisano), longer than any answer, so
    item k from position alone means a table of 100 starts x 56 positions; from the two items before,
    one addition.
    """

    name = "fib"
    min_items, max_items = 40, 56

    def _make(self, rng: random.Random) -> Example:
        n, a, b = rng.randint(self.min_items, self.max_items), rng.randrange(10), rng.randrange(10)
        values = [a, b]
        while len(values) < n:
            values.append((values[-1] + values[-2]) % 10)
        return Example(f"fib {n} from {a} {b}:", " ".join(map(str, values)), self.name,
                       {"start": (a, b), "n": n})


CHAIN_TASKS = (Count, Walk)               # suite "chains": periodic rules, learned by tiny-dlm-chains
HARD_CHAIN_TASKS = (RunningSum, Fibonacci)  # suite "chains-hard": not computable from the position; sum is
                                            # learned by tiny-dlm-chains-hard, fib not yet (docs/tiny_dlm_training.md)
