"""scripts/bench_caching.py: the head-to-head reading, --extra parsing, and one tiny end-to-end run."""
import json
import math

import pytest
import torch

from script_loader import load_script  # tests/script_loader.py (tests/ is on sys.path)


@pytest.fixture(scope="module")
def bench():
    return load_script("bench_caching.py")


def _row(cache, speedup, psnr, model="pixart", steps=20):
    return dict(model=model, steps=steps, cache=cache, speedup=speedup, psnr=psnr)


def test_head_to_head_takes_our_fastest_row_at_equal_or_better_psnr(bench):
    rows = [
        _row("uncached", 1.0, math.inf),
        _row("never-skip", 0.99, math.inf),
        _row("block:a", 1.9, 40.0),  # faster but below their PSNR: not eligible
        _row("block:b", 1.5, 50.0),
        _row("block:c", 1.7, 45.0),  # the fastest eligible one
        _row("block:d", 3.0, math.inf),  # skipped nothing (PSNR inf): not eligible
        _row("block:e", 5.0, 60.0, steps=50),  # other step count
        _row("diffusers FirstBlockCache(0.1)", 1.6, 45.0),
        _row("diffusers TaylorSeer", 1.0, math.inf),  # skipped nothing: no comparison row
        _row("diffusers FirstBlockCache(0.3)", 2.5, 70.0),  # nothing of ours reaches 70 dB
        _row("cache-dit DBCache(0.2)", 1.2, 41.0),  # cache-dit rows are the field's too
    ]
    out = bench.head_to_head(rows)
    assert [r["theirs"] for r in out] == ["diffusers FirstBlockCache(0.1)", "diffusers FirstBlockCache(0.3)",
                                          "cache-dit DBCache(0.2)"]
    assert out[2]["ours"] == "block:c"
    assert out[0]["ours"] == "block:c" and out[0]["ratio"] == round(1.7 / 1.6, 2)
    assert out[1]["ours"] is None and out[1]["ratio"] is None


def test_head_to_head_reads_the_pair_speedups_under_paired(bench):
    rows = [dict(_row("block:a", 1.9, 45.0), pair_speedup=1.4),
            dict(_row("block:b", 1.5, 46.0), pair_speedup=1.6),  # faster by its back-to-back pairs
            dict(_row("diffusers FirstBlockCache(0.1)", 1.6, 44.0), pair_speedup=1.2)]
    (out,) = bench.head_to_head(rows)
    assert out["ours"] == "block:b" and out["our_speedup"] == 1.6 and out["their_speedup"] == 1.2
    assert out["ratio"] == round(1.6 / 1.2, 2)


def test_bad_extra_spec_is_a_one_line_usage_error(bench, capsys):
    with pytest.raises(SystemExit) as err:
        bench.main(["--extra", "block:treshold=0.2", "--models", "digits"])
    assert err.value.code == 2
    assert "--extra: bad cache option 'treshold=0.2'" in capsys.readouterr().err


@pytest.mark.parametrize("paired", [False, True])
def test_tiny_run_writes_rows_plot_and_head_to_head(bench, tmp_path, paired):
    out = tmp_path / "c"
    assert bench.main(["--models", "digits", "--steps", "3", "--repeats", "1", "--digit-repeats", "1",
                       "--caches", "none", "--extra", "block:threshold=10,warmup_steps=1", "--no-diffusers",
                       "--out", str(out)] + (["--paired"] if paired else [])) == 0
    rows = json.loads((out / "caching.json").read_text())
    # --paired: every cached row carries the time of the uncached calls made beside it
    assert all(("ref_seconds" in r) == paired for r in rows[1:]) and "ref_seconds" not in rows[0]
    # and the median of its back-to-back (uncached / cached) time ratios
    assert all(("pair_speedup" in r) == paired for r in rows[1:])
    assert all(r["pair_speedup"] > 0 for r in rows[1:] if paired)
    assert [r["cache"] for r in rows] == ["uncached", "never-skip", "block:threshold=10,warmup_steps=1"]
    assert all(r["model"] == "digits" and r["steps"] == 3 for r in rows)
    assert rows[1]["psnr"] == math.inf  # never-skip reproduces uncached exactly
    assert rows[2]["psnr"] < math.inf  # the --extra config skipped blocks
    assert (out / "caching.png").stat().st_size > 0
    assert json.loads((out / "head_to_head.json").read_text()) == []  # no diffusers rows


