"""Where each seed sampler pays (issue 44): every seed sampler on every bed, forwards at equal quality
against the best baseline frontier, with the spread of repeated runs; one table, one plot.

    python scripts/where_it_pays.py --out runs/where-it-pays            # everything (CPU: about an hour)
    python scripts/where_it_pays.py --out runs/wip --beds oracle-keyed   # one bed
    python scripts/where_it_pays.py --report runs/where-it-pays          # the table again, from its JSON
    python scripts/where_it_pays.py --report runs/a --merge runs/b       # one table from two sweeps over other beds

Beds: the tiny-dlm suites (list edits, arithmetic, puzzles: one `dlm bench` run of `all`, read suite
by suite), chains-hard (tiny-dlm-chains-hard), the tiny-dgemma suites, and the exact oracles
(permutation, hmm, pivot, and the three beds made for the seed samplers' own arguments: keyed for
LoPA, runs for Saber, schedules for HEX). Each bed runs in `dlm bench` (`dlm.bench.run_bench`)
`--repeats` times with seeds 0, 1, ...: other prompts for the task suites and the schedule oracle,
other draws for the oracles sampled at temperature 1.

On every bed the baselines are `threshold` at tau 0.5 / 0.7 / 0.9 and `confidence` at a quarter,
half and all of the one-token-per-step budget, plus `random` and `entropy` at those budgets on the
oracles sampled at temperature 1 (where the exact sampler, random order at one token per step,
belongs on the frontier). The candidates: `lopa` (default), `lopa:published=true` (with D2F's
window shown one block ahead when the bed has several blocks, as the released loop sees it),
`saber` (default), `saber:backtrack=published` (one block, the released layout; masked models
only) and `hex` (published: every expert gen/2 passes). On oracle-keyed the oracle's own best
order (`dlm.oracles.keyed.KeyFirstSampler`, keys first) is decoded on the same draws, for LoPA's target.

For each candidate and repeat: the cheapest baseline pair within 1 point of its quality
(`dlm.bench.frontier.equal_quality_ratio`), ratio = that pair's forwards / the candidate's. A
candidate better than every baseline pair is "beyond" the frontier (no ratio: no baseline reaches
it), one more than 1 point worse than the frontier's cheapest point is "below" (no equal-quality
comparison). Quality: % exact answers (task suites, schedules), 100 x (1 - TV) on the sampled
oracles (TV to the exact joint, or to exact laws of run statistics on pivot and runs),
100 x valid fraction on the permutation oracle. HEX is also read against its own best expert.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dlm.bench import BenchConfig  # noqa: E402
from dlm.bench.frontier import best_ratio, equal_quality_ratio  # noqa: E402
from dlm.bench.harness import BenchResult, PairResult, result_suites, run_bench  # noqa: E402

TAUS = (0.5, 0.7, 0.9)
TOLERANCE = 1.0  # points: the equal-quality rule of dlm.bench.frontier


def _bed(name, model, suite, gen, block, limit, sampled=False, masked=True, split=False, experts=5, batch=16):
    """A bed: its `dlm bench` settings; `gen`/`block` None take the model's; `experts` sets HEX's total."""
    return dict(name=name, model=model, suite=suite, gen=gen, block=block, limit=limit, sampled=sampled,
                masked=masked, split=split, experts=experts, batch=batch)


BEDS = {
    "tiny-dlm": _bed("tiny-dlm", "tiny-dlm", "all", 64, 32, 4, split=True),
    "chains-hard": _bed("chains-hard", "tiny-dlm-chains-hard", "chains-hard", 128, 32, 6),
    "tiny-dgemma": _bed("tiny-dgemma", "tiny-dgemma", "all", None, None, 4, masked=False, split=True, experts=3),
    "oracle-permutation": _bed("oracle-permutation", "oracle", "oracle-permutation", 8, 8, 1024, sampled=True, experts=3),
    "oracle-hmm": _bed("oracle-hmm", "oracle", "oracle-hmm", 8, 8, 2048, sampled=True, experts=3),
    "oracle-pivot": _bed("oracle-pivot", "oracle", "oracle-pivot", 64, 64, 512, sampled=True),
    "oracle-keyed": _bed("oracle-keyed", "oracle", "oracle-keyed", 14, 14, 2048, sampled=True, experts=3),
    "oracle-runs": _bed("oracle-runs", "oracle", "oracle-runs", 64, 64, 512, sampled=True),
    "oracle-schedules": _bed("oracle-schedules", "oracle", "oracle-schedules", 32, 32, 48, experts=4),
}

CANDIDATES = ("lopa", "lopa:published", "saber", "saber:published", "hex")


def _steps(values) -> str:
    return "/".join(str(v) for v in sorted(set(values), reverse=True))


def bed_samplers(bed: dict, gen: int, block: int) -> tuple[list[str], dict[str, str]]:
    """`(baseline entries, {candidate: entry})` for `dlm bench --samplers` on this bed."""
    budgets = _steps([gen, max(gen // 2, gen // block), max(gen // 4, gen // block)])
    baselines = [f"threshold:tau={t}" for t in TAUS] + [f"confidence:steps={budgets}"]
    if bed["sampled"]:
        baselines += [f"random:steps={budgets}", f"entropy:steps={budgets}"]
    several_blocks = gen > block
    window = several_blocks and bed["masked"]  # uniform noise decodes canvas after canvas: no window
    candidates = {"lopa": "lopa",
                  "lopa:published": "lopa:published=true" + (":window=2:open=1.0" if window else ""),
                  "saber": "saber",
                  "hex": f"hex:steps={bed['experts'] * gen // 2}"}
    if bed["masked"]:  # the reference is a masked-diffusion loop over one driver block
        candidates["saber:published"] = "saber:backtrack=published" + (f":block={gen}" if several_blocks else "")
    return baselines, candidates


def _lengths(bed: dict) -> tuple[int, int]:
    if bed["gen"] is not None:
        return bed["gen"], bed["block"]
    from dlm.bench.harness import load_model, model_lengths

    model, _, _ = load_model(bed["model"])
    return model_lengths(model)


def run_bed(bed: dict, seed: int, progress: bool) -> BenchResult:
    gen, block = _lengths(bed)
    baselines, candidates = bed_samplers(bed, gen, block)
    cfg = BenchConfig(model=bed["model"], suite=bed["suite"], samplers=baselines + list(candidates.values()),
                      steps=[gen], limit=bed["limit"], gen_length=gen, block_length=block, seed=seed,
                      batch_size=bed["batch"], warmup=False)
    result = run_bench(cfg, progress=progress)
    result.meta["where_it_pays"] = {"baselines": baselines, "candidates": candidates, "gen": gen, "block": block}
    return result


def keyed_best_order(seed: int, num: int, tau: float = 0.9) -> dict:
    """The keyed oracle's best order (`KeyFirstSampler`, keys first) decoded as the bench decodes the
    oracle (same prompts, seed, temperature 1, one block), scored the same way; with its exact
    expected forwards (`KeyedOracle.best_order_forwards`)."""
    import torch

    import dlm
    from dlm.oracles.keyed import KeyFirstSampler
    from dlm.tasks.oracle_tasks import ORACLE_SUITES

    suite = ORACLE_SUITES["oracle-keyed"]
    oracle = suite.build()
    out = dlm.generate(oracle, suite.prompts(oracle, num), **suite.generate_kwargs(oracle), block_length=oracle.n,
                       steps=oracle.n, sampler=KeyFirstSampler(oracle, tau), temperature=1.0,
                       generator=torch.Generator().manual_seed(seed))
    metrics = suite.evaluate(oracle, out.sequences, seed=seed)
    return {"sampler": f"key-first:tau={tau}", "budget": oracle.n, "quality": 100.0 * (1 - metrics.total_variation),
            "nfe": float(out.nfe), "expected_nfe": oracle.best_order_forwards(tau)}


def _views(bed: dict, result: BenchResult) -> dict[str, BenchResult]:
    """`{bed row name: result}`: a multi-suite run read suite by suite (as `compare_by_suite`)."""
    if not bed["split"]:
        return {bed["name"]: result}
    out = {}
    for suite in result_suites(result):
        pairs = [replace(p, **p.by_suite[suite]) for p in result.pairs if suite in p.by_suite]
        out[f"{bed['name']} {suite}"] = BenchResult(config=result.config, meta=result.meta, pairs=pairs)
    return out


def read_point(result: BenchResult, baselines: list[str], candidate: str) -> dict:
    """One candidate on one repeat: its quality/forwards and its place against the baseline frontier."""
    rows = equal_quality_ratio(result, candidate, baselines, TOLERANCE)
    row = rows[0]  # one budget per candidate
    best = best_ratio(rows)
    b = row["baseline"]
    if best is not None:
        status, ratio = "ratio", best["nfe_ratio"]
    elif row["below"]:
        # no baseline point of its quality: either one is as cheap and better (dominated), or every
        # better one costs more and none of its quality exists (a gap in the frontier: a trade)
        status, ratio = ("dominated" if b["nfe"] <= row["nfe"] else "gap"), None
    else:
        status, ratio = "beyond", None
    pair = next(p for p in result.pairs if p.sampler == candidate)
    out: dict = {"quality": row["quality"], "nfe": row["nfe"], "status": status, "ratio": ratio,
           "baseline": None if b is None else f"{b['sampler']}@{b['budget']}",
           "baseline_quality": None if b is None else b["quality"], "baseline_nfe": None if b is None else b["nfe"]}
    extra = getattr(pair, "extra", None) or {}
    if "best_expert_quality" in extra:
        out["best_expert_quality"] = extra["best_expert_quality"]
        out["token_vote_quality"] = extra.get("token_vote_quality")
    return out


def _status(point: dict) -> str:
    """A point's place against the frontier (older stores say "below" for dominated and gap alike)."""
    if point["status"] != "below":
        return point["status"]
    return "dominated" if point["baseline_nfe"] <= point["nfe"] else "gap"


