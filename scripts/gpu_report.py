"""The GPU report (issue 40): every speed and memory figure of the engine at real model sizes, against the
hardware's floor and beside the field's code, in one run on one H100 or H200.

    python scripts/gpu_report.py --out runs/gpu            # on a CUDA machine: ~8 minutes, bf16
    python scripts/gpu_report.py --smoke --out runs/smoke  # every section at tiny size on CPU, seconds

Writes report.json (every number) and report.md (the tables and the targets marked met / not met) to --out.
Sections run in this order, each in `dlm/bench/gpu/`: machine (copy bandwidth and matmul rate: the floors'
denominators), kernels (fused decoding statistics), engine (LLaDA-8B and DiffusionGemma-26B-A4B replicas
through `dlm.generate`, beside transformers' generate and diffusers' LLaDA2Pipeline), replica_forward (each
replica's pure forward vs its weight-streaming floor), video (a Wan2.1-1.3B-shaped DiT at 480x832x33 with and
without `video.streamline`). A section that fails is recorded with its error and the run goes on; a
section that would start after the time budget (--budget-s) is recorded as skipped. Nothing is downloaded:
the replicas are random-weight models of the real shapes (`dlm.replica`). diffusers is not on a bare GPU
machine: carry its wheel (docs/gpu.md) or the diffusers comparisons are reported as skipped.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SECTIONS = ("machine", "kernels", "engine", "replica_forward", "video")


def _markdown_of(name: str, module, result: dict) -> str:
    if "error" in result:
        return f"**failed**: `{result['error']}`"
    if "skipped" in result and len(result) == 1:
        return f"skipped: {result['skipped']}"
    render = getattr(module, "markdown", None) or getattr(module, "to_markdown", None)
    return render(result) if render else "```\n" + json.dumps(result, indent=1)[:4000] + "\n```"


def collect_targets(results: dict) -> list[dict]:
    """Every section's targets, in one list of {section, name, target, value, met}."""
    rows = []
    for section, result in results.items():
        for name, t in (result.get("targets") or {}).items():
            rows.append({"section": section, "name": name, **t})
    forward = results.get("replica_forward", {})
    for rep in forward.get("replicas", []):
        for r in rep.get("rows", []):
            if rep["name"] == "llada-8b" and r["batch"] == 1 and r["mode"] == "prefix":
                rows.append({"section": "replica_forward", "name": "llada_prefix_floor",
                             "target": "LLaDA-8B batch 1, block-32 step with prefix cache: >= 80% of the weight-streaming floor",
                             "value": r["pct_of_floor"], "met": r["pct_of_floor"] >= 80})
            if rep["name"] == "diffusiongemma-26b-a4b" and r["batch"] == 1:
                ratio = r["ms"] / r["floor_ms"]
                rows.append({"section": "replica_forward", "name": "dgemma_floor",
                             "target": "DiffusionGemma-26B-A4B canvas 256, batch 1: a step within 1.25x of its floor",
                             "value": ratio, "met": ratio <= 1.25})
    return rows


def _fmt(value) -> str:
    if value is None:
        return "not measured"
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def write_markdown(path: Path, meta: dict, results: dict, modules: dict, targets: list[dict]) -> None:
    lines = [f"# GPU report ({meta['date']}, {meta['device']}, {meta['dtype']}{', smoke' if meta['smoke'] else ''})", "",
             f"Command: `{meta['command']}`; {meta['seconds']:.0f} s.", "", "## Targets", "",
             "| section | target | value | met |", "|---|---|---|---|"]
    for t in targets:
        met = {True: "met", False: "**not met**", None: "n/a"}[t["met"]]
        lines.append(f"| {t['section']} | {t['target']} | {_fmt(t['value'])} | {met} |")
    for name, result in results.items():
        lines += ["", f"## {name}", "", _markdown_of(name, modules.get(name), result)]
    path.write_text("\n".join(lines) + "\n")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="runs/gpu_report", help="folder for report.json and report.md")
    parser.add_argument("--smoke", action="store_true", help="every section at tiny size on CPU (seconds)")
    parser.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated subset of {','.join(SECTIONS)}")
    parser.add_argument("--budget-s", type=float, default=450.0, help="no section starts after this many seconds")
    args = parser.parse_args(argv)
    import torch

    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = sorted(set(sections) - set(SECTIONS))
    if unknown:
        print(f"error: unknown section(s) {', '.join(unknown)}; choose from {', '.join(SECTIONS)}", file=sys.stderr)
        return 2
    if not args.smoke and not torch.cuda.is_available():
        print("error: no CUDA device here: the report measures a GPU; run with --smoke to check the script on CPU",
              file=sys.stderr)
        return 2
    import importlib

    from dlm.bench.gpu import ReportContext

    device = torch.device("cpu" if args.smoke else "cuda")
    dtype = torch.float32 if args.smoke else torch.bfloat16
    started = time.monotonic()
    ctx = ReportContext(device=device, dtype=dtype, smoke=args.smoke, deadline=started + args.budget_s,
                        log=lambda line: print(line, file=sys.stderr, flush=True))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results, modules = {}, {}
    for name in sections:
        module = importlib.import_module(f"dlm.bench.gpu.{name}")
        modules[name] = module
        if ctx.time_left() <= 0:
            results[name] = {"skipped": f"not started: the {args.budget_s:.0f} s budget was spent"}
            continue
        ctx.log(f"== {name} ({ctx.time_left():.0f} s left)")
        try:
            results[name] = module.run(ctx)
        except Exception as error:  # noqa: BLE001 - one GPU window: record, go on
            if args.smoke:
                raise
            results[name] = {"error": f"{type(error).__name__}: {error}"[:500], "traceback": traceback.format_exc()[-3000:]}
        # written after every section: a run cut short by the machine still leaves what it measured
        _write(out, ctx, args, results, modules, started)
    _write(out, ctx, args, results, modules, started)
    print(f"wrote {out / 'report.json'} and {out / 'report.md'}", file=sys.stderr)
    return 0


def _write(out: Path, ctx, args, results: dict, modules: dict, started: float) -> None:
    import datetime

    device = results.get("machine", {}).get("name") or str(ctx.device)
    meta = {"date": datetime.date.today().isoformat(), "device": device, "dtype": str(ctx.dtype).replace("torch.", ""),
            "smoke": args.smoke, "seconds": time.monotonic() - started,
            "command": "python scripts/gpu_report.py " + " ".join(sys.argv[1:] if sys.argv[0].endswith("gpu_report.py") else [])}
    targets = collect_targets(results)
    (out / "report.json").write_text(json.dumps({"meta": meta, "targets": targets, "sections": results}, indent=1,
                                                default=str))
    write_markdown(out / "report.md", meta, results, modules, targets)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