def test_spread_calls_a_gain_only_beyond_the_never_skip_band(bench):
    rows = []
    for run, (never, a, b, c) in enumerate([(0.90, 1.30, 1.05, 0.70), (1.10, 1.20, 0.95, 0.80), (1.00, 1.25, 1.12, 0.85)]):
        rows += [dict(_row("uncached", 1.0, math.inf), run=run, seconds=2.0, accuracy=None),
                 dict(_row("never-skip", never, math.inf), run=run, seconds=2.0, accuracy=None),
                 dict(_row("block:a", a, 50.0), run=run, seconds=1.6, accuracy=None),   # slowest run 1.20 > 1.10
                 dict(_row("block:b", b, 50.0), run=run, seconds=1.9, accuracy=None),   # 0.95-1.12: inside the band
                 dict(_row("block:c", c, 50.0), run=run, seconds=2.6, accuracy=None)]   # fastest 0.85 < 0.90
    rows.append(dict(model="pixart", steps=20, cache="diffusers X", error="IndexError: x", run=0))
    table = {r["cache"]: r for r in bench.spread(rows)}
    assert table["never-skip"]["min"] == 0.90 and table["never-skip"]["max"] == 1.10
    assert [table[k]["verdict"] for k in ("block:a", "block:b", "block:c")] == ["gain", "noise", "loss"]
    assert table["block:a"]["median"] == 1.25 and table["block:a"]["speedups"] == [1.30, 1.20, 1.25]
    assert table["diffusers X"]["error"] == "IndexError: x"
    md = bench.spread_markdown(list(table.values()))
    assert "| pixart | 20 | block:a | 1.6 | 1.25x (1.20-1.30) | gain | 50.0 |  |" in md
    # the band pools every model's never-skip rows: another model's 1.25 widens it, block:a is then noise
    other = [dict(_row("never-skip", 1.25, math.inf, model="digits"), run=0, seconds=1.0, accuracy=None)]
    assert {r["cache"]: r for r in bench.spread(rows + other)}["block:a"]["verdict"] == "noise"
    # and a band below 1 does not make a row that reads under 1.0 in some run a gain
    low = [dict(_row("never-skip", 0.8, math.inf, model="x"), run=0, seconds=1.0, accuracy=None)]
    below = [dict(_row("block:e", up, 50.0), run=run, seconds=1.0, accuracy=None) for run, up in enumerate((0.97, 1.3))]
    kept = [r for r in rows if r["cache"] != "never-skip"]
    assert {r["cache"]: r for r in bench.spread(kept + low + below)}["block:e"]["verdict"] == "noise"


def test_runs_repeat_every_row_and_write_the_spread(bench, tmp_path):
    out = tmp_path / "r"
    assert bench.main(["--models", "digits", "--steps", "3", "--repeats", "1", "--digit-repeats", "1", "--runs", "2",
                       "--caches", "none", "--extra", "block:threshold=10,warmup_steps=1", "--no-diffusers",
                       "--out", str(out)]) == 0
    rows = json.loads((out / "caching.json").read_text())
    assert [(r["run"], r["cache"]) for r in rows] == [
        (run, c) for run in (0, 1) for c in ("uncached", "never-skip", "block:threshold=10,warmup_steps=1")]
    table = json.loads((out / "spread.json").read_text())
    assert [r["runs"] for r in table] == [2, 2, 2]
    assert table[2]["verdict"] in ("gain", "noise", "loss")
    assert "min-max over runs" in (out / "spread.md").read_text()


def test_mag_cache_rows_calibrate_on_their_first_call_then_skip(bench):
    from tests.caching.tiny import sample, tiny_pixart

    model = tiny_pixart()
    ref = sample(model, 8)
    attach, before_call = bench.mag_caches(8, thresholds=(0.24,))["diffusers MagCache(0.24)"]
    attach(model)
    with before_call(model):
        calibration = sample(model, 8)
    assert torch.equal(calibration, ref)  # the calibration call skips nothing
    with before_call(model):
        cached = sample(model, 8)
    assert not torch.equal(cached, ref)  # calibrated: it skips blocks now
    with before_call(model):
        assert torch.equal(sample(model, 8), cached)  # and its state resets between calls
