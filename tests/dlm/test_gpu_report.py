"""scripts/gpu_report.py: the smoke run exercises every section's code path on CPU (so the script cannot rot
between GPU runs); the targets are read off the results as the issues state them; the runner keeps what was
measured when a part fails, a section lacks time, a signal arrives or a section hangs; a machine without CUDA
is refused in one line."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import types
import zipfile
from pathlib import Path

import pytest
import torch

from tests.script_loader import load_script

report = load_script("gpu_report.py")
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu_report")
    assert report.main(["--smoke", "--out", str(out)]) == 0
    return (json.loads((out / "report.json").read_text()), (out / "report.md").read_text(),
            (out / "report.log").read_text())


def test_smoke_runs_every_section_in_the_safe_order(smoke):
    data, md, log = smoke
    assert list(data["sections"]) == list(report.SECTIONS)
    assert report.SECTIONS.index("kernels") > report.SECTIONS.index("autoregressive")  # the first Triton launch late
    assert report.SECTIONS[-1] == "extras" and data["meta"]["status"] == "complete"
    for name, result in data["sections"].items():
        assert "error" not in result and set(result) != {"skipped"} and not result.get("partial"), name
    masked, uniform = data["sections"]["engine_masked"], data["sections"]["engine_uniform"]
    assert [r["batch"] for r in masked["rows"]] == [1, 2] and not any(r["compile"] for r in masked["rows"])
    assert report.SECTIONS.index("engine_lossless") == report.SECTIONS.index("engine_masked") + 1
    lossless = data["sections"]["engine_lossless"]  # CPU: a row's logits do not depend on the batch shape
    base, mine = lossless["rows"]["confidence"], lossless["rows"]["lossless"]
    assert lossless["identical_tokens"] and base["nfe"] == base["steps"] == lossless["budget"]["steps"]
    assert mine["steps"] == base["nfe"] and mine["nfe"] < base["nfe"] and 1 < mine["acceptance"] <= lossless["depth"]
    assert mine["branch_forwards"] == mine["plain_passes"] + lossless["depth"] * mine["verification_passes"]
    assert lossless["nfe_ratio"] == base["nfe"] / mine["nfe"] and lossless["expected_gain"]["gain"] > 0
    assert [r["batch"] for r in uniform["rows"]] == [1, 2]
    for r in uniform["rows"]:  # the tiny replica on CPU: our tokens are transformers', and each is deterministic
        ident = r["identity"]
        assert ident["identical"] and ident["ours_vs_transformers"]["equal_fraction"] == 1.0
        assert ident["transformers_vs_transformers"]["first_differing_step"] is None
        assert ident["ours_vs_transformers"]["steps_compared"] == uniform["denoising_steps"]
    ar = data["sections"]["autoregressive"]
    for b in ar["batches"]:
        assert set(b["ratios"]) == {"fixed_budget", "threshold"}
        assert b["fixed_budget"]["nfe"] == ar["ours"]["fixed_budget"]["steps"]
        assert b["autoregressive"]["tokens_to_eos"] <= b["batch"] * ar["new_tokens"]
    extras = data["sections"]["extras"]
    assert extras["compile"]["compile"] and extras["compile"]["same_tokens_as_first_call"]
    assert extras["compile"]["nfe"] == masked["rows"][0]["nfe"]
    assert extras["llada_floor_graph"] == {"skipped": "CUDA graphs need a GPU"}
    assert extras["ar_compiled"]["compile"] and "speedup" in extras["llada2_vs_diffusers"]
    assert "TRITON_INTERPRET" in data["sections"]["kernels"]["sweep"]["skipped"]
    forward = {r["name"]: r for r in data["sections"]["replica_forward"]["replicas"]}
    assert all("enqueue_ms" in row for row in forward["llada-8b"]["rows"] if row["batch"] == 1)
    names = {t["name"] for t in data["targets"]}
    assert {"llada_overhead", "dgemma_sampler_share", "dgemma_transient", "dgemma_identical", "llada_prefix_floor",
            "dgemma_floor", "bandwidth", "memory", "time", "identical", "dllm_vs_autoregressive", "lossless_time_ratio",
            "lossless_identical"} <= names
    # CPU numbers at toy size judge nothing: every target reads n/a (smoke), in the table and in the sections
    assert all(t["met"] is None and t["note"] == "n/a (smoke)" for t in data["targets"])
    table = [line.split(" | ") for line in md.split("## Targets")[1].split("\n## ")[0].splitlines()
             if line.startswith("| ") and not line.startswith("| section")]
    assert len(table) == len(data["targets"]) and all(cells[3] == "n/a (smoke)" for cells in table)
    assert "**not met**" not in md and ": met" not in md  # nor in the sections' own lists (video)
    assert "## engine_uniform" in md and "## autoregressive" in md and "## engine_lossless" in md and "== extras" in log


def test_targets_are_read_as_the_issues_state_them():
    def forward(pct, ms, floor):
        return {"replicas": [{"name": "llada-8b", "rows": [{"batch": 1, "mode": "prefix", "pct_of_floor": pct,
                                                            "ms": 6.25, "floor_ms": 5.0, "enqueue_ms": 6.1}]},
                             {"name": "diffusiongemma-26b-a4b", "rows": [{"batch": 1, "ms": ms, "floor_ms": floor}]}]}
    rows = {t["name"]: t for t in report.collect_targets({"replica_forward": forward(80.0, 12.5, 10.0),
                                                          "extras": {"llada_floor_graph": {"graphed_ms": 5.2}}})}
    assert {k: t["met"] for k, t in rows.items()} == {"llada_prefix_floor": True, "dgemma_floor": True}
    assert rows["llada_prefix_floor"]["note"] == ("forward 6.25 ms, floor 5.00 ms, host enqueue 6.10 ms, "
                                                  "CUDA-graph replay 5.20 ms")
    rows = {t["name"]: t["met"] for t in report.collect_targets({"replica_forward": forward(79.9, 12.6, 10.0)})}
    assert rows == {"llada_prefix_floor": False, "dgemma_floor": False}
    smoke_rows = report.collect_targets({"replica_forward": forward(90.0, 1.0, 10.0)}, smoke=True)
    assert [(t["met"], t["note"]) for t in smoke_rows] == [(None, "n/a (smoke)")] * 2

    from dlm.bench.gpu import engine_masked, engine_uniform

    t = engine_masked.targets({"rows": [{"batch": 1, "compile": False, "overhead_pct": 5.0, "tokens_per_s": 100.0}]})
    assert t["llada_overhead"]["met"] is True and t["llada_tokens_per_s"]["met"] is None

    def agree(fraction, step):
        return {"equal_fraction": fraction, "first_differing_step": step, "steps_compared": 16}
    identity = {"ours_vs_transformers": agree(0.98, 11), "transformers_vs_transformers": agree(1.0, None),
                "identical": False}
    rows = [{"batch": 1, "sampler_pct": 3.1, "tokens_per_s": 10.0, "transient_beyond_logits_per_request_bytes": 0.6e9},
            {"batch": 8, "sampler_pct": 1.0, "tokens_per_s": 40.0, "speedup_vs_transformers": 1.6,
             "identity": identity, "transient_beyond_logits_per_request_bytes": 0.1e9}]
    t = engine_uniform.targets({"rows": rows})
    assert t["dgemma_sampler_share"]["met"] is False and t["dgemma_transient"]["met"] is True
    assert t["dgemma_batch_growth"]["met"] is True
    # speed and identity are judged apart: fast enough, and the tokens differ from step 11 on
    assert t["dgemma_vs_transformers"]["met"] is True
    assert t["dgemma_identical"]["met"] is False and t["dgemma_identical"]["value"] == 0.98
    assert "first differing step 11" in t["dgemma_identical"]["note"] and "itself 1.0000" in t["dgemma_identical"]["note"]
    # a peak below the logits' own size is a measurement that missed them, not a transient that is met
    rows[0]["transient_beyond_logits_per_request_bytes"] = -3e4
    assert engine_uniform.targets({"rows": rows})["dgemma_transient"]["met"] is None

    from dlm.bench.gpu import engine_lossless

    def lossless(identical, position=None):
        return engine_lossless.targets({"time_ratio": 1.4, "nfe_ratio": 2.1, "expected_gain": {"gain": 1.9},
                                        "identical_tokens": identical, "first_differing_position": position})
    t = lossless(True)
    assert t["lossless_time_ratio"]["met"] is None and t["lossless_time_ratio"]["value"] == 1.4  # no bar
    assert "nfe ratio 2.10, cost model 1.90" in t["lossless_time_ratio"]["note"]
    assert t["lossless_identical"]["met"] is True
    t = lossless(False, 37)  # batched verification rows rounded a near-tie the other way
    assert t["lossless_identical"]["met"] is False and "first differing position 37" in t["lossless_identical"]["note"]


def test_agreement_counts_equal_tokens_and_finds_the_first_differing_step():
    from dlm.bench.gpu.engine import agreement

    prompt = torch.tensor([[7, 8], [7, 9]])
    a_steps = [torch.tensor([[1, 2, 3], [4, 5, 6]]) + i for i in range(4)]
    b_steps = [s.clone() for s in a_steps]
    b_steps[2][1, 0] += 1  # one position differs at step 2, and stays different
    b_steps[3][1, 0] += 1
    a, b = torch.cat([prompt, a_steps[-1]], 1), torch.cat([prompt, b_steps[-1]], 1)
    assert agreement(a, b, a_steps, b_steps, prompt=2) == {"equal_fraction": 5 / 6, "first_differing_step": 2,
                                                           "steps_compared": 4}
    assert agreement(a, a, a_steps, a_steps, prompt=2) == {"equal_fraction": 1.0, "first_differing_step": None,
                                                           "steps_compared": 4}


def test_tokens_up_to_eos_count_each_row_to_its_first_eos():
    from dlm.bench.gpu import tokens_up_to_eos

    generated = torch.tensor([[5, 2, 7, 2], [1, 3, 4, 6], [2, 2, 2, 2]])
    assert tokens_up_to_eos(generated, eos_token_id=2) == 2 + 4 + 1


def test_autoregressive_row_is_a_causal_llama_of_the_replica():
    """The row decodes with the replica's own LlamaForCausalLM made causal for the call: the same tokens as a
    plain transformers LlamaForCausalLM holding the same weights; the replica stays bidirectional after."""
    from transformers import LlamaForCausalLM

    from dlm.bench.gpu.autoregressive import ar_generate, causal
    from dlm.replicas import TINY_OVERRIDES, replica

    model = replica("llada-8b", layers=2, overrides=TINY_OVERRIDES["llada-8b"], device="cpu", dtype=torch.float32)
    reference = LlamaForCausalLM(model.lm.config).eval()
    reference.load_state_dict(model.lm.state_dict())
    ids = torch.randint(0, 500, (2, 9), generator=torch.Generator().manual_seed(3))
    eos = int(model.config.eos_token_id)
    with causal(model.lm):
        ours = ar_generate(model.lm, ids, 12, eos)
    theirs = reference.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False,
                                eos_token_id=eos, pad_token_id=eos)
    assert torch.equal(ours, theirs)
    assert not any(layer.self_attn.is_causal for layer in model.lm.model.layers)


def _ctx(**kw):
    from dlm.bench.gpu import ReportContext

    saved = []
    base = dict(device=torch.device("cpu"), dtype=torch.float32, smoke=True, deadline=time.monotonic() + 600,
                log=lambda line: None, save=lambda partial: saved.append(json.loads(json.dumps(partial, default=str))),
                raise_errors=False)
    return ReportContext(**{**base, **kw}), saved


def test_uniform_transformers_failure_marks_only_itself(monkeypatch):
    """transformers' generate out of memory at batch 1: our batch-1 row stays, says why transformers' is
    missing, and our batch 2 still runs (with transformers' row and the identity check)."""
    from dlm.bench.gpu import engine_uniform

    real = engine_uniform.transformers_row

    def tight(ctx, model, gc, ids, *args):
        if ids.shape[0] == 1:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(ctx, model, gc, ids, *args)
    monkeypatch.setattr(engine_uniform, "transformers_row", tight)
    ctx, saved = _ctx()
    out = engine_uniform.run(ctx)
    one, two = out["rows"]
    assert one["transformers_status"]["error"].startswith("OutOfMemoryError") and "transformers_ms" not in one
    assert one["identity"]["identical"] and two["identity"]["identical"] and "transformers_ms" in two
    assert saved[0]["rows"][0]["batch"] == 1 and "identity" not in saved[0]["rows"][0]  # on disk before the checks
    assert "n/a: OutOfMemoryError" in engine_uniform.markdown(out)


def test_masked_rows_are_saved_before_a_later_batch_fails(monkeypatch):
    from dlm.bench.gpu import engine_masked

    real = engine_masked.masked_row

    def tight(ctx, model, ids, *args, **kw):
        if ids.shape[0] == 2:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory")
        return real(ctx, model, ids, *args, **kw)
    monkeypatch.setattr(engine_masked, "masked_row", tight)
    ctx, saved = _ctx()
    out = engine_masked.run(ctx)
    assert [r["batch"] for r in out["rows"]] == [1] and out["notes"] == ["batch 2: out of memory; larger batches skipped"]
    assert [r["batch"] for r in saved[-1]["rows"]] == [1]


def test_extras_failed_compile_row_marks_only_itself(monkeypatch):
    from dlm.bench.gpu import extras

    def broken(*args, **kw):
        raise RuntimeError("CUDA error: operation not permitted when stream is capturing")
    monkeypatch.setattr(extras, "masked_row", broken)
    ar = {"ms": 1.0, "ms_per_token": 0.1, "tokens_per_s": 10.0, "first_call_s": 2.0}
    monkeypatch.setattr(extras, "ar_row", lambda *a, **kw: ar)
    monkeypatch.setattr(extras, "llada2_vs_diffusers", lambda ctx: {"ran": True})
    ctx, saved = _ctx()
    out = extras.run(ctx)
    assert out["compile"]["error"].startswith("RuntimeError: CUDA error") and "Traceback" in out["compile"]["traceback"]
    assert out["ar_compiled"] == ar and out["llada2_vs_diffusers"] == {"ran": True}
    assert "compile: **failed**" in extras.markdown(out)
    assert [set(s) for s in saved][:2] == [{"llada_note", "compile"}, {"llada_note", "compile", "llada_floor_graph"}]


def test_parts_and_batches_start_only_with_their_minimum_left():
    from dlm.bench.gpu import run_part
    from dlm.bench.gpu.engine import over_batches

    ctx, saved = _ctx(smoke=False, deadline=time.monotonic() + 8)
    out, calls = {}, []
    run_part(ctx, "big", 60, lambda: calls.append("big") or {}, out)
    run_part(ctx, "small", 2, lambda: calls.append("small") or {"ok": 1}, out)
    assert calls == ["small"] and out["small"] == {"ok": 1}
    assert out["big"]["skipped"].startswith("not started: needs about 60 s, ") and len(saved) == 2
    notes = []
    over_batches(ctx, (1, 4, 16), lambda batch: calls.append(batch), notes, minimum_s=30)
    assert calls == ["small"] and notes[0].startswith("batch 1+: not started")


class _Sections:
    """Stand-in section modules for the runner (its logic without a model): installed in sys.modules."""

    def __init__(self, monkeypatch):
        self.monkeypatch = monkeypatch
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # the runner's real-size path, no CUDA used

    def add(self, name, run, minimum=0.0):
        module = types.ModuleType(f"dlm.bench.gpu.{name}")
        module.run, module.MIN_START_S = run, minimum
        module.markdown = lambda result: "rows: " + ", ".join(str(r) for r in result.get("rows", []))
        self.monkeypatch.setitem(sys.modules, module.__name__, module)
        import dlm.bench.gpu as package
        self.monkeypatch.setattr(package, name, module, raising=False)


def _report(out):
    return json.loads((out / "report.json").read_text()), (out / "report.md").read_text(), (out / "report.log").read_text()


def test_runner_records_failures_and_skips_and_goes_on(monkeypatch, tmp_path):
    sections = _Sections(monkeypatch)
    sections.add("machine", lambda ctx: {"name": "stand-in GPU"})

    def failing(ctx):
        ctx.save({"rows": [1]})
        raise RuntimeError("illegal memory access")
    sections.add("replica_forward", failing)
    sections.add("engine_masked", lambda ctx: {"rows": [2]}, minimum=1000.0)
    sections.add("engine_uniform", lambda ctx: {"rows": [3]})
    code = report.main(["--out", str(tmp_path), "--sections", "machine,replica_forward,engine_masked,engine_uniform",
                        "--budget-s", "60"])
    assert code == 0
    data, md, log = _report(tmp_path)
    s = data["sections"]
    assert s["replica_forward"]["rows"] == [1] and s["replica_forward"]["error"] == "RuntimeError: illegal memory access"
    assert s["engine_masked"]["skipped"].startswith("not started: needs about 1000 s")
    assert s["engine_uniform"] == {"rows": [3]} and data["meta"]["status"] == "complete"
    assert "**failed**: `RuntimeError: illegal memory access` (what it had measured follows)" in md
    assert "rows: 1" in md and "== engine_uniform" in log


def test_sigint_writes_the_partial_report(monkeypatch, tmp_path):
    sections = _Sections(monkeypatch)
    sections.add("machine", lambda ctx: {"name": "stand-in GPU"})

    def interrupted(ctx):
        ctx.save({"rows": [1, 2]})
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)
        return {"rows": "never"}
    sections.add("engine_masked", interrupted)
    sections.add("engine_uniform", lambda ctx: {"rows": [3]})
    before = signal.getsignal(signal.SIGINT)
    assert report.main(["--out", str(tmp_path), "--sections", "machine,engine_masked,engine_uniform"]) == 130
    data, md, log = _report(tmp_path)
    masked = data["sections"]["engine_masked"]
    assert masked["rows"] == [1, 2] and masked["interrupted"].startswith("SIGINT after")
    assert "engine_uniform" not in data["sections"] and data["meta"]["status"].startswith("interrupted (SIGINT")
    assert "**interrupted**" in md and "rows: 1, 2" in md and "partial report written" in log
    assert signal.getsignal(signal.SIGINT) is before  # the caller's handler is back


