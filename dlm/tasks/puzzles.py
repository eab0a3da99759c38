"""4x4 Sudoku (rows, columns and 2x2 boxes) and 4x4 Latin squares (rows and columns).

Puzzles come from a random valid grid with 4-8 cells blanked (`.`); rows separated by spaces:
    sudoku: 1.3. .4.. ..1. 3...    -> 1234 3412 2143 4321
Scored by validity: any completion that keeps every clue and obeys the rules counts.
"""
from __future__ import annotations

import itertools
import random
import re
from functools import lru_cache
from typing import Optional

from .base import Example, Task

_GRID = re.compile(r"[1-4]{4}(?: [1-4]{4}){3}")


def _rows_cols_ok(g) -> bool:
    full = set("1234")
    return all(set(r) == full for r in g) and all(set(c) == full for c in zip(*g))


def _boxes_ok(g) -> bool:
    for br in (0, 2):
        for bc in (0, 2):
            if {g[r][c] for r in (br, br + 1) for c in (bc, bc + 1)} != set("1234"):
                return False
    return True


@lru_cache(maxsize=None)
def _all_grids(sudoku: bool) -> tuple[tuple[str, ...], ...]:
    perms = ["".join(p) for p in itertools.permutations("1234")]
    out = []

    def extend(rows):
        if len(rows) == 4:
            if not sudoku or _boxes_ok(rows):
                out.append(tuple(rows))
            return
        for p in perms:  # prune on column repeats row by row
            if all(p[c] != r[c] for r in rows for c in range(4)):
                extend(rows + [p])

    extend([])
    return tuple(out)  # 288 Sudoku grids, 576 Latin squares (in a fixed order)


def parse_grid(text) -> Optional[list[str]]:
    if not isinstance(text, str):
        return None
    m = _GRID.search(text.strip().split("\n", 1)[0]) if text.strip() else None
    return m.group(0).split() if m else None


class GridPuzzle(Task):
    sudoku = True
    min_blanks, max_blanks = 4, 8

    def _make(self, rng: random.Random) -> Example:
        grid = rng.choice(_all_grids(self.sudoku))
        cells = [list(r) for r in grid]
        for idx in rng.sample(range(16), rng.randint(self.min_blanks, self.max_blanks)):
            cells[idx // 4][idx % 4] = "."
        puzzle = " ".join("".join(r) for r in cells)
        return Example(f"{self.name}: {puzzle}", " ".join(grid), self.name, {"puzzle": puzzle})

    def extract(self, output_text: str) -> Optional[str]:
        g = parse_grid(output_text)
        return " ".join(g) if g else None

    def is_valid(self, puzzle: str, rows: list[str]) -> bool:
        if not _rows_cols_ok(rows) or (self.sudoku and not _boxes_ok(rows)):
            return False
        clues = puzzle.split()
        return all(c == "." or c == g for cr, gr in zip(clues, rows) for c, g in zip(cr, gr))

    def score(self, example: Example, output_text: str) -> float:
        rows = parse_grid(output_text)
        return 1.0 if rows is not None and self.is_valid(example.meta["puzzle"], rows) else 0.0


class Sudoku(GridPuzzle):
    name = "sudoku"
    sudoku = True


class Latin(GridPuzzle):
    name = "latin"
    sudoku = False
