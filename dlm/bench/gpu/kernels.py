"""Report section: the fused decoding statistics (`kernels.decode_stats`) beside the plain-torch path.

At `[rows, 126,464]` (LLaDA) and `[rows, 262,144]` (Gemma) bf16 logits, rows = a 32-token block x batch
and a 256-token canvas: time of the fused kernel (Triton on CUDA) and of the softmax path the samplers
take without it (`step_stats` with DLM_FUSED_DECODE=off semantics: float32 softmax, gather, top-2,
entropy), the bytes the kernel must read (the logits, once) over its time as GB/s and as a % of the
machine's copy bandwidth (bytes read + written per second: a read-only kernel at 100% moves as many
bytes per second as the copy does), and exactness against a float64 reference (token equality, max
error of probability, margin, entropy).

The kernel runs one program per row (`decode_stats`' launch: 1,024 columns a block, Triton's default of
4 warps), so 256 rows fill about 2 blocks per multiprocessor of an H100's 132: a launch-configuration sweep
(`SWEEP`: block size x warps, at `SWEEP_SHAPE`) says how much of the bandwidth target is the launch's, each
configuration checked against the default launch's tokens and probabilities. The sweep launches the Triton
kernel itself, so it runs where Triton does (a GPU, or the CPU interpreter under TRITON_INTERPRET=1).
"""
from __future__ import annotations

import torch

from dlm.bench.gpu import ReportContext, run_part, time_call

SHAPES = ((32, 126_464), (256, 126_464), (256, 262_144), (2048, 262_144))
SMOKE_SHAPES = ((8, 1000), (16, 4096))
SWEEP_SHAPE, SMOKE_SWEEP_SHAPE = (256, 262_144), (8, 1000)
SWEEP = {"block": (1024, 2048, 4096), "num_warps": (4, 8, 16)}
SMOKE_SWEEP = {"block": (256, 1024), "num_warps": (1, 4)}
MIN_START_S = 20.0


def _softmax_path(logits: torch.Tensor):
    """What a confidence/margin/entropy sampler computes without the fused kernel (one table)."""
    probs = torch.softmax(logits.float(), dim=-1)
    top = probs.topk(2, dim=-1)
    entropy = -torch.special.xlogy(probs, probs).sum(dim=-1)
    return top.indices[..., 0], top.values[..., 0], top.values[..., 0] - top.values[..., 1], entropy


def _exactness(logits: torch.Tensor, stats) -> dict:
    from kernels.decode_stats import decode_stats_ref

    ref = decode_stats_ref(logits.double())
    return {"tokens_equal": bool(torch.equal(stats.token.cpu(), ref.token.cpu())),
            "prob_max_error": float((stats.prob.double() - ref.prob).abs().max()),
            "margin_max_error": float((stats.margin.double() - ref.margin).abs().max()),
            "entropy_max_error": float((stats.entropy.double() - ref.entropy).abs().max())}


def launch(x: torch.Tensor, block: int, num_warps: int):
    """`decode_stats` of `x [N, V]` (rows evenly strided, columns contiguous) with a chosen launch: `block`
    columns per iteration, `num_warps` warps per program. Returns `DecodeStats` of shape `[N]`."""
    from kernels.decode_stats import DecodeStats, _decode_stats_kernel

    N, V = x.shape
    dev = x.device
    token = torch.empty(N, dtype=torch.int64, device=dev)
    prob, margin, ent = (torch.empty(N, dtype=torch.float32, device=dev) for _ in range(3))
    _decode_stats_kernel[(N,)](x, token, prob, margin, ent, x.stride(0), V, BLOCK=block, num_warps=num_warps)
    return DecodeStats(token, prob, margin, ent)


def sweep(ctx: ReportContext, shape: tuple[int, int], grid: dict, copy_gbps: float | None, reps: int) -> dict:
    """Time `launch` over `grid["block"] x grid["num_warps"]` at `shape` (bf16 logits on a GPU, the run's dtype
    elsewhere); each configuration's tokens and probabilities against the default launch's (`decode_stats`).
    Configurations past the deadline are recorded as skipped."""
    from kernels._backend import use_triton
    from kernels.decode_stats import decode_stats

    n, vocab = shape
    dtype = torch.bfloat16 if ctx.device.type == "cuda" else ctx.dtype
    gen = torch.Generator(device=ctx.device).manual_seed(1)
    logits = (torch.randn((n, vocab), generator=gen, device=ctx.device) * 4).to(dtype)
    if not use_triton(logits):
        return {"skipped": "the sweep launches the Triton kernel: a GPU, or TRITON_INTERPRET=1 on a CPU"}
    default = decode_stats(logits)
    read = logits.numel() * logits.element_size()
    rows = []
    for block in grid["block"]:
        for warps in grid["num_warps"]:
            if ctx.time_left() <= 0:
                rows.append({"block": block, "num_warps": warps, "skipped": "deadline"})
                continue
            t = time_call(ctx, lambda: launch(logits, block, warps), reps=reps, warmup=1)
            got = launch(logits, block, warps)
            gbps = read / (t["ms"] * 1e-3) / 1e9
            rows.append({"block": block, "num_warps": warps, "ms": t["ms"], "range_ms": [t["min_ms"], t["max_ms"]],
                         "gbps": gbps, "pct_of_copy": None if not copy_gbps else 100.0 * gbps / copy_gbps,
                         "tokens_equal": bool(torch.equal(got.token, default.token)),
                         "prob_max_diff": float((got.prob - default.prob).abs().max())})
    timed = [r for r in rows if "ms" in r]
    best = min(timed, key=lambda r: r["ms"]) if timed else None
    if best:
        ctx.log(f"kernels: sweep at {list(shape)}: best block {best['block']} x {best['num_warps']} warps, "
                f"{best['ms']:.3f} ms ({best['gbps']:.0f} GB/s)")
    return {"shape": list(shape), "dtype": str(dtype).replace("torch.", ""), "rows": rows,
            "best": None if best is None else {"block": best["block"], "num_warps": best["num_warps"]}}


