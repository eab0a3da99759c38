"""Can one learned solver serve every model? Fit a bespoke table on a family of random Gaussian
mixtures and test it, unchanged, on models it never saw (issue 14, target (a): "defaults, no
per-model fitting, at 10 NFE at or below diffusers' best at 20").

    python scripts/fit_universal_solver.py                       # about 6 min on one CPU thread
    python scripts/fit_universal_solver.py --nfe 10 --models 24 --iters 300 --no-digits

What it does:
1. draws ``--models`` random isotropic Gaussian mixtures (dimension 2-64, 2-16 modes, std 0.02-0.3,
   means uniform in a box of half-width 0.4-0.9; ``--family-seed``) on the linear VP schedule the
   oracles and the digits model share (betas 1e-4..0.02, T = 1000);
2. fits one bespoke table (``samplers.solvers.bespoke.fit_bespoke_family``: the mean over models of
   the log mean squared distance to a 500-step DPM-Solver++ 2M solve) starting from ``--base``
   (default: DPM-Solver++ 2M with ``use_lu_lambdas``, our best default at 10 NFE on the oracles);
3. evaluates, in the same run, the trajectory RMS to the 500-step solve of that table, of the base
   solver at the same NFE, and of diffusers' DPM-Solver++ 3M (``use_lu_lambdas``) at 20 NFE (its
   best setting at 20 on both oracles) on: the benchmark oracles ``ring2d`` and ``image8x8`` (10000
   noises of seed 0, as in ``scripts/bench_solvers.py``), ``--heldout`` new mixtures of another family
   seed, and the digits transformer (200 images, guidance 3, against a 200-step DPM-Solver++ 2M solve
   from t = 999, with diffusers' UniPC + Karras sigmas at 20, its best there).

Writes ``--out`` (default ``docs/figures/solvers_universal.json``) with every number and the table.
The table is not shipped as a scheduler default: see docs/solvers.md, "One learned solver for every
model?", for why.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

from fit_bespoke import progress_printer  # noqa: E402
from fit_schedule import GMM_VP, load_model, solve, solver_config  # noqa: E402
from samplers.solvers import get_solver, solver_from_pipeline  # noqa: E402
from samplers.solvers.bespoke import bespoke_solve, fit_bespoke_family, trace_linear_solver  # noqa: E402

DIMS = (2, 3, 4, 8, 16, 32, 64)


def random_mixtures(count: int, seed: int):
    """``count`` random Gaussian-mixture oracles on the shared linear VP schedule (see the module doc)."""
    from dlm.oracles.gaussian_mixture import GaussianMixtureOracle

    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        dim = DIMS[int(torch.randint(len(DIMS), (1,), generator=g))]
        modes = int(torch.randint(2, 17, (1,), generator=g))
        std = math.exp(float(torch.empty(1).uniform_(math.log(0.02), math.log(0.3), generator=g)))
        half_width = float(torch.empty(1).uniform_(0.4, 0.9, generator=g))
        means = (torch.rand(modes, dim, generator=g) * 2 - 1) * half_width
        out.append(GaussianMixtureOracle(means=means.tolist(), stds=std, sample_shape=(dim,), **GMM_VP))
    return out


def oracle_problem(oracle, samples: int, seed: int):
    """``(eps_fn, x_T [samples, D], 500-step DPM-Solver++ 2M solve)`` for one oracle."""
    fn = lambda x, t: oracle(x, t).sample  # noqa: E731
    x_T = torch.randn((samples,) + tuple(oracle._shape), generator=torch.Generator().manual_seed(seed))
    return fn, x_T, solve("dpmpp-2m", dict(GMM_VP), fn, x_T, steps=500)


def base_scheduler(base: str, nfe: int):
    """Our scheduler for ``base`` (``dpmpp-2m-lu``, ``dpmpp-3m-lu``, ``unipc``, ...) with ``nfe`` steps set."""
    extra = {"use_lu_lambdas": True} if base.endswith("-lu") else {}
    name = base[: -len("-lu")] if base.endswith("-lu") else base
    sched = get_solver(name, **solver_config(name, dict(GMM_VP)), **extra)
    sched.set_timesteps(nfe)
    return sched


def run_scheduler(sched, fn, x_T):
    x = x_T.clone()
    with torch.no_grad():
        for t in sched.timesteps:
            x = sched.step(fn(x, t), t, x).prev_sample
    return x


def _show(row: dict) -> None:
    print("  " + "  ".join(f"{k}: {v:.4f}" if isinstance(v, float) else str(v) for k, v in row.items()), flush=True)


def rms(x, ref) -> float:
    return float(((x.double() - ref.double()) ** 2).mean().sqrt())


def evaluate_oracles(named, fit, ac, base: str, nfe: int):
    """Trajectory RMS of the universal table, the base solver at ``nfe`` and diffusers' 3M-lu at 20 per oracle."""
    from diffusers import DPMSolverMultistepScheduler

    rows = []
    for name, (fn, x_T, ref) in named:
        with torch.no_grad():
            ours = bespoke_solve(fn, x_T.double(), torch.tensor(fit["timesteps"]), fit["table"], ac)
        diffusers_20 = DPMSolverMultistepScheduler(**GMM_VP, solver_order=3, use_lu_lambdas=True)
        diffusers_20.set_timesteps(20)
        row = {"model": name, "universal": rms(ours, ref),
               f"{base}@{nfe}": rms(run_scheduler(base_scheduler(base, nfe), fn, x_T), ref),
               "diffusers DPMSolverMultistep(3M, lu)@20": rms(run_scheduler(diffusers_20, fn, x_T), ref)}
        rows.append(row)
        _show(row)
    return rows