def _pair_result(p: dict) -> PairResult:
    return PairResult(sampler=p["sampler"], budget=p["budget"], engine="dlm", kv_cache="none", n=1,
                      quality=p["quality"], quality_by_task={}, nfe=p["nfe"], nfe_per_call=p["nfe"], tpf=0.0,
                      tokens_per_s=0.0, seconds=0.0, forward_tokens=0, peak_mem_mb=None, mem_method="-")


def recompute(data: dict) -> None:
    """Re-read every stored repeat's points from its stored pairs (the frontier rule may have changed
    since it ran); a HEX point keeps its expert readings. Repeats stored without pairs keep theirs."""
    beds = data["meta"].get("beds", {})
    for row, runs in data["runs"].items():
        bed = max((b for b in beds if row == b or row.startswith(b + " ")), key=len, default=None)
        if bed is None:
            continue
        info = beds[bed]
        for run in runs:
            if "pairs" not in run:
                continue
            view = BenchResult(config={}, meta={}, pairs=[_pair_result(p) for p in run["pairs"]])
            for cand, label in info["candidates"].items():
                old = run["points"].get(cand, {})
                new = read_point(view, info["baselines"], label)
                for key in ("best_expert_quality", "token_vote_quality"):
                    if key in old:
                        new[key] = old[key]
                run["points"][cand] = new


