"""The GPU report's video section (dlm.bench.gpu.video) in smoke mode: the tiny Wan on CPU, seconds."""

import sys
import time

import pytest
import torch

import video
import video.dit
from dlm.bench.gpu import ReportContext
from dlm.bench.gpu import video as section

RUN_FIELDS = {"peak_mib", "blocks_peak_mib", "ms", "min_ms", "max_ms", "reps", "block_ms", "block_min_ms",
              "block_max_ms", "max_abs_diff", "rel_diff", "identical", "repeat_identical"}
STREAMLINED = ("streamline(slices=4, head_slices=2)", "streamline(slices=4, head_slices=1)")


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def _smoke(dtype=torch.float32):
    lines = []
    ctx = ReportContext(device=torch.device("cpu"), dtype=dtype, smoke=True, deadline=time.monotonic() + 60,
                        log=lines.append)
    return section.run(ctx), lines


def test_smoke_section_reports_every_configuration():
    res, lines = _smoke()
    assert res["tokens"] == 3 * 12 * 16 and res["latent"] == [1, 4, 3, 24, 32] and res["layers"] == 2
    assert list(res["runs"]) == ["unsliced", *STREAMLINED, "backend:_native_math"]
    for name, r in res["runs"].items():
        assert RUN_FIELDS <= set(r), name
        assert r["peak_mib"] is None  # no MALLOC_MMAP_THRESHOLD_ here: RSS would not track tensors
        assert r["ms"] > 0 and r["block_ms"] > 0 and r["repeat_identical"]
    assert res["runs"]["unsliced"]["max_abs_diff"] == 0
    for name in STREAMLINED:
        r = res["runs"][name]
        # exact slicing: in float32 on CPU the sliced forward equals diffusers' bit for bit here
        assert r["identical"] and r["max_abs_diff"] == 0
        assert r["block_time_ratio"] == pytest.approx(r["block_ms"] / res["runs"]["unsliced"]["block_ms"])
        assert set(r["verdicts"]) == {"memory", "time", "identical"}
        assert r["verdicts"]["memory"]["met"] is None  # not measured, not claimed
        assert r["verdicts"]["identical"]["met"] is True
    assert res["primary"] == STREAMLINED[0] and res["targets"] == res["runs"][STREAMLINED[0]]["verdicts"]
    assert res["fp32_reference"]["fp32_streamlined_vs_fp32"] == 0
    assert len(lines) == 4 and all(line.startswith("video: ") for line in lines)
    md = section.to_markdown(res)
    assert all(f"| {name} |" in md for name in res["runs"])
    assert f"Targets ({STREAMLINED[0]}):" in md and "- identical: bit-identical output: 0: met" in md


def _local_attention_only(monkeypatch):
    """The classic wrong slicing: each query span attends only to its own span's keys."""
    real = video.dit.attention_by_spans

    def local(segs, length, heads, head_slices, kv_of, q_of, attn_fn, qsegs=None):
        current = {}

        def q_of_recorded(seg, h0, h1):
            current["seg"] = seg
            return q_of(seg, h0, h1)

        def attn_local(q, k, v):
            a, b = current["seg"][3], current["seg"][4]
            return attn_fn(q, k[:, a:b], v[:, a:b])

        return real(segs, length, heads, head_slices, kv_of, q_of_recorded, attn_local, qsegs)

    monkeypatch.setattr(video.dit, "attention_by_spans", local)


def test_equality_check_catches_wrong_slicing(monkeypatch):
    _local_attention_only(monkeypatch)
    res, _ = _smoke()
    for name in STREAMLINED:
        r = res["runs"][name]
        assert not r["identical"] and r["rel_diff"] > 1e-3, r
        assert r["verdicts"]["identical"]["met"] is False
    assert res["targets"]["identical"]["met"] is False
    assert res["fp32_reference"]["fp32_streamlined_vs_fp32"] > 1e-3
    # the reference itself is untouched by the patch
    assert res["runs"]["unsliced"]["max_abs_diff"] == 0
    assert res["runs"]["backend:_native_math"]["rel_diff"] < 1e-5


def test_bfloat16_smoke_and_fp32_reference():
    """The bf16 path on CPU (dtype handling of the sliced blocks); the float32 reference really runs
    in float32, so bf16's own rounding shows up there."""
    res, _ = _smoke(torch.bfloat16)
    assert res["dtype"] == "bfloat16"
    for name in STREAMLINED:
        r = res["runs"][name]
        assert "error" not in r and r["rel_diff"] < 1e-2
    fr = res["fp32_reference"]
    assert fr["unsliced_vs_fp32"] > 1e-4 * fr["output_max_abs"]  # bf16 differs from float32
    assert fr["fp32_streamlined_vs_fp32"] <= 1e-5 * fr["output_max_abs"]


