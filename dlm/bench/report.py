"""Benchmark output: a text table, `results.json`, `results.csv` and the quality plots."""
from __future__ import annotations

import csv
import json
from pathlib import Path

from dlm.bench.harness import BenchResult, result_suites

COLUMNS = (("sampler", "sampler", "{}"), ("budget", "steps", "{}"), ("quality", "quality%", "{:.1f}"),
           ("nfe", "NFE/seq", "{:.1f}"), ("branch_forwards", "branchF/seq", "{:.1f}"), ("nfe_per_call", "NFE/call", "{:.1f}"), ("tpf", "TPF", "{:.2f}"),
           ("tokens_per_s", "tok/s", "{:.0f}"), ("seconds", "seconds", "{:.2f}"), ("peak_mem_mb", "peakMB", "{:.0f}"))


MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


def _fmt(fmt: str, value) -> str:
    return "-" if value is None else fmt.format(value)


def _grid(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    line = lambda cells: "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))
    return "\n".join([line(header), line(["-" * w for w in widths])] + [line(r) for r in rows])


def format_table(result: BenchResult) -> str:
    """The pairs as a fixed-width table, plus a per-task quality table for multi-task suites."""
    pairs = result.pairs
    rows = [[_fmt(fmt, getattr(p, key)) for key, _, fmt in COLUMNS] for p in pairs]
    cfg = result.config
    title = (f"suite {cfg['suite']} | model {cfg['model']} | {result.meta['prompts']} prompts | "
             f"gen {cfg['gen_length']} block {cfg['block_length']} | batch {cfg['batch_size']}")
    text = title + "\n" + _grid([h for _, h, _ in COLUMNS], rows)
    tasks = result.meta.get("suite_tasks", [])
    if len(tasks) > 1:
        trows = [[f"{p.sampler}@{p.budget}"] + [_fmt("{:.0f}", p.quality_by_task.get(t)) for t in tasks] for p in pairs]
        text += "\n\nquality% by task\n" + _grid(["sampler@steps"] + list(tasks), trows)
    experts = [p for p in pairs if (p.extra or {}).get("expert_quality")]
    if experts:  # HEX: each expert's quality beside the vote's
        trows = [[f"{p.sampler}@{p.budget}", f"{p.quality:.1f}", f"{p.extra['best_expert_quality']:.1f}",
                  " ".join(f"b{b}:{q:.0f}" for b, q in p.extra["expert_quality"].items())] for p in experts]
        text += "\n\nensemble vs its experts (quality%)\n" + _grid(["sampler@steps", "vote", "best expert", "experts"], trows)
    laws = [p for p in pairs if (p.extra or {}).get("reference_total_variation_q95") is not None]
    if laws:  # pivot oracle: distances to exact laws beside exact sampling's noise at the same N
        text += _law_table(laws)
    targets = result.meta.get("targets") or {}
    if targets:
        trows = [[name, f"{t['reference_quality']:.1f}@{t['reference_budget']}", str(t["min_budget"]),
                  f"{t['min_nfe']:.1f}", f"{t['quality']:.1f}", f"{t['tpf']:.2f}"] for name, t in targets.items()]
        text += f"\n\nsmallest NFE within 1 point of {_reference_runs(targets, cfg['gen_length'])}\n" + _grid(
            ["sampler", "ref q@steps", "steps", "NFE/seq", "quality%", "TPF"], trows)
    for base, cmp in (result.meta.get("vs_diffusers") or {}).items():
        text += _vs_baseline(base, cmp)
    for suite, by_base in (result.meta.get("vs_diffusers_by_suite") or {}).items():
        for base, cmp in by_base.items():
            text += _vs_baseline(base, cmp, f"[{suite}] ")
    return text


def _reference_runs(targets: dict, gen_length: int) -> str:
    """What the targets table compares with, naming only runs that were made: each sampler's run at
    steps = gen_length (one token per step) when the budgets include it, else its largest budget."""
    references = {t["reference_budget"] for t in targets.values()}
    if references == {gen_length}:
        return f"the sampler's steps={gen_length} run (a budget of one forward per token)"
    if gen_length not in references:
        return "the sampler's largest-budget run (ref q@steps)"
    return f"the sampler's reference run (ref q@steps: steps={gen_length} where it was run, else its largest budget)"


def _law_table(pairs) -> str:
    """Pivot oracle: TV to the exact laws (max, S = state switches, T = top-symbol count), each beside
    the mean/q95 of the same TV for exact samples; mean S; log-likelihood gap with its standard error."""
    def num(key, fmt="{:.3f}"):
        value = p.extra.get(key)
        return value if isinstance(value, str) else _fmt(fmt, value)

    trows = []
    for p in pairs:
        row = [f"{p.sampler}@{p.budget}", f"{p.tpf:.2f}"]
        for name in ("total_variation", "total_variation_switches", "total_variation_top"):
            row += [num(name), f"{num('reference_' + name)}/{num('reference_' + name + '_q95')}"]
        row += [f"{num('mean_switches', '{:.2f}')}/{num('expected_switches', '{:.2f}')}",
                f"{num('log_prob_gap', '{:+.2f}')} +- {num('log_prob_gap_stderr', '{:.2f}')}"]
        trows.append(row)
    header = ["sampler@steps", "TPF", "TV", "exact", "TV(S)", "exact", "TV(T)", "exact", "S/exact",
              "logp gap (nats)"]
    return ("\n\ndistance to the exact laws: TV = max(TV(S), TV(T)), S = state switches, T = top-symbol "
            "count; exact = mean/q95 of exact samples\n" + _grid(header, trows))


def _vs_baseline(base: str, cmp: dict, prefix: str = "") -> str:
    """One equal-quality comparison (see `compare_to_baselines`) as a titled table."""
    trows = []
    for name, r in cmp["ours"].items():
        trows.append([name] + (["-"] * 6 if r is None else [
            str(r["budget"]), f"{r['quality']:.1f}", f"{r['nfe']:.1f}", f"{r['seconds']:.2f}",
            f"{r['nfe_ratio']:.2f}x", f"{r['wall_ratio']:.2f}x"]))
    title = (f"\n\n{prefix}vs {base} at steps {cmp['budget']} (quality {cmp['quality']:.1f}, NFE {cmp['nfe']:.1f}, "
             f"{cmp['seconds']:.2f} s): our fastest pair within 1 point\n")
    return title + _grid(["sampler", "steps", "quality%", "NFE/seq", "seconds", "NFE ratio", "wall ratio"], trows)


def format_markdown(result: BenchResult, per_task: bool = True) -> str:
    """The pairs as a Markdown table (for docs), plus per-task quality when the suite has several tasks."""
    cols = [c for c in COLUMNS if c[0] != "peak_mem_mb"]
    lines = ["| " + " | ".join(h for _, h, _ in cols) + " |", "|" + "---|" * len(cols)]
    for p in result.pairs:
        lines.append("| " + " | ".join(_fmt(fmt, getattr(p, key)) for key, _, fmt in cols) + " |")
    tasks = result.meta.get("suite_tasks", [])
    if per_task and len(tasks) > 1:
        lines += ["", "| sampler@steps | TPF | " + " | ".join(tasks) + " |", "|" + "---|" * (len(tasks) + 2)]
        for p in result.pairs:
            lines.append(f"| {p.sampler}@{p.budget} | {p.tpf:.2f} | "
                         + " | ".join(_fmt("{:.0f}", p.quality_by_task.get(t)) for t in tasks) + " |")
    return "\n".join(lines)


def load_result(path) -> BenchResult:
    """Read a `results.json` back into a `BenchResult`."""
    from dlm.bench.harness import PairResult

    data = json.loads(Path(path).read_text())
    return BenchResult(config=data["config"], meta=data["meta"], pairs=[PairResult(**p) for p in data["pairs"]])


def write_json(result: BenchResult, path: Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result.to_dict(), indent=2) + "\n")
    return path