def summarize(runs: dict) -> dict:
    """`{bed row: {candidate: summary}}` over repeats: median ratio and its min-max, statuses."""
    def order(row: str) -> tuple:
        bed = max((b for b in BEDS if row == b or row.startswith(b + " ")), key=len, default=None)
        return (list(BEDS).index(bed) if bed else len(BEDS), row)

    table = {}
    for row in sorted(runs, key=order):
        repeats = runs[row]
        table[row] = {}
        for cand in CANDIDATES:
            points = [dict(r["points"][cand], status=_status(r["points"][cand]))
                      for r in repeats if r["points"].get(cand) is not None]
            if not points:
                continue
            ratios = [p["ratio"] for p in points if p["status"] == "ratio"]
            table[row][cand] = {
                "repeats": len(points),
                "statuses": [p["status"] for p in points],
                "ratio_median": statistics.median(ratios) if ratios else None,
                "ratio_min": min(ratios) if ratios else None, "ratio_max": max(ratios) if ratios else None,
                "quality": [p["quality"] for p in points], "nfe": [p["nfe"] for p in points],
                "baseline": [p["baseline"] for p in points],
                "baseline_quality": [p["baseline_quality"] for p in points],
                "baseline_nfe": [p["baseline_nfe"] for p in points],
                "best_expert_quality": [p.get("best_expert_quality") for p in points],
            }
    return table


