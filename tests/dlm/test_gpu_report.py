"""scripts/gpu_report.py: the smoke run exercises every section's code path on CPU (so the script
cannot rot between GPU runs), the targets are read off the results as the issue states them, and a
machine without CUDA is refused in one line."""
from __future__ import annotations

import json

import pytest
import torch

from tests.script_loader import load_script

report = load_script("gpu_report.py")


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu_report")
    assert report.main(["--smoke", "--out", str(out)]) == 0
    return json.loads((out / "report.json").read_text()), (out / "report.md").read_text()


def test_smoke_runs_every_section(smoke):
    data, md = smoke
    assert list(data["sections"]) == list(report.SECTIONS)
    for name, result in data["sections"].items():
        assert "error" not in result and set(result) != {"skipped"}, name
    engine = data["sections"]["engine"]
    assert engine["masked"]["rows"] and engine["uniform"]["rows"]
    # the uniform engine is token-equal to transformers' generate on the replica, asserted in the run
    assert all(r["identical_tokens"] for r in engine["uniform"]["rows"] if "identical_tokens" in r)
    assert any(r["compile"] for r in engine["masked"]["rows"])
    assert data["sections"]["machine"]["copy_gbps"] > 0
    assert all(r["tokens_equal"] for r in data["sections"]["kernels"]["rows"])
    names = {t["name"] for t in data["targets"]}
    assert {"llada_overhead", "dgemma_sampler_share", "dgemma_transient", "llada_prefix_floor", "dgemma_floor",
            "bandwidth", "memory", "time", "identical"} <= names
    assert "## Targets" in md and "## engine" in md


def test_targets_are_read_as_the_issue_states_them():
    def forward(pct, ms, floor):
        return {"replicas": [{"name": "llada-8b", "rows": [{"batch": 1, "mode": "prefix", "pct_of_floor": pct}]},
                             {"name": "diffusiongemma-26b-a4b", "rows": [{"batch": 1, "ms": ms, "floor_ms": floor}]}]}
    rows = {t["name"]: t["met"] for t in report.collect_targets({"replica_forward": forward(80.0, 12.5, 10.0)})}
    assert rows == {"llada_prefix_floor": True, "dgemma_floor": True}
    rows = {t["name"]: t["met"] for t in report.collect_targets({"replica_forward": forward(79.9, 12.6, 10.0)})}
    assert rows == {"llada_prefix_floor": False, "dgemma_floor": False}

    from dlm.bench.gpu import engine
    masked = {"rows": [{"batch": 1, "compile": False, "overhead_pct": 5.0, "tokens_per_s": 100.0}]}
    uniform = {"rows": [
        {"batch": 1, "sampler_pct": 3.1, "tokens_per_s": 10.0, "transient_beyond_logits_per_request_bytes": 0.6e9},
        {"batch": 8, "sampler_pct": 1.0, "tokens_per_s": 40.0, "speedup_vs_transformers": 1.6,
         "identical_tokens": False, "transient_beyond_logits_per_request_bytes": 0.1e9}]}
    t = engine.targets({"masked": masked, "uniform": uniform})
    assert t["llada_overhead"]["met"] is True and t["dgemma_sampler_share"]["met"] is False
    assert t["dgemma_transient"]["met"] is True and t["dgemma_batch_growth"]["met"] is True
    assert t["dgemma_vs_transformers"]["met"] is False  # fast enough, but the tokens differ


def test_without_cuda_one_line_and_exit_2(capsys, tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert report.main(["--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--smoke" in err[0]


def test_unknown_section_refused(capsys, tmp_path):
    assert report.main(["--smoke", "--sections", "machine,gpu", "--out", str(tmp_path)]) == 2
    assert "unknown section(s) gpu" in capsys.readouterr().err