def test_watchdog_dumps_the_stack_of_a_hung_section(monkeypatch, tmp_path):
    sections = _Sections(monkeypatch)

    def stuck_in_a_kernel(ctx):
        time.sleep(2.0)
        return {"rows": [1]}
    sections.add("kernels", stuck_in_a_kernel)
    monkeypatch.setitem(report.HANG_S, "kernels", 0.5)
    assert report.main(["--out", str(tmp_path), "--sections", "kernels"]) == 0
    data, md, log = _report(tmp_path)
    assert data["sections"]["kernels"] == {"rows": [1]}
    assert "watchdog: section kernels has run" in log and "stuck_in_a_kernel" in log and log.count("watchdog:") == 1


def test_watchdog_hard_limit_writes_the_report_and_exits_124(tmp_path):
    from dlm.bench.gpu.watchdog import Watchdog

    written, exits, lines = [], [], []
    with open(tmp_path / "log", "w") as f:
        dog = Watchdog([f], hard_limit_s=0.2, on_hard_limit=written.append, log=lines.append, poll_s=0.05,
                       exit=exits.append)
        with dog.section("engine_uniform", hang_s=100):
            deadline = time.monotonic() + 5
            while not exits and time.monotonic() < deadline:
                time.sleep(0.05)
        dog.stop()
    assert written == ["engine_uniform"] and exits == [124] and "hard limit" in lines[0]
    assert "hard limit passed during engine_uniform" in (tmp_path / "log").read_text()


