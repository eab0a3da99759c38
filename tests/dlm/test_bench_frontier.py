"""Equal-quality ratios against a baseline's whole frontier (dlm.bench.frontier)."""
import pytest

from dlm.bench.frontier import best_quality, best_ratio, equal_quality_ratio, frontier_points
from dlm.bench.harness import BenchResult, PairResult


def _pair(sampler, budget, quality, nfe):
    return PairResult(sampler=sampler, budget=budget, engine="dlm", kv_cache="none", n=10, quality=quality,
                      quality_by_task={}, nfe=nfe, nfe_per_call=nfe, tpf=128 / nfe, tokens_per_s=1.0, seconds=1.0,
                      forward_tokens=0, peak_mem_mb=None, mem_method="none")


def _result():
    return BenchResult(config={"gen_length": 128}, meta={}, pairs=[
        _pair("threshold:tau=0.5", 128, 70.0, 20.0),
        _pair("threshold:tau=0.9", 128, 90.0, 60.0),
        _pair("threshold:tau=0.95", 128, 91.0, 80.0),
        _pair("lopa", 64, 89.5, 30.0),
        _pair("lopa", 128, 95.0, 40.0),
        _pair("lopa", 32, 60.0, 10.0),
    ])


def test_ratio_uses_the_cheapest_frontier_point_within_tolerance():
    taus = ["threshold:tau=0.5", "threshold:tau=0.9", "threshold:tau=0.95"]
    rows = equal_quality_ratio(_result(), "lopa", taus, tolerance=1.0)
    assert [r["budget"] for r in rows] == [32, 64, 128]
    # 60% is 10 points below the frontier's cheapest point (70%): no equal-quality point, no ratio
    assert rows[0]["baseline"]["sampler"] == "threshold:tau=0.5" and rows[0]["below"] and rows[0]["nfe_ratio"] is None
    # 89.5 - 1 = 88.5: tau=0.9 (60 NFE) is the cheapest point that good, not tau=0.95
    assert rows[1]["baseline"]["sampler"] == "threshold:tau=0.9" and rows[1]["nfe_ratio"] == pytest.approx(2.0)
    assert rows[2]["baseline"] is None and rows[2]["nfe_ratio"] is None  # beyond the whole frontier
    assert not rows[1]["below"] and best_ratio(rows)["budget"] == 64
    assert best_quality(_result(), taus) == 91.0
    assert [p["nfe"] for p in frontier_points(_result(), taus)] == [20.0, 60.0, 80.0]


def test_no_baseline_pairs_is_an_error():
    with pytest.raises(ValueError, match="no baseline pairs"):
        equal_quality_ratio(_result(), "lopa", ["confidence"])


def test_equally_cheap_baseline_points_match_the_one_of_equal_quality():
    """Two baseline points at the same cost, one within the tolerance of the candidate, one more
    than a point above it: the candidate is at equal quality with the first, not below the second."""
    result = BenchResult(config={"gen_length": 14}, meta={}, pairs=[
        _pair("entropy", 14, 87.0, 14.0), _pair("random", 14, 86.1, 14.0), _pair("lopa", 14, 85.9, 6.0)])
    row = equal_quality_ratio(result, "lopa", ["entropy", "random"], tolerance=1.0)[0]
    assert row["baseline"]["sampler"] == "random" and not row["below"] and row["nfe_ratio"] == pytest.approx(14 / 6)
