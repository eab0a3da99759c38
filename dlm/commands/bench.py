"""`dlm bench`: quality vs forward passes for several samplers on one suite, the field's engines beside them."""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from dlm._progress import show_progress
from dlm.tasks.oracle_names import ORACLE_SUITE_NAMES
from dlm.commands._common import (KV_CACHE_CHOICES, check_output_dir, device_value, positive_int, temperature_value,
                                  threads_label)


def _limit(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {value}")
    return value


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "bench", help="quality vs NFE / wall time for samplers on a task suite",
        description="Run every (sampler, step budget) pair on the same prompts and report quality, NFE, tokens "
                    "per forward, tokens/s, seconds and peak memory; write results.json, results.csv and plots.")
    p.add_argument("--model", default="tiny-dlm", help="built-in name or checkpoint path (default: tiny-dlm)")
    p.add_argument("--suite", default="list_edits",
                   help="task suite (list_edits, arithmetic, puzzles, all, chains), a task name (copy, shuffle, ...), "
                        f"an oracle suite ({', '.join(ORACLE_SUITE_NAMES)}) or jsonl:PATH (default: list_edits)")
    p.add_argument("--samplers", default="confidence,threshold",
                   help="comma-separated entries name[:key=value...]; kv=none|prefix|dual|prompt picks the cache per entry, "
                        "xblock=1 extends it across blocks, refresh=N rebuilds it every N steps, cut=1 cuts the window "
                        "at the block end, block=N sets the entry's block length (either engine), steps=A/B gives the entry its own "
                        "budgets instead of --steps (e.g. hex:steps=320), window=W[:open=f] decodes W blocks at once "
                        "(D2F's window, e.g. lopa:window=2); "
                        "external rows: diffusers-llada2 and diffusers-llada2-thr (diffusers' LLaDA2Pipeline), "
                        "transformers-diffusiongemma, diffusers-diffusiongemma and dlm-exact (DiffusionGemma models; "
                        "--steps points map to entropy bounds, see docs/benchmarks.md) (default: confidence,threshold)")
    p.add_argument("--steps", default="8,16,32,64", help="comma-separated forward-pass budgets (default: 8,16,32,64)")
    p.add_argument("--limit", type=_limit, default=None,
                   help="prompts per task (default: 50 per task, every JSONL line, 4096 oracle samples)")
    p.add_argument("--out", default=None, help="output directory (default: runs/bench-<suite>)")
    p.add_argument("--gen-length", type=positive_int, default=None,
                   help="tokens to generate (default: the suite's own length, 64 for the short suites and 128 "
                        "for chains; a DiffusionGemma's generation_config max_new_tokens)")
    p.add_argument("--block-length", type=positive_int, default=None,
                   help="block size (default: 32; a DiffusionGemma's canvas_length)")
    p.add_argument("--kv-cache", choices=KV_CACHE_CHOICES, default="auto",
                   help="KV cache for entries without kv=, as in dlm sample (default: auto: the prompt's cache where "
                        "it is exact, as on tiny-dlm, else none; DiffusionGemma: its own exact cache)")
    p.add_argument("--batch-size", type=positive_int, default=16, help="prompts per batched call (default: 16)")
    p.add_argument("--seed", type=int, default=0, help="seed of the prompts and of sampling (default: 0)")
    p.add_argument("--temperature", type=temperature_value, default=None,
                   help="sampling temperature (default: 0 for task suites, 1 for oracle suites)")
    p.add_argument("--extractor", default=None,
                   help="answer extractor for jsonl: suites (boxed, hash, last-number, exact, first-line, contains)")
    p.add_argument("--no-eos-stop", action="store_true",
                   help="decode every block even after a row has emitted EOS (default: stop such rows, in both engines)")
    p.add_argument("--device", type=device_value, default="cpu", help="torch device (default: cpu)")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress bars on stderr (default: on when stderr is a terminal, off when redirected)")
    p.add_argument("--json", action="store_true", help="print the JSON summary on stdout (the table goes to stderr)")
    p.add_argument("--resume", action="store_true",
                   help="reuse the finished pairs of an interrupted run of the same options in --out (its pairs.jsonl)")
    p.set_defaults(func=run)


