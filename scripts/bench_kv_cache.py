"""Speed and quality of the prefix and dual KV caches against no cache, in one run.

    python scripts/bench_kv_cache.py --limit 8 --out runs/kv-cache

For each sampler and cache mode: task accuracy on the test split, NFE, tokens/s and the wall-time
ratio against `kv_cache="none"` measured in the same process (a warm-up batch runs first).
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

import dlm
from dlm.tasks import get_suite

MODES = ("none", "prefix", "dual")


def examples_of(suite: str, limit: int, seed: int):
    return [(task, ex) for task in get_suite(suite) for ex in task.examples("test", limit, seed=seed)]


def run_mode(pipe, items, mode, sampler, steps, gen_length, block_length, batch_size):
    correct, nfe, seconds, calls = 0.0, 0, 0.0, 0
    for i in range(0, len(items), batch_size):
        chunk = items[i: i + batch_size]
        started = time.perf_counter()
        out = pipe([ex.prompt for _, ex in chunk], num_inference_steps=steps, gen_length=gen_length,
                   block_length=block_length, sampler=sampler, kv_cache=mode, eos_early_stop=False)
        seconds += time.perf_counter() - started
        nfe, calls = nfe + out.nfe, calls + 1
        correct += sum(task.score(ex, text) for (task, ex), text in zip(chunk, out.texts))
    return {"accuracy": correct / len(items), "nfe_per_batch": nfe / calls, "seconds": seconds,
            "tokens_per_second": len(items) * gen_length / seconds}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny-dlm")
    parser.add_argument("--suite", default="all")
    parser.add_argument("--limit", type=int, default=8, help="test examples per task")
    parser.add_argument("--samplers", default="confidence,threshold")
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--gen-length", type=int, default=64)
    parser.add_argument("--block-length", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: leave as is)")
    parser.add_argument("--out", default="runs/kv-cache")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    pipe = dlm.DLMPipeline.from_pretrained(args.model)
    items = examples_of(args.suite, args.limit, seed=0)
    pipe([items[0][1].prompt], num_inference_steps=8, gen_length=args.gen_length, block_length=args.block_length)  # warm-up
    rows = []
    for sampler in tqdm(args.samplers.split(","), desc="samplers"):
        base = None
        for mode in MODES:
            r = run_mode(pipe, items, mode, sampler, args.steps, args.gen_length, args.block_length, args.batch_size)
            base = base or r["seconds"]
            rows.append({"sampler": sampler, "kv_cache": mode, **r, "speedup_vs_none": base / r["seconds"]})
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"args": vars(args), "rows": rows}, indent=2))
    print(f"{'sampler':<11} {'cache':<7} {'acc':>6} {'nfe':>6} {'tok/s':>8} {'sec':>7} {'speedup':>8}")
    for r in rows:
        print(f"{r['sampler']:<11} {r['kv_cache']:<7} {r['accuracy']:>6.3f} {r['nfe_per_batch']:>6.1f} "
              f"{r['tokens_per_second']:>8.1f} {r['seconds']:>7.2f} {r['speedup_vs_none']:>7.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
