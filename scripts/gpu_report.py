"""The GPU report (issues 40, 48): every speed and memory figure of the engine at real model sizes, against the
hardware's floor, beside the field's code and beside an autoregressive model of the same size, in one run on
one H100 or H200.

    python scripts/gpu_report.py --out runs/gpu            # on a CUDA machine: about 5.5 minutes, bf16
    python scripts/gpu_report.py --smoke --out runs/smoke  # every section at tiny size on CPU
    bash scripts/gpu_report_run.sh "$OUT"                  # on the bare GPU machine (docs/gpu.md)

Writes report.json (every number), report.md (the tables and the targets marked met / not met) and report.log
(the progress lines, and the stacks of a hung section) to --out. Sections run in this order, safest and most
valuable first, each a module of `dlm/bench/gpu/`: machine (copy bandwidth and matmul rate: the floors'
denominators), replica_forward (each replica's forward vs its weight-streaming floor), engine_masked (LLaDA-8B
through `dlm.generate`), engine_lossless (`lossless:base=confidence` beside `confidence` on LLaDA-8B at batch 1),
engine_uniform (DiffusionGemma-26B-A4B, beside transformers' generate),
autoregressive (transformers' generate on a causal Llama of LLaDA-8B's shape, beside our engine), kernels
(the fused decoding statistics, the first Triton launch), video (a Wan2.1-1.3B-shaped DiT with and without
`video.streamline`), extras (compile, CUDA-graph replays, transformers' compiled generate, diffusers'
LLaDA2Pipeline).

Time: no section or part starts with less than its minimum left before the deadline (--budget-s after the
start), so the run ends near it; results are written after every section and every part within one, so a
run cut short keeps what it measured. SIGINT or SIGTERM writes the partial report (the running section marked
interrupted) and exits 130; a watchdog thread dumps every thread's stack to the log when a section runs past
its hang limit, and past --hard-limit-s writes the partial report and exits 124 even when the main thread is
stuck in a CUDA call. A failing section or part is recorded with its error and the run goes on. Nothing is
downloaded: the replicas are random-weight models of the real shapes (`dlm.replica`).
"""
from __future__ import annotations

import argparse
import datetime
import importlib
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

STARTED = time.monotonic()  # before torch is imported: run as a script, the budget counts the whole process
_t0 = STARTED  # the run's start: STARTED as a script, the call of `main` otherwise (tests)
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SECTIONS = ("machine", "replica_forward", "engine_masked", "engine_lossless", "engine_uniform", "autoregressive",
            "kernels", "video", "extras")
BUDGET_S = 330.0
HARD_EXTRA_S = 45.0  # past the budget: the longest a started part may overrun its minimum
HANG_S = {"machine": 60, "replica_forward": 150, "engine_masked": 120, "engine_lossless": 90, "engine_uniform": 150,
          "autoregressive": 120, "kernels": 90, "video": 120, "extras": 240}
SMOKE_NOTE = "n/a (smoke)"


class ReportInterrupted(BaseException):
    """SIGINT / SIGTERM during a section: not an `Exception`, so no section's error guard swallows it."""


def collect_targets(results: dict, smoke: bool = False) -> list[dict]:
    """Every section's targets, in one list of {section, name, target, value, met[, note]}. In smoke mode every
    target is "n/a (smoke)": CPU numbers at toy size judge nothing."""
    rows = []
    for section, result in results.items():
        for name, t in (result.get("targets") or {}).items():
            rows.append({"section": section, "name": name, **t})
    forward = results.get("replica_forward", {})
    graphs = results.get("extras", {})
    for rep in forward.get("replicas", []):
        for r in rep.get("rows", []):
            if rep["name"] == "llada-8b" and r["batch"] == 1 and r["mode"] == "prefix":
                rows.append({"section": "replica_forward", "name": "llada_prefix_floor",
                             "target": "LLaDA-8B batch 1, block-32 step with prefix cache: >= 80% of the weight-streaming floor",
                             "value": r["pct_of_floor"], "met": r["pct_of_floor"] >= 80,
                             "note": _why(r, graphs.get("llada_floor_graph"))})
            if rep["name"] == "diffusiongemma-26b-a4b" and r["batch"] == 1:
                ratio = r["ms"] / r["floor_ms"]
                rows.append({"section": "replica_forward", "name": "dgemma_floor",
                             "target": "DiffusionGemma-26B-A4B canvas 256, batch 1: a step within 1.25x of its floor",
                             "value": ratio, "met": ratio <= 1.25, "note": _why(r, graphs.get("dgemma_floor_graph"))})
    if smoke:
        for row in rows:
            row.update(met=None, note=SMOKE_NOTE)
        for result in results.values():  # the sections' own tables show the same
            for t in (result.get("targets") or {}).values():
                t.update(met=None, note=SMOKE_NOTE)
    return rows


