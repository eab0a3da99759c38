"""Benchmark: distance to the true distribution vs NFE for our solvers and diffusers' on the exact
Gaussian-mixture oracle (no trained model, so every gap is solver error).

    python scripts/bench_solvers.py                 # full run (a few CPU minutes)
    python scripts/bench_solvers.py --samples 2000  # quick look

Writes ``<out>/solvers_gmm.json``, ``<out>/solvers_gmm.csv`` and ``<out>/solvers_gmm.png`` (default
``docs/figures``). Every solver sees the same initial noises; NFE counts oracle calls.
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

NFES = (5, 10, 20, 50, 100)
# Shared schedule: the oracle's linear betas; DDIM/PNDM end on clean data (set_alpha_to_one) and no
# clipping, so all solvers integrate the same ODE to the same end point.
VP = dict(num_train_timesteps=1000, beta_start=0.0001, beta_end=0.02, beta_schedule="linear")


def _ours(name):
    extra = {"set_alpha_to_one": True} if name in ("ddim", "pndm", "plms") else {}
    if name == "ddim":
        extra["clip_sample"] = False
    return lambda: get_solver(name, **VP, **extra)


SOLVERS = {
    # label: (factory, steps for an NFE budget, ours?)
    "ours:ddim": (_ours("ddim"), lambda nfe: nfe, True),
    "ours:pndm-prk": (_ours("pndm"), lambda nfe: pndm_steps_for_nfe(nfe, False), True),
    "ours:plms": (_ours("plms"), lambda nfe: pndm_steps_for_nfe(nfe, True), True),
    "ours:dpmpp-2m": (_ours("dpmpp-2m"), lambda nfe: nfe, True),
    "diffusers:DDIM": (lambda: DDIMScheduler(**VP, clip_sample=False, set_alpha_to_one=True), lambda n: n, False),
    "diffusers:PNDM": (
        lambda: PNDMScheduler(**VP, skip_prk_steps=True, set_alpha_to_one=True),
        lambda nfe: pndm_steps_for_nfe(nfe, True),
        False,
    ),
    "diffusers:DPMSolverMultistep": (lambda: DPMSolverMultistepScheduler(**VP), lambda n: n, False),
    "diffusers:UniPC": (lambda: UniPCMultistepScheduler(**VP), lambda n: n, False),
}


def run_solver(sched, steps, oracle, x_T):
    sched.set_timesteps(steps)
    x = x_T.clone()
    nfe = 0
    with torch.no_grad():
        for t in sched.timesteps:
            x = sched.step(oracle(x, t).sample, t, x).prev_sample
            nfe += 1
    return x, nfe


def bench(oracle, name, n, seed, nfes, log):
    x_T = torch.randn((n,) + oracle._shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float32)
    ref = oracle.reference_metrics(n, seed=seed)
    rows = [dict(oracle=name, solver="truth (same-size exact sample)", ours=False, nfe=0, steps=0, **ref.to_dict())]
    log(f"[{name}] truth floor: SW={ref.sliced_wasserstein:.4f} logp-gap={ref.log_density_gap:.3f}")
    jobs = [(label, nfe) for label in SOLVERS for nfe in nfes]
    jobs.append(("ours:ddim", 1000))
    jobs.append(("diffusers:DDIM", 1000))
    for label, budget in jobs:
        factory, steps_for, ours = SOLVERS[label]
        steps = steps_for(budget)
        t0 = time.perf_counter()
        x, nfe = run_solver(factory(), steps, oracle, x_T)
        dt = time.perf_counter() - t0
        m = oracle.metrics(x.double(), seed=seed)
        rows.append(dict(oracle=name, solver=label, ours=ours, nfe=nfe, steps=steps, seconds=round(dt, 3), **m.to_dict()))
        log(
            f"[{name}] {label:32s} NFE={nfe:4d} steps={steps:4d} SW={m.sliced_wasserstein:.4f} "
            f"logp={m.mean_log_density:8.3f} gap={m.log_density_gap:7.3f} cov={m.mode_coverage:.2f} ({dt:.1f}s)"
        )
    return rows


def plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    oracles = list(dict.fromkeys(r["oracle"] for r in rows))
    metrics = [("sliced_wasserstein", "sliced W2 to truth"), ("log_density_gap", "|mean log p - E log p|")]
    fig, axes = plt.subplots(len(oracles), 2, figsize=(12, 4.6 * len(oracles)), squeeze=False)
    for i, o in enumerate(oracles):
        rs = [r for r in rows if r["oracle"] == o]
        truth = next(r for r in rs if r["nfe"] == 0)
        for j, (key, label) in enumerate(metrics):
            ax = axes[i][j]
            for solver in dict.fromkeys(r["solver"] for r in rs if r["nfe"] > 0):
                pts = sorted((r["nfe"], r[key]) for r in rs if r["solver"] == solver and r["nfe"] <= 200)
                ours = solver.startswith("ours")
                ax.plot(
                    [p[0] for p in pts],
                    [p[1] for p in pts],
                    marker="o" if ours else "s",
                    linestyle="-" if ours else "--",
                    label=solver,
                    linewidth=2 if ours else 1.2,
                )
            for solver, style in (("ours:ddim", "k:"), ("diffusers:DDIM", "k-.")):
                ddim1000 = [r for r in rs if r["solver"] == solver and r["nfe"] == 1000]
                if ddim1000 and solver == "ours:ddim":
                    ax.axhline(ddim1000[0][key], color="k", linestyle=":", label="DDIM 1000 steps")
            ax.axhline(truth[key], color="grey", linestyle="-", alpha=0.5, label="exact samples (floor)")
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel("NFE (oracle calls)")
            ax.set_ylabel(label)
            ax.set_title(f"{o}: {label}")
            ax.grid(True, which="both", alpha=0.3)
            if i == 0 and j == 0:
                ax.legend(fontsize=7, ncol=2)
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
    )
    with open(os.path.join(args.out, "solvers_gmm.json"), "w") as f:
        json.dump(dict(meta=meta, rows=rows), f, indent=1)
    keys = ["oracle", "solver", "ours", "nfe", "steps", "sliced_wasserstein", "log_density_gap", "mean_log_density", "mode_coverage", "num_samples", "seconds"]
    with open(os.path.join(args.out, "solvers_gmm.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    plot(rows, os.path.join(args.out, "solvers_gmm.png"))
    print(f"wrote {args.out}/solvers_gmm.(json|csv|png) in {meta['seconds']}s")


if __name__ == "__main__":
    main()
