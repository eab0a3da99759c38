"""Exact behaviour of the baseline step policies on hand-made logits."""
from __future__ import annotations

import math

import pytest
import torch

from samplers import StepContext, get_sampler
from samplers.unmasking.entropy_bounded import entropy_bounded_count
from samplers.unmasking.threshold import factor_count

MASK = 9


def ctx_for(x, k, temperature=0.0):
    candidates = x == MASK
    return StepContext(x=x, candidates=candidates, num_transfer=torch.tensor([k] * x.shape[0]), step=0,
                       steps_in_block=4, last_step=False, temperature=temperature, generator=None, mask_token_id=MASK)


def logits_from_probs(rows):
    return torch.tensor(rows, dtype=torch.float32).clamp_min(1e-9).log().unsqueeze(0)


# position 0 committed; 1: p=.6/.4 (low margin); 2: p=.5/.1x5 (higher margin, lower top-prob than 1); 3: p=.3
PROBS = [
    [1.0, 0, 0, 0, 0, 0],
    [0.6, 0.4, 0, 0, 0, 0],
    [0.0, 0.5, 0.1, 0.1, 0.1, 0.2],
    [0.3, 0.25, 0.25, 0.2, 0, 0],
]
X = torch.tensor([[4, MASK, MASK, MASK]])


def test_confidence_commits_most_probable():
    res = get_sampler("confidence").step(logits_from_probs(PROBS), ctx_for(X, 1))
    assert res.x.tolist() == [[4, 0, MASK, MASK]]


def test_margin_prefers_the_decided_position():
    # margins: pos1 0.2, pos2 0.3, pos3 0.05 -> pos 2 first although its top-prob is lower.
    res = get_sampler("margin").step(logits_from_probs(PROBS), ctx_for(X, 1))
    assert res.x.tolist() == [[4, MASK, 1, MASK]]


def test_entropy_prefers_low_entropy():
    res = get_sampler("entropy").step(logits_from_probs(PROBS), ctx_for(X, 1))
    assert res.x.tolist() == [[4, 0, MASK, MASK]]  # H(pos1)=0.67 < H(pos2)=1.36 < H(pos3)=1.37


def test_threshold_commits_all_above_tau_and_at_least_floor():
    probs = [[1, 0, 0], [0.95, 0.05, 0], [0.92, 0.08, 0], [0.5, 0.5, 0]]
    x = torch.tensor([[0, MASK, MASK, MASK]])
    res = get_sampler("threshold", tau=0.9).step(logits_from_probs(probs), ctx_for(x, 1))
    assert res.x.tolist() == [[0, 0, 0, MASK]]
    res = get_sampler("threshold", tau=0.99).step(logits_from_probs(probs), ctx_for(x, 1))
    assert res.x.tolist() == [[0, 0, MASK, MASK]]  # nothing passes: the floor commits the top-1


def test_factor_rule():
    conf = torch.tensor([[0.99, 0.7, 0.5, 0.2]], dtype=torch.float64)
    cand = torch.ones_like(conf, dtype=torch.bool)
    # f=1: need c_m >= 1 - 1/(m+1): m=1 .5, m=2 .667, m=3 .75 -> 0.99 ok, 0.7 ok, 0.5 fails -> n=2
    assert factor_count(conf, cand, 1.0).tolist() == [2]


def test_entropy_bound_prefix():
    h = torch.tensor([[0.05, 0.3, 0.02, 0.5]])
    cand = torch.tensor([[True, True, True, True]])
    # sorted 0.02, 0.05, 0.3, 0.5: k=1 -> 0; k=2 -> 0.02; k=3 -> 0.07; k=4 -> 0.37
    assert entropy_bounded_count(h, cand, 0.1).tolist() == [3]
    assert entropy_bounded_count(h, cand, 0.0).tolist() == [1]


def test_gumbel_max_samples_the_softmax():
    from samplers.unmasking._common import gumbel_max
    logits = torch.tensor([[[math.log(0.7), math.log(0.2), math.log(0.1)]]]).expand(1, 40000, 3)
    draws = gumbel_max(logits, 1.0, torch.Generator().manual_seed(0))
    freq = torch.bincount(draws.flatten(), minlength=3).double() / draws.numel()
    assert torch.allclose(freq, torch.tensor([0.7, 0.2, 0.1], dtype=torch.float64), atol=0.01)


@pytest.mark.parametrize("name,bad", [("threshold", {"tau": 0}), ("threshold", {"factor": -1}),
                                      ("eb", {"gamma": -0.1}), ("confidence", {"alg_temp": -1})])
def test_invalid_config_is_refused(name, bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        get_sampler(name, **bad)


def test_position_aware_trades_confidence_against_distance_from_the_block_start():
    """score = log p - decay * j: decay 0 is confidence; pos 3 (p .9) keeps its lead over pos 1 (p .5)
    while 2 * decay < log(.9 / .5) = 0.588, so the switch is exactly between decay 0.29 and 0.30;
    a large decay is left to right."""
    probs = [[1.0, 0, 0, 0, 0, 0], [0.5, 0.5, 0, 0, 0, 0], [0.6, 0.4, 0, 0, 0, 0], [0.9, 0.1, 0, 0, 0, 0]]
    x = torch.tensor([[4, MASK, MASK, MASK]])
    logits = logits_from_probs(probs)
    plain = get_sampler("confidence").step(logits, ctx_for(x, 1)).x
    assert get_sampler("position", decay=0.0).step(logits, ctx_for(x, 1)).x.tolist() == plain.tolist() == [[4, MASK, MASK, 0]]
    assert get_sampler("position", decay=0.29).step(logits, ctx_for(x, 1)).x.tolist() == [[4, MASK, MASK, 0]]
    assert get_sampler("position", decay=0.30).step(logits, ctx_for(x, 1)).x.tolist() == [[4, 0, MASK, MASK]]
    assert get_sampler("position", decay=5.0).step(logits, ctx_for(x, 2)).x.tolist() == [[4, 0, 0, MASK]]
    for bad in (-0.1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="decay must be a finite number >= 0"):
            get_sampler("position", decay=bad)
