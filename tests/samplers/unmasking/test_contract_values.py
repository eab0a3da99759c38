"""`samplers.contract` value for value against a plain-Python reference written from its docstring.

The contract tests (test_contract.py) check the guarantees through whole generations; these pin the two
functions themselves on exhaustive small cases, so that an off-by-one in the quota or a wrong row, mask
or tie rule in the guarantees fails here (mutation testing found such edits surviving; docs/testing.md).
"""
from __future__ import annotations

import math
import random

import pytest
import torch

from samplers.base import StepResult
from samplers.contract import enforce_step_contract, tokens_this_step

MASK = 9


def test_quota_is_the_ceiling_share_and_at_least_one_where_masks_remain():
    masks = torch.arange(0, 40)
    for steps_left in range(1, 12):
        got = tokens_this_step(masks, steps_left)
        want = [0 if m == 0 else max(1, math.ceil(m / steps_left)) for m in masks.tolist()]
        assert got.dtype == torch.long
        assert got.tolist() == want, steps_left


def test_quota_per_row_with_a_batch():
    masks = torch.tensor([0, 1, 7, 8, 9, 64])
    assert tokens_this_step(masks, 8).tolist() == [0, 1, 1, 1, 2, 8]


def _reference(x, candidates, new, proposal, confidence, *, remasks, last, fillable):
    """The guarantees of `enforce_step_contract`, row by row in plain Python (lists of ints/floats)."""
    out = []
    for r in range(len(x)):
        masks_left = sum(candidates[r])
        if masks_left == 0:  # rows without candidates do not change
            out.append(list(x[r]))
            continue
        row = [new[r][j] if (remasks or candidates[r][j]) else x[r][j] for j in range(len(x[r]))]

        def open_(j):
            return row[j] == MASK and (fillable is None or fillable[r][j])

        still = [j for j in range(len(row)) if open_(j)]
        if len(still) >= masks_left:  # no progress: commit the most confident proposal (first on ties)
            best = max(still, key=lambda j: (confidence[r][j], -j))
            row[best] = proposal[r][best]
        if last:  # the budget's last step fills every remaining mask
            row = [proposal[r][j] if open_(j) else row[j] for j in range(len(row))]
        out.append(row)
    return out


def _case(rng: random.Random, rows: int, length: int, remasks: bool):
    x = [[rng.choice([MASK, MASK, 3, 4, 5]) for _ in range(length)] for _ in range(rows)]
    candidates = [[t == MASK for t in row] for row in x]
    if rows > 1:  # one row already finished: no candidates
        x[0] = [rng.choice([3, 4, 5]) for _ in range(length)]
        candidates[0] = [False] * length
    proposal = [[rng.randrange(10, 20) for _ in range(length)] for _ in range(rows)]
    confidence = [[rng.choice([0.1, 0.2, 0.5, 0.5, 0.9]) for _ in range(length)] for _ in range(rows)]
    new = []
    for r in range(rows):
        kind = rng.choice(["stall", "commit", "touch"])
        row = list(x[r])
        for j in range(length):
            if kind == "commit" and candidates[r][j] and rng.random() < 0.5:
                row[j] = proposal[r][j]
            elif kind == "touch" and rng.random() < 0.4:  # writes outside the candidates too
                row[j] = rng.choice([proposal[r][j], MASK])
        new.append(row)
    if remasks:  # a remasking sampler masks some committed tokens again
        for r in range(rows):
            for j in range(length):
                if not candidates[r][j] and rng.random() < 0.3:
                    new[r][j] = MASK
    fillable = None
    if rng.random() < 0.5:
        fillable = [[candidates[r][j] or rng.random() < 0.5 for j in range(length)] for r in range(rows)]
    return x, candidates, new, proposal, confidence, fillable


@pytest.mark.parametrize("remasks", [False, True])
@pytest.mark.parametrize("last", [False, True])
def test_guarantees_equal_the_plain_reference(remasks, last):
    rng = random.Random(f"{remasks}{last}")
    for _ in range(150):
        rows, length = rng.randrange(1, 4), rng.randrange(1, 7)
        x, candidates, new, proposal, confidence, fillable = _case(rng, rows, length, remasks)
        want = _reference(x, candidates, new, proposal, confidence, remasks=remasks, last=last, fillable=fillable)
        result = StepResult(torch.tensor(new), torch.tensor(proposal), torch.tensor(confidence, dtype=torch.float32))
        got = enforce_step_contract(result, torch.tensor(x), torch.tensor(candidates), remasks=remasks, last=last,
                                    mask_id=MASK, fillable=None if fillable is None else torch.tensor(fillable))
        assert got.tolist() == want, (x, new, fillable)


def test_a_stalled_row_gets_exactly_its_most_confident_proposal():
    x = torch.tensor([[MASK, MASK, MASK, 4], [5, MASK, MASK, MASK]])
    candidates = x == MASK
    proposal = torch.tensor([[11, 12, 13, 14], [15, 16, 17, 18]])
    confidence = torch.tensor([[0.2, 0.7, 0.1, 0.99], [0.99, 0.3, 0.3, 0.6]])
    got = enforce_step_contract(StepResult(x.clone(), proposal, confidence), x, candidates, remasks=False,
                                last=False, mask_id=MASK)
    # Row 0: the 0.99 sits on a committed token, so the best mask is position 1; row 1: position 3.
    assert got.tolist() == [[MASK, 12, MASK, 4], [5, MASK, MASK, 18]]


def test_a_row_that_progressed_is_left_as_the_policy_returned_it():
    x = torch.tensor([[MASK, MASK, MASK]])
    new = torch.tensor([[MASK, 7, MASK]])
    got = enforce_step_contract(StepResult(new, torch.tensor([[1, 2, 3]]), torch.tensor([[0.9, 0.1, 0.8]])), x,
                                x == MASK, remasks=False, last=False, mask_id=MASK)
    assert got.tolist() == [[MASK, 7, MASK]]


def test_a_wrong_shape_is_refused():
    x = torch.full((1, 3), MASK)
    with pytest.raises(RuntimeError, match="shape"):
        enforce_step_contract(StepResult(x[:, :2], x, x.float()), x, x == MASK, remasks=False, last=False,
                              mask_id=MASK)
