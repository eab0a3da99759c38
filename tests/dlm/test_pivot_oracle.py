"""The pivot oracle (sticky HMM, observable state path) and its exact-law metrics (issue 33).

Exact laws are checked against brute-force enumeration of a tiny configuration; the suite's
metrics must put an exact sampler within exact sampling's noise and parallel decoding far outside.
"""
from __future__ import annotations

import json
import math

import pytest
import torch

import dlm
from dlm.oracles import HMMOracle
from dlm.oracles.pivot import PivotOracle, sticky_hmm_parameters
from dlm.tasks.oracle_tasks import (ORACLE_SUITES, PivotTask, expected_total_variation, get_oracle_suite,
                                    law_distances, pivot_metrics)


@pytest.fixture(scope="module")
def tiny():
    """3 states x 2 symbols, length 5: 6^5 = 7776 sequences, enumerable."""
    return PivotOracle(3, 2, 5, stay=0.7, seed=1, concentration=0.5)


def _law_by_enumeration(oracle, statistic, cells):
    seqs, log_p = oracle.enumerate_joint()
    return torch.zeros(cells, dtype=torch.float64).index_add_(0, statistic(seqs), log_p.exp())


def test_parameters_are_sticky_and_block_emitting():
    pi, A, E = sticky_hmm_parameters(8, 8, 0.95, seed=0, concentration=0.5)
    assert A.shape == (8, 8) and E.shape == (8, 64)
    assert (abs(A.diagonal() - 0.95) < 1e-12).all() and (abs(A.sum(1) - 1) < 1e-12).all()
    for k in range(8):  # state k emits only from its own group of 8 symbols
        assert abs(E[k, 8 * k:8 * k + 8].sum() - 1) < 1e-12 and E[k].sum() - E[k, 8 * k:8 * k + 8].sum() == 0
    oracle = get_oracle_suite("oracle-pivot").build()
    assert oracle.num_states >= 6 and oracle.num_symbols >= 64 and oracle.gen_length >= 64
    assert oracle.config.model_type == "oracle-pivot" and isinstance(oracle, HMMOracle)


@pytest.mark.parametrize("kwargs, match", [({"num_states": 1}, "num_states"), ({"symbols_per_state": 0}, "symbols_per_state"),
                                           ({"stay": 1.0}, "stay"), ({"concentration": 0.0}, "concentration")])
def test_bad_parameters_name_the_argument(kwargs, match):
    args = {"num_states": 3, "symbols_per_state": 2, "stay": 0.9, **kwargs}
    with pytest.raises(ValueError, match=match):
        sticky_hmm_parameters(args["num_states"], args["symbols_per_state"], args["stay"],
                              concentration=kwargs.get("concentration", 1.0))


def test_state_path_is_read_off_the_output(tiny):
    x = torch.tensor([[0, 1, 2, 3, 5], [4, 4, 5, 0, 1], [0, 1, tiny.config.mask_token_id, 0, 0]])
    assert tiny.state_path(x).tolist()[:2] == [[0, 0, 1, 1, 2], [2, 2, 2, 0, 0]]
    assert tiny.num_switches(x).tolist() == [2, 1, -1]  # a mask left: no state path
    tops = tiny.top_symbols()
    assert tiny.num_top_symbols(tops[torch.tensor([[0, 0, 1, 2, 2]])]).tolist() == [5]


def test_switch_law_sums_to_one_and_matches_enumeration(tiny):
    law = tiny.switch_count_law()
    assert law.shape == (5,) and abs(float(law.sum()) - 1) < 1e-12
    brute = _law_by_enumeration(tiny, tiny.num_switches, 5)
    assert torch.allclose(law, brute, atol=1e-12, rtol=0)


def test_top_symbol_law_sums_to_one_and_matches_enumeration(tiny):
    law = tiny.top_symbol_count_law()
    assert law.shape == (6,) and abs(float(law.sum()) - 1) < 1e-12
    assert torch.allclose(law, _law_by_enumeration(tiny, tiny.num_top_symbols, 6), atol=1e-12, rtol=0)


def test_exact_entropy_matches_enumeration(tiny):
    seqs, log_p = tiny.enumerate_joint()
    h_brute = float(-(log_p.exp() * log_p).sum())
    h, exact = tiny.entropy()
    assert exact and abs(h - h_brute) < 1e-10


def test_expected_total_variation_is_the_binomial_mean_absolute_deviation():
    from scipy.stats import binom

    law = torch.tensor([0.5, 0.3, 0.15, 0.05], dtype=torch.float64)
    for n in (1, 7, 50):
        k = torch.arange(n + 1, dtype=torch.float64)
        brute = sum(float((torch.from_numpy(binom.pmf(k.numpy(), n, p)) * (k - n * p).abs()).sum()) for p in law.tolist())
        assert abs(expected_total_variation(law, n) - brute / (2 * n)) < 1e-12
    with pytest.raises(ValueError, match="num_samples"):
        expected_total_variation(law, 0)


def test_law_distances():
    law = torch.tensor([0.25, 0.75], dtype=torch.float64)
    tv, kl_f, kl_r = law_distances(torch.tensor([1, 3]), law)
    assert tv == 0 and abs(kl_f) < 1e-15 and kl_r > 0  # the smoothing moves q off p
    tv, kl_f, _ = law_distances(torch.tensor([0, 3]), law, outside=1)
    assert abs(tv - 0.5 * (0.25 + 0.0 + 0.25)) < 1e-12 and math.isinf(kl_f)
    tv, kl_f, kl_r = law_distances(torch.tensor([4, 0]), law, smoothing=0.5)
    q = torch.tensor([4.5, 0.5], dtype=torch.float64) / 5
    assert abs(tv - 0.75) < 1e-12 and abs(kl_f - math.log(4)) < 1e-12
    assert abs(kl_r - float((law * (law.log() - q.log())).sum())) < 1e-12


