"""GPU report section "video": a Wan2.1-T2V-1.3B-shaped DiT, unsliced vs ``video.streamline``.

One denoising forward of diffusers' ``WanTransformer3DModel`` with Wan2.1-T2V-1.3B's published
configuration (dim 1536 = 12 heads x 128, FFN 8960, text dim 4096, patch (1, 2, 2), 16 latent
channels, 30 blocks) at 480x832, 33 frames (latents ``[1, 16, 9, 60, 104]``: 14,040 video tokens,
512 text tokens), random weights, cut to ``GPU_LAYERS`` blocks: the activation peak of a block stack
does not grow with depth, the time does, so time is reported per block with the depth used and
nothing is scaled to 30 blocks.

Measured on the same model in the same process, for each configuration:

- ``unsliced``: diffusers' own forward (its default attention backend, ``native`` = torch SDPA, which
  picks a flash kernel for bf16 on a GPU): the reference;
- ``streamline(slices=s, head_slices=h)``: ``video.streamline`` (Zhan et al., "Streamlined
  Inference", ECCV 2024; ``video.dit``: exact query-span attention, token-span FFN), the settings of
  ``STREAMLINE_SETTINGS`` (the first is the one the targets are judged on) and the sweep
  ``STREAMLINE_SWEEP``;
- ``backend:<name>``: diffusers' own memory option for Wan, ``set_attention_backend`` (diffusers has
  no FFN chunking for Wan: ``enable_forward_chunking`` is UNet/SD3-only; offloading and layerwise
  casting act on weights, not activations).

Each gets: peak activation memory of the whole forward (``peak_extra_bytes``: CUDA allocator peak above
the level before the call), the same for the block stack alone (the blocks called directly on the
inputs the model gives its first block), median time of the forward and of the block stack per block
(``time_call``), and its output against the unsliced one: max abs difference, relative to the output's
max abs value, and whether it is bit-identical. Beside them, the same model with its weights upcast
to float32 says how far bf16 itself is from the float32 result, the scale any bf16 difference is read
against.

Weights and dtypes are as ``from_pretrained(torch_dtype=bfloat16)`` leaves them: parameters in bf16
except diffusers' ``_keep_in_fp32_modules`` (time embedder, modulation tables, norms), the rotary tables
(buffers) in the float32 they are built in. ``ctx.smoke``: the same code on a tiny Wan on CPU (seconds).
"""
from __future__ import annotations

import copy
import math
import os
import time
from dataclasses import dataclass

import torch

from dlm.bench.gpu import ReportContext, enqueue_ms, graphed_ms, peak_extra_bytes, time_call

# Wan2.1-T2V-1.3B (Wan-AI/Wan2.1-T2V-1.3B-Diffusers transformer/config.json; Wan's own
# wan/configs/wan_t2v_1_3B.py: dim 1536, ffn_dim 8960, freq_dim 256, num_heads 12, num_layers 30,
# qk_norm, cross_attn_norm, eps 1e-6; umT5 text states of width 4096, 512 tokens).
WAN21_T2V_1_3B = dict(patch_size=(1, 2, 2), num_attention_heads=12, attention_head_dim=128, in_channels=16,
                      out_channels=16, text_dim=4096, freq_dim=256, ffn_dim=8960, num_layers=30,
                      cross_attn_norm=True, qk_norm="rms_norm_across_heads", eps=1e-6, image_dim=None,
                      added_kv_proj_dim=None, rope_max_seq_len=1024)
# smoke: the same architecture, tiny (2 heads x 16, FFN 80)
SMOKE_WAN = dict(WAN21_T2V_1_3B, num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=4,
                 text_dim=24, freq_dim=32, ffn_dim=80)