def run(args) -> int:
    from dataclasses import asdict

    from dlm.bench import BenchConfig, format_table, parse_sampler_specs, parse_steps, run_bench
    from dlm.bench.journal import Journal, OutputError, write_partial
    from dlm.bench.report import plot_results, write_csv, write_json

    # Fail on spelling mistakes and unusable output paths before any model loads.
    specs = parse_sampler_specs(args.samplers)
    steps = parse_steps(args.steps)
    stem = Path(args.suite).stem if args.suite.startswith("jsonl:") else args.suite
    safe_suite = "".join(c if c.isalnum() or c in "-_." else "_" for c in stem) or "suite"
    out_dir = check_output_dir(Path(args.out) if args.out else Path("runs") / f"bench-{safe_suite}")
    cfg = BenchConfig(model=args.model, suite=args.suite, samplers=[s.label for s in specs], steps=steps,
                      limit=args.limit, gen_length=args.gen_length, block_length=args.block_length,
                      kv_cache=args.kv_cache, batch_size=args.batch_size, seed=args.seed, temperature=args.temperature,
                      eos_early_stop=not args.no_eos_stop, extractor=args.extractor, device=args.device)
    out_dir.mkdir(parents=True, exist_ok=True)
    journal = Journal.open(out_dir, asdict(cfg), resume=args.resume)
    if args.resume:
        print(f"resume: {len(journal.pairs)} finished pairs in {journal.path}" if journal.pairs
              else f"resume: nothing to resume in {out_dir}; starting afresh", file=sys.stderr)
    try:
        with _sigterm_as_interrupt():
            result = run_bench(cfg, progress=show_progress(args.progress), journal=journal)
    except OutputError:
        raise  # the folder cannot be written: its message says where the finished pairs are
    except BaseException as err:  # Ctrl-C, SIGTERM, a crash: keep what finished
        reason = "interrupted" if isinstance(err, KeyboardInterrupt) else f"stopped by {type(err).__name__}"
        line = write_partial(journal, out_dir, plots=not args.no_plots, reason=reason)
        if line:
            print(line, file=sys.stderr)
        raise
    if journal.reused:
        print(f"resume: reused {len(journal.reused)} of {len(result.pairs)} pairs "
              f"({', '.join(f'{s}@{b}' for s, b in journal.reused)}); ran {len(result.pairs) - len(journal.reused)}",
              file=sys.stderr)
    try:
        files = {"json": str(write_json(result, out_dir / "results.json")), "csv": str(write_csv(result, out_dir / "results.csv"))}
        if not args.no_plots:
            for path in plot_results(result, out_dir):
                files[path.stem] = str(path)
    except OSError as err:
        raise ValueError(f"cannot write the results in {out_dir}: {err.strerror or err}; every pair is kept in "
                         f"{journal.path}: make the folder writable and rerun with --resume") from None
    table = format_table(result)
    if args.json:
        print(table, file=sys.stderr)
        summary = {"suite": args.suite, "model": result.config["model"], "out": str(out_dir), "files": files,
                   "pairs": [{k: getattr(p, k) for k in ("sampler", "budget", "engine", "kv_cache", "n", "quality",
                                                         "nfe", "branch_forwards", "nfe_per_call", "tpf", "tokens_per_s", "seconds",
                                                         "peak_mem_mb", "quality_by_task")} for p in result.pairs],
                   "targets": result.meta.get("targets", {}), "vs_diffusers": result.meta.get("vs_diffusers", {}),
                   "resumed_pairs": len(journal.reused)}
        print(json.dumps(summary))
    else:
        print(table)
        total = time.perf_counter() - getattr(args, "started", time.perf_counter())
        print(f"\nwrote {', '.join(files.values())} ({total:.1f} s in all, {threads_label()}; the table's "
              "seconds are each pair's decoding only)", file=sys.stderr)
    return 0


class _sigterm_as_interrupt:
    """SIGTERM (a job scheduler stopping the run) raises KeyboardInterrupt, as Ctrl-C does, so that the
    finished pairs are written out; the previous handler comes back afterwards."""

    def __enter__(self):
        import signal
        import threading

        self._old = None
        if threading.current_thread() is threading.main_thread():
            self._old = signal.signal(signal.SIGTERM, self._raise)
        return self

    @staticmethod
    def _raise(signum, frame):
        raise KeyboardInterrupt

    def __exit__(self, *exc):
        if self._old is not None:
            import signal
            signal.signal(signal.SIGTERM, self._old)
        return False