def _why(row: dict, graph: dict | None) -> str:
    """Beside a floor row: its time, the host's enqueue time and the CUDA-graph replay (extras), so a miss
    says whether the host's dispatch or the GPU's own time is short of the floor."""
    parts = [f"forward {row['ms']:.2f} ms, floor {row['floor_ms']:.2f} ms"]
    if "enqueue_ms" in row:
        parts.append(f"host enqueue {row['enqueue_ms']:.2f} ms")
    if graph and "graphed_ms" in graph:
        parts.append(f"CUDA-graph replay {graph['graphed_ms']:.2f} ms")
    return ", ".join(parts)


def _fmt(value) -> str:
    if value is None:
        return "not measured"
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def _markdown_of(module, result: dict) -> str:
    head = []
    if result.get("interrupted"):
        head.append(f"**interrupted**: {result['interrupted']} (what it had measured follows)")
    if "error" in result:
        head.append(f"**failed**: `{result['error']}`" + (" (what it had measured follows)" if result.get("partial") else ""))
    if "skipped" in result and len(result) == 1:
        return f"skipped: {result['skipped']}"
    render = getattr(module, "markdown", None) or getattr(module, "to_markdown", None)
    body = ""
    if render and (not head or result.get("partial")):
        try:
            body = render(result)
        except Exception as error:  # noqa: BLE001 - a partial result may lack what the table reads
            body = f"(table not drawn: {type(error).__name__}: {error})\n```\n" + json.dumps(result, indent=1,
                                                                                              default=str)[:4000] + "\n```"
    return "\n\n".join(head + ([body] if body else []))


def write_markdown(path: Path, meta: dict, results: dict, modules: dict, targets: list[dict]) -> None:
    lines = [f"# GPU report ({meta['date']}, {meta['device']}, {meta['dtype']}{', smoke' if meta['smoke'] else ''})", "",
             f"Command: `{meta['command']}`; {meta['seconds']:.0f} s of a {meta['budget_s']:.0f} s budget; "
             f"{meta['status']}.", "", "## Targets", "",
             "| section | target | value | met | notes |", "|---|---|---|---|---|"]
    for t in targets:
        met = t.get("note") if t.get("note") == SMOKE_NOTE else {True: "met", False: "**not met**", None: "n/a"}[t["met"]]
        note = "" if t.get("note") == SMOKE_NOTE else t.get("note", "")
        lines.append(f"| {t['section']} | {t['target']} | {_fmt(t['value'])} | {met} | {note} |")
    for name, result in results.items():
        lines += ["", f"## {name}", "", _markdown_of(modules.get(name), result)]
    path.write_text("\n".join(lines) + "\n")


class Report:
    """The run's results and their writer (report.json, report.md), safe to call from the watchdog thread."""

    def __init__(self, out: Path, args, smoke: bool, device):
        self.out, self.args, self.smoke, self.device = out, args, smoke, device
        self.results: dict = {}
        self.modules: dict = {}
        self.status = "running"
        self._lock = threading.Lock()

    def write(self) -> None:
        with self._lock:
            for attempt in range(3):  # the main thread may be adding a row while the watchdog writes
                try:
                    self._write()
                    return
                except RuntimeError:
                    if attempt == 2:
                        raise
                    time.sleep(0.05)

    def _write(self) -> None:
        machine = self.results.get("machine", {})
        meta = {"date": datetime.date.today().isoformat(), "device": machine.get("name") or str(self.device),
                "dtype": machine.get("dtype") or ("float32" if self.smoke else "bfloat16"), "smoke": self.smoke,
                "seconds": time.monotonic() - _t0, "budget_s": self.args.budget_s,
                "hard_limit_s": self.args.hard_limit_s, "status": self.status, "sections": list(self.results),
                "command": "python scripts/gpu_report.py " + " ".join(self.args.argv)}
        results = json.loads(json.dumps(self.results, default=str))  # a snapshot: the table marks touch a copy
        targets = collect_targets(results, self.smoke)
        (self.out / "report.json").write_text(json.dumps({"meta": meta, "targets": targets, "sections": results},
                                                         indent=1, default=str))
        write_markdown(self.out / "report.md", meta, results, self.modules, targets)


def _interrupt(signum, frame):
    raise ReportInterrupted(f"{signal.Signals(signum).name} after {time.monotonic() - _t0:.0f} s")