def test_metrics_refuse_bad_input(tiny):
    with pytest.raises(ValueError, match="PivotOracle"):
        pivot_metrics(HMMOracle.random(2, 2, 4), torch.zeros(3, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="repeats"):
        pivot_metrics(tiny, torch.zeros(3, 5, dtype=torch.long), repeats=1)
    with pytest.raises(ValueError, match="num_samples"):
        tiny.sample_statistics(0)


def test_simulated_statistics_follow_the_exact_laws(tiny):
    """`sample_statistics` (the noise reference) against the exact laws and against `sample`."""
    switches, top = tiny.sample_statistics(40_000, torch.Generator().manual_seed(0))
    law_s, law_t = tiny.switch_count_law(), tiny.top_symbol_count_law()
    noise = expected_total_variation(law_s, 40_000)
    assert law_distances(torch.bincount(switches, minlength=5), law_s)[0] < 3 * noise
    assert law_distances(torch.bincount(top, minlength=6), law_t)[0] < 3 * expected_total_variation(law_t, 40_000)
    x = tiny.sample(40_000, torch.Generator().manual_seed(1))  # the joint of (S, T) too
    joint = lambda s, t: torch.bincount(s * 6 + t, minlength=30).double() / s.numel()
    tv = 0.5 * float((joint(switches, top) - joint(tiny.num_switches(x), tiny.num_top_symbols(x))).abs().sum())
    assert tv < 0.02


@pytest.fixture(scope="module")
def suite_runs():
    """The suite decoded at one token per step in random order (exact) and at 8 tokens per step."""
    suite = get_oracle_suite("oracle-pivot")
    return {"exact": suite.run(sampler="random", num_samples=256, seed=0),
            "parallel": suite.run(sampler="random", steps=8, num_samples=256, seed=0),
            "confidence": suite.run(sampler="confidence", steps=64, num_samples=128, seed=0)}


def test_exact_sampler_scores_within_noise(suite_runs):
    run = suite_runs["exact"]
    m = run.metrics
    assert run.nfe == 64 and run.tpf == 1.0 and m.num_samples == 256 and m.valid_fraction == 1.0
    assert m.total_variation <= m.reference_total_variation_q95
    assert m.total_variation == max(m.total_variation_switches, m.total_variation_top)
    assert m.total_variation_switches <= m.reference_total_variation_switches_q95
    assert m.total_variation_top <= m.reference_total_variation_top_q95
    assert m.kl_empirical_to_true <= m.reference_kl_empirical_to_true_q95
    assert m.chi2_pvalue > 0.01 and abs(m.log_prob_gap) < 3 * m.log_prob_gap_stderr
    # the noise floor: the replicates' mean TV agrees with its exact expectation
    expected = m.expected_total_variation_switches
    assert abs(m.reference_total_variation_switches - expected) < 0.1 * expected


def test_many_tokens_per_step_scores_measurably_worse(suite_runs):
    exact, parallel = suite_runs["exact"].metrics, suite_runs["parallel"].metrics
    assert suite_runs["parallel"].nfe == 8
    # independent commits break runs: more switches, outputs less likely than exact samples
    assert parallel.total_variation_switches > 5 * parallel.reference_total_variation_switches_q95
    assert parallel.mean_switches > 2 * parallel.expected_switches and parallel.chi2_pvalue < 1e-6
    assert parallel.log_prob_gap > 10 * parallel.log_prob_gap_stderr
    assert parallel.total_variation > exact.total_variation + 0.5


def test_confidence_order_is_mode_seeking_even_at_one_token_per_step(suite_runs):
    m = suite_runs["confidence"].metrics
    assert m.mean_switches < 0.5 * m.expected_switches
    assert m.total_variation_switches > 3 * m.reference_total_variation_switches_q95
    # too many top symbols: over-likely outputs
    assert m.total_variation_top > 3 * m.reference_total_variation_top_q95 and m.mean_top_symbols > m.expected_top_symbols
    assert m.log_prob_gap < -10 * m.log_prob_gap_stderr


def test_runs_are_deterministic(suite_runs):
    again = get_oracle_suite("oracle-pivot").run(sampler="random", steps=8, num_samples=256, seed=0)
    assert again.metrics.to_dict() == suite_runs["parallel"].metrics.to_dict()
    other = get_oracle_suite("oracle-pivot").run(sampler="random", steps=8, num_samples=256, seed=1)
    assert other.metrics.to_dict() != suite_runs["parallel"].metrics.to_dict()


def test_registered_and_run_by_dlm_bench(tmp_path):
    from dlm.cli import main

    suite = ORACLE_SUITES["oracle-pivot"]
    assert isinstance(suite, PivotTask)
    out = tmp_path / "bench"
    assert main(["bench", "--suite", "oracle-pivot", "--limit", "32", "--steps", "8,64", "--samplers", "random",
                 "--no-plots", "--threads", "1", "--out", str(out)]) == 0
    result = json.loads((out / "results.json").read_text())
    assert result["meta"]["quality_metric"] == suite.quality_metric and result["meta"]["prompts"] == 32
    for pair in result["pairs"]:
        assert pair["quality"] == pytest.approx(100 * (1 - pair["extra"]["total_variation"]))
        assert pair["extra"]["statistic"].startswith("S = state switches")
    assert [p["tpf"] for p in result["pairs"]] == [8.0, 1.0]
    assert (out / "results.csv").read_text().count("\n") == 3
