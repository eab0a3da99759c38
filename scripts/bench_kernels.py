"""Fused dLLM decoding stats vs the softmax path at a 126k vocabulary: peak memory, time, tokens.

CPU part: each path runs in its own subprocess; memory is the peak resident set size (VmHWM) reset
via /proc/self/clear_refs once the logits exist, minus the RSS then (extra memory of the step).
"softmax" computes the same four statistics from a materialised float32 softmax [B, L, V];
"fused" is kernels.decode_stats, which on CPU without Triton is the reference chunked over the
vocabulary (online softmax). Sampler-step part: one `confidence` sampler step on the same logits
with the engine's fused path off and on (DLM_FUSED_DECODE), same peak-RSS method, same commits
required. GPU part (only when CUDA is present): Triton kernel vs softmax path,
torch.cuda.max_memory_allocated and CUDA-event time; skipped with a message otherwise.

    OMP_NUM_THREADS=1 python scripts/bench_kernels.py --positions 256 --vocab 126464
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def _kb(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1])
    raise RuntimeError(field)


def softmax_stats(logits):
    """The straightforward path: [B, L, V] float32 softmax, then top-2 and entropy."""
    p = logits.float().softmax(-1)
    top = p.topk(2, dim=-1)
    ent = -(p * p.clamp_min(1e-30).log()).sum(-1)
    return top.indices[..., 0], top.values[..., 0], top.values[..., 0] - top.values[..., 1], ent


def sampler_step(logits, fused):
    """One greedy `confidence` step over the whole sequence as the engine runs it."""
    import torch

    from samplers import get_sampler
    from samplers.base import StepContext

    os.environ["DLM_FUSED_DECODE"] = "on" if fused else "off"
    B, L = logits.shape[:2]
    ctx = StepContext(x=torch.full((B, L), 1, dtype=torch.long), candidates=torch.ones(B, L, dtype=torch.bool),
                      num_transfer=torch.full((B,), 4), step=0, steps_in_block=L // 4, last_step=False,
                      temperature=0.0, generator=None, mask_token_id=1)
    r = get_sampler("confidence").step(logits, ctx)
    return r.x, r.confidence, r.confidence, r.confidence


def child(a):
    import torch

    from kernels.decode_stats import decode_stats

    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(1, a.positions, a.vocab, generator=g) * 3
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    base = _kb("VmRSS")
    times = []
    for _ in range(a.reps):
        t0 = time.perf_counter()
        if a.path == "softmax":
            tok, p1, margin, ent = softmax_stats(logits)
        elif a.path.startswith("step-"):
            tok, p1, margin, ent = sampler_step(logits, fused=a.path == "step-fused")
        else:
            s = decode_stats(logits, block=a.block)
            tok, p1, margin, ent = s.token, s.prob, s.margin, s.entropy
        times.append(time.perf_counter() - t0)
    peak = _kb("VmHWM")
    torch.save({"tok": tok, "p1": p1, "margin": margin, "ent": ent}, a.out)
    print(json.dumps({"extra_mib": (peak - base) / 1024, "time_s": min(times)}))


def gpu_part(a):
    import torch

    if not torch.cuda.is_available():
        return "skipped: no CUDA device"
    from kernels.decode_stats import decode_stats

    logits = torch.randn(1, a.positions, a.vocab, device="cuda") * 3
    out = {}
    for name, fn in (("softmax", lambda: softmax_stats(logits)[0]), ("fused", lambda: decode_stats(logits).token)):
        fn()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(10):
            tok = fn()
        e1.record()
        torch.cuda.synchronize()
        out[name] = {"extra_mib": (torch.cuda.max_memory_allocated() - base) / 2**20,
                     "time_ms": e0.elapsed_time(e1) / 10, "tok": tok}
    same = bool(torch.equal(out["softmax"].pop("tok"), out["fused"].pop("tok")))
    return {**out, "same_tokens": same, "mem_ratio": out["softmax"]["extra_mib"] / out["fused"]["extra_mib"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--positions", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=126464)
    ap.add_argument("--block", type=int, default=8192)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--path", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.path:
        return child(a)
    import torch

    res = {}
    with tempfile.TemporaryDirectory() as d:
        for path in ("softmax", "fused", "step-softmax", "step-fused"):
            out = os.path.join(d, path + ".pt")
            cmd = [sys.executable, __file__, "--path", path, "--positions", str(a.positions), "--vocab",
                   str(a.vocab), "--block", str(a.block), "--reps", str(a.reps), "--out", out]
            r = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
            if r.returncode:
                sys.exit(f"error: {path} run failed: {r.stderr.strip().splitlines()[-1]}")
            res[path] = json.loads(r.stdout.strip().splitlines()[-1])
            res[path]["stats"] = torch.load(out)
    s, f = res["softmax"].pop("stats"), res["fused"].pop("stats")
    ss, sf = res["step-softmax"].pop("stats"), res["step-fused"].pop("stats")
    step = {"mem_ratio": res["step-softmax"]["extra_mib"] / max(res["step-fused"]["extra_mib"], 1e-9),
            "time_ratio": res["step-fused"]["time_s"] / res["step-softmax"]["time_s"],
            "same_commits": bool(torch.equal(ss["tok"], sf["tok"])),
            "max_abs_diff_confidence": (ss["p1"] - sf["p1"]).abs().max().item()}
    summary = {"positions": a.positions, "vocab": a.vocab, "cpu": res,
               "cpu_mem_ratio": res["softmax"]["extra_mib"] / max(res["fused"]["extra_mib"], 1e-9),
               "cpu_time_ratio": res["fused"]["time_s"] / res["softmax"]["time_s"],
               "same_tokens": bool(torch.equal(s["tok"], f["tok"])),
               "max_abs_diff": {k: (s[k] - f[k]).abs().max().item() for k in ("p1", "margin", "ent")},
               "sampler_step": step, "gpu": gpu_part(a)}
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
