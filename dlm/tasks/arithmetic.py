"""GSM8K-like multi-step word problems with small numbers.

2-3 operations among +, - and * (by 2 or 3); every intermediate and final value lies in 0..99.
The answer shows the worked steps, then `#### N`:
    prompt: ann has 3 figs. she gets 5. she loses 2. how many?
    answer: 3+5=8. 8-2=6. #### 6
Extraction (GSM8K convention): the number after the last `####`, else the last number in the text,
else None. Score: extracted number == true answer.
"""
from __future__ import annotations

import random
import re
from typing import Optional

from .base import Example, Task

PEOPLE = (("ann", "she"), ("bea", "she"), ("eva", "she"), ("kim", "she"), ("liz", "she"),
          ("tom", "he"), ("max", "he"), ("sam", "he"), ("ben", "he"), ("leo", "he"))
OBJECTS = ("figs", "pens", "cups", "eggs", "cars", "hats", "toys", "nuts")

_HASH = re.compile(r"####\s*(-?\d+)")
_NUM = re.compile(r"-?\d+")


def extract_number(text) -> Optional[int]:
    if not isinstance(text, str):
        return None
    m = _HASH.findall(text)
    if m:
        return int(m[-1])
    nums = _NUM.findall(text)
    return int(nums[-1]) if nums else None


def pad_numbers(answer: str, width: int = 2) -> str:
    """The arithmetic worked steps with every number zero-padded to ``width`` digits
    ("3+5=8. 8-2=6. #### 6" -> "03+05=08. 08-02=06. #### 06").

    Why: with numbers of varying length a result digit's role (tens or ones) and the positions of the
    operand digits it depends on vary from step to step; at a fixed width the ones digit of a result
    always sits at the same offset from the ones digits of its operands. Scoring is unchanged
    (``extract_number("#### 06") == 6``), so this is the model's own worked-step format, as a
    chain-of-thought format is; the suites' prompts and verifiers do not change.
    """
    return re.sub(r"\d+", lambda m: m.group().zfill(width), answer)


class Arithmetic(Task):
    name = "arithmetic"
    step_counts = (2, 3)  # operations per problem (inclusive range)

    def _make(self, rng: random.Random) -> Example:
        while True:
            ex = self._try(rng)
            if ex is not None:
                return ex

    def _try(self, rng: random.Random) -> Optional[Example]:
        person, pro = rng.choice(PEOPLE)
        obj = rng.choice(OBJECTS)
        v = rng.randint(1, 20)
        sents = [f"{person} has {v} {obj}."]
        steps = []
        for _ in range(rng.randint(*self.step_counts)):
            kind = rng.choices(("add", "sub", "mul"), weights=(4, 4, 1))[0]
            if kind == "add":
                n = rng.randint(1, 20)
                new, sents_i, step = v + n, f"{pro} gets {n}.", f"{v}+{n}={v + n}."
            elif kind == "sub":
                if v == 0:
                    continue
                n = rng.randint(1, min(v, 20))
                new, sents_i, step = v - n, f"{pro} loses {n}.", f"{v}-{n}={v - n}."
            else:
                k = rng.choice((2, 3))
                new = v * k
                sents_i = f"{pro} {'doubles' if k == 2 else 'triples'}."
                step = f"{v}*{k}={new}."
            if not 0 <= new <= 99:
                return None
            v = new
            sents.append(sents_i)
            steps.append(step)
        if len(steps) < self.step_counts[0]:
            return None
        prompt = " ".join(sents) + " how many?"
        answer = " ".join(steps) + f" #### {v}"
        return Example(prompt, answer, self.name, {"value": v})

    def extract(self, output_text: str) -> Optional[str]:
        n = extract_number(output_text)
        return None if n is None else str(n)

    def score(self, example: Example, output_text: str) -> float:
        return 1.0 if extract_number(output_text) == example.meta["value"] else 0.0


class ArithmeticDrill(Arithmetic):
    """One-operation problems in the arithmetic task's format, for training only (in no suite):
    "ann has 17 figs. she gets 5. how many?" -> "17+5=22. #### 22". Each drill is one more result to
    compute, with the same prompt template and worked-step format as the task
    (``scripts/train_tiny_dlm.py --arith-drill``)."""

    name = "arithmetic_drill"
    step_counts = (1, 1)