def test_build_wan_casts_like_from_pretrained():
    """Dtypes as diffusers' from_pretrained(torch_dtype=bfloat16) leaves a Wan checkpoint (its loader keeps a
    parameter in float32 when a component of its name is in WanTransformer3DModel._keep_in_fp32_modules:
    rope, time_embedder, scale_shift_table, norm1/2/3; non-persistent buffers keep their built dtype).
    from_pretrained itself needs accelerate for that path, which is not installed here, so the expected
    names are written out."""
    from diffusers import WanTransformer3DModel

    m = section.build_wan(section.SMOKE_WAN, 1, torch.device("cpu"), torch.bfloat16)
    fp32 = {"scale_shift_table", "blocks.0.scale_shift_table", "blocks.0.norm2.weight", "blocks.0.norm2.bias"}
    fp32 |= {f"condition_embedder.time_embedder.linear_{i}.{w}" for i in (1, 2) for w in ("weight", "bias")}
    params = dict(m.named_parameters())
    assert {n for n, p in params.items() if p.dtype == torch.float32} == fp32
    assert all(p.dtype == torch.bfloat16 for n, p in params.items() if n not in fp32)
    assert {n: b.dtype for n, b in m.named_buffers()} == {"rope.freqs_cos": torch.float32,
                                                          "rope.freqs_sin": torch.float32}
    # the same weights diffusers' constructor draws under the same seed, then rounded to bf16
    torch.manual_seed(0)
    ref = WanTransformer3DModel(**dict(section.SMOKE_WAN, num_layers=1))
    for n, p in ref.named_parameters():
        assert torch.equal(p.to(params[n].dtype), params[n]), n


def test_missing_diffusers_is_one_clear_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "diffusers", None)  # import diffusers -> ImportError
    lines = []
    ctx = ReportContext(device=torch.device("cpu"), dtype=torch.float32, smoke=True,
                        deadline=time.monotonic() + 60, log=lines.append)
    res = section.run(ctx)
    assert set(res) == {"skipped"} and "needs diffusers" in res["skipped"]
    assert lines == [f"video: skipped: {res['skipped']}"]
    with pytest.raises(SystemExit, match="error: the video section needs diffusers"):
        section.main(["--device", "cpu"])


def test_cli_rejects_bad_settings(capsys):
    with pytest.raises(SystemExit):
        section.main(["--settings", "16"])
    assert "--settings must look like 16x1,16x2, got '16'" in capsys.readouterr().err


def test_section_model_runs_off_cpu():
    """The device path without a GPU: built under a device context on the meta device (as on CUDA) and run
    unsliced and streamlined in bf16, every tensor stays on that device (a CPU-made tensor meeting a meta
    one raises) and the output keeps diffusers' shape and dtype."""
    dev = torch.device("meta")
    m = section.build_wan(section.SMOKE_WAN, 2, dev, torch.bfloat16)
    shape = section.SMOKE_SHAPE
    x = (torch.empty(shape.latent(4), device=dev, dtype=torch.bfloat16), torch.tensor([500], device=dev),
         torch.empty(1, shape.text_len, 24, device=dev, dtype=torch.bfloat16))
    with torch.inference_mode():
        ref = m(*x).sample
        video.streamline(m, slices=4, head_slices=2)
        try:
            got = m(*x).sample
        finally:
            video.unstreamline(m)
    assert got.device == dev and got.dtype == ref.dtype == torch.bfloat16 and got.shape == ref.shape


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the capture-failure path of a CPU-only torch")
def test_launch_diagnostics_record_a_failed_capture():
    """The CUDA-only host-dispatch diagnostics: a graph capture that cannot run is reported, not raised,
    and the report's host table shows it."""
    ctx = ReportContext(device=torch.device("cpu"), dtype=torch.float32, smoke=True, deadline=time.monotonic() + 60)
    calls = []
    diag = section._launch_diagnostics(ctx, lambda: calls.append(1), layers=2, reps=3)
    assert len(calls) == 3 and diag["block_enqueue_ms"] >= 0 and "block_graphed_ms" not in diag
    assert diag["block_graphed_error"]
    res, _ = _smoke()
    res["runs"]["unsliced"].update(diag)
    md = section.to_markdown(res)
    assert f"| unsliced | {res['runs']['unsliced']['block_ms']:.2f} | {diag['block_enqueue_ms']:.2f} | " \
           f"{diag['block_graphed_error']} | - |" in md
