"""Positions fed to the model per row: our engine beside diffusers' LLaDA2Pipeline, per suite.

At one forward per block the wall time of either engine follows the number of positions the model
processes, so this shows where a speed ratio can and cannot come from (docs/benchmarks.md, "Why there
is no 3x at those points"). It runs `dlm bench`'s own runner on the same batches, one thread:

    python scripts/bench_window_positions.py --samplers threshold,threshold:cut=1,diffusers-llada2-thr --steps 2 --limit 32
"""
from __future__ import annotations

import argparse

import torch

from dlm.bench.harness import (BenchConfig, _Runner, collect_examples, encoded_suite_batches, load_model,
                               parse_sampler_specs, resolve_suite)


def positions_per_row(runner: _Runner, spec, budget: int, batches) -> dict:
    """Mean prompt width (left-padded, as fed), forward positions per row, model calls per batch, ms per batch."""
    rows = positions = calls = 0
    seconds = 0.0
    prompt = 0
    with torch.inference_mode():
        for _, _, ids, mask in batches:
            _, _, batch_calls, batch_positions, batch_seconds, _, _ = runner.run(
                spec, budget, ids, mask, torch.Generator().manual_seed(0))
            rows += ids.shape[0]
            positions += batch_positions
            calls += batch_calls
            seconds += batch_seconds
            prompt += ids.numel()
    return {"prompt": prompt / rows, "positions": positions / rows, "calls": calls / len(batches),
            "ms_per_batch": 1000 * seconds / len(batches)}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="tiny-dlm")
    ap.add_argument("--suites", default="list_edits,arithmetic,puzzles")
    ap.add_argument("--samplers", default="threshold,threshold:cut=1,diffusers-llada2-thr")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--limit", type=int, default=32, help="test prompts per task")
    ap.add_argument("--batch-size", type=int, default=16)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    model, tok, ids = load_model(args.model)
    model.eval()
    specs = parse_sampler_specs(args.samplers)
    print("| suite | sampler | prompt width | positions per row | calls per batch | ms per batch |")
    print("|---|---|---:|---:|---:|---:|")
    for suite in args.suites.split(","):
        cfg = BenchConfig(model=args.model, suite=suite, samplers=args.samplers, steps=[args.steps],
                          limit=args.limit, temperature=0.0, batch_size=args.batch_size)
        runner = _Runner(model, tok, cfg, ids)
        examples = collect_examples(resolve_suite(suite, None), args.limit, 0)
        batches = encoded_suite_batches(tok, examples, args.batch_size, runner.pad_id, torch.device("cpu"))
        for spec in specs:
            r = positions_per_row(runner, spec, args.steps, batches)
            print(f"| {suite} | `{spec.label}` | {r['prompt']:.1f} | {r['positions']:.1f} | {r['calls']:.2f} | "
                  f"{r['ms_per_batch']:.1f} |")


if __name__ == "__main__":
    main()
