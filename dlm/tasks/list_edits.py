"""ParallelBench-style "waiting line" list edits (ALGORITHMS 1.10).

Lists of 3-6 distinct short names drawn from a fixed pool. Deterministic edits (copy, reverse,
sort, insert/remove/replace at an index) are scored by exact match; random edits (shuffle, insert
at random, replace at random) by validity, since many answers are correct.

Prompt formats (indices are 0-based):
    copy: ana bo cyd            -> ana bo cyd
    reverse: ana bo cyd         -> cyd bo ana
    sort: cyd ana bo            -> ana bo cyd
    insert 1 eli: ana bo cyd    -> ana eli bo cyd
    remove 1: ana bo cyd        -> ana cyd
    replace 1 eli: ana bo cyd   -> ana eli cyd
    shuffle: ana bo cyd         -> any permutation different from the input
    insert eli: ana bo cyd      -> the input with eli inserted at any one position
    replace eli: ana bo cyd     -> the input with exactly one name replaced by eli
"""
from __future__ import annotations

import itertools
import random
from collections import Counter
from typing import Optional

from .base import Example, Task, first_line

NAMES = (
    "ana", "bo", "cyd", "dex", "eli", "fay", "gus", "hal", "ivy", "jo", "kai", "lev",
    "mia", "ned", "oli", "pam", "quin", "rex", "sal", "tom", "uma", "vic", "wes", "zoe",
)


def _parse(text: Optional[str]) -> Optional[list[str]]:
    line = first_line(text)
    if not line:
        return None
    return line.split()


class ListEditTask(Task):
    op: str = ""
    random_edit = False

    def __init__(self):
        self.name = self.op

    def _sample_list(self, rng: random.Random) -> list[str]:
        return rng.sample(NAMES, rng.randint(3, 6))

    def extract(self, output_text: str) -> Optional[str]:
        items = _parse(output_text)
        return " ".join(items) if items else None

    def score(self, example: Example, output_text: str) -> float:
        got = _parse(output_text)
        if got is None:
            return 0.0
        return 1.0 if self._valid(example, got) else 0.0

    def _valid(self, example: Example, got: list[str]) -> bool:
        return got == example.answer.split()

    def valid_answers(self, example: Example) -> list[list[str]]:
        """Every answer `score` accepts, as lists of names (one for a deterministic edit)."""
        return [example.answer.split()]

    def slot_marginals(self, example: Example, visible: list[Optional[str]]) -> list[dict[str, float]]:
        """Each answer slot's distribution over names when the valid answers consistent with the
        `visible` slots (a name, or None where hidden; one entry per name of `example.answer`) are
        equally likely: for a random edit, the exact posterior of a hidden slot given the shown ones,
        which a single sampled answer only approximates. ValueError if no valid answer fits."""
        fits = [a for a in self.valid_answers(example)
                if len(a) == len(visible) and all(v is None or v == n for v, n in zip(visible, a))]
        if not fits:
            raise ValueError(f"no valid {self.name} answer matches the visible slots {visible}")
        counts = [Counter(a[j] for a in fits) for j in range(len(visible))]
        return [{name: c / len(fits) for name, c in slot.items()} for slot in counts]


class Copy(ListEditTask):
    op = "copy"

    def _make(self, rng):
        xs = self._sample_list(rng)
        return Example(f"copy: {' '.join(xs)}", " ".join(xs), self.name, {"items": xs})


class Reverse(ListEditTask):
    op = "reverse"

    def _make(self, rng):
        xs = self._sample_list(rng)
        return Example(f"reverse: {' '.join(xs)}", " ".join(xs[::-1]), self.name, {"items": xs})


class Sort(ListEditTask):
    op = "sort"

    def _make(self, rng):
        xs = self._sample_list(rng)
        return Example(f"sort: {' '.join(xs)}", " ".join(sorted(xs)), self.name, {"items": xs})


