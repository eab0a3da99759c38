"""scripts/bench_video_rehash.py: the verdict over repeated runs against the noise of identical work."""
from script_loader import load_script  # tests/script_loader.py (tests/ is on sys.path)


def test_a_gain_only_beyond_the_uncached_again_band():
    bench = load_script("bench_video_rehash.py")
    rows = []
    for run, (again, a, b, c) in enumerate([(0.95, 1.30, 1.00, 0.60), (1.08, 1.25, 1.15, 0.70), (1.00, 1.20, 0.90, 0.65)]):
        for config, up in (("uncached", 1.0), ("uncached again", again), ("rehash:a", a), ("rehash:b", b), ("streamline", c)):
            rows.append(dict(config=config, speedup=up, cpu_s=10 / up, rehashed=0, max_abs=0.0, psnr=90.0, run=run))
    table = {r["config"]: r for r in bench.verdicts(rows)}
    assert table["uncached again"]["verdict"] is None and table["uncached again"]["speedups"] == [0.95, 1.08, 1.00]
    assert [table[k]["verdict"] for k in ("rehash:a", "rehash:b", "streamline")] == ["gain", "noise", "loss"]
    assert table["rehash:a"]["median"] == 1.25 and (table["rehash:a"]["min"], table["rehash:a"]["max"]) == (1.20, 1.30)
