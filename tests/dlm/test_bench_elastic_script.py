"""scripts/bench_elastic.py --smoke: what it counts per setting, checked against each cache's schedule
worked out by hand, its exact settings, and its noise-band arithmetic."""
import json
import math

import pytest

from script_loader import load_script  # tests/script_loader.py (tests/ is on sys.path)


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("elastic-smoke")
    script = load_script("bench_elastic.py")
    assert script.main(["--smoke", "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    beds = {(e["bed"], e["sampler"]): {r["setting"]: r for r in e["rows"]} for e in results["beds"]}
    return script, out, results, beds


def _replica_schedule(P=6, G=32, Lb=16, steps=32, probe=4):
    """Forward tokens per sequence of each cache on the smoke replica bed (confidence: one token per step,
    `steps // blocks` steps per block, no EOS stop), counted from each mode's rule."""
    L, blocks = P + G, G // Lb
    per = steps // blocks
    starts = [P + b * Lb for b in range(blocks)]
    window = lambda s, e: e - s  # noqa: E731
    none = steps * L
    prompt = L + (steps - 1) * G  # one full forward, then the whole response every step
    prefix = sum(L + (per - 1) * window(s, L) for s in starts)  # full at each block start, then block..end
    dual = blocks * (L + (per - 1) * Lb)  # full at each block start, then the block
    # across blocks: the first block's full forward, then each block starts by recomputing from the previous
    # block's start to the end
    prefix_x = L + (per - 1) * (L - P) + sum((L - (s - Lb)) + (per - 1) * (L - s) for s in starts[1:])
    dual_x = L + (per - 1) * Lb + sum((L - (s - Lb)) + (per - 1) * Lb for s in starts[1:])
    dual_r2 = blocks * (per // 2 * L + per // 2 * Lb)  # full at even steps
    # threshold 0 never refreshes here (no key or value turns by 90 degrees): like dual_x, but each window and
    # extension also takes up to `probe` cached positions before it; the replica's prompt attends to the
    # response, so the first block's probes are the prompt's last positions
    never = L + (per - 1) * (Lb + min(probe, P)) + sum((L - max(0, s - Lb - probe)) + (per - 1) * (Lb + probe)
                                                       for s in starts[1:])
    return {"none": none, "prompt": prompt, "prefix": prefix, "dual": dual, "prefix xblock": prefix_x,
            "dual xblock": dual_x, "dual refresh=2": dual_r2, "elastic 0 p=4": never, "elastic 1.5 p=2": none}


def test_forward_tokens_and_full_forwards_follow_each_cache_schedule(smoke):
    _, _, _, beds = smoke
    rows = beds[("replica-2", "confidence")]
    expected = _replica_schedule()
    for label, tokens in expected.items():
        assert rows[label]["forward_tokens_per_seq"] == tokens, label
        assert rows[label]["engine_forward_tokens_per_seq"] == tokens, label  # the engine's own tally agrees
        assert rows[label]["forward_tokens_vs_none"] == pytest.approx(tokens / expected["none"])
    full = {k: r["full_forwards_per_seq"] for k, r in rows.items()}
    assert full["none"] == full["elastic 1.5 p=2"] == 32  # every step a full forward
    assert full["prefix"] == full["dual"] == 2 and full["dual refresh=2"] == 16
    assert full["prompt"] == full["prefix xblock"] == full["dual xblock"] == full["elastic 0 p=4"] == 1
    # a refreshing elastic setting lies between never and always
    assert 1 <= full["elastic 0.999 p=2"] <= 32 and all(r["nfe_per_seq"] == 32 for r in rows.values())


def test_exact_settings_score_full_quality_and_approximations_less(smoke):
    _, _, results, beds = smoke
    replica = beds[("replica-2", "confidence")]
    assert replica["none"]["quality_units"] == [100.0, 100.0]  # agreement of the reference with itself
    assert replica["elastic 1.5 p=2"]["quality_units"] == [100.0, 100.0]  # refresh every step: the uncached tokens
    assert replica["dual xblock"]["quality"] < 100  # the bed makes the fixed caches approximate
    entry = next(e for e in results["beds"] if e["bed"] == "replica-2")
    assert len(entry["numerics_floor"]) == 2 and all(0 <= f <= 100 for f in entry["numerics_floor"])
    task = beds[("sum", "threshold")]
    # tiny-dlm-chains-hard's prompt ignores the response: the prompt cache is exact there
    assert task["prompt"]["agreement"] == 100.0 and task["prompt"]["quality_units"] == task["none"]["quality_units"]
    always = task["elastic 1.5 p=2"]
    assert always["forward_tokens_per_seq"] == task["none"]["forward_tokens_per_seq"] and always["agreement"] == 100.0
    assert always["full_forwards_per_seq"] == always["nfe_per_seq"] == task["none"]["nfe_per_seq"]


def test_each_elastic_row_is_compared_with_the_best_fixed_cache_at_no_more_cost(smoke):
    script, out, _, beds = smoke
    for rows in beds.values():
        fixed = [r for r in rows.values() if r["kind"] == "fixed"]
        for r in rows.values():
            if r["kind"] != "elastic":
                continue
            cheaper = [f for f in fixed if f["forward_tokens_per_seq"] <= r["forward_tokens_per_seq"]]
            if cheaper:
                assert rows[r["comparator"]]["quality"] == max(f["quality"] for f in cheaper)
                assert not r["comparator_costs_more"]
            else:
                assert r["comparator_costs_more"]
            diffs = [a - b for a, b in zip(r["quality_units"], rows[r["comparator"]]["quality_units"])]
            assert r["vs_comparator"]["mean"] == pytest.approx(sum(diffs) / len(diffs))
    assert (out / "quality_vs_forward_tokens.png").stat().st_size > 0
    assert "| elastic 0 p=4 |" in (out / "results.md").read_text()


def test_noise_band_is_the_95_percent_t_interval_of_paired_differences(smoke):
    script = smoke[0]
    # differences 1, 2, 3: mean 2, sd 1, t(0.975, 2 dof) = 4.302653
    d = script.paired([1.0, 2.0, 3.0], [0.0, 0.0, 0.0])
    assert d["mean"] == 2 and d["band"] == pytest.approx(4.302653 / math.sqrt(3), rel=1e-6)
    assert script.verdict(d) == "within noise"
    assert script.verdict(script.paired([5.0, 6.0, 7.0], [0.0, 0.0, 0.0])) == "better"
    assert script.verdict(script.paired([0.0, 0.0, 0.0], [5.0, 6.0, 7.0])) == "worse"
    assert script.verdict(script.paired([1.0, 1.0], [1.0, 1.0])) == "equal"
