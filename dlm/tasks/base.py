"""Shared pieces of the verifiable task suites: the example record, the task interface and the
held-out split.

Splits: a prompt belongs to the test split iff `sha1(prompt) % 10 == 0` (`split_of`), so membership
depends on the prompt text alone (stable across seeds, processes and Python versions). Of the other
prompts, about one in ten (another slice of the same hash, `is_validation`) is the validation split:
kept out of training and used to choose checkpoints and decoding settings, so the test split is read
only to report. The three splits never share a prompt.
"""
from __future__ import annotations

import hashlib
import random
import re
from dataclasses import dataclass, field
from typing import Optional

# The tiny model was trained on `prompt + PROMPT_SUFFIX` followed by the response; build the
# model input with `Example.input_text` (or `format_prompt`) for the built-in model.
PROMPT_SUFFIX = "\n"
MAX_ANSWER_CHARS = 63   # the answer plus at least one EOS fits the default 64-token generation
MAX_PROMPT_CHARS = 72
SPLITS = ("train", "val", "test")


def format_prompt(prompt: str) -> str:
    """`prompt` ending in PROMPT_SUFFIX, added only when missing (as `TinyCharTokenizer.format_prompt`)."""
    return prompt if prompt.endswith(PROMPT_SUFFIX) else prompt + PROMPT_SUFFIX


def split_of(prompt: str) -> str:
    """'test' for about one prompt in ten (by a stable hash of the text), else 'train' (which holds the
    validation prompts too: see `is_validation` and `subset_of`)."""
    h = int.from_bytes(hashlib.sha1(prompt.encode("utf-8")).digest()[:8], "big")
    return "test" if h % 10 == 0 else "train"


def is_validation(prompt: str) -> bool:
    """True for about one in ten prompts (a different slice of sha1 from `split_of`'s first 8 bytes);
    the validation split is the train-split prompts for which it holds."""
    h = int.from_bytes(hashlib.sha1(prompt.encode("utf-8")).digest()[8:16], "big")
    return h % 10 == 0


def subset_of(prompt: str) -> str:
    """'test', 'val' or 'train': the split a prompt belongs to, training excluding validation."""
    split = split_of(prompt)
    return "val" if split == "train" and is_validation(prompt) else split


@dataclass(frozen=True)
class Example:
    """One task instance.

    prompt: the question, without the separator (see `input_text`).
    answer: one reference answer (for random tasks, one valid answer among many).
    task: the task name.
    meta: what the scorer needs besides the prompt (the input list, the clues, the true number).
    """

    prompt: str
    answer: str
    task: str
    meta: dict = field(default_factory=dict, compare=False, hash=False)

    @property
    def input_text(self) -> str:
        return format_prompt(self.prompt)


def first_line(text: Optional[str]) -> str:
    """The model's answer is the first line of the decoded response (EOS padding removed)."""
    if not isinstance(text, str):
        return ""
    return text.strip().split("\n", 1)[0].strip() if text.strip() else ""


class Task:
    """A verifiable task. Subclasses implement `_make(rng)` and `score`/`extract`."""

    name: str = "task"
    max_tries_factor = 200

    def _make(self, rng: random.Random) -> Example:  # pragma: no cover - abstract
        raise NotImplementedError

    def examples(self, split: str, n: int, seed: int = 0, unique: bool = True) -> list[Example]:
        """`n` examples of `split`, deterministic in `seed` (a private `random.Random`).

        With `unique`, prompts do not repeat (raises if the task cannot supply that many).
        """
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        rng = random.Random(f"{self.name}|{split}|{seed}")
        out: list[Example] = []
        seen: set[str] = set()
        tries = 0
        while len(out) < n:
            tries += 1
            if tries > self.max_tries_factor * max(n, 10):
                raise ValueError(
                    f"task {self.name!r} could not produce {n} distinct {split} examples "
                    f"(got {len(out)}); ask for fewer or pass unique=False")
            ex = self._make(rng)
            if subset_of(ex.prompt) != split or (unique and ex.prompt in seen):
                continue
            seen.add(ex.prompt)
            out.append(ex)
        return out

    def extract(self, output_text: str) -> Optional[str]:
        line = first_line(output_text)
        return line or None

    def score(self, example: Example, output_text: str) -> float:  # pragma: no cover
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


_INT = re.compile(r"-?\d+")
