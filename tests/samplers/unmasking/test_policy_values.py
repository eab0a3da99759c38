"""The scoring step policies against a plain-Python reference of their published rules, on random
batches: several rows, committed positions mixed with masks, quotas from 1 to the whole block.

test_baselines.py checks each rule on one hand-made row; these compare every row of many random
steps with the rule computed again in float64 from the probabilities (math.exp, math.log), so that a
wrong reduction axis, a wrong row, a strict instead of inclusive bound or a wrong constant fails here.
The references are written from the papers' rules as the samplers' docstrings state them:
confidence p(x0) (LLaDA), margin p1 - p2 (Kim et al.), entropy (Dream), position-aware
log p - decay * j (PC-Sampler), threshold tau with the quota as a floor and the factor rule
(Fast-dLLM), entropy-bounded prefix sum H - max H <= gamma (EB-sampler).
"""
from __future__ import annotations

import math
import random

import pytest
import torch

from samplers import StepContext, get_sampler
from samplers.unmasking._common import gumbel_max, step_stats, top_k_mask

MASK = 7
VOCAB = 6
MIN_GAP = 1e-4  # cases whose chosen and next-best scores are closer than this are drawn again


def _probs(row):
    top = max(row)
    e = [math.exp(v - top) for v in row]
    return [v / sum(e) for v in e]


def _stats(logits):
    """Per position: (argmax token, p1, p1 - p2, entropy) in float64."""
    out = []
    for row in logits:
        p = _probs(row)
        token = max(range(len(p)), key=lambda v: (p[v], -v))
        top = sorted(p, reverse=True)
        out.append((token, top[0], top[0] - top[1], -sum(q * math.log(q) for q in p if q > 0)))
    return out


def _top_k(scores, candidates, k):
    """The k candidates with the highest score; None when the k-th and (k+1)-th are too close to call."""
    ranked = sorted((j for j in range(len(scores)) if candidates[j]), key=lambda j: -scores[j])
    if 0 < k < len(ranked) and scores[ranked[k - 1]] - scores[ranked[k]] < MIN_GAP:
        return None
    return set(ranked[:k])


def _reference(name, config, logits, x, k):
    """Plain-Python decision of one row: the set of committed positions, or None if too close to call."""
    stats = _stats(logits)
    candidates = [t == MASK for t in x]
    p1 = [s[1] for s in stats]
    if name == "confidence":
        return _top_k(p1, candidates, k)
    if name == "margin":
        return _top_k([s[2] for s in stats], candidates, k)
    if name == "entropy":
        return _top_k([-s[3] for s in stats], candidates, k)
    if name == "position":
        return _top_k([math.log(max(p, 1e-30)) - config["decay"] * j for j, p in enumerate(p1)], candidates, k)
    if name == "threshold" and "factor" in config:
        ranked = sorted((p1[j] for j in range(len(x)) if candidates[j]), reverse=True)
        n = 0
        while n < len(ranked) and ranked[n] >= 1 - config["factor"] / (n + 2):
            n += 1
        if any(abs(ranked[m] - (1 - config["factor"] / (m + 2))) < MIN_GAP for m in range(len(ranked))):
            return None
        return _top_k(p1, candidates, max(n, k))
    if name == "threshold":
        floor = _top_k(p1, candidates, k)
        if floor is None or any(abs(p1[j] - config["tau"]) < MIN_GAP for j in range(len(x)) if candidates[j]):
            return None
        return floor | {j for j in range(len(x)) if candidates[j] and p1[j] >= config["tau"]}
    if name == "eb":
        entropy = [s[3] for s in stats]
        ranked = sorted(entropy[j] for j in range(len(x)) if candidates[j])
        n = 0
        while n < len(ranked) and sum(ranked[:n + 1]) - ranked[n] <= config["gamma"]:
            n += 1
        if any(abs(sum(ranked[:m]) - config["gamma"]) < MIN_GAP for m in range(1, len(ranked))):
            return None
        return _top_k([-h for h in entropy], candidates, max(n, k))
    raise AssertionError(name)


CASES = [
    ("confidence", {}), ("margin", {}), ("entropy", {}), ("position", {"decay": 0.0}), ("position", {"decay": 0.4}),
    ("threshold", {"tau": 0.5}), ("threshold", {"tau": 0.85}), ("threshold", {"factor": 1.0}),
    ("threshold", {"factor": 2.5}), ("eb", {"gamma": 0.0}), ("eb", {"gamma": 0.6}), ("eb", {"gamma": 3.0}),
]


