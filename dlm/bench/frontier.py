"""Equal-quality comparisons against a baseline's whole frontier, not one setting of it.

A sampler's claim "k x fewer forwards" means little against one threshold tau: a lower tau may
already be as good and as cheap. Here the baseline is every pair of a set of bench entries (e.g.
`threshold:tau=0.5` ... `threshold:tau=0.95`, each at its budgets), and a candidate pair is compared
with the cheapest baseline pair whose quality is within `tolerance` points of the candidate's:

    ratio = baseline_nfe / candidate_nfe   (> 1: the candidate needs fewer forwards per sequence)

`None` when no baseline pair reaches the candidate's quality minus the tolerance (the candidate is
better than the whole frontier; the ratio is then unbounded, reported as such, not as a number), and
`None` with `below` set when the candidate is more than `tolerance` points worse than that cheapest
baseline pair: the baseline has no point of the candidate's quality, so there is no equal-quality
comparison to make (a sampler that breaks its answers is not "faster at equal quality").
"""
from __future__ import annotations

from typing import Iterable


def _pairs(result, labels: Iterable[str]) -> list:
    labels = set(labels)
    return [p for p in result.pairs if p.sampler in labels]


def frontier_points(result, labels: Iterable[str]) -> list[dict]:
    """The baseline's pairs, cheapest first: `[{"sampler", "budget", "quality", "nfe"}]`."""
    pts = [{"sampler": p.sampler, "budget": p.budget, "quality": p.quality, "nfe": p.nfe}
           for p in _pairs(result, labels)]
    return sorted(pts, key=lambda d: (d["nfe"], -d["quality"]))


def best_quality(result, labels: Iterable[str]) -> float:
    """The highest quality any of `labels`' pairs reached (the frontier's best)."""
    return max(p.quality for p in _pairs(result, labels))


def equal_quality_ratio(result, candidate: str, baseline: Iterable[str], tolerance: float = 1.0) -> list[dict]:
    """For every pair of `candidate`: the cheapest baseline pair within `tolerance` points of its
    quality, and the forward ratio. Returns one dict per candidate budget, in budget order."""
    base = frontier_points(result, baseline)
    if not base:
        raise ValueError(f"no baseline pairs among {sorted(set(baseline))}; list them in --samplers")
    rows = []
    for p in sorted(_pairs(result, [candidate]), key=lambda q: q.budget):
        ok = [b for b in base if b["quality"] >= p.quality - tolerance]
        # the cheapest; among equally cheap points, one within the tolerance before one above it
        match = min(ok, key=lambda b: (b["nfe"], b["quality"] > p.quality + tolerance)) if ok else None
        below = match is not None and p.quality < match["quality"] - tolerance
        rows.append({"budget": p.budget, "quality": p.quality, "nfe": p.nfe,
                     "baseline": match, "below": below,
                     "nfe_ratio": None if match is None or below else match["nfe"] / max(p.nfe, 1e-9)})
    return rows


def best_ratio(rows: list[dict]) -> dict | None:
    """The candidate point with the largest forward ratio (points beyond or below the frontier excluded)."""
    finite = [r for r in rows if r["nfe_ratio"] is not None]
    return max(finite, key=lambda r: r["nfe_ratio"]) if finite else None
