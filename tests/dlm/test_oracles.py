"""The analytic oracle languages and the exactness of one-token-per-step random-order decoding.

The key property (DESIGN "Test bed without downloads"): with exact conditionals, committing ONE
token per step at a uniformly random masked position and sampling it at temperature 1 draws the
exact joint (chain rule in a random order; also within semi-AR blocks, since the factorisation
holds for any order). The chi-square tests below check that end to end through `dlm.generate`, and
the power tests check that the same test does reject parallel decoding.
"""
from __future__ import annotations

import itertools
import math

import pytest
import torch

import dlm
from dlm.oracles import IMPOSSIBLE_LOGIT, HMMOracle, PermutationOracle
from dlm.tasks.oracle_tasks import (ORACLE_SUITE_NAMES, cell_counts, chi_square_test, get_oracle_suite,
                                    merge_small_cells, oracle_metrics)

pytest.importorskip("scipy")

# Peaked parameters (Dirichlet 0.3): strong dependence between neighbours, so parallel decoding is
# detectably wrong with a few ten thousand samples. 3^5 = 243 cells.
HMM_SEED = 1
P_ACCEPT = 1e-3
P_REJECT = 1e-6


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _decode(oracle, num_samples, seed, **kwargs):
    g = torch.Generator().manual_seed(seed)
    out = dlm.generate(oracle, oracle.prompt(num_samples), gen_length=oracle.gen_length, temperature=1.0,
                       generator=g, **kwargs)
    assert out.sequences.shape == (num_samples, 1 + oracle.gen_length)
    return out.sequences


def _random_masks(oracle, num_rows, seed):
    """`[num_rows, 1 + n]` inputs: exact samples with a random subset of positions masked."""
    g = torch.Generator().manual_seed(seed)
    gen = oracle.sample(num_rows, g)
    hide = torch.rand(gen.shape, generator=g) < 0.5
    gen = torch.where(hide, torch.full_like(gen, oracle.config.mask_token_id), gen)
    return torch.cat([oracle.prompt(num_rows), gen], dim=1)


# -- permutation language -----------------------------------------------------------------------------
def test_permutation_conditionals_are_uniform_over_unused_symbols():
    oracle = PermutationOracle(6)
    x = _random_masks(oracle, 200, seed=0)
    cond = oracle.conditionals(x)
    gen = x[:, 1:]
    mask = oracle.config.mask_token_id
    assert torch.allclose(cond.sum(-1), torch.ones(200, 6, dtype=torch.float64))
    for row in range(200):
        used = {int(t) for t in gen[row] if t != mask}
        unused = [v for v in range(6) if v not in used]
        for i in range(6):
            expected = torch.zeros(6, dtype=torch.float64)
            if gen[row, i] == mask:
                expected[unused] = 1.0 / len(unused)
            else:
                expected[gen[row, i]] = 1.0
            assert torch.allclose(cond[row, i], expected)
    logits = oracle(x)
    assert logits.shape == (200, 7, oracle.config.vocab_size) and torch.isfinite(logits).all()
    assert torch.allclose(torch.softmax(logits[:, 1:].double(), -1)[..., :6], cond, atol=1e-6)
    assert (logits[:, 1:, 6:] == IMPOSSIBLE_LOGIT).all()  # BOS / MASK / EOS never proposed
    assert (logits[:, 0].argmax(-1) == oracle.config.bos_token_id).all()


def test_permutation_log_prob_validity_and_samples():
    oracle = PermutationOracle(4)
    seqs, log_p = oracle.enumerate_joint()
    assert seqs.shape == (24, 4) and torch.allclose(log_p.exp().sum(), torch.tensor(1.0, dtype=torch.float64))
    assert torch.allclose(log_p, torch.full((24,), -math.log(24), dtype=torch.float64))
    bad = torch.tensor([[0, 0, 1, 2], [0, 1, 2, 4], [3, 2, 1, 0]])
    assert oracle.is_valid(bad).tolist() == [False, False, True]
    assert oracle.log_prob(bad)[:2].isneginf().all()
    samples = oracle.sample(24_000, torch.Generator().manual_seed(0))
    assert oracle.is_valid(samples).all()
    assert chi_square_test(oracle, samples).pvalue > P_ACCEPT