def write_csv(result: BenchResult, path: Path) -> Path:
    """One row per pair; per-task qualities as `quality[<task>]` columns."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tasks = result.meta.get("suite_tasks", [])
    base = ["sampler", "budget", "engine", "kv_cache", "n", "quality", "nfe", "branch_forwards", "nfe_per_call", "tpf",
            "tokens_per_s", "seconds", "forward_tokens", "peak_mem_mb", "mem_method"]
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(base + [f"quality[{t}]" for t in tasks])
        for p in result.pairs:
            w.writerow([getattr(p, k) for k in base] + [p.quality_by_task.get(t) for t in tasks])
    return path


def _lines(result: BenchResult):
    by: dict[str, list] = {}
    for p in result.pairs:
        by.setdefault(p.sampler, []).append(p)
    return {k: sorted(v, key=lambda p: p.budget) for k, v in by.items()}


def plot_results(result: BenchResult, out_dir: Path) -> list[Path]:
    """`quality_vs_nfe.png` (log2 NFE), `quality_vs_seconds.png` (log seconds) and, for multi-task
    suites, `quality_vs_tpf_by_task.png` (one panel per task: the ParallelBench view)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    plain = FuncFormatter(lambda v, _: f"{v:g}")

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    lines = _lines(result)
    cfg = result.config
    subtitle = f"{cfg['suite']} | {cfg['model']} | {result.meta['prompts']} prompts | gen {cfg['gen_length']}, block {cfg['block_length']}"
    metric = result.meta.get("quality_metric")
    ylabel = f"quality (100 x {metric})" if metric else "quality (% correct)"
    paths = []
    for key, xlabel, fname, base in (("nfe", "forward passes per sequence (NFE, log2)", "quality_vs_nfe.png", 2),
                                     ("seconds", "wall time for all prompts, s (log)", "quality_vs_seconds.png", 10)):
        # Wide enough for a legend beside the axes, so it never covers a curve or a label.
        fig, ax = plt.subplots(figsize=(9.5, 4.8))
        for i, (name, ps) in enumerate(lines.items()):
            style = "--" if ps[0].engine != "dlm" else "-"
            # distinct markers and shrinking sizes keep coinciding lines visible
            ax.plot([getattr(p, key) for p in ps], [p.quality for p in ps], style, marker=MARKERS[i % len(MARKERS)],
                    markersize=max(3, 9 - i), linewidth=max(0.8, 2.2 - 0.2 * i), label=name)
            if key == "nfe":
                # Budget labels: each line's labels sit at its own offset (alternating above and
                # below, in its colour), so labels of lines that share a point do not pile up.
                colour = ax.get_lines()[-1].get_color()
                dy = (4 + 7 * (i // 2)) * (1 if i % 2 == 0 else -1) - (0 if i % 2 == 0 else 6)
                # Budgets an adaptive sampler ends at the same point share one label ("16,32").
                at_point: dict = {}
                for p in ps:
                    at_point.setdefault((p.nfe, p.quality), []).append(str(p.budget))
                for (x, y), budgets in at_point.items():
                    ax.annotate(",".join(budgets), (x, y), textcoords="offset points", xytext=(4, dy),
                                fontsize=7, color=colour, alpha=0.8)
        ax.set_xscale("log", base=base)
        if base == 10:
            ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.xaxis.set_major_formatter(plain)
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_ylim(-2, 102)
        ax.grid(True, which="both", alpha=0.3)
        ax.set_title(f"quality vs {'NFE' if key == 'nfe' else 'wall time'}\n{subtitle}", fontsize=9)
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0,
                  title="sampler (budget labels: steps)" if key == "nfe" else "sampler", title_fontsize=8)
        fig.tight_layout()
        path = out_dir / fname
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    tasks = result.meta.get("suite_tasks", [])
    if len(tasks) > 1:
        cols = min(3, len(tasks))
        rows = (len(tasks) + cols - 1) // cols
        fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3 * rows), squeeze=False, sharey=True)
        for ax, task in zip(axes.flat, tasks):
            for name, ps in lines.items():
                ax.plot([p.tpf for p in ps], [p.quality_by_task.get(task, float("nan")) for p in ps],
                        "--" if ps[0].engine != "dlm" else "-", marker="o", label=name)
            ax.set_xscale("log", base=2)
            ax.xaxis.set_major_formatter(plain)
            ax.set_title(task, fontsize=9)
            ax.set_xlabel("tokens per forward (log2)", fontsize=8)
            ax.set_ylim(-2, 102)
            ax.grid(True, alpha=0.3)
        for ax in list(axes.flat)[len(tasks):]:
            ax.axis("off")
        handles, labels = axes.flat[0].get_legend_handles_labels()
        fig.suptitle(f"quality vs tokens per forward, by task\n{subtitle}", fontsize=9)
        # One legend for all panels, below them, instead of one covering the first panel.
        fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 4), fontsize=7, frameon=False)
        fig.tight_layout(rect=(0, 0.04 + 0.03 * ((len(labels) - 1) // 4), 1, 1))
        path = out_dir / "quality_vs_tpf_by_task.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        paths.append(path)
    suites = result_suites(result)
    if suites:
        paths.append(_plot_seconds_by_suite(plt, lines, suites, subtitle, out_dir / "quality_vs_seconds_by_suite.png"))
    return paths


def _plot_seconds_by_suite(plt, lines: dict, suites: list, subtitle: str, path: Path) -> Path:
    """One panel per suite of a multi-suite run: quality vs that suite's wall time (log), the view
    in which each suite's equal-quality speed-up against the external baselines is read."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    fig, axes = plt.subplots(1, len(suites), figsize=(4.2 * len(suites), 3.8), squeeze=False, sharey=True)
    for ax, suite in zip(axes.flat, suites):
        for i, (name, ps) in enumerate(lines.items()):
            pts = [p.by_suite[suite] for p in ps if suite in p.by_suite]
            ax.plot([q["seconds"] for q in pts], [q["quality"] for q in pts],
                    "--" if ps[0].engine != "dlm" else "-", marker=MARKERS[i % len(MARKERS)],
                    markersize=max(3, 8 - i), label=name)
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_title(f"{suite} ({pts[0]['n'] if pts else 0} prompts)", fontsize=9)
        ax.set_xlabel("wall time for the suite's prompts, s (log)", fontsize=8)
        ax.set_ylim(-2, 102)
        ax.grid(True, which="both", alpha=0.3)
    axes.flat[0].set_ylabel("quality (% correct)")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.suptitle(f"quality vs wall time, by suite (dashed: external engines)\n{subtitle}", fontsize=9)
    fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 4), fontsize=7, frameon=False)
    fig.tight_layout(rect=(0, 0.05 + 0.035 * ((len(labels) - 1) // 4), 1, 1))
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def write_all(result: BenchResult, out_dir: Path) -> dict:
    """Write results.json, results.csv and the plots; returns {kind: path}."""
    out_dir = Path(out_dir)
    files = {"json": write_json(result, out_dir / "results.json"), "csv": write_csv(result, out_dir / "results.csv")}
    for p in plot_results(result, out_dir):
        files[p.stem] = p
    return {k: str(v) for k, v in files.items()}