class InsertIndex(ListEditTask):
    op = "insert_index"

    def _make(self, rng):
        xs = rng.sample(NAMES, rng.randint(3, 6))
        new = rng.choice([n for n in NAMES if n not in xs])
        i = rng.randint(0, len(xs))
        ys = xs[:i] + [new] + xs[i:]
        return Example(f"insert {i} {new}: {' '.join(xs)}", " ".join(ys), self.name,
                       {"items": xs, "name": new, "index": i})


class RemoveIndex(ListEditTask):
    op = "remove_index"

    def _make(self, rng):
        xs = self._sample_list(rng)
        i = rng.randrange(len(xs))
        ys = xs[:i] + xs[i + 1:]
        return Example(f"remove {i}: {' '.join(xs)}", " ".join(ys), self.name,
                       {"items": xs, "index": i})


class ReplaceIndex(ListEditTask):
    op = "replace_index"

    def _make(self, rng):
        xs = self._sample_list(rng)
        new = rng.choice([n for n in NAMES if n not in xs])
        i = rng.randrange(len(xs))
        ys = xs[:i] + [new] + xs[i + 1:]
        return Example(f"replace {i} {new}: {' '.join(xs)}", " ".join(ys), self.name,
                       {"items": xs, "name": new, "index": i})


class Shuffle(ListEditTask):
    op = "shuffle"
    random_edit = True

    def _make(self, rng):
        xs = self._sample_list(rng)
        ys = xs[:]
        while ys == xs:
            rng.shuffle(ys)
        return Example(f"shuffle: {' '.join(xs)}", " ".join(ys), self.name, {"items": xs})

    def _valid(self, example, got):
        xs = example.meta["items"]
        return sorted(got) == sorted(xs) and got != xs

    def valid_answers(self, example):
        xs = example.meta["items"]  # 3-6 names: at most 720 orders
        return [list(p) for p in itertools.permutations(xs) if list(p) != xs]


class InsertRandom(ListEditTask):
    op = "insert_random"
    random_edit = True

    def _make(self, rng):
        xs = self._sample_list(rng)
        new = rng.choice([n for n in NAMES if n not in xs])
        i = rng.randint(0, len(xs))
        ys = xs[:i] + [new] + xs[i:]
        return Example(f"insert {new}: {' '.join(xs)}", " ".join(ys), self.name,
                       {"items": xs, "name": new})

    def _valid(self, example, got):
        xs, new = example.meta["items"], example.meta["name"]
        return len(got) == len(xs) + 1 and new in got and \
            [g for g in got if g != new] == xs and got.count(new) == 1

    def valid_answers(self, example):
        xs, new = example.meta["items"], example.meta["name"]
        return [xs[:i] + [new] + xs[i:] for i in range(len(xs) + 1)]


class ReplaceRandom(ListEditTask):
    op = "replace_random"
    random_edit = True

    def _make(self, rng):
        xs = self._sample_list(rng)
        new = rng.choice([n for n in NAMES if n not in xs])
        i = rng.randrange(len(xs))
        ys = xs[:i] + [new] + xs[i + 1:]
        return Example(f"replace {new}: {' '.join(xs)}", " ".join(ys), self.name,
                       {"items": xs, "name": new})

    def _valid(self, example, got):
        xs, new = example.meta["items"], example.meta["name"]
        if len(got) != len(xs):
            return False
        diff = [i for i, (a, b) in enumerate(zip(xs, got)) if a != b]
        return len(diff) == 1 and got[diff[0]] == new

    def valid_answers(self, example):
        xs, new = example.meta["items"], example.meta["name"]
        return [xs[:i] + [new] + xs[i + 1:] for i in range(len(xs))]


LIST_EDIT_TASKS = (Copy, Reverse, Sort, InsertIndex, RemoveIndex, ReplaceIndex,
                   Shuffle, InsertRandom, ReplaceRandom)