@pytest.mark.parametrize("name,config", CASES, ids=[f"{n}-{c}" for n, c in CASES])
def test_committed_positions_equal_the_reference(name, config):
    rng = random.Random(f"{name}{config}")
    sampler = get_sampler(name, **config)
    checked = 0
    for _ in range(400):  # draws too close to call are skipped; 40 must be checked
        if checked == 40:
            break
        rows, length = rng.randrange(1, 4), rng.randrange(2, 8)
        x = [[rng.choice([MASK, MASK, MASK, 1, 2]) for _ in range(length)] for _ in range(rows)]
        for row in x:
            row[rng.randrange(length)] = MASK  # every row has a candidate
        k = [rng.randrange(1, sum(t == MASK for t in row) + 1) for row in x]
        scale = rng.choice([1.0, 3.0])
        logits = [[[rng.gauss(0, scale) for _ in range(VOCAB)] for _ in range(length)] for _ in range(rows)]
        want = [_reference(name, config, logits[r], x[r], k[r]) for r in range(rows)]
        if any(w is None for w in want):
            continue
        xt = torch.tensor(x)
        ctx = StepContext(x=xt, candidates=xt == MASK, num_transfer=torch.tensor(k), step=0, steps_in_block=4,
                          last_step=False, temperature=0.0, generator=None, mask_token_id=MASK)
        result = sampler.step(torch.tensor(logits, dtype=torch.float32), ctx)
        for r in range(rows):
            tokens = [s[0] for s in _stats(logits[r])]
            expected = [tokens[j] if j in want[r] else x[r][j] for j in range(length)]
            assert result.x[r].tolist() == expected, (name, config, r)
            assert result.proposal[r].tolist() == tokens
            assert torch.allclose(result.confidence[r].double(), torch.tensor([_stats(logits[r])[j][1] for j in range(length)],
                                                                             dtype=torch.float64), atol=1e-6)
        checked += 1
    assert checked == 40


def test_threshold_bound_is_inclusive():
    # Two equal logits give p = 0.5 exactly in float32: tau = 0.5 accepts both positions.
    logits = torch.tensor([[[0.0, 0.0, -1e9], [0.0, 0.0, -1e9], [2.0, 0.0, -1e9]]])
    x = torch.full((1, 3), MASK)
    ctx = StepContext(x=x, candidates=x == MASK, num_transfer=torch.tensor([1]), step=0, steps_in_block=4,
                      last_step=False, temperature=0.0, generator=None, mask_token_id=MASK)
    assert get_sampler("threshold", tau=0.5).step(logits, ctx).x.tolist() == [[0, 0, 0]]


def test_step_stats_margin_and_entropy_equal_the_reference():
    rng = random.Random(3)
    logits = [[[rng.gauss(0, 2) for _ in range(VOCAB)] for _ in range(5)] for _ in range(3)]
    x = torch.full((3, 5), MASK)
    ctx = StepContext(x=x, candidates=x == MASK, num_transfer=torch.ones(3, dtype=torch.long), step=0,
                      steps_in_block=4, last_step=False, temperature=0.0, generator=None, mask_token_id=MASK)
    s = step_stats(torch.tensor(logits), ctx, margin=True, entropy=True)
    for r in range(3):
        ref = _stats(logits[r])
        assert s.proposal[r].tolist() == [t[0] for t in ref]
        for field, index in (("confidence", 1), ("margin", 2), ("entropy", 3)):
            got = getattr(s, field)[r].double()
            assert torch.allclose(got, torch.tensor([t[index] for t in ref], dtype=torch.float64), atol=1e-5), field


def test_top_k_mask_takes_the_best_candidates_first_index_on_ties():
    scores = torch.tensor([[0.5, 0.9, 0.9, 0.1, 0.9], [0.3, 0.2, 0.1, 0.0, -1.0]])
    candidates = torch.tensor([[True, False, True, True, True], [True, True, True, True, True]])
    got = top_k_mask(scores, candidates, torch.tensor([2, 0]))
    assert got.tolist() == [[False, False, True, False, True], [False] * 5]
    got = top_k_mask(scores, candidates, torch.tensor([9, 3]))  # more than the candidates: all of them
    assert got.tolist() == [[True, False, True, True, True], [True, True, True, False, False]]


@pytest.mark.parametrize("temperature", [0.5, 2.0])
def test_gumbel_max_draws_the_tempered_softmax(temperature):
    logits = torch.tensor([math.log(0.6), math.log(0.3), math.log(0.1)])
    draws = gumbel_max(logits.expand(1, 60000, 3), temperature, torch.Generator().manual_seed(1))
    freq = torch.bincount(draws.flatten(), minlength=3).double() / draws.numel()
    want = torch.softmax(logits.double() / temperature, dim=0)
    assert torch.allclose(freq, want, atol=0.01), (freq, want)


def test_alg_temp_draws_a_position_with_the_softmax_of_its_scores():
    # Dream's alg_temp: with one token to commit, position j is drawn with probability softmax(score / alg_temp).
    probs = [0.9, 0.7, 0.6]  # the proposal is token 0 everywhere: the confidence is p
    logits = torch.tensor([[[math.log(p), math.log(1 - p)] for p in probs]]).expand(20000, 3, 2)
    x = torch.full((20000, 3), MASK)
    ctx = StepContext(x=x, candidates=x == MASK, num_transfer=torch.ones(20000, dtype=torch.long), step=0,
                      steps_in_block=4, last_step=False, temperature=0.0, generator=torch.Generator().manual_seed(0),
                      mask_token_id=MASK)
    committed = get_sampler("confidence", alg_temp=0.25).step(logits, ctx).x != MASK
    assert committed.sum(dim=1).eq(1).all()
    freq = committed.double().mean(dim=0)
    want = torch.softmax(torch.tensor(probs, dtype=torch.float64) / 0.25, dim=0)
    assert torch.allclose(freq, want, atol=0.015), (freq, want)


