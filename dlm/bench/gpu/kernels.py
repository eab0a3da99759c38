"""Report section: the fused decoding statistics (`kernels.decode_stats`) beside the plain-torch path.

At `[rows, 126,464]` (LLaDA) and `[rows, 262,144]` (Gemma) bf16 logits, rows = a 32-token block x batch
and a 256-token canvas: time of the fused kernel (Triton on CUDA) and of the softmax path the samplers
take without it (`step_stats` with DLM_FUSED_DECODE=off semantics: float32 softmax, gather, top-2,
entropy), the bytes the kernel must read (the logits, once) over its time as GB/s and as a % of the
machine's copy bandwidth (bytes read + written per second: a read-only kernel at 100% moves as many
bytes per second as the copy does), and exactness against a float64 reference (token equality, max
error of probability, margin, entropy).
"""
from __future__ import annotations

import torch

from dlm.bench.gpu import ReportContext, time_call

SHAPES = ((32, 126_464), (256, 126_464), (256, 262_144), (2048, 262_144))
SMOKE_SHAPES = ((8, 1000), (16, 4096))


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
    return {"rows": rows, "copy_gbps": copy, "targets": {"bandwidth": target}}


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
    return "\n".join(lines)