GPU_LAYERS = 4
SMOKE_LAYERS = 2
# The settings a user would pick at 14,040 tokens, the first judged against the targets. slices=16:
# every span (878 tokens) holds its FFN hidden state (~31 MB in bf16) and float32 norm temporaries,
# small next to the full-size [tokens, 1536] buffers a sliced block must keep (input, attention output,
# K, V: 43 MB each), with spans still long enough for efficient GEMMs. head_slices=2 halves K/V, so the
# block holds 3 instead of 4 hidden-state sizes, for one more whole q/k projection per block (Wan's
# qk-norm spans all heads): about +6% of a block's multiply-adds (q, k: 2 x 1536^2 per token of ~85M).
# Chosen after the scaled CPU run (1,950 tokens, bf16, docs/gpu.md): whole-forward peak 3.39x lower
# with (16, 2), 2.77x with (16, 1); both are measured, and the sweep shows the neighbours.
STREAMLINE_SETTINGS = ((16, 2), (16, 1))
STREAMLINE_SWEEP = ((4, 1), (8, 1), (32, 1), (8, 2), (32, 2))
GPU_BACKENDS = ("_native_flash", "_native_efficient", "_native_cudnn", "_native_math")
CPU_BACKENDS = ("_native_math",)  # CPU's default (native) already runs the flash kernel

TARGET_MEM_RATIO = 3.0  # >= 3x lower peak activation memory
TARGET_TIME_RATIO = 1.15  # <= 15% slower
GPU_BUDGET_S = 60.0  # the whole section on the GPU, model build included
MIN_START_S = GPU_BUDGET_S  # the unsliced baseline runs first: the section starts only with its budget left