def _cell(s: dict | None) -> str:
    if s is None:
        return "n/a"
    statuses = s["statuses"]
    parts = []
    if s["ratio_median"] is not None:
        spread = f" ({s['ratio_min']:.2f}-{s['ratio_max']:.2f})" if len(statuses) > 1 else ""
        parts.append(f"**{s['ratio_median']:.2f}x**{spread}")
    for tag in ("beyond", "dominated", "gap"):
        k = statuses.count(tag)
        if k:
            parts.append(f"{tag} {k}/{len(statuses)}")
    q = s["quality"]
    parts.append(f"q {statistics.mean(q):.1f}" + (f"±{statistics.pstdev(q):.1f}" if len(q) > 1 else ""))
    parts.append(f"F {statistics.mean(s['nfe']):.1f}")
    return ", ".join(parts)


def markdown(table: dict, meta: dict) -> str:
    head = "| bed | " + " | ".join(CANDIDATES) + " |"
    lines = [head, "|" + "---|" * (len(CANDIDATES) + 1)]
    for row, cells in table.items():
        lines.append(f"| {row} | " + " | ".join(_cell(cells.get(c)) for c in CANDIDATES) + " |")
    lines += ["", "Cell: median forward ratio against the cheapest baseline point within 1 point of the candidate's "
              "quality (min-max over repeats); `beyond k/n`: better than every baseline point on k of n repeats; "
              "`dominated k/n`: a baseline point at most as costly is more than 1 point better; `gap k/n`: no "
              "baseline point within 1 point of its quality, the better ones all cost more (a trade, not a win); "
              "q: quality (mean ± sd over repeats); F: the candidate's forwards per sequence (mean). "
              f"Repeats: {meta.get('repeats')}."]
    return "\n".join(lines)


def hex_rows(table: dict) -> list[str]:
    lines = ["| bed | HEX vote q | best expert q | vote - best expert (per repeat) |", "|---|---|---|---|"]
    for row, cells in table.items():
        s = cells.get("hex")
        if not s or s["best_expert_quality"][0] is None:
            continue
        diffs = [q - b for q, b in zip(s["quality"], s["best_expert_quality"])]
        lines.append(f"| {row} | {statistics.mean(s['quality']):.1f} | {statistics.mean(s['best_expert_quality']):.1f} | "
                     + ", ".join(f"{d:+.1f}" for d in diffs) + " |")
    return lines


def _frontier_match(pairs: list[dict], prefix: str, point: dict) -> tuple[str, float | None, dict | None]:
    """The candidate `point` against the frontier of the pairs whose sampler starts with `prefix`:
    `(status, ratio, matched pair)` as `read_point` does against the whole baseline set."""
    base = sorted((p for p in pairs if p["sampler"].startswith(prefix)), key=lambda p: (p["nfe"], -p["quality"]))
    ok = [b for b in base if b["quality"] >= point["quality"] - TOLERANCE]
    if not ok:
        return "beyond", None, max(base, key=lambda b: b["quality"]) if base else None
    match = min(ok, key=lambda b: b["nfe"])
    if point["quality"] < match["quality"] - TOLERANCE:
        return "below", None, match
    return "ratio", match["nfe"] / max(point["nfe"], 1e-9), match


def _describe(status: str, ratio, match: dict | None, point: dict) -> str:
    own = f"{point['quality']:.1f}% at {point['nfe']:.1f}"
    if status == "ratio":
        return f"{ratio:.2f}x ({own}; {match['sampler']}@{match['budget']}: {match['quality']:.1f}% at {match['nfe']:.1f})"
    if status == "beyond":
        best = "" if match is None else f"; its best point {match['sampler']}@{match['budget']}: {match['quality']:.1f}% at {match['nfe']:.1f}"
        return f"beyond the frontier ({own}{best})"
    return f"below the frontier ({own}; {match['sampler']}@{match['budget']}: {match['quality']:.1f}% at {match['nfe']:.1f})"