def evaluate_digits(fit, nfe: int, base: str, samples: int = 200):
    """The same three numbers on the digits pipeline (diffusers' UniPC + Karras at 20 instead of 3M-lu)."""
    import tempfile

    from diffusers import UniPCMultistepScheduler

    from dlm.image.digits_model import load_digits_pipeline
    from samplers.solvers.bespoke import SCHEDULE_KEYS, BespokeSolver
    from samplers.solvers.dpmpp_2m import DPMSolverPP2M

    pipe = load_digits_pipeline()
    cfg = pipe.scheduler.config
    extra = {"use_lu_lambdas": True} if base.endswith("-lu") else {}
    base_sched = solver_from_pipeline(pipe, base[: -len("-lu")] if base.endswith("-lu") else base, **extra)
    labels = torch.arange(samples) % 10
    noise = torch.randn(samples, 1, 8, 8, generator=torch.Generator().manual_seed(0))

    def run(scheduler, steps):
        pipe.scheduler = scheduler
        return pipe(digits=labels, num_inference_steps=steps, guidance_scale=3.0, latents=noise.clone(),
                    generator=torch.Generator().manual_seed(1)).images

    ref = run(DPMSolverPP2M.from_config(cfg, timestep_spacing="linspace"), 200)
    entry = {"timesteps": fit["timesteps"], "coefficients": fit["table"].tolist(),
             "noise_schedule": {k: cfg[k] for k in SCHEDULE_KEYS}}
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump({"bespoke": {str(nfe): entry}}, f)
    try:
        universal = run(BespokeSolver.from_config(cfg, bespoke=f.name), nfe)
    finally:
        os.unlink(f.name)
    base_out = run(base_sched, nfe)
    row = {"model": "digits", "universal": rms(universal, ref), f"{base}@{nfe}": rms(base_out, ref),
           "diffusers UniPC(karras)@20": rms(run(UniPCMultistepScheduler.from_config(cfg, use_karras_sigmas=True), 20), ref)}
    _show(row)
    return row


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nfe", type=int, default=10)
    p.add_argument("--base", default="dpmpp-2m-lu", choices=["dpmpp-2m-lu", "dpmpp-3m-lu", "dpmpp-2m", "unipc"])
    p.add_argument("--models", type=int, default=24, help="random mixtures in the fit family")
    p.add_argument("--samples", type=int, default=512, help="fit noises per model (seed 1)")
    p.add_argument("--iters", type=int, default=300)
    p.add_argument("--family-seed", type=int, default=123)
    p.add_argument("--heldout", type=int, default=8, help="new random mixtures (family seed + 1) to evaluate on")
    p.add_argument("--eval-samples", type=int, default=10000)
    p.add_argument("--no-digits", action="store_true", help="skip the digits transformer")
    p.add_argument("--out", default=os.path.join(os.path.dirname(HERE), "docs", "figures", "solvers_universal.json"))
    args = p.parse_args(argv)
    for key in ("nfe", "models", "samples", "iters", "eval_samples"):
        if getattr(args, key) < (2 if key == "nfe" else 1):
            p.error(f"--{key.replace('_', '-')} must be >= {2 if key == 'nfe' else 1}")
    out_dir = os.path.dirname(os.path.abspath(args.out))
    if not os.path.isdir(out_dir):
        p.error(f"--out: folder {out_dir} does not exist")
    torch.set_num_threads(1)
    t0 = time.perf_counter()

    print(f"fit family: {args.models} random mixtures (seed {args.family_seed}), {args.samples} noises each", flush=True)
    problems = [oracle_problem(o, args.samples, 1) for o in random_mixtures(args.models, args.family_seed)]
    problems = [(fn, x.double(), ref.double()) for fn, x, ref in problems]
    sched = base_scheduler(args.base, args.nfe)
    calls, table = trace_linear_solver(sched)
    fit = fit_bespoke_family(problems, calls, table, sched.alphas_cumprod, iters=args.iters,
                             progress=progress_printer(f"NFE {args.nfe}", args.iters))
    fit_seconds = time.perf_counter() - t0
    print(f"fitted in {fit_seconds:.0f}s: timesteps {[round(t, 1) for t in fit['timesteps']]}, "
          f"loss {fit['loss_start']:.3f} -> {fit['loss_fit']:.3f} (mean log MSE)", flush=True)

    ac = sched.alphas_cumprod
    print("benchmark oracles (seed 0):", flush=True)
    named = []
    for name in ("gmm-ring2d", "gmm-image8x8"):
        fn, x_T, _ = load_model(name, args.eval_samples, 0)
        named.append((name, (fn, x_T, solve("dpmpp-2m", dict(GMM_VP), fn, x_T, steps=500))))
    rows = evaluate_oracles(named, fit, ac, args.base, args.nfe)
    print(f"held-out random mixtures (family seed {args.family_seed + 1}):", flush=True)
    held = [(f"random-{i}", oracle_problem(o, 1000, 0))
            for i, o in enumerate(random_mixtures(args.heldout, args.family_seed + 1))]
    rows += evaluate_oracles(held, fit, ac, args.base, args.nfe)
    if not args.no_digits:
        print("digits transformer:", flush=True)
        rows.append(evaluate_digits(fit, args.nfe, args.base))

    result = {"command": "python scripts/fit_universal_solver.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "args": vars(args), "fit_seconds": round(fit_seconds, 1), "loss_start": fit["loss_start"],
              "loss_fit": fit["loss_fit"], "timesteps": fit["timesteps"], "coefficients": fit["table"].tolist(),
              "rows": rows, "seconds": round(time.perf_counter() - t0, 1)}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {args.out} ({result['seconds']:.0f}s)")


if __name__ == "__main__":
    main()