@dataclass(frozen=True)
class VideoShape:
    """A clip in pixels and its text length; latents follow Wan's VAE (4x time, 8x space)."""

    frames: int
    height: int
    width: int
    text_len: int

    def latent(self, channels: int) -> tuple[int, ...]:
        return (1, channels, (self.frames - 1) // 4 + 1, self.height // 8, self.width // 8)

    def tokens(self, patch) -> int:
        _, _, f, h, w = self.latent(1)
        return (f // patch[0]) * (h // patch[1]) * (w // patch[2])


REAL_SHAPE = VideoShape(frames=33, height=480, width=832, text_len=512)  # 9 x 60 x 104 latents, 14,040 tokens
SMOKE_SHAPE = VideoShape(frames=9, height=192, width=256, text_len=7)  # 3 x 24 x 32 latents, 576 tokens


class MissingDiffusers(RuntimeError):
    pass


def _wan_class():
    try:
        from diffusers import WanTransformer3DModel
    except ImportError as e:
        raise MissingDiffusers(f"the video section needs diffusers (WanTransformer3DModel), which is not "
                               f"installed here ({e}); install the diffusers wheel carried with the report") from e
    return WanTransformer3DModel


def build_wan(config: dict, layers: int, device, dtype, seed: int = 0):
    """A random-weight ``WanTransformer3DModel`` with ``config`` cut to ``layers`` blocks, initialised on
    ``device`` and cast as ``from_pretrained(torch_dtype=dtype)`` casts a checkpoint: every parameter to
    ``dtype`` except those of ``_keep_in_fp32_modules``; buffers (the float32 rotary tables) untouched."""
    cls = _wan_class()
    torch.manual_seed(seed)
    with torch.device(device):
        model = cls(**dict(config, num_layers=layers))
    keep = tuple(model._keep_in_fp32_modules or ())
    for name, p in model.named_parameters():
        if not any(k in name.split(".") for k in keep):
            p.data = p.data.to(dtype)
    return model.eval().requires_grad_(False)


def wan_inputs(config: dict, shape: VideoShape, device, dtype, seed: int = 1):
    """(latents ``[1, C, f, h, w]``, timestep ``[1]``, text states ``[1, text_len, text_dim]``)."""
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(shape.latent(config["in_channels"]), generator=g, device=device, dtype=dtype)
    text = torch.randn(1, shape.text_len, config["text_dim"], generator=g, device=device, dtype=dtype)
    return x, torch.tensor([500], device=device), text


def _block_args(model, inputs):
    """The positional arguments diffusers passes its first block (hidden states, text states, timestep
    projection, rotary (cos, sin)), captured from one forward."""
    seen = {}

    def grab(_module, args):
        seen["args"] = args
        raise _Captured

    handle = model.blocks[0].register_forward_pre_hook(grab)
    try:
        model(*inputs)
    except _Captured:
        pass
    finally:
        handle.remove()
    return seen["args"]


class _Captured(Exception):
    pass


def _diff(out, ref) -> dict:
    d = (out.float() - ref.float()).abs().max().item()
    scale = ref.float().abs().max().item()
    return {"max_abs_diff": d, "rel_diff": d / scale if scale else math.inf, "identical": bool(torch.equal(out, ref))}


def _mib(n):
    return None if n is None else n / 2**20


def _peak_mib(ctx: ReportContext, fn) -> float | None:
    """``peak_extra_bytes`` in MiB; None on CPU unless glibc returns freed blocks at once
    (``MALLOC_MMAP_THRESHOLD_`` set at process start), where the resident-set peak would not track tensors."""
    if ctx.device.type != "cuda" and "MALLOC_MMAP_THRESHOLD_" not in os.environ:
        fn()  # the same work, unmeasured
        return None
    return _mib(peak_extra_bytes(ctx, fn))


def _measure(ctx: ReportContext, model, inputs, block_args, ref, reps: int, warmup: int) -> dict:
    """Peak memory, time and output of the model as it is set up now (forward and block stack)."""
    layers = len(model.blocks)

    def forward():
        return model(*inputs).sample

    def block_stack():
        h = block_args[0]
        for b in model.blocks:
            h = b(h, *block_args[1:])
        return h

    out = forward()
    res = {"peak_mib": _peak_mib(ctx, forward), "blocks_peak_mib": _peak_mib(ctx, block_stack)}
    res.update(time_call(ctx, forward, reps=reps, warmup=warmup))
    t = time_call(ctx, block_stack, reps=reps, warmup=warmup)
    res.update(block_ms=t["ms"] / layers, block_min_ms=t["min_ms"] / layers, block_max_ms=t["max_ms"] / layers)
    res.update(_diff(out, out if ref is None else ref))
    res["repeat_identical"] = bool(torch.equal(forward(), out))  # run-to-run determinism of this setup
    if ctx.device.type == "cuda":
        res.update(_launch_diagnostics(ctx, block_stack, layers, reps))
    return res, out


def _launch_diagnostics(ctx: ReportContext, block_stack, layers: int, reps: int) -> dict:
    """CUDA only: per-block host enqueue time and CUDA-graph replay time of the block stack. A sliced
    block issues ~10-15x more ops than diffusers' (measured on CPU: 1,262 leaf ops per block at
    slices=16 vs 106), so eager time can be host-bound where the graph's is not."""
    res = {"block_enqueue_ms": enqueue_ms(ctx, block_stack, reps) / layers}
    try:
        res["block_graphed_ms"] = graphed_ms(ctx, block_stack, reps) / layers
    except Exception as e:  # a capture failure is data
        res["block_graphed_error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    return res


def _ratios(run: dict, base: dict) -> None:
    def ratio(a, b):
        return None if a is None or b in (None, 0) else a / b

    run["mem_ratio"] = ratio(base["peak_mib"], run["peak_mib"])  # how many times lower
    run["blocks_mem_ratio"] = ratio(base["blocks_peak_mib"], run["blocks_peak_mib"])
    run["time_ratio"] = ratio(run["ms"], base["ms"])  # > 1: slower
    run["block_time_ratio"] = ratio(run["block_ms"], base["block_ms"])
    if "block_graphed_ms" in run and "block_graphed_ms" in base:
        run["block_graphed_time_ratio"] = ratio(run["block_graphed_ms"], base["block_graphed_ms"])


def _verdicts(run: dict) -> dict:
    """The issue's three targets for one streamlined run. Memory is judged on the whole forward (what a
    user gets, including diffusers' unsliced output head), time per block (what 30 blocks add up to;
    the embedding and head run the same code in both), equality bit for bit."""
    mem, tim = run.get("mem_ratio"), run.get("block_time_ratio")
    return {
        "memory": {"target": f">= {TARGET_MEM_RATIO:g}x lower peak activation memory (whole forward)",
                   "value": mem, "met": None if mem is None else mem >= TARGET_MEM_RATIO},
        "time": {"target": f"<= {100 * (TARGET_TIME_RATIO - 1):.0f}% slower per block", "value": tim,
                 "met": tim <= TARGET_TIME_RATIO},
        "identical": {"target": "bit-identical output", "value": run["max_abs_diff"], "met": run["identical"]},
    }


def _streamline_name(s, h):
    return f"streamline(slices={s}, head_slices={h})"


def measure_wan(ctx: ReportContext, config: dict, layers: int, shape: VideoShape, settings, sweep=(),
                backends=(), reps: int = 10, warmup: int = 2, fp32_reference: bool = True,
                budget_s: float = math.inf) -> dict:
    """The whole section for one model size; see the module docstring. Never raises for a shortfall or
    an option that fails (its error is recorded); skips what ``budget_s`` (from the call) or the report's
    deadline leaves no time for, and says so in ``skipped``."""
    import video

    stop = time.monotonic() + budget_s
    dev, dtype = ctx.device, ctx.dtype
    model = build_wan(config, layers, dev, dtype)
    inputs = wan_inputs(config, shape, dev, dtype)
    result = {
        "model": "WanTransformer3DModel (diffusers), random weights, " + (
            "Wan2.1-T2V-1.3B shape" if config == WAN21_T2V_1_3B else
            f"reduced shape ({config['num_attention_heads']} heads x {config['attention_head_dim']}, "
            f"FFN {config['ffn_dim']})"),
        "config": {k: (list(v) if isinstance(v, tuple) else v) for k, v in config.items()},
        "layers": layers, "layers_published": config["num_layers"],
        "video": {"frames": shape.frames, "height": shape.height, "width": shape.width},
        "latent": list(shape.latent(config["in_channels"])), "tokens": shape.tokens(config["patch_size"]),
        "text_tokens": shape.text_len, "dtype": str(dtype).removeprefix("torch."), "device": str(dev),
        "memory_method": ("torch.cuda.max_memory_allocated above the level before the call" if dev.type == "cuda"
                          else "process VmHWM above VmRSS (tracks tensors only with MALLOC_MMAP_THRESHOLD_=65536)"),
        "runs": {}, "skipped": [],
    }
    runs = result["runs"]
    with torch.inference_mode():
        block_args = _block_args(model, inputs)
        base, ref = _measure(ctx, model, inputs, block_args, None, reps, warmup)
        runs["unsliced"] = base
        _log_run(ctx, "unsliced", base)
        order = [(_streamline_name(s, h), ("streamline", s, h)) for s, h in tuple(settings) + tuple(sweep)]
        order += [(f"backend:{b}", ("backend", b)) for b in backends]
        for name, what in order:
            if min(ctx.time_left(), stop - time.monotonic()) < 5:
                result["skipped"].append(f"{name}: no time left (section budget {budget_s:g} s or report deadline)")
                continue
            try:
                if what[0] == "streamline":
                    video.streamline(model, slices=what[1], head_slices=what[2])
                else:
                    model.set_attention_backend(what[1])
                run, _ = _measure(ctx, model, inputs, block_args, ref, reps, warmup)
            except Exception as e:  # an option this machine cannot run is data, not a crash
                runs[name] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}
                ctx.log(f"video: {name}: {runs[name]['error']}")
                continue
            finally:
                if what[0] == "streamline":
                    video.unstreamline(model)
                else:
                    model.reset_attention_backend()
                if dev.type == "cuda":
                    torch.cuda.empty_cache()
            _ratios(run, base)
            if what[0] == "streamline":
                run["verdicts"] = _verdicts(run)
            runs[name] = run
            _log_run(ctx, name, run)
        if fp32_reference and min(ctx.time_left(), stop - time.monotonic()) > 5:
            result["fp32_reference"] = _fp32_reference(model, inputs, ref, runs, settings, video)
    primary = _streamline_name(*settings[0])
    if primary in runs and "error" not in runs[primary]:
        result["primary"] = primary
        result["targets"] = runs[primary]["verdicts"]
    return result


def _fp32_reference(model, inputs, ref, runs, settings, video) -> dict:
    """The same weights upcast to float32 (buffers untouched), unsliced and with the primary setting:
    bf16's own distance from float32 next to streamline's distance from unsliced bf16."""
    m32 = copy.deepcopy(model)
    for p in m32.parameters():
        p.data = p.data.float()
    x32 = [t.float() if t.is_floating_point() else t for t in inputs]
    out32 = m32(*x32).sample
    s, h = settings[0]
    video.streamline(m32, slices=s, head_slices=h)
    sliced32 = m32(*x32).sample
    res = {"unsliced_vs_fp32": _diff(ref, out32)["max_abs_diff"],
           "fp32_streamlined_vs_fp32": _diff(sliced32, out32)["max_abs_diff"],
           "output_max_abs": out32.abs().max().item()}
    primary = runs.get(_streamline_name(s, h), {})
    if "error" not in primary:
        # the primary setting's bf16 output was not kept: recompute it once (same model, same inputs)
        video.streamline(model, slices=s, head_slices=h)
        try:
            res["streamlined_vs_fp32"] = _diff(model(*inputs).sample, out32)["max_abs_diff"]
        finally:
            video.unstreamline(model)
        # > 1: streamline moved the bf16 output further from float32 than diffusers' own bf16 rounding
        if res["unsliced_vs_fp32"] > 0:
            res["streamlined_error_over_unsliced_error"] = res["streamlined_vs_fp32"] / res["unsliced_vs_fp32"]
    del m32
    return res


def _log_run(ctx: ReportContext, name: str, r: dict) -> None:
    def x(v):
        return "?" if v is None else f"{v:.2f}x"

    mem = "?" if r["peak_mib"] is None else f"{r['peak_mib']:.0f} MiB"
    rel = "" if name == "unsliced" else (f" ({x(r['mem_ratio'])} lower, blocks {x(r['blocks_mem_ratio'])}; "
                                         f"{x(r['block_time_ratio'])} time per block)")
    host = ""
    if "block_enqueue_ms" in r:
        graphed = (f"graphed {r['block_graphed_ms']:.2f} ms/block" if "block_graphed_ms" in r
                   else f"graph capture failed: {r.get('block_graphed_error')}")
        host = f"; host enqueue {r['block_enqueue_ms']:.2f} ms/block, {graphed}"
    ctx.log(f"video: {name}: peak {mem}, {r['block_ms']:.2f} ms/block [{r['block_min_ms']:.2f}-"
            f"{r['block_max_ms']:.2f}], forward {r['ms']:.1f} ms{rel}, max|diff| {r['max_abs_diff']:.3g}"
            f"{' identical' if r['identical'] else ''}{host}")


def run(ctx: ReportContext) -> dict:
    """The report section: real shape on the GPU, the tiny Wan on CPU in smoke mode."""
    try:
        _wan_class()
    except MissingDiffusers as e:
        ctx.log(f"video: skipped: {e}")
        return {"skipped": str(e)}
    if ctx.smoke:
        return measure_wan(ctx, SMOKE_WAN, SMOKE_LAYERS, SMOKE_SHAPE, settings=((4, 2), (4, 1)), sweep=(),
                           backends=CPU_BACKENDS, reps=2, warmup=1)
    backends = GPU_BACKENDS if ctx.device.type == "cuda" else CPU_BACKENDS
    return measure_wan(ctx, WAN21_T2V_1_3B, GPU_LAYERS, REAL_SHAPE, STREAMLINE_SETTINGS, STREAMLINE_SWEEP,
                       backends, reps=10, budget_s=GPU_BUDGET_S)


def to_markdown(result: dict) -> str:
    """The section's table for report.md."""
    if "skipped" in result and "runs" not in result:
        return f"Video: skipped: {result['skipped']}\n"
    lines = [f"Video: {result['model']}, {result['layers']} of {result['layers_published']} blocks, "
             f"{result['video']['frames']} frames {result['video']['height']}x{result['video']['width']} "
             f"(latents {result['latent']}, {result['tokens']} tokens, {result['text_tokens']} text tokens), "
             f"{result['dtype']} on {result['device']}", "",
             "| configuration | peak MiB (forward) | x lower | peak MiB (blocks) | x lower | ms/block [range] "
             "| x time | forward ms | max abs diff | identical |", "|---|---|---|---|---|---|---|---|---|---|"]

    def f(v, fmt):
        return "-" if v is None else format(v, fmt)

    for name, r in result["runs"].items():
        if "error" in r:
            lines.append(f"| {name} | {r['error']} |||||||||")
            continue
        lines.append(f"| {name} | {f(r['peak_mib'], '.0f')} | {f(r.get('mem_ratio'), '.2f')} | "
                     f"{f(r['blocks_peak_mib'], '.0f')} | {f(r.get('blocks_mem_ratio'), '.2f')} | "
                     f"{r['block_ms']:.2f} [{r['block_min_ms']:.2f}-{r['block_max_ms']:.2f}] | "
                     f"{f(r.get('block_time_ratio'), '.2f')} | {r['ms']:.1f} | {r['max_abs_diff']:.3g} | "
                     f"{'yes' if r['identical'] else 'no'} |")
    host = [(n, r) for n, r in result["runs"].items() if "block_enqueue_ms" in r]
    if host:
        lines += ["", "Host dispatch (block stack, per block): eager ms, host enqueue ms (close to eager: "
                  "host-bound), CUDA-graph replay ms, graphed x time vs unsliced graphed", "",
                  "| configuration | eager ms | enqueue ms | graphed ms | graphed x time |", "|---|---|---|---|---|"]
        for name, r in host:
            graphed = f(r["block_graphed_ms"], ".2f") if "block_graphed_ms" in r else r.get("block_graphed_error")
            lines.append(f"| {name} | {r['block_ms']:.2f} | {r['block_enqueue_ms']:.2f} | {graphed} | "
                         f"{f(r.get('block_graphed_time_ratio'), '.2f')} |")
    if "fp32_reference" in result:
        fr = result["fp32_reference"]
        lines += ["", "float32 reference (same weights): " + ", ".join(f"{k} {v:.3g}" for k, v in fr.items())]
    if "targets" in result:
        lines += ["", f"Targets ({result['primary']}):"]
        for k, v in result["targets"].items():
            val = "-" if v["value"] is None else f"{v['value']:.3g}"
            verdict = v.get("note") or ("not measured" if v["met"] is None else "met" if v["met"] else "NOT met")
            lines.append(f"- {k}: {v['target']}: {val}: {verdict}")
    if result.get("skipped"):
        lines += ["", "Skipped: " + "; ".join(result["skipped"])]
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    """Run the section at a chosen shape outside the report (e.g. a scaled shape on CPU):

        MALLOC_MMAP_THRESHOLD_=65536 OMP_NUM_THREADS=1 python -m dlm.bench.gpu.video --layers 1 \\
            --frames 33 --height 240 --width 416 --dtype bfloat16 --settings 16x2,16x1
    """
    import argparse
    import json

    ap = argparse.ArgumentParser(description=main.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=GPU_LAYERS)
    ap.add_argument("--frames", type=int, default=REAL_SHAPE.frames)
    ap.add_argument("--height", type=int, default=REAL_SHAPE.height)
    ap.add_argument("--width", type=int, default=REAL_SHAPE.width)
    ap.add_argument("--text-len", type=int, default=REAL_SHAPE.text_len)
    ap.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--settings", default=",".join(f"{s}x{h}" for s, h in STREAMLINE_SETTINGS),
                    help="streamline settings slices x head_slices, comma-separated; the first is judged")
    ap.add_argument("--backends", default=None, help="comma-separated attention backends ('none' for none)")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--no-fp32-reference", action="store_true")
    ap.add_argument("--json", default=None, help="also write the result here")
    a = ap.parse_args(argv)
    try:
        settings = tuple(tuple(int(v) for v in item.split("x")) for item in a.settings.split(","))
        assert settings and all(len(st) == 2 for st in settings)
    except (ValueError, AssertionError):
        ap.error(f"--settings must look like 16x1,16x2, got {a.settings!r}")
    device = torch.device(a.device)
    if a.backends is None:
        backends = GPU_BACKENDS if device.type == "cuda" else CPU_BACKENDS
    else:
        backends = () if a.backends == "none" else tuple(a.backends.split(","))
    ctx = ReportContext(device=device, dtype=getattr(torch, a.dtype), smoke=False, deadline=time.monotonic() + 1e6)
    try:
        _wan_class()
    except MissingDiffusers as e:
        raise SystemExit(f"error: {e}")
    shape = VideoShape(a.frames, a.height, a.width, a.text_len)
    res = measure_wan(ctx, WAN21_T2V_1_3B, a.layers, shape, settings, (), backends, reps=a.reps, warmup=a.warmup,
                      fp32_reference=not a.no_fp32_reference)
    print(to_markdown(res))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
