"""`chains`: long, near-deterministic outputs whose every step depends on the step before.

The other suites leave a parallel decoder little to do: a 32-token block of a deterministic list
edit settles in about one forward, and the random edits break at a second token per forward. Here
the answer is long (64-100 tokens, generated in 128) and sequential: token k is determined by the
prompt *and token k-1*, so a decoder that fills token k before k-1 is settled guesses, and a
confidence threshold has to wait for the chain to advance. This is the regime where look-ahead
(LoPA) and backtracking (Saber) are meant to pay, and where a single answer exists, so an ensemble
vote (HEX) means something.

    running_sum 7: 3518...   -> 0364...   each output digit = (previous output + input digit) mod 10,
                                          the "previous output" of the first being the start digit
    follow ana: ana=cyd bo=ana cyd=bo ... -> cyd bo ana cyd bo ...
                                          the chain of successors from the start name, n names

Both are scored by exact match of the first line (one answer each). Digits are one token each in
the built-in tokenizer and names one token each, so the answer lengths in tokens are those above.
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


class RunningSum(ChainTask):
    """Running sum mod 10 of 64-100 digits (one token per digit, no separators).

    Output digit k sits at the same rotary position as input digit k (positions restart after the
    prompt and the prompt header has a fixed length), so the local rule is easy to learn; computing
    digit k without digit k-1 needs a prefix sum, which a small model cannot do in one forward.
    """

    name = "running_sum"
    min_digits, max_digits = 64, 100

    def _make(self, rng: random.Random) -> Example:
        start = rng.randrange(10)
        digits = [rng.randrange(10) for _ in range(rng.randint(self.min_digits, self.max_digits))]
        out, acc = [], start
        for d in digits:
            acc = (acc + d) % 10
            out.append(str(acc))
        prompt = f"running_sum {start}: {''.join(map(str, digits))}"
        return Example(prompt, "".join(out), self.name, {"start": start, "digits": digits})


class Follow(ChainTask):
    """Follow a successor table over 6-8 names (one cycle through all of them) for 32-48 steps.

    Each output name is the table's successor of the one before; the table is a single cycle, so
    the chain never gets stuck on a fixed point and every name of the table is used.
    """

    name = "follow"
    min_names, max_names = 6, 8
    min_steps, max_steps = 32, 48

    def _make(self, rng: random.Random) -> Example:
        names = rng.sample(NAMES, rng.randint(self.min_names, self.max_names))
        cycle = names[:]
        rng.shuffle(cycle)
        successor = {cycle[i]: cycle[(i + 1) % len(cycle)] for i in range(len(cycle))}
        table = " ".join(f"{name}={successor[name]}" for name in names)  # listed in a random order
        start = rng.choice(names)
        chain, cur = [], start
        for _ in range(rng.randint(self.min_steps, self.max_steps)):
            cur = successor[cur]
            chain.append(cur)
        return Example(f"follow {start}: {table}", " ".join(chain), self.name,
                       {"start": start, "successor": successor})


CHAIN_TASKS = (RunningSum, Follow)