def test_kernel_launch_sweep_under_the_interpreter():
    """The sweep's own launch (block size x warps) computes decode_stats: under the Triton interpreter, each
    configuration gives the float64 reference's tokens, and blocks smaller than the vocabulary loop over it."""
    from tests.kernels.kernel_interp import run_interpreted

    out = run_interpreted("""
        import json, time, torch
        from dlm.bench.gpu import ReportContext
        from dlm.bench.gpu.kernels import launch, sweep
        from kernels.decode_stats import decode_stats_ref
        ctx = ReportContext(device=torch.device("cpu"), dtype=torch.float32, smoke=True, deadline=time.monotonic() + 60)
        res = sweep(ctx, (6, 200), {"block": (16, 256), "num_warps": (1, 4)}, None, 1)
        x = (torch.randn((6, 200), generator=torch.Generator().manual_seed(1)) * 4)
        ref = decode_stats_ref(x.double())
        got = launch(x, 16, 4)
        print(json.dumps({"res": res, "tokens": torch.equal(got.token, ref.token),
                          "prob": float((got.prob.double() - ref.prob).abs().max())}))
    """)
    data = json.loads(out.strip().splitlines()[-1])
    rows = data["res"]["rows"]
    assert [(r["block"], r["num_warps"]) for r in rows] == [(16, 1), (16, 4), (256, 1), (256, 4)]
    assert all(r["tokens_equal"] and r["prob_max_diff"] < 1e-5 for r in rows)  # float32, another summation order
    assert data["tokens"] and data["prob"] < 1e-5


