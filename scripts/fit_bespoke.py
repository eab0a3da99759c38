"""Learn a bespoke few-step solver (step positions and coefficients) for one model; see
``samplers/solvers/bespoke.py``.

    python scripts/fit_bespoke.py --model gmm-ring2d --base dpmpp-3m --nfe 8 10
    python scripts/fit_bespoke.py --model digits --base unipc --nfe 8 --samples 200 --ref-steps 60

For each NFE budget: draw ``--samples`` noises from ``--fit-seed``, solve them once with a many-step
reference (DPM-Solver++ 2M, ``--ref-steps`` steps), trace the ``--base`` solver on its fitted grid
(the one ``scripts/fit_schedule.py`` shipped for this model and solver; its default grid if there is
none, or with ``--start default``: the fit is not convex and either start can end lower) into the
bespoke form, and learn the table and the timesteps with Adam (``--iters`` full-batch
steps). The result is added to ``samplers/solvers/schedules/<model>.json`` (or ``--out``) under
``"bespoke"``, with the losses, the command and the time; load it with
``BespokeSolver.from_config(pipe.scheduler.config, bespoke="<model>")``. Evaluate on another seed
(``scripts/bench_solvers.py``, ``scripts/bench_digits_solvers.py``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

from fit_schedule import default_grid, load_model, solve, solver_config  # noqa: E402
from samplers.solvers import get_solver  # noqa: E402
from samplers.solvers.bespoke import SCHEDULE_KEYS, fit_bespoke, trace_linear_solver  # noqa: E402
from samplers.solvers.schedules import SCHEDULE_DIR, save_bespoke, saved_timesteps  # noqa: E402

BASES = ("ddim", "dpmpp-2m", "dpmpp-3m", "unipc")


def start_grid(model: str, base: str, cfg: dict, nfe: int, start: str = "fitted"):
    """``(grid, where it came from)``: with ``start="fitted"`` the shipped fitted grid of ``base`` at ``nfe``
    calls if there is one, else (or with ``start="default"``) the base solver's default grid."""
    name = model.replace("gmm-", "gmm_")
    try:
        ts = saved_timesteps(name, base, nfe) if start == "fitted" else None
    except ValueError:
        ts = None
    return (ts, f"fitted grid of {base} ({name}.json)") if ts else (default_grid(base, cfg, nfe), f"default grid of {base}")


def progress_printer(label: str, iters: int):
    """Print the loss every tenth of the run (and a tqdm bar when stderr is a terminal)."""
    bar = None
    if sys.stderr.isatty():
        from tqdm.auto import tqdm

        bar = tqdm(total=iters + 1, desc=label, leave=False)

    def report(it, loss):
        if bar is not None:
            bar.update(1)
            bar.set_postfix(loss=f"{loss:.3g}")
        if it % max(1, iters // 10) == 0 or it == iters:
            print(f"  {label} iter {it:4d}: loss {loss:.6g}", flush=True)

    return report


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, choices=["gmm-ring2d", "gmm-image8x8", "digits"])
    p.add_argument("--base", default="unipc", choices=list(BASES), help="solver the table starts from (traced exactly)")
    p.add_argument("--nfe", type=int, nargs="+", default=[8])
    p.add_argument("--start", default="fitted", choices=["fitted", "default"],
                   help="grid the fit starts from: the base solver's shipped fitted grid (if any) or its default grid")
    p.add_argument("--samples", type=int, default=4000)
    p.add_argument("--fit-seed", type=int, default=1, help="noise seed of the fit set (benchmarks evaluate on seed 0)")
    p.add_argument("--ref-steps", type=int, default=500)
    p.add_argument("--iters", type=int, default=300)
    p.add_argument("--lr", type=float, default=5e-4, help="Adam learning rate of the coefficients")
    p.add_argument("--lr-times", type=float, default=0.01, help="Adam learning rate of the timestep logits (0: keep the grid)")
    p.add_argument("--out", default=None, help="JSON file (default: the shipped samplers/solvers/schedules/<model>.json)")
    args = p.parse_args(argv)
    for name in ("samples", "iters", "ref_steps"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if any(n < 2 for n in args.nfe):
        p.error("--nfe values must be >= 2")
    torch.set_num_threads(1)
    out = args.out or str(SCHEDULE_DIR / f"{args.model.replace('gmm-', 'gmm_')}.json")
    t0 = time.perf_counter()
    eps_fn, x_T, base_cfg = load_model(args.model, args.samples, args.fit_seed)
    ref = solve("dpmpp-2m", base_cfg, eps_fn, x_T, steps=args.ref_steps)
    clamp = base_cfg.get("clamp")
    cfg = {k: v for k, v in base_cfg.items() if k != "clamp"}
    print(f"[{args.model}] reference: dpmpp-2m {args.ref_steps} steps on {args.samples} fit samples "
          f"({time.perf_counter() - t0:.1f}s)", flush=True)
    for nfe in args.nfe:
        t1 = time.perf_counter()
        grid, origin = start_grid(args.model, args.base, cfg, nfe, args.start)
        sched = get_solver(args.base, **solver_config(args.base, cfg))
        sched.set_timesteps(timesteps=grid)
        calls, table = trace_linear_solver(sched)
        base_loss = float(((solve(args.base, base_cfg, eps_fn, x_T, timesteps=grid) - ref) ** 2).mean())
        # A pipeline that clamps its output (digits) is compared after the same clamp: what users get.
        fit = fit_bespoke(eps_fn, x_T, ref, calls, table, sched.alphas_cumprod, iters=args.iters, lr=args.lr,
                          lr_times=args.lr_times, learn_times=args.lr_times > 0,
                          output_transform=None if clamp is None else (lambda x: x.clamp(-clamp, clamp)),
                          progress=progress_printer(f"NFE {nfe}", args.iters))
        entry = {"base": args.base, "start": origin, "timesteps": fit["timesteps"], "coefficients": fit["table"].tolist(),
                 "noise_schedule": {k: cfg[k] for k in SCHEDULE_KEYS}}
        info = dict(nfe=nfe, base=args.base, start=origin, start_timesteps=calls,
                    loss_base_solver=round(base_loss, 8), loss_start=round(fit["loss_start"], 8),
                    loss_fit=round(fit["loss_fit"], 8), iters=args.iters, lr=args.lr, lr_times=args.lr_times,
                    samples=args.samples, fit_seed=args.fit_seed, ref_steps=args.ref_steps, clamped_reference=clamp,
                    seconds=round(time.perf_counter() - t1, 1),
                    command="python scripts/fit_bespoke.py " + " ".join(argv if argv is not None else sys.argv[1:]))
        save_bespoke(out, args.model, entry, info)
        print(f"[{args.model}] bespoke from {args.base} at NFE {nfe}: timesteps {[round(t, 1) for t in fit['timesteps']]}; "
              f"loss {args.base} {base_loss:.6g} -> {fit['loss_fit']:.6g} ({info['seconds']}s)", flush=True)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