def test_longer_prompt_and_guidance_do_not_change_the_oracle():
    oracle = PermutationOracle(4)
    prompt = oracle.prompt(500, prompt_length=3)
    out = dlm.generate(oracle, prompt, gen_length=4, steps=4, sampler="random", temperature=1.0,
                       cfg_scale=1.5, generator=torch.Generator().manual_seed(0))
    assert (out.sequences[:, :3] == prompt).all() and oracle.is_valid(out.sequences).all()


def test_oracle_refuses_a_wrong_generation_length():
    oracle = PermutationOracle(4)
    with pytest.raises(ValueError, match="gen_length=4"):
        dlm.generate(oracle, oracle.prompt(2), gen_length=3, steps=3, sampler="random")
    with pytest.raises(ValueError, match="at least one BOS"):
        oracle(torch.full((1, 4), oracle.config.mask_token_id))


# -- hidden-Markov language ---------------------------------------------------------------------------
def _brute_force_joint(oracle):
    """`{sequence: p}` by summing over every hidden path (no forward algorithm)."""
    pi, A, E = oracle.initial, oracle.transition, oracle.emission
    joint = {}
    for x in itertools.product(range(oracle.V), repeat=oracle.n):
        total = 0.0
        for z in itertools.product(range(oracle.num_states), repeat=oracle.n):
            p = pi[z[0]] * E[z[0], x[0]]
            for i in range(1, oracle.n):
                p = p * A[z[i - 1], z[i]] * E[z[i], x[i]]
            total += float(p)
        joint[x] = total
    return joint


def test_hmm_log_prob_matches_brute_force_enumeration():
    oracle = HMMOracle.random(3, 3, 4, seed=HMM_SEED)
    joint = _brute_force_joint(oracle)
    seqs, log_p = oracle.enumerate_joint()
    brute = torch.tensor([joint[tuple(s.tolist())] for s in seqs], dtype=torch.float64)
    assert torch.allclose(log_p.exp(), brute, rtol=1e-10, atol=0)
    assert abs(float(log_p.exp().sum()) - 1.0) < 1e-12
    assert oracle.log_prob(torch.tensor([[0, 1, oracle.config.mask_token_id, 2]])).isneginf().all()


def test_hmm_posterior_marginals_match_brute_force():
    oracle = HMMOracle.random(3, 3, 4, seed=HMM_SEED)
    joint = _brute_force_joint(oracle)
    mask = oracle.config.mask_token_id
    x = _random_masks(oracle, 60, seed=1)
    x[0, 1:] = mask  # the unconditional marginals
    cond = oracle.conditionals(x)
    assert torch.allclose(cond.sum(-1), torch.ones(60, 4, dtype=torch.float64))
    for row in range(60):
        gen = x[row, 1:].tolist()
        consistent = {s: p for s, p in joint.items() if all(g == mask or g == v for g, v in zip(gen, s))}
        z = sum(consistent.values())
        for i in range(4):
            expected = torch.zeros(3, dtype=torch.float64)
            if gen[i] == mask:
                for s, p in consistent.items():
                    expected[s[i]] += p / z
            else:
                expected[gen[i]] = 1.0
            assert torch.allclose(cond[row, i], expected, rtol=1e-9, atol=1e-12), (row, i)
    logits = oracle(x)
    assert torch.isfinite(logits).all() and (logits[:, 1:, 3:] == IMPOSSIBLE_LOGIT).all()
    assert torch.allclose(torch.softmax(logits[:, 1:].double(), -1)[..., :3], cond, atol=1e-5)


def test_hmm_ancestral_samples_match_joint():
    oracle = HMMOracle.random(3, 3, 5, seed=HMM_SEED)
    samples = oracle.sample(30_000, torch.Generator().manual_seed(0))
    assert chi_square_test(oracle, samples).pvalue > P_ACCEPT


# -- exactness of one-token-per-step random-order decoding --------------------------------------------
def test_random_order_one_token_per_step_samples_the_hmm_joint():
    oracle = HMMOracle.random(3, 3, 5, seed=HMM_SEED)
    seqs = _decode(oracle, 30_000, seed=0, steps=5, sampler="random")
    result = chi_square_test(oracle, seqs)
    assert result.outside == 0 and result.dof > 50
    assert result.pvalue > P_ACCEPT, result


def test_random_order_one_token_per_step_samples_the_permutation_joint():
    oracle = PermutationOracle(5)
    seqs = _decode(oracle, 24_000, seed=0, steps=5, sampler="random")
    assert oracle.is_valid(seqs).all()
    result = chi_square_test(oracle, seqs)
    assert result.num_cells == 120 and result.pvalue > P_ACCEPT, result