def main(argv=None, started: float | None = None) -> int:
    """The command line (see the module docstring); `started`: the monotonic time the budget counts from
    (default: now)."""
    global _t0
    _t0 = time.monotonic() if started is None else started
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="runs/gpu_report", help="folder for report.json, report.md and report.log")
    parser.add_argument("--smoke", action="store_true", help="every section at tiny size on CPU")
    parser.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated subset of {','.join(SECTIONS)}")
    parser.add_argument("--budget-s", type=float, default=BUDGET_S,
                        help="the run's wall-clock budget from the process start: no section or part starts "
                             "with less than its minimum left")
    parser.add_argument("--hard-limit-s", type=float, default=None,
                        help=f"the watchdog writes the partial report and exits 124 past this (default: the "
                             f"budget + {HARD_EXTRA_S:.0f} s)")
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(argv)
    args.argv = argv
    if args.hard_limit_s is None:
        args.hard_limit_s = args.budget_s + HARD_EXTRA_S
    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = sorted(set(sections) - set(SECTIONS))
    if unknown:
        print(f"error: unknown section(s) {', '.join(unknown)}; choose from {', '.join(SECTIONS)}", file=sys.stderr)
        return 2
    if args.budget_s <= 0 or args.hard_limit_s < args.budget_s:
        print("error: --budget-s must be > 0 and --hard-limit-s at least --budget-s", file=sys.stderr)
        return 2
    import torch

    if not args.smoke and not torch.cuda.is_available():
        print("error: no CUDA device here: the report measures a GPU; run with --smoke to check the script on CPU",
              file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log_file = open(out / "report.log", "a", buffering=1)
    return _run(args, sections, out, log_file)


def _run(args, sections: list[str], out: Path, log_file) -> int:
    import torch

    from dlm.bench.gpu import ReportContext, error_entry
    from dlm.bench.gpu.watchdog import Watchdog

    def log(line: str) -> None:
        stamped = f"[{time.monotonic() - _t0:6.1f} s] {line}"
        print(stamped, file=sys.stderr, flush=True)
        log_file.write(stamped + "\n")

    device = torch.device("cpu" if args.smoke else "cuda")
    report = Report(out, args, args.smoke, device)
    ctx = ReportContext(device=device, dtype=torch.float32 if args.smoke else torch.bfloat16, smoke=args.smoke,
                        deadline=_t0 + args.budget_s, log=log)
    current = {"name": None}

    def on_hard_limit(name: str) -> None:
        if name in report.results and isinstance(report.results[name], dict):
            report.results[name] = {**report.results[name], "interrupted": "the run's hard limit"}
        report.status = f"stopped by the watchdog at the hard limit ({args.hard_limit_s:.0f} s) during {name}"
        report.write()

    watchdog = Watchdog([log_file, sys.stderr], args.hard_limit_s - (time.monotonic() - _t0), on_hard_limit, log)
    previous = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    code = 0
    try:
        for name in sections:
            current["name"] = name
            module = importlib.import_module(f"dlm.bench.gpu.{name}")
            report.modules[name] = module
            minimum = getattr(module, "MIN_START_S", 0.0)
            if not ctx.may_start(minimum):
                report.results[name] = {"skipped": f"not started: needs about {minimum:.0f} s, "
                                                   f"{max(ctx.time_left(), 0):.0f} s left of the {args.budget_s:.0f} s budget"}
                log(f"== {name}: {report.results[name]['skipped']}")
                report.write()
                continue
            log(f"== {name} ({ctx.time_left():.0f} s left)")

            def save(partial: dict, name=name) -> None:
                report.results[name] = {**partial, "partial": True}
                report.write()
            ctx.save = save
            try:
                with watchdog.section(name, 600 if args.smoke else HANG_S.get(name, 180)):
                    report.results[name] = module.run(ctx)
            except ReportInterrupted:
                raise
            except Exception as error:  # noqa: BLE001 - one GPU window: record, go on
                if ctx.raise_errors:
                    raise
                report.results[name] = {**report.results.get(name, {}), **error_entry(error)}
                log(f"{name}: failed: {report.results[name]['error']}")
            report.write()
        report.status = "complete"
    except ReportInterrupted as stop:
        name = current["name"]
        report.results[name] = {**report.results.get(name, {}), "interrupted": str(stop)}
        report.status = f"interrupted ({stop}) during {name}"
        log(f"interrupted: {stop}; partial report written")
        code = 130
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        watchdog.stop()
        report.write()
        log(f"wrote {out / 'report.json'}, {out / 'report.md'} and {out / 'report.log'} ({report.status})")
        log_file.close()
    return code


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main(started=STARTED))