def targets(runs: dict) -> list[str]:
    """Issue 44's targets on the beds made for them, per repeat."""
    lines = ["| target | per repeat (seed: result) | met? |", "|---|---|---|"]

    def rows_of(bed):
        return [r for r in runs.get(bed, []) if "pairs" in r]

    def pick(run, label):
        return next((p for p in run["pairs"] if p["sampler"] == label), None)

    keyed = rows_of("oracle-keyed")
    for label, name in (("lopa", "LoPA (default)"), ("lopa:published=true", "LoPA (published)")):
        cells, met = [], []
        for run in keyed:
            point = pick(run, label)
            status, ratio, match = _frontier_match(run["pairs"], "threshold:", point)
            best = next(p for p in run["pairs"] if p["sampler"].startswith("key-first"))
            to_best = point["nfe"] / best["nfe"]
            as_good = point["quality"] >= best["quality"] - TOLERANCE  # "within 1.25x" at equal TV
            cells.append(f"{run['seed']}: vs threshold {_describe(status, ratio, match, point)}; "
                         f"{to_best:.2f}x the best order's {best['nfe']:.0f} forwards (expected {best['expected_nfe']:.2f}) "
                         f"at {best['quality']:.1f}%" + ("" if as_good else " (more than 1 point better: not equal TV)"))
            met.append((status == "beyond" or (ratio or 0) >= 1.5) and to_best <= 1.25 and as_good)
        if cells:
            lines.append(f"| oracle-keyed: {name} >= 1.5x fewer forwards than threshold's frontier at equal exact TV "
                         f"and within 1.25x of the best order | " + "<br>".join(cells) + f" | {_met(met)} |")
    for label, name in (("saber", "Saber (default)"), ("saber:backtrack=published", "Saber (published)")):
        cells, met = [], []
        for run in rows_of("oracle-runs"):
            point = pick(run, label)
            status, ratio, match = _frontier_match(run["pairs"], "confidence:", point)
            cells.append(f"{run['seed']}: vs confidence {_describe(status, ratio, match, point)}")
            met.append(status == "beyond" or (ratio or 0) >= 1.5)
        if cells:
            lines.append(f"| oracle-runs: {name} >= 1.5x fewer forwards than confidence at equal TV | "
                         + "<br>".join(cells) + f" | {_met(met)} |")
    cells, met = [], []
    for run in rows_of("oracle-schedules"):
        point = run["points"]["hex"]
        diff = point["quality"] - point["best_expert_quality"]
        cells.append(f"{run['seed']}: vote {point['quality']:.1f} vs best expert {point['best_expert_quality']:.1f} ({diff:+.1f})")
        met.append(diff >= 2)
    if cells:
        lines.append("| oracle-schedules: HEX vote >= best expert + 2 | " + "<br>".join(cells) + f" | {_met(met)} |")
    return lines


def _met(flags: list[bool]) -> str:
    if all(flags):
        return "met on every repeat"
    return "not met" if not any(flags) else f"met on {sum(flags)} of {len(flags)} repeats"


