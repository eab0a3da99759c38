"""Fit few-step timesteps for one model on its own samples (see ``samplers/solvers/schedules.py``).

    python scripts/fit_schedule.py --model gmm-ring2d --solvers dpmpp-2m plms --nfe 8 10
    python scripts/fit_schedule.py --model digits --solvers dpmpp-2m plms --nfe 8 10 --samples 100

For each solver and NFE budget: draw ``--samples`` noises from ``--fit-seed``, solve them once with a
many-step reference (DPM-Solver++ 2M, ``--ref-steps`` steps), then search the step positions
(coordinate descent) that bring the few-step solve closest to the reference (mean squared distance).
The starting grid is the best of ``--inits`` (the solver's default grid, the uniform log-SNR grid and
optionally the trailing grid). The fitted
grid is added to ``samplers/solvers/schedules/<model>.json`` (or ``--out``) with the fit's numbers.
Evaluate on another seed set (``scripts/bench_solvers.py`` / ``scripts/bench_digits_solvers.py``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from samplers.solvers import get_solver  # noqa: E402
from samplers.solvers._vp import vp_timesteps  # noqa: E402
from samplers.solvers.dpmpp_2m import dpm_timesteps  # noqa: E402
from samplers.solvers.schedules import SCHEDULE_DIR, fit_timesteps, save_schedule  # noqa: E402

# The oracles' schedule (linear betas, T = 1000), the one scripts/bench_solvers.py uses.
GMM_VP = dict(num_train_timesteps=1000, beta_start=0.0001, beta_end=0.02, beta_schedule="linear")
FITTABLE = ("ddim", "plms", "dpmpp-2m", "dpmpp-3m", "unipc")


def steps_for_nfe(solver: str, nfe: int) -> int:
    """Inference steps that make ``nfe`` model calls (PLMS's Heun warm start costs one extra call)."""
    return nfe - 1 if solver == "plms" else nfe


def solver_config(solver: str, base: dict) -> dict:
    """Scheduler config for ``solver`` on a model's schedule: DDIM/PLMS end on clean data, no clipping."""
    cfg = dict(base)
    if solver in ("ddim", "plms", "pndm"):
        cfg["set_alpha_to_one"] = True
    if solver == "ddim":
        cfg["clip_sample"] = False
    return cfg


def load_model(name: str, samples: int, seed: int):
    """``(eps_fn(x, t), x_T [samples, ...], VP config)`` for a model name. For the digits model the
    config carries ``clamp`` (its pipeline clamps images to [-1, 1]; the fit compares what users get)."""
    g = torch.Generator().manual_seed(seed)
    if name.startswith("gmm-"):
        from dlm.oracles.gaussian_mixture import image_oracle, plane_oracle

        oracle = plane_oracle(num_modes=8, radius=0.7, std=0.05) if name == "gmm-ring2d" else image_oracle(num_modes=8, size=8, std=0.1, seed=0)
        x_T = torch.randn((samples,) + oracle._shape, generator=g)
        return (lambda x, t: oracle(x, t).sample), x_T, dict(GMM_VP)
    if name == "digits":
        from dlm.image.digits_model import load_digits_pipeline

        pipe = load_digits_pipeline()
        labels = torch.arange(samples) % 10
        x_T = torch.randn(samples, 1, 8, 8, generator=g)
        keys = ("num_train_timesteps", "beta_start", "beta_end", "beta_schedule", "steps_offset")
        base = {k: pipe.scheduler.config[k] for k in keys}
        base["clamp"] = 1.0
        return (lambda x, t: pipe.predict_noise(x, t, labels, GUIDANCE)), x_T, base
    raise ValueError(f"unknown model {name!r}; use gmm-ring2d, gmm-image8x8 or digits")


GUIDANCE = 3.0  # the digits benchmark's guidance scale


def solve(solver: str, base: dict, eps_fn, x_T: torch.Tensor, timesteps=None, steps=None, **extra) -> torch.Tensor:
    base = dict(base)
    clamp = base.pop("clamp", None)
    sched = get_solver(solver, **solver_config(solver, base), **extra)
    if timesteps is not None:
        sched.set_timesteps(timesteps=timesteps)
    else:
        sched.set_timesteps(steps)
    x = x_T.clone()
    with torch.no_grad():
        for t in sched.timesteps:
            x = sched.step(eps_fn(x, t), t, x).prev_sample
    return x if clamp is None else x.clamp(-clamp, clamp)


def default_grid(solver: str, base: dict, steps: int):
    base = {k: v for k, v in base.items() if k != "clamp"}
    sched = get_solver(solver, **solver_config(solver, base))
    sched.set_timesteps(steps)
    return sorted(set(int(t) for t in sched.timesteps.tolist()), reverse=True)


def logsnr_grid(base: dict, steps: int):
    base = {k: v for k, v in base.items() if k != "clamp"}
    ac = get_solver("ddim", **solver_config("ddim", base)).alphas_cumprod
    ts, _ = dpm_timesteps(steps, ac, use_lu_lambdas=True)
    out = []
    for t in ts.tolist():  # rounding can repeat a timestep near t = 0; keep the grid strictly descending
        out.append(min(int(t), out[-1] - 1) if out else int(t))
    return [t for t in out if t >= 0]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, choices=["gmm-ring2d", "gmm-image8x8", "digits"])
    p.add_argument("--solvers", nargs="+", default=["dpmpp-2m", "plms"], choices=list(FITTABLE))
    p.add_argument("--nfe", type=int, nargs="+", default=[8, 10])
    p.add_argument("--samples", type=int, default=1000)
    p.add_argument("--fit-seed", type=int, default=1, help="noise seed of the fit set (benchmarks evaluate on seed 0)")
    p.add_argument("--ref-steps", type=int, default=200)
    p.add_argument("--deltas", type=int, nargs="+", default=[64, 32, 16, 8, 4, 2, 1])
    p.add_argument("--sweeps", type=int, default=2)
    p.add_argument("--inits", nargs="+", default=["default", "logsnr"], choices=["default", "logsnr", "trailing"],
                   help="starting grids to try; the fit starts from the one with the lowest loss")
    p.add_argument("--out", default=None, help="JSON file (default: the shipped samplers/solvers/schedules/<model>.json)")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    out = args.out or str(SCHEDULE_DIR / f"{args.model.replace('gmm-', 'gmm_')}.json")
    t0 = time.perf_counter()
    eps_fn, x_T, base = load_model(args.model, args.samples, args.fit_seed)
    ref = solve("dpmpp-2m", base, eps_fn, x_T, steps=args.ref_steps)
    print(f"[{args.model}] reference: dpmpp-2m {args.ref_steps} steps on {args.samples} fit samples ({time.perf_counter() - t0:.1f}s)")
    for solver in args.solvers:
        for nfe in args.nfe:
            t1 = time.perf_counter()
            steps = steps_for_nfe(solver, nfe)
            calls = [0]

            def loss(ts):
                calls[0] += 1
                return float(((solve(solver, base, eps_fn, x_T, timesteps=ts) - ref) ** 2).mean())

            grids = {"default": lambda: default_grid(solver, base, steps), "logsnr": lambda: logsnr_grid(base, steps),
                     "trailing": lambda: vp_timesteps(steps, base["num_train_timesteps"], "trailing").tolist()}
            inits = {k: grids[k]() for k in args.inits}
            inits = {k: v for k, v in inits.items() if len(v) == steps}
            init_losses = {k: loss(v) for k, v in inits.items()}
            init_name = min(init_losses, key=init_losses.get)
            ts, trace = fit_timesteps(loss, inits[init_name], base["num_train_timesteps"], args.deltas, args.sweeps)
            info = dict(
                nfe=nfe, loss_init={k: round(v, 6) for k, v in init_losses.items()}, init=init_name,
                loss_fit=round(trace[-1], 6), evaluations=calls[0], samples=args.samples, fit_seed=args.fit_seed,
                ref_steps=args.ref_steps, seconds=round(time.perf_counter() - t1, 1),
                command="python scripts/fit_schedule.py " + " ".join(argv if argv is not None else sys.argv[1:]),
            )
            save_schedule(out, args.model, solver, ts, info)
            print(f"[{args.model}] {solver} NFE {nfe}: {ts}  loss {init_losses} -> {trace[-1]:.6f} "
                  f"({calls[0]} solves, {info['seconds']}s)", flush=True)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
