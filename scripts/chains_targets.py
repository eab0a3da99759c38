"""Issue 33's targets, read off ONE `dlm bench --suite chains` run (results.json), each met or not.

    dlm bench --model tiny-dlm-chains --suite chains --threads 1 --out runs/bench-chains \
        --steps 128 --samplers "$(python scripts/chains_targets.py --samplers)"
    python scripts/chains_targets.py runs/bench-chains/results.json            # markdown tables

What is compared (quality = % exact answers; forwards = decoder forward passes per sequence, a
batched look-ahead forward counted once; "within 1 point" is the equal-quality rule):
- the suite: one token per step (`confidence` at steps = gen length) >= 80%, and `threshold` at the
  best point of its tau frontier (0.5-0.95) needs >= 5 forwards per 32-token block;
- LoPA: >= 1.5x fewer forwards than the cheapest point of threshold's WHOLE tau frontier at equal
  quality; >= 2x with the multi-block window;
- Saber at its layout (one 128-token block): >= 2x fewer forwards than `confidence` on the same
  block at equal quality (confidence's budgets form its frontier);
- HEX: the vote >= its best expert + 2 points (the experts are scored by the harness on the same run).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dlm.bench.frontier import best_ratio, equal_quality_ratio  # noqa: E402
from dlm.bench.report import load_result  # noqa: E402

TAUS = (0.5, 0.6, 0.7, 0.8, 0.9, 0.95)
THRESHOLD = [f"threshold:tau={t}" for t in TAUS]
CONFIDENCE = "confidence:steps=128/64/32"
LOPA = "lopa"
LOPA_WINDOW = "lopa:window=2"
SABER = "saber:block=128"
CONFIDENCE_LONG = "confidence:block=128:steps=128/64/32/16"
HEX = "hex:steps=320"
SAMPLERS = THRESHOLD + [CONFIDENCE, LOPA, LOPA_WINDOW, SABER, CONFIDENCE_LONG, HEX]


def _pair(result, label, budget=None):
    ps = [p for p in result.pairs if p.sampler == label and (budget is None or p.budget == budget)]
    return max(ps, key=lambda p: p.budget) if ps else None


def _met(ok) -> str:
    return "met" if ok else "not met"


def _ratio_row(name, rows, target):
    best = best_ratio(rows)
    if best is None:
        below = [r for r in rows if r.get("below")]
        if below:  # every point of the method is worse than the baseline's cheapest point of that quality
            r = max(below, key=lambda r: r["quality"])
            b = r["baseline"]
            return (f"| {name} | {r['budget']} | {r['quality']:.1f} / {r['nfe']:.1f} | below the frontier: "
                    f"{b['sampler']}@{b['budget']} reaches {b['quality']:.1f} / {b['nfe']:.1f} | - | {target}x | not met |")
        return f"| {name} | - | - | beyond the frontier or no pair | - | {target}x | n/a |"
    b = best["baseline"]
    return (f"| {name} | {best['budget']} | {best['quality']:.1f} / {best['nfe']:.1f} | "
            f"{b['sampler']}@{b['budget']}: {b['quality']:.1f} / {b['nfe']:.1f} | **{best['nfe_ratio']:.2f}x** | "
            f"{target}x | {_met(best['nfe_ratio'] >= target)} |")


def report(result) -> str:
    gen = result.config["gen_length"]
    blocks = gen // result.config["block_length"]
    lines = [f"Suite `{result.config['suite']}`, model `{result.config['model']}`, {result.meta.get('prompts')} prompts, "
             f"gen {gen}, block {result.config['block_length']}.", ""]
    one = _pair(result, CONFIDENCE, gen)
    taus = [p for p in (_pair(result, t) for t in THRESHOLD) if p is not None]
    lines += ["| threshold tau | quality % | forwards/seq | forwards per 32-token block |", "|---|---|---|---|"]
    for p in taus:
        lines.append(f"| {p.sampler.split('=')[1]} | {p.quality:.1f} | {p.nfe:.1f} | {p.nfe / blocks:.1f} |")
    if one is not None and taus:
        best = max(taus, key=lambda p: (p.quality, -p.nfe))
        lines += ["", f"One token per step (confidence@{gen}): {one.quality:.1f}% (target >= 80: {_met(one.quality >= 80)}); "
                  f"threshold's best point (tau {best.sampler.split('=')[1]}, {best.quality:.1f}%) uses "
                  f"{best.nfe / blocks:.1f} forwards per block (target >= 5: {_met(best.nfe / blocks >= 5)}).", ""]
    lines += ["| method | its budget | its quality % / forwards | cheapest baseline point within 1 point | ratio | target | |",
              "|---|---|---|---|---|---|---|"]
    for name, label, base, target in ((LOPA, LOPA, THRESHOLD, 1.5), (LOPA_WINDOW, LOPA_WINDOW, THRESHOLD, 2.0),
                                      (SABER, SABER, [CONFIDENCE_LONG], 2.0)):
        if _pair(result, label) is not None:
            lines.append(_ratio_row(name, equal_quality_ratio(result, label, base), target))
    hexp = _pair(result, HEX)
    if hexp is not None and hexp.extra.get("expert_quality"):
        experts = hexp.extra["expert_quality"]
        best = hexp.extra["best_expert_quality"]
        lines += ["", "| HEX | vote | " + " | ".join(f"block {b}" for b in experts) + " | target |",
                  "|---|---|" + "---|" * len(experts) + "---|",
                  f"| quality % | **{hexp.quality:.1f}** | " + " | ".join(f"{q:.1f}" for q in experts.values())
                  + f" | vote >= best + 2 = {best + 2:.1f}: {_met(hexp.quality >= best + 2)} |",
                  "", f"HEX used {hexp.nfe:.1f} forwards per sequence in all (the experts' total)."]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("results", nargs="?", help="results.json of the chains run")
    ap.add_argument("--samplers", action="store_true", help="print the --samplers list of the run and exit")
    args = ap.parse_args(argv)
    if args.samplers:
        print(",".join(SAMPLERS))
        return 0
    if not args.results:
        ap.error("give the results.json of a `dlm bench --suite chains` run (or --samplers)")
    print(report(load_result(args.results)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
