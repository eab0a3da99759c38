"""Decoding speed of the built-in model on 1 thread against all cores, quiet and with one core busy.

    python scripts/bench_threads.py --repeats 5 --out runs/threads

Why: torch starts one intra-op thread per core. On a tiny model every forward is a few small matrix
products, so the threads spend more time meeting at barriers than computing; when another process
holds a core, each barrier waits for a thread the scheduler has parked, and decoding collapses.
This script measures that, to choose the CLI's default (`dlm --threads`, docs/dlm.md "Threads").

Workload: tiny-dlm, `confidence` (one token per forward), gen 64, block 32, no KV cache, EOS stop
off, so every call is exactly 64 forwards whatever the answers; batch 1 and batch 8. Conditions:
"quiet" (whatever else the machine runs; its load average is recorded) and "one core busy" (this
script starts a pure-Python busy loop in a child process, as a second user's job would). The thread
counts alternate call by call inside each condition, so drift in the machine's load hits both alike.
Reported per cell: the median seconds of `--repeats` calls, their min-max, and the ratio
all-cores / 1-thread (above 1: one thread is faster).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

import dlm

PROMPTS = ["sort: tom fay ivy gus bo wes", "reverse: ana bo cyd tom", "copy: dex jo bo", "sort: tom fay ivy",
           "reverse: al bo cy", "copy: ivy gus wes", "sort: jo al bo", "reverse: tom wes fay gus"]


def one_call(pipe, prompts: list[str]) -> float:
    started = time.perf_counter()
    out = pipe(prompts, num_inference_steps=64, gen_length=64, block_length=32, sampler="confidence",
               kv_cache="none", eos_early_stop=False)
    seconds = time.perf_counter() - started
    assert out.nfe == 64, out.nfe  # the workload is fixed: a different count would compare unlike runs
    return seconds


class busy_core:
    """A child process spinning on one core for the duration of the block."""

    def __enter__(self):
        self.proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        time.sleep(0.5)  # let the scheduler give it its core
        return self

    def __exit__(self, *exc):
        self.proc.terminate()
        self.proc.wait()
        return False


def measure(pipe, threads: list[int], batch: int, repeats: int, bar) -> dict[int, list[float]]:
    prompts = (PROMPTS * 8)[:batch]
    times: dict[int, list[float]] = {t: [] for t in threads}
    for t in threads:  # warm-up per thread count (the pool is resized on first use)
        torch.set_num_threads(t)
        one_call(pipe, prompts)
        bar.update(1)
    for _ in range(repeats):
        for t in threads:
            torch.set_num_threads(t)
            times[t].append(one_call(pipe, prompts))
            bar.update(1)
    return times


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per cell (default: 5)")
    parser.add_argument("--batches", default="1,8", help="batch sizes (default: 1,8)")
    parser.add_argument("--out", default="runs/threads", help="folder for results.json (default: runs/threads)")
    args = parser.parse_args(argv)
    cores = os.cpu_count() or 1
    threads = sorted({1, cores})
    pipe = dlm.DLMPipeline.from_pretrained("tiny-dlm")
    rows = []
    batches = [int(b) for b in args.batches.split(",")]
    bar = tqdm(total=2 * len(batches) * len(threads) * (args.repeats + 1), desc="calls", file=sys.stderr)
    for condition in ("quiet", "one core busy"):
        for batch in batches:
            load = os.getloadavg()[0]
            if condition == "quiet":
                times = measure(pipe, threads, batch, args.repeats, bar)
            else:
                with busy_core():
                    times = measure(pipe, threads, batch, args.repeats, bar)
            row = {"condition": condition, "batch": batch, "load_before": round(load, 2),
                   "seconds": {str(t): [round(s, 4) for s in v] for t, v in times.items()}}
            medians = {t: statistics.median(v) for t, v in times.items()}
            row["median"] = {str(t): round(m, 4) for t, m in medians.items()}
            row["ratio_all_over_1"] = round(medians[cores] / medians[1], 2) if cores > 1 else 1.0
            rows.append(row)
            bar.write(json.dumps(row), file=sys.stderr)
    bar.close()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"cores": cores, "torch": torch.__version__, "rows": rows}, indent=1))
    print(f"| condition | batch | load before | 1 thread: median s (min-max) | {cores} threads: median s (min-max) "
          f"| {cores} threads / 1 thread |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        cells = []
        for t in threads:
            v = row["seconds"][str(t)]
            cells.append(f"{statistics.median(v):.2f} ({min(v):.2f}-{max(v):.2f})")
        print(f"| {row['condition']} | {row['batch']} | {row['load_before']} | {' | '.join(cells)} | "
              f"{row['ratio_all_over_1']:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
