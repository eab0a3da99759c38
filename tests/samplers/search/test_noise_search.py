"""Noise search: budgets in NFE, best-of-N correctness, ZO geometry, verifier validation."""
import math

import pytest
import torch
from diffusers import DDIMScheduler

from samplers.search.noise_search import (FunctionDenoiser, SchedulerDenoiser, paths_cost, paths_plan, paths_search,
                                   random_search, run_search, zero_order_search, zo_neighbors)
from samplers.search.verifiers import (ClassifierVerifier, FunctionVerifier, LogDensityVerifier, as_verifier,
                                check_scores)

torch.set_num_threads(1)
SHAPE = (1, 4, 4)


def toy_denoiser(num_steps=5):
    """Deterministic 'denoiser': each step shrinks the state halfway to tanh(x); x0 = tanh(x)."""
    abars = [0.01 + 0.99 * i / num_steps for i in range(num_steps)] + [1.0]

    def fn(x, start, stop):
        for _ in range(start, stop):
            x = 0.5 * x + 0.5 * torch.tanh(x)
        return x

    return FunctionDenoiser(fn, abars, SHAPE, x0_fn=lambda x, i: torch.tanh(x))


def mean_verifier(x):
    return x.flatten(1).mean(1)


class CountingEps:
    def __init__(self):
        self.calls = 0

    def __call__(self, x, t):
        self.calls += x.shape[0]
        return 0.1 * x


def scheduler_denoiser(steps=6):
    eps = CountingEps()
    return SchedulerDenoiser(eps, DDIMScheduler(), steps, SHAPE), eps


@pytest.mark.parametrize("method", ["random", "zero-order", "paths"])
@pytest.mark.parametrize("budget", [6, 13, 40, 97])
def test_budget_never_exceeded(method, budget):
    den, eps = scheduler_denoiser(6)
    g = torch.Generator().manual_seed(0)
    try:
        res = run_search(method, den, mean_verifier, budget_nfe=budget, generator=g)
    except ValueError as err:  # a budget below one path/trajectory must be refused, not overspent
        assert "budget" in str(err)
        assert eps.calls == 0
        return
    assert res.nfe <= budget
    assert eps.calls == den.calls == res.nfe  # the plan matches the model calls actually made
    assert res.history[-1]["nfe"] == res.nfe
    assert res.best_sample.shape == SHAPE and res.best_noise.shape == SHAPE


def test_random_search_picks_max_among_candidates():
    den = toy_denoiser()
    g = torch.Generator().manual_seed(3)
    res = random_search(den, mean_verifier, num_candidates=9, generator=g, batch_size=4)
    assert res.scores.shape == (9,) and res.samples.shape == (9,) + SHAPE
    assert res.best_score == pytest.approx(res.scores.max().item())
    # recompute independently from the same seed
    noises = torch.randn((9,) + SHAPE, generator=torch.Generator().manual_seed(3))
    ref = mean_verifier(den.fn(noises, 0, den.num_steps))
    assert torch.allclose(ref, res.scores, atol=1e-6)
    assert torch.equal(res.best_noise, noises[int(ref.argmax())])
    assert res.nfe == 9 * den.num_steps


def test_random_search_candidates_over_budget_raises():
    with pytest.raises(ValueError, match="exceeds budget"):
        random_search(toy_denoiser(5), mean_verifier, num_candidates=3, budget_nfe=14)


def test_zo_neighbors_keep_norm_and_angle():
    p = torch.randn(SHAPE, generator=torch.Generator().manual_seed(0))
    nb = zo_neighbors(p, 16, lam=0.95, generator=torch.Generator().manual_seed(1))
    assert nb.shape == (16,) + SHAPE
    norms = nb.flatten(1).norm(dim=1)
    assert torch.allclose(norms, p.norm().expand(16), rtol=1e-5)
    cos = (nb.flatten(1) @ p.flatten()) / (norms * p.norm())
    assert torch.allclose(cos, torch.full((16,), 0.95), atol=1e-5)