def test_random_order_commits_uniformly_among_the_candidates():
    x = torch.tensor([[MASK, 1, MASK, MASK]]).expand(30000, 4)
    ctx = StepContext(x=x, candidates=x == MASK, num_transfer=torch.ones(30000, dtype=torch.long), step=0,
                      steps_in_block=4, last_step=False, temperature=0.0, generator=torch.Generator().manual_seed(0),
                      mask_token_id=MASK)
    logits = torch.zeros(30000, 4, 3)
    logits[..., 2] = 5.0
    committed = get_sampler("random").step(logits, ctx).x == 2
    assert committed.sum(dim=1).eq(1).all() and not committed[:, 1].any()
    freq = committed.double().mean(dim=0)
    assert torch.allclose(freq, torch.tensor([1 / 3, 0, 1 / 3, 1 / 3], dtype=torch.float64), atol=0.015)


def test_factor_rule_accepts_confidences_exactly_at_the_bound():
    # n equal confidences exactly at the n-th bound 1 - factor / (n + 1) (float64) pass every bound up to
    # the n-th (the bounds grow with m): all n are accepted; a hair below, only n - 1.
    from samplers.unmasking.threshold import factor_count
    for n in (4, 6):
        bound = 1 - 1.0 / (n + 1)
        candidates = torch.ones(1, n + 1, dtype=torch.bool)
        at = torch.tensor([[bound] * n + [0.1]], dtype=torch.float64)
        assert factor_count(at, candidates, 1.0).tolist() == [n]
        below = torch.tensor([[bound - 1e-12] * n + [0.1]], dtype=torch.float64)
        assert factor_count(below, candidates, 1.0).tolist() == [n - 1]


def test_tau_may_be_one_and_no_more():
    assert get_sampler("threshold", tau=1.0).config.tau == 1.0
    for bad in (1.5, 0.0):
        with pytest.raises(ValueError, match="tau must be in"):
            get_sampler("threshold", tau=bad)


@pytest.mark.parametrize("name,config,temperature", [("random", {}, 0.0), ("random", {}, 1.0),
                                                     ("confidence", {"alg_temp": 0.5}, 0.0),
                                                     ("confidence", {}, 1.0)])
def test_the_generator_alone_decides_the_draws(name, config, temperature):
    """Two steps with generators of the same seed commit the same tokens whatever the global RNG did."""
    rng = random.Random(5)
    logits = torch.tensor([[[rng.gauss(0, 1) for _ in range(VOCAB)] for _ in range(6)] for _ in range(3)])
    x = torch.full((3, 6), MASK)
    results = []
    for global_seed in (1, 2):
        torch.manual_seed(global_seed)
        ctx = StepContext(x=x, candidates=x == MASK, num_transfer=torch.tensor([1, 2, 3]), step=0, steps_in_block=4,
                          last_step=False, temperature=temperature, generator=torch.Generator().manual_seed(0),
                          mask_token_id=MASK)
        results.append(get_sampler(name, **config).step(logits, ctx))
    assert torch.equal(results[0].x, results[1].x) and torch.equal(results[0].proposal, results[1].proposal)


def test_random_order_proposes_the_argmax_with_its_probability_at_temperature_zero():
    rng = random.Random(6)
    logits = [[[rng.gauss(0, 2) for _ in range(VOCAB)] for _ in range(5)] for _ in range(2)]
    x = torch.full((2, 5), MASK)
    ctx = StepContext(x=x, candidates=x == MASK, num_transfer=torch.tensor([2, 5]), step=0, steps_in_block=4,
                      last_step=False, temperature=0.0, generator=torch.Generator().manual_seed(0), mask_token_id=MASK)
    result = get_sampler("random").step(torch.tensor(logits), ctx)
    for r in range(2):
        ref = _stats(logits[r])
        assert result.proposal[r].tolist() == [t[0] for t in ref]
        assert torch.allclose(result.confidence[r].double(), torch.tensor([t[1] for t in ref], dtype=torch.float64),
                              atol=1e-6)
    assert (result.x != MASK).sum(dim=1).tolist() == [2, 5]


def test_top_k_mask_breaks_ties_by_position_on_long_rows():
    # 120 positions, every third one tied at the top: the k first of them by position are chosen (an
    # unstable sort orders ties differently from 64 elements on).
    scores = torch.zeros(2, 120, dtype=torch.float64)
    scores[:, ::3] = 1.0
    got = top_k_mask(scores, torch.ones(2, 120, dtype=torch.bool), torch.tensor([5, 30]))
    assert got[0].nonzero().flatten().tolist() == [0, 3, 6, 9, 12]
    assert got[1].nonzero().flatten().tolist() == list(range(0, 90, 3))