def test_semi_autoregressive_blocks_stay_exact():
    hmm = HMMOracle.random(3, 3, 6, seed=HMM_SEED)
    result = chi_square_test(hmm, _decode(hmm, 30_000, seed=0, steps=6, block_length=2, sampler="random"))
    assert result.pvalue > P_ACCEPT, result
    perm = PermutationOracle(4)
    seqs = _decode(perm, 12_000, seed=0, steps=4, block_length=2, sampler="random")
    assert perm.is_valid(seqs).all() and chi_square_test(perm, seqs).pvalue > P_ACCEPT


# -- the test has power: parallel decoding is caught ---------------------------------------------------
def test_parallel_decoding_breaks_permutations():
    oracle = PermutationOracle(4)
    for sampler in ("confidence", "random"):
        seqs = _decode(oracle, 4_000, seed=0, steps=2, sampler=sampler)
        valid = oracle.is_valid(seqs).double().mean()
        assert 0.0 < valid < 0.9, (sampler, valid)
        assert chi_square_test(oracle, seqs).pvalue == 0.0


def test_parallel_decoding_is_rejected_on_the_hmm():
    oracle = HMMOracle.random(3, 3, 5, seed=HMM_SEED)
    for sampler in ("random", "confidence"):
        result = chi_square_test(oracle, _decode(oracle, 30_000, seed=0, steps=3, sampler=sampler))
        assert result.pvalue < P_REJECT, (sampler, result)


# -- metrics and suites ---------------------------------------------------------------------------------
def test_merge_small_cells_pools_until_expected_count():
    obs, exp = merge_small_cells(torch.tensor([1, 0, 2, 10, 30]), torch.tensor([0.5, 1.0, 2.0, 9.0, 30.0]), 5.0)
    assert obs.sum() == 43 and abs(exp.sum() - 42.5) < 1e-12 and (exp >= 5.0).all()


def test_oracle_metrics_exact_versus_parallel():
    oracle = HMMOracle.random(3, 3, 5, seed=HMM_SEED)
    exact = oracle_metrics(oracle, oracle.sample(20_000, torch.Generator().manual_seed(3)), seed=4)
    assert exact.valid_fraction == 1.0 and exact.expected_log_prob_exact
    entropy = -exact.expected_log_prob
    assert abs(exact.log_prob_gap) < 0.05 * entropy
    assert exact.total_variation < 2 * exact.reference_total_variation
    assert exact.num_cells == 243 and exact.chi2_pvalue > P_ACCEPT
    parallel = oracle_metrics(oracle, _decode(oracle, 20_000, seed=0, steps=1, sampler="random"), seed=4)
    assert parallel.total_variation > exact.total_variation + 0.05
    assert parallel.kl_empirical_to_true > exact.kl_empirical_to_true
    assert parallel.log_prob_gap > 0.1  # independent marginals: less likely than the chain's samples

    perm = PermutationOracle(4)
    bad = oracle_metrics(perm, _decode(perm, 2_000, seed=0, steps=1, sampler="random"))
    assert bad.valid_fraction < 0.2 and math.isinf(bad.kl_empirical_to_true)
    assert abs(bad.log_prob_gap) < 1e-9  # every valid permutation is equally likely
    counts = cell_counts(perm, perm.sample(100, torch.Generator().manual_seed(0)))
    assert counts.total == 100 and counts.outside == 0


def test_oracle_suites_are_registered_and_run():
    assert set(ORACLE_SUITE_NAMES) == {"oracle-permutation", "oracle-hmm", "oracle-pivot", "oracle-keyed",
                                       "oracle-runs", "oracle-schedules"}  # the last three: tests/dlm/test_seed_beds.py
    with pytest.raises(ValueError, match="oracle-hmm"):
        get_oracle_suite("oracle-nope")
    for name in ("oracle-permutation", "oracle-hmm"):  # oracle-pivot: tests/dlm/test_pivot_oracle.py
        suite = get_oracle_suite(name)
        run = suite.run(sampler="random", num_samples=256, seed=0)
        assert run.nfe == 8 and run.metrics.valid_fraction == 1.0 and run.metrics.num_samples == 256
        row = run.to_dict()
        assert row["suite"] == name and row["steps"] == 8 and "total_variation" in row
    fast = get_oracle_suite("oracle-permutation").run(sampler="confidence", steps=2, num_samples=256)
    assert fast.nfe == 2 and fast.metrics.valid_fraction < 0.5
