"""Benchmark: distance to the true distribution vs NFE for our solvers and diffusers' on the exact
Gaussian-mixture oracle (no trained model, so every gap is solver error).

    python scripts/bench_solvers.py                 # full run (a few CPU minutes)
    python scripts/bench_solvers.py --samples 2000  # quick look

Writes ``<out>/solvers_gmm.json``, ``<out>/solvers_gmm.csv`` and ``<out>/solvers_gmm.png`` (default
``docs/figures``). Every solver sees the same initial noises (``--seed``); NFE counts oracle calls.
Metrics: sliced W2 to exact samples, the log-density gap, and the trajectory error (RMS distance to a
500-step DPM-Solver++ 2M solve from the same noises: the ODE discretisation error alone, free of the
sampling noise that dominates W2 near its floor).

Rows: our solvers with their defaults; ``+fitted`` rows use the shipped schedules
(``samplers/solvers/schedules/gmm_<oracle>.json``, fitted by ``scripts/fit_schedule.py`` on another
seed) and ``bespoke`` rows the learned solvers in the same files (``scripts/fit_bespoke.py``); both
are evaluated on the benchmark seed and, to show generalisation, on the fit seed too; each
diffusers scheduler in several settings (spacing, Karras sigmas, uniform log-SNR, order 3), so that
"diffusers' best" is the best of its settings at each NFE. The targets are printed at the end.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from diffusers import (  # noqa: E402
    DDIMScheduler,
    DPMSolverMultistepScheduler,
    PNDMScheduler,
    UniPCMultistepScheduler,
)

from dlm.oracles.gaussian_mixture import image_oracle, plane_oracle  # noqa: E402
from samplers.solvers.pndm import pndm_steps_for_nfe  # noqa: E402
from samplers.solvers import get_solver  # noqa: E402
from samplers.solvers.schedules import load_schedule  # noqa: E402

NFES = (5, 8, 10, 20, 50)
# Shared schedule: the oracle's linear betas; DDIM/PNDM end on clean data (set_alpha_to_one) and no
# clipping, so all solvers integrate the same ODE to the same end point.
VP = dict(num_train_timesteps=1000, beta_start=0.0001, beta_end=0.02, beta_schedule="linear")
REF_STEPS = 500


def _ours(name, **cfg):
    extra = {"set_alpha_to_one": True} if name in ("ddim", "pndm", "plms") else {}
    if name == "ddim":
        extra["clip_sample"] = False
    return lambda: get_solver(name, **VP, **extra, **cfg)


def same(n):
    return n


def plms_steps(nfe):
    return pndm_steps_for_nfe(nfe, True)


SOLVERS = {
    # label: (factory, steps for an NFE budget, ours?)
    "ours:ddim": (_ours("ddim"), same, True),
    "ours:pndm-prk": (_ours("pndm"), lambda nfe: pndm_steps_for_nfe(nfe, False), True),
    "ours:plms": (_ours("plms"), plms_steps, True),
    "ours:dpmpp-2m": (_ours("dpmpp-2m"), same, True),
    "ours:dpmpp-2m (use_lu_lambdas)": (_ours("dpmpp-2m", use_lu_lambdas=True), same, True),
    "ours:dpmpp-3m": (_ours("dpmpp-3m"), same, True),
    "ours:dpmpp-3m (use_lu_lambdas)": (_ours("dpmpp-3m", use_lu_lambdas=True), same, True),
    "ours:unipc": (_ours("unipc"), same, True),
    "ours:dpmpp-2m-sde": (_ours("dpmpp-2m-sde"), same, True),
    "diffusers:DDIM": (lambda: DDIMScheduler(**VP, clip_sample=False, set_alpha_to_one=True), same, False),
    "diffusers:DDIM (trailing)": (
        lambda: DDIMScheduler(**VP, clip_sample=False, set_alpha_to_one=True, timestep_spacing="trailing"), same, False),
    "diffusers:PNDM": (lambda: PNDMScheduler(**VP, skip_prk_steps=True, set_alpha_to_one=True), plms_steps, False),
    "diffusers:PNDM (trailing)": (
        lambda: PNDMScheduler(**VP, skip_prk_steps=True, set_alpha_to_one=True, timestep_spacing="trailing"), plms_steps, False),
    "diffusers:DPMSolverMultistep": (lambda: DPMSolverMultistepScheduler(**VP), same, False),
    "diffusers:DPMSolverMultistep (karras)": (lambda: DPMSolverMultistepScheduler(**VP, use_karras_sigmas=True), same, False),
    "diffusers:DPMSolverMultistep (lu_lambdas)": (lambda: DPMSolverMultistepScheduler(**VP, use_lu_lambdas=True), same, False),
    "diffusers:DPMSolverMultistep (3M, lu_lambdas)": (
        lambda: DPMSolverMultistepScheduler(**VP, solver_order=3, use_lu_lambdas=True), same, False),
    "diffusers:DPMSolverMultistep (2M SDE)": (
        lambda: DPMSolverMultistepScheduler(**VP, algorithm_type="sde-dpmsolver++"), same, False),
    "diffusers:UniPC": (lambda: UniPCMultistepScheduler(**VP), same, False),
    "diffusers:UniPC (karras)": (lambda: UniPCMultistepScheduler(**VP, use_karras_sigmas=True), same, False),
    "diffusers:UniPC (trailing)": (lambda: UniPCMultistepScheduler(**VP, timestep_spacing="trailing"), same, False),
}
FITTED = ("dpmpp-2m", "dpmpp-3m", "unipc", "plms")
# stochastic solvers: their noise comes from a generator seeded like the start noise, the same for ours
# and diffusers' (so the two rows draw the same path)
STOCHASTIC = ("ours:dpmpp-2m-sde", "diffusers:DPMSolverMultistep (2M SDE)")


def run_solver(sched, oracle, x_T, steps=None, timesteps=None, noise_seed=None):
    kw = {} if noise_seed is None else {"generator": torch.Generator().manual_seed(noise_seed)}
    if timesteps is not None:
        sched.set_timesteps(timesteps=timesteps)
    else:
        sched.set_timesteps(steps)
    x = x_T.clone()
    nfe = 0
    with torch.no_grad():
        for t in sched.timesteps:
            x = sched.step(oracle(x, t).sample, t, x, **kw).prev_sample
            nfe += 1
    return x, nfe


def _row(oracle, name, label, ours, nfe, steps, x, ref, seed, dt, **extra):
    m = oracle.metrics(x.double(), seed=seed)
    rms = float(((x.double() - ref.double()) ** 2).mean().sqrt())
    return dict(oracle=name, solver=label, ours=ours, nfe=nfe, steps=steps, seconds=round(dt, 3),
                trajectory_rms=rms, **m.to_dict(), **extra)


def _log(log, r):
    log(
        f"[{r['oracle']}] {r['solver']:44s} NFE={r['nfe']:4d} SW={r['sliced_wasserstein']:.4f} "
        f"gap={r['log_density_gap']:7.3f} traj-rms={r['trajectory_rms']:.4f} cov={r['mode_coverage']:.2f}"
        + (f" seed={r['eval_seed']}" if "eval_seed" in r else "")
    )


def bench(oracle, name, n, seed, nfes, log):
    x_T = torch.randn((n,) + oracle._shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float32)
    ref_x, _ = run_solver(get_solver("dpmpp-2m", **VP), oracle, x_T, steps=REF_STEPS)
    ref = oracle.reference_metrics(n, seed=seed)
    rows = [dict(oracle=name, solver="truth (same-size exact sample)", ours=False, nfe=0, steps=0, **ref.to_dict())]
    log(f"[{name}] truth floor: SW={ref.sliced_wasserstein:.4f} logp-gap={ref.log_density_gap:.3f}")
    rows.append(_row(oracle, name, f"reference: dpmpp-2m {REF_STEPS} steps", False, REF_STEPS, REF_STEPS, ref_x, ref_x, seed, 0.0))
    _log(log, rows[-1])
    jobs = [(label, nfe) for label in SOLVERS for nfe in nfes] + [("ours:ddim", 1000)]
    for label, budget in jobs:
        factory, steps_for, ours = SOLVERS[label]
        steps = steps_for(budget)
        t0 = time.perf_counter()
        x, nfe = run_solver(factory(), oracle, x_T, steps=steps,
                            noise_seed=seed + 1 if label in STOCHASTIC else None)
        rows.append(_row(oracle, name, label, ours, nfe, steps, x, ref_x, seed, time.perf_counter() - t0))
        _log(log, rows[-1])
    starts = {seed: (x_T, ref_x)}

    def start_and_reference(eval_seed):
        """The noises of ``eval_seed`` and their 500-step solve, computed once per seed."""
        if eval_seed not in starts:
            xs = torch.randn((n,) + oracle._shape, generator=torch.Generator().manual_seed(eval_seed), dtype=torch.float32)
            starts[eval_seed] = (xs, run_solver(get_solver("dpmpp-2m", **VP), oracle, xs, steps=REF_STEPS)[0])
        return starts[eval_seed]

    def fitted_rows(label, fit, solve, steps, timesteps):
        """Rows of a solver fitted on ``fit["fit_seed"]``: on this seed (held out) and on the fit seed."""
        for eval_seed in (seed, fit["fit_seed"]):
            xs, refs = start_and_reference(eval_seed)
            t0 = time.perf_counter()
            x, nfe = solve(xs)
            rows.append(_row(oracle, name, label + ("" if eval_seed == seed else " (fit seed)"), True, nfe, steps, x, refs,
                             eval_seed, time.perf_counter() - t0, eval_seed=eval_seed, fit_seed=fit["fit_seed"],
                             timesteps=timesteps))
            _log(log, rows[-1])

    def fit_of(solver, steps_key):
        return next(f for f in sched_file["fits"] if f["solver"] == solver and f["steps"] == int(steps_key))

    sched_file = load_schedule(f"gmm_{name}")
    for solver in FITTED:  # fitted grids (scripts/fit_schedule.py)
        for steps_key, ts in sorted(sched_file["schedules"].get(solver, {}).items(), key=lambda kv: int(kv[0])):
            fitted_rows(f"ours:{solver}+fitted", fit_of(solver, steps_key),
                        lambda xs, s=solver, g=ts: run_solver(_ours(s)(), oracle, xs, timesteps=g), len(ts), ts)
    # learned solvers (scripts/fit_bespoke.py)
    for steps_key, entry in sorted(sched_file.get("bespoke", {}).items(), key=lambda kv: int(kv[0])):
        fitted_rows(f"ours:bespoke (from {entry['base']})", fit_of("bespoke", steps_key),
                    lambda xs, k=int(steps_key): run_solver(get_solver("bespoke", **VP, bespoke=f"gmm_{name}"), oracle, xs,
                                                             steps=k), int(steps_key), entry["timesteps"])
    return rows


def _learned(label: str) -> bool:
    """Rows fitted to the model: a fitted grid or a learned (bespoke) solver."""
    return "fitted" in label or "bespoke" in label


def targets(rows, oracle):
    """Target (a): our best default at 10 NFE vs diffusers' best setting at 20; (b) fitted at 8 vs the same."""
    rs = [r for r in rows if r["oracle"] == oracle and r["nfe"] > 0 and "(fit seed)" not in r["solver"]]
    out = {}
    for key in ("sliced_wasserstein", "trajectory_rms"):
        def best(pred, nfe):
            c = [r for r in rs if pred(r) and r["nfe"] == nfe]
            return min(c, key=lambda r: r[key]) if c else None
        d20 = best(lambda r: r["solver"].startswith("diffusers:"), 20)
        o10 = best(lambda r: r["ours"] and not _learned(r["solver"]), 10)
        f8 = best(lambda r: _learned(r["solver"]), 8)
        out[key] = {
            "diffusers_best_at_20": (d20["solver"], d20[key]) if d20 else None,
            "ours_default_best_at_10": (o10["solver"], o10[key]) if o10 else None,
            "ours_fitted_best_at_8": (f8["solver"], f8[key]) if f8 else None,
            "a_met": bool(d20 and o10 and o10[key] <= d20[key]),
            "b_met": bool(d20 and f8 and f8[key] <= d20[key]),
        }
    return out


def plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    oracles = list(dict.fromkeys(r["oracle"] for r in rows))
    metrics = [("sliced_wasserstein", "sliced W2 to truth"), ("trajectory_rms", "RMS distance to 500-step solve")]
    fig, axes = plt.subplots(len(oracles), 2, figsize=(14, 5.5 * len(oracles)), squeeze=False)
    for i, o in enumerate(oracles):
        rs = [r for r in rows if r["oracle"] == o]
        truth = next(r for r in rs if r["nfe"] == 0)
        for j, (key, label) in enumerate(metrics):
            ax = axes[i][j]
            for solver in dict.fromkeys(r["solver"] for r in rs if 0 < r["nfe"] <= 200):
                pts = sorted((r["nfe"], r[key]) for r in rs if r["solver"] == solver and r["nfe"] <= 200)
                ours = solver.startswith("ours")
                fitted = _learned(solver)
                ax.plot(
                    [p[0] for p in pts],
                    [p[1] for p in pts],
                    marker="*" if fitted else ("o" if ours else "s"),
                    markersize=11 if fitted else 5,
                    linestyle="-" if ours else "--",
                    label=solver,
                    linewidth=2 if ours else 1.0,
                    alpha=1.0 if ours else 0.6,
                )
            for solver, style in (("ours:ddim", "k:"), ("diffusers:DDIM", "k-.")):
                ddim1000 = [r for r in rs if r["solver"] == solver and r["nfe"] == 1000]
                if ddim1000 and solver == "ours:ddim":
                    ax.axhline(ddim1000[0][key], color="k", linestyle=":", label="DDIM 1000 steps")
            if key in truth:
                ax.axhline(truth[key], color="grey", linestyle="-", alpha=0.5, label="exact samples (floor)")
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel("NFE (oracle calls)")
            ax.set_ylabel(label)
            ax.set_title(f"{o}: {label}")
            ax.grid(True, which="both", alpha=0.3)
            if i == 0 and j == 0:
                ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--samples", type=int, default=10000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="docs/figures")
    p.add_argument("--nfe", type=int, nargs="+", default=list(NFES))
    p.add_argument("--oracles", nargs="+", default=["ring2d", "image8x8"], choices=["ring2d", "image8x8"])
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    os.makedirs(args.out, exist_ok=True)
    oracles = {
        "ring2d": lambda: plane_oracle(num_modes=8, radius=0.7, std=0.05),
        "image8x8": lambda: image_oracle(num_modes=8, size=8, std=0.1, seed=0),
    }
    rows = []
    t0 = time.perf_counter()
    for name in args.oracles:
        rows += bench(oracles[name](), name, args.samples, args.seed, args.nfe, print)
    meta = dict(
        command="python scripts/bench_solvers.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        samples=args.samples,
        seed=args.seed,
        seconds=round(time.perf_counter() - t0, 1),
        torch=torch.__version__,
        targets={name: targets(rows, name) for name in args.oracles},
    )
    for name, t in meta["targets"].items():
        for key, v in t.items():
            print(f"[{name}] {key}: diffusers best @20 {v['diffusers_best_at_20']}, ours default best @10 "
                  f"{v['ours_default_best_at_10']} (a met: {v['a_met']}), ours fitted @8 {v['ours_fitted_best_at_8']} "
                  f"(b met: {v['b_met']})")
    with open(os.path.join(args.out, "solvers_gmm.json"), "w") as f:
        json.dump(dict(meta=meta, rows=rows), f, indent=1)
    keys = ["oracle", "solver", "ours", "nfe", "steps", "eval_seed", "sliced_wasserstein", "trajectory_rms", "log_density_gap", "mean_log_density", "mode_coverage", "num_samples", "seconds"]
    with open(os.path.join(args.out, "solvers_gmm.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    plot(rows, os.path.join(args.out, "solvers_gmm.png"))
    print(f"wrote {args.out}/solvers_gmm.(json|csv|png) in {meta['seconds']}s")


if __name__ == "__main__":
    main()