def test_zero_order_moves_uphill_and_uses_budget():
    den = toy_denoiser(4)
    res = zero_order_search(den, mean_verifier, budget_nfe=4 * 11, num_neighbors=4,
                            generator=torch.Generator().manual_seed(0))
    assert res.nfe == 44 and res.scores.shape == (11,)  # pivot + 4 + 4 + 2 (partial last round)
    bests = [h["best_score"] for h in res.history]
    assert bests == sorted(bests)
    assert res.best_score == pytest.approx(res.scores.max().item())


def test_paths_plan_and_cost():
    plan = paths_plan(10, 4, 2, 4)
    assert plan == [(2, 6), (4, 8), (6, 10)]
    assert paths_cost(1, 2, 10, 4, plan) == 4 + 2 * (5 + 5 + 4)
    den = toy_denoiser(10)
    res = paths_search(den, mean_verifier, budget_nfe=100, num_branches=2, start_index=4, forward_steps=2,
                       backward_steps=4, generator=torch.Generator().manual_seed(0))
    assert res.nfe == 3 * 32 and den.calls == res.nfe
    assert res.scores.shape == (3,)
    with pytest.raises(ValueError):
        paths_plan(10, 4, 3, 3)
    # a one-step grid has no room to expand: plain best-of-N, still within budget
    one = paths_search(toy_denoiser(1), mean_verifier, budget_nfe=3, generator=torch.Generator().manual_seed(0))
    assert one.nfe == 3 and one.scores.shape == (3,)


def test_verifier_validation_errors_name_the_verifier():
    v = FunctionVerifier(lambda x: x.flatten(1).mean(1, keepdim=True), name="bad-shape")
    with pytest.raises(ValueError, match="bad-shape"):
        v(torch.zeros(3, 1, 4, 4))
    v = FunctionVerifier(lambda x: torch.zeros(x.shape[0], dtype=torch.long), name="int-scores")
    with pytest.raises(ValueError, match="int-scores.*floating"):
        v(torch.zeros(3, 1, 4, 4))
    v = FunctionVerifier(mean_verifier, name="shaped", sample_shape=SHAPE)
    with pytest.raises(ValueError, match="shaped"):
        v(torch.zeros(3, 1, 8, 8))
    with pytest.raises(ValueError, match="shaped.*floating"):
        v(torch.zeros((3,) + SHAPE, dtype=torch.long))
    with pytest.raises(ValueError, match="nan-scores"):
        check_scores("nan-scores", torch.tensor([0.0, float("nan")]), 2)
    with pytest.raises(ValueError):
        as_verifier(3)
    # a search with a broken verifier fails loudly
    with pytest.raises(ValueError, match="bad"):
        random_search(toy_denoiser(), as_verifier(lambda x: x, "bad"), num_candidates=2)


def test_classifier_and_log_density_verifiers():
    logits = lambda x: torch.stack([x.flatten(1).mean(1), -x.flatten(1).mean(1)], 1)
    v = ClassifierVerifier(logits, target=0, name="toy-clf")
    x = torch.randn(5, 1, 4, 4)
    s = v(x)
    assert s.shape == (5,) and (s <= 0).all()
    assert torch.allclose(s.exp() + ClassifierVerifier(logits, 1)(x).exp(), torch.ones(5), atol=1e-5)
    with pytest.raises(ValueError, match="toy-clf"):
        ClassifierVerifier(logits, target=7, name="toy-clf")(x)
    ld = LogDensityVerifier(lambda x: -0.5 * x.flatten(1).pow(2).sum(1).double(), sample_shape=SHAPE)
    assert ld(x).dtype == torch.float32


def test_gmm_oracle_verifier_and_search():
    from dlm.oracles.gaussian_mixture import plane_oracle
    from samplers.search.verifiers import gmm_verifier

    oracle = plane_oracle()
    v = gmm_verifier(oracle)
    den = SchedulerDenoiser(lambda x, t: oracle(x, t).sample, DDIMScheduler(), 8, (2,))
    one = random_search(den, v, num_candidates=1, generator=torch.Generator().manual_seed(0))
    many = random_search(den, v, num_candidates=32, generator=torch.Generator().manual_seed(0))
    assert many.best_score >= one.best_score
    assert math.isfinite(many.best_score)
    with pytest.raises(ValueError, match="gmm-log-density"):
        v(torch.zeros(2, 3))