def _wheel(folder: Path) -> Path:
    """A minimal wheel (one module), enough for pip to install into a folder offline."""
    path = folder / "gpu_report_probe-1.0-py3-none-any.whl"
    info = "gpu_report_probe-1.0.dist-info"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("gpu_report_probe.py", "VERSION = '1.0'\n")
        z.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: gpu-report-probe\nVersion: 1.0\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", f"gpu_report_probe.py,,\n{info}/METADATA,,\n{info}/WHEEL,,\n{info}/RECORD,,\n")
    return path


def test_gpu_machine_script_installs_offline_and_keeps_the_logs(tmp_path):
    """scripts/gpu_report_run.sh as on the GPU machine: carried wheels installed with --no-index into a folder
    first on PYTHONPATH, the report run, install.log / report.log / report.json in OUT; no wheels: exit 3."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _wheel(wheels)
    out = tmp_path / "out"
    env = dict(os.environ, GPU_REPORT_PYTHON=sys.executable, WHEELS=str(wheels), GPU_REPORT_SITE=str(tmp_path / "site"))
    r = subprocess.run(["bash", "scripts/gpu_report_run.sh", str(out), "--smoke", "--sections", "machine"], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    install = (out / "install.log").read_text()
    assert "Successfully installed gpu-report-probe-1.0" in install and "installed gpu_report_probe" in install
    assert (tmp_path / "site" / "gpu_report_probe.py").exists() and not (tmp_path / "site" / "__pycache__").exists()
    assert json.loads((out / "report.json").read_text())["meta"]["status"] == "complete"
    assert "gpu_report.py exited 0" in (out / "report.log").read_text()
    empty = tmp_path / "none"
    empty.mkdir()
    r = subprocess.run(["bash", "scripts/gpu_report_run.sh", str(out)], cwd=ROOT, env=dict(env, WHEELS=str(empty)),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 3 and "no wheels in" in r.stderr


def test_wheels_are_pinned_and_carry_nothing_unneeded():
    text = (ROOT / "scripts" / "gpu_report_wheels.sh").read_text()
    download = next(line for line in text.splitlines() if "pip download" in line)
    following = text.splitlines()[text.splitlines().index(download) + 1]
    requirements = [w.strip('"') for w in (download + following).split() if "==" in w]
    assert requirements == ["transformers==5.24.0", "diffusers==0.42.1"]
    assert "importlib" not in download + following


def test_without_cuda_one_line_and_exit_2(capsys, tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert report.main(["--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--smoke" in err[0]


def test_unknown_section_refused(capsys, tmp_path):
    assert report.main(["--smoke", "--sections", "machine,gpu", "--out", str(tmp_path)]) == 2
    assert "unknown section(s) gpu" in capsys.readouterr().err