def run(ctx: ReportContext) -> dict:
    from kernels._backend import use_triton
    from kernels.decode_stats import decode_stats

    copy = ctx.facts.get("copy_gbps")
    dtype = torch.bfloat16 if ctx.device.type == "cuda" else ctx.dtype
    rows = []
    for n, vocab in SMOKE_SHAPES if ctx.smoke else SHAPES:
        if ctx.time_left() <= 0:
            rows.append({"rows": n, "vocab": vocab, "skipped": "deadline"})
            continue
        gen = torch.Generator(device=ctx.device).manual_seed(0)
        logits = (torch.randn((n, vocab), generator=gen, device=ctx.device) * 4).to(dtype)
        reps = 3 if ctx.smoke else 20
        fused = time_call(ctx, lambda: decode_stats(logits), reps=reps)
        plain = time_call(ctx, lambda: _softmax_path(logits), reps=reps)
        read = logits.numel() * logits.element_size()
        gbps = read / (fused["ms"] * 1e-3) / 1e9
        row = {"rows": n, "vocab": vocab, "dtype": str(dtype).replace("torch.", ""),
               "backend": "triton" if use_triton(logits) else "torch reference (vocabulary chunks)",
               "fused_ms": fused["ms"], "fused_range_ms": [fused["min_ms"], fused["max_ms"]],
               "softmax_path_ms": plain["ms"], "speedup": plain["ms"] / fused["ms"], "gbps": gbps,
               "pct_of_copy": None if not copy else 100.0 * gbps / copy, **_exactness(logits, decode_stats(logits))}
        ctx.log(f"kernels: [{n}, {vocab}] fused {fused['ms']:.3f} ms ({gbps:.0f} GB/s), softmax path "
                f"{plain['ms']:.3f} ms, tokens equal {row['tokens_equal']}")
        rows.append(row)
        del logits
    big = [r for r in rows if r.get("vocab") == 262_144 and "gbps" in r]
    target = {"target": ">= 80% of the measured copy bandwidth at 262,144 columns",
              "value": max((r["pct_of_copy"] or 0) for r in big) if big and copy else None}
    target["met"] = None if target["value"] is None else target["value"] >= 80.0
    result = {"rows": rows, "copy_gbps": copy, "targets": {"bandwidth": target}}
    ctx.save(result)
    run_part(ctx, "sweep", 10.0, lambda: sweep(ctx, SMOKE_SWEEP_SHAPE if ctx.smoke else SWEEP_SHAPE,
                                               SMOKE_SWEEP if ctx.smoke else SWEEP, copy, 3 if ctx.smoke else 20), result)
    return result


def markdown(result: dict) -> str:
    lines = ["| rows x vocab | backend | fused ms | softmax path ms | speed-up | GB/s | % of copy | tokens equal | max prob error |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        if "skipped" in r:
            lines.append(f"| {r['rows']} x {r['vocab']} | skipped ({r['skipped']}) | | | | | | | |")
            continue
        pct = "n/a" if r["pct_of_copy"] is None else f"{r['pct_of_copy']:.0f}%"
        lines.append(f"| {r['rows']} x {r['vocab']} | {r['backend']} | {r['fused_ms']:.3f} | {r['softmax_path_ms']:.3f} | "
                     f"{r['speedup']:.2f}x | {r['gbps']:.0f} | {pct} | {r['tokens_equal']} | {r['prob_max_error']:.1e} |")
    sw = result.get("sweep", {})
    if "rows" in sw:
        lines += ["", f"Launch sweep at {sw['shape'][0]} x {sw['shape'][1]} ({sw['dtype']}; the default launch is block "
                  "1024, 4 warps):", "", "| block | warps | ms [range] | GB/s | % of copy | tokens equal to default | "
                  "max prob diff |", "|---|---|---|---|---|---|---|"]
        for r in sw["rows"]:
            if "ms" not in r:
                lines.append(f"| {r['block']} | {r['num_warps']} | skipped ({r['skipped']}) | | | | |")
                continue
            pct = "n/a" if r["pct_of_copy"] is None else f"{r['pct_of_copy']:.0f}%"
            lines.append(f"| {r['block']} | {r['num_warps']} | {r['ms']:.3f} [{r['range_ms'][0]:.3f}-{r['range_ms'][1]:.3f}] | "
                         f"{r['gbps']:.0f} | {pct} | {r['tokens_equal']} | {r['prob_max_diff']:.1e} |")
    elif sw:
        lines += ["", f"Launch sweep: {sw.get('skipped') or sw.get('error')}"]
    return "\n".join(lines)