def plot(table: dict, path: Path) -> Path:
    """Median ratio per bed and candidate with its min-max over repeats (log scale); a candidate
    beyond the frontier is drawn at the top (^), a dominated one at the bottom (v), one in a gap of
    the frontier just above it (x); marker size grows with the share of repeats."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = list(table)
    colors = plt.get_cmap("tab10").colors
    fig, ax = plt.subplots(figsize=(max(8, 0.9 * len(rows) + 2), 5))
    width = 0.8 / len(CANDIDATES)
    top, bottom = 12.0, 1 / 96  # the markers' rows, outside the points' range (0.02-7 here)
    for j, cand in enumerate(CANDIDATES):
        color = colors[j % len(colors)]
        ax.plot([], [], "o", color=color, label=cand)
        for i, row in enumerate(rows):
            s = table[row].get(cand)
            if s is None:
                continue
            x = i + (j - (len(CANDIDATES) - 1) / 2) * width
            if s["ratio_median"] is not None:
                med = s["ratio_median"]
                ax.errorbar([x], [med], yerr=[[med - s["ratio_min"]], [s["ratio_max"] - med]], fmt="o", color=color,
                            capsize=2, ms=5)
            n = len(s["statuses"])
            for tag, y, marker in (("beyond", top, "^"), ("dominated", bottom, "v"), ("gap", bottom * 1.7, "x")):
                k = s["statuses"].count(tag)
                if k:
                    ax.plot([x], [y], marker, color=color, ms=4 + 4 * k / n, alpha=0.9)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_yscale("log", base=2)
    ax.set_ylim(bottom / 1.5, top * 1.5)
    ax.axhspan(bottom / 1.5, bottom * 2.3, color="0.93", zorder=0)  # the band of markers, not ratios
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels(rows, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("best baseline's forwards / candidate's, at equal quality")
    ax.set_title("Where each seed sampler pays (> 1: fewer forwards at equal quality)\n"
                 "^ beyond the frontier, v dominated, x in a gap of the frontier", fontsize=10)
    ax.legend(fontsize=7, ncol=5, loc="upper center", bbox_to_anchor=(0.5, -0.28))
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="runs/where-it-pays")
    ap.add_argument("--beds", default=",".join(BEDS), help=f"comma-separated, of {', '.join(BEDS)}")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--report", metavar="DIR", help="rewrite the table and plot from DIR/where_it_pays.json")
    ap.add_argument("--merge", metavar="DIR", action="append", default=[],
                    help="with --report: first add the beds of DIR/where_it_pays.json (a sweep run as several "
                         "processes over disjoint --beds); its rows replace DIR's rows of the same name")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)
    out = Path(args.report or args.out)
    out.mkdir(parents=True, exist_ok=True)
    store = out / "where_it_pays.json"
    if args.merge and not args.report:
        print("error: --merge needs --report", file=sys.stderr)
        return 2
    if args.report:
        data = json.loads(store.read_text())
        for other in args.merge:
            extra = json.loads((Path(other) / "where_it_pays.json").read_text())
            data["runs"].update(extra["runs"])
            data["meta"].setdefault("beds", {}).update(extra["meta"].get("beds", {}))
            data["meta"]["seconds"] = data["meta"].get("seconds", 0) + extra["meta"].get("seconds", 0)
            data["meta"].setdefault("merged", []).append(extra["meta"].get("command"))
        if args.merge:
            store.write_text(json.dumps(data, indent=1))
    else:
        import torch

        torch.set_num_threads(args.threads)
        beds = [b.strip() for b in args.beds.split(",") if b.strip()]
        unknown = [b for b in beds if b not in BEDS]
        if unknown or args.repeats < 1:
            print(f"error: unknown beds {unknown} (valid: {', '.join(BEDS)})" if unknown else "error: --repeats >= 1",
                  file=sys.stderr)
            return 2
        data = json.loads(store.read_text()) if store.exists() else {"runs": {}, "meta": {}}
        started = time.perf_counter()
        for name in beds:
            bed = BEDS[name]
            for seed in range(args.repeats):
                result = run_bed(bed, seed, progress=not args.quiet)
                info = result.meta["where_it_pays"]
                for row, view in _views(bed, result).items():
                    points = {c: read_point(view, info["baselines"], label) for c, label in info["candidates"].items()}
                    pairs = [{"sampler": p.sampler, "budget": p.budget, "quality": p.quality, "nfe": p.nfe}
                             for p in view.pairs]
                    if name == "oracle-keyed":  # the oracle's best order, decoded on the same draws
                        pairs.append(keyed_best_order(seed, bed["limit"]))
                    runs = data["runs"].setdefault(row, [])
                    runs[:] = [r for r in runs if r["seed"] != seed] + [{"seed": seed, "points": points, "pairs": pairs}]
                data["meta"].setdefault("beds", {})[name] = {"gen": info["gen"], "block": info["block"],
                                                              "baselines": info["baselines"],
                                                              "candidates": info["candidates"]}
                store.write_text(json.dumps(data, indent=1))  # after every run: an interrupted sweep keeps what it did
                print(f"[{name} seed {seed}] done at {time.perf_counter() - started:.0f}s", file=sys.stderr)
        data["meta"].update(repeats=args.repeats, seconds=data["meta"].get("seconds", 0) + time.perf_counter() - started,
                            threads=args.threads, command=" ".join(sys.argv))
        store.write_text(json.dumps(data, indent=1))
    recompute(data)
    data["meta"]["repeats"] = max(len(r) for r in data["runs"].values())  # a sweep cut short has fewer
    table = summarize(data["runs"])
    text = (markdown(table, data["meta"]) + "\n\nHEX against its own best expert:\n\n" + "\n".join(hex_rows(table))
            + "\n\nTargets on the beds made for them:\n\n" + "\n".join(targets(data["runs"])))
    (out / "where_it_pays.md").write_text(text + "\n")
    plot(table, out / "where_it_pays.png")
    print(text)
    print(f"\nwrote {store}, {out / 'where_it_pays.md'}, {out / 'where_it_pays.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
