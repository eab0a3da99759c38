"""`dlm image`: sample 8x8 digits from the shipped class-conditioned transformer.

    dlm image                                   # digits 0-9, our DDIM, 20 steps, guidance 3
    dlm image --solver dpmpp-2m --steps 10 --digits 3,7 --num-samples 8 --out out/
    dlm image --search random --budget 160 --json
    dlm image --steps 50 --cache block:threshold=0.1     # feature caching (caching package)

Writes one nearest-neighbour-upscaled PNG per sample and a grid, prints the paths and the NFE
(model calls; with --search, per-image model evaluations summed over images).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from dlm._progress import show_progress
from dlm.commands._common import check_output_dir, positive_int, quiet_diffusers

# diffusers' own schedulers, selectable next to the project's registry (samplers.solvers.SOLVERS)
DIFFUSERS_SOLVERS = {
    "diffusers-ddim": ("DDIMScheduler", {}),
    "diffusers-pndm": ("PNDMScheduler", {"skip_prk_steps": True}),
    "diffusers-dpm": ("DPMSolverMultistepScheduler", {"algorithm_type": "dpmsolver++", "solver_order": 2}),
    "diffusers-unipc": ("UniPCMultistepScheduler", {}),
}
SEARCH_METHODS = ("random", "zero-order", "paths")


def solver_names() -> list[str]:
    try:
        from samplers.solvers import SOLVERS
        ours = sorted(k for k, s in SOLVERS.items() if s.family == "vp")
    except ImportError:  # registry not installed: diffusers' schedulers only
        ours = []
    return ours + sorted(DIFFUSERS_SOLVERS)


def make_scheduler(pipe, name: str):
    """Scheduler ``name`` configured from the pipeline's training schedule; ValueError if unknown."""
    if name in DIFFUSERS_SOLVERS:
        import diffusers

        cls_name, extra = DIFFUSERS_SOLVERS[name]
        return getattr(diffusers, cls_name).from_config(pipe.scheduler.config, **extra)
    try:
        from samplers.solvers import SOLVERS, solver_from_pipeline
    except ImportError:
        SOLVERS = {}
    if name not in SOLVERS:
        raise ValueError(f"unknown solver {name!r}; choose from {', '.join(solver_names())}")
    if name == "bespoke":  # the learned solver shipped for the built-in digits model
        return solver_from_pipeline(pipe, name, bespoke="digits")
    return solver_from_pipeline(pipe, name)


def min_steps(scheduler) -> int:
    """Fewest inference steps the solver supports: its multistep order (PLMS's Heun start needs 2)."""
    cfg = scheduler.config
    need = max(int(getattr(scheduler, "order", 1) or 1), int(cfg.get("solver_order", 1) or 1))
    if cfg.get("skip_prk_steps", False):
        need = max(need, 2)
    return need


def parse_digit_list(text: str) -> list[int]:
    try:
        digits = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise ValueError(f"--digits must be comma-separated integers 0-9, got {text!r}") from None
    if not digits or any(d < 0 or d > 9 for d in digits):
        raise ValueError(f"--digits must be comma-separated integers 0-9, got {text!r}")
    return digits


def register(subparsers) -> None:
    p = subparsers.add_parser("image", help="sample 8x8 digits from the built-in class-conditioned transformer",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("--solver", default=None,
                   help="solver name: ours (samplers.solvers) or diffusers-ddim/-pndm/-dpm/-unipc (default: ddim)")
    p.add_argument("--steps", type=positive_int, default=20, help="inference steps (default: 20)")
    p.add_argument("--digits", default="0,1,2,3,4,5,6,7,8,9", help="comma-separated digits 0-9 (default: 0-9)")
    p.add_argument("--num-samples", type=positive_int, default=None,
                   help="images to make, cycling through --digits (default: one per digit)")
    p.add_argument("--guidance", type=float, default=3.0, help="classifier-free guidance scale (default: 3)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    p.add_argument("--search", choices=SEARCH_METHODS, default=None,
                   help="noise search per image under the digits classifier verifier")
    p.add_argument("--budget", type=positive_int, default=None,
                   help="NFE budget per image for --search (default: 8 full denoisings)")
    p.add_argument("--cache", default=None, metavar="NAME[:key=value,...]",
                   help="reuse or forecast features across steps: tgate, block, deepcache, rehash (UNets) or "
                        "forecast, options as in their configs (e.g. tgate:gate_step=10, forecast:interval=4; "
                        "forecast's num_steps defaults to this run's step count; see docs/caching.md)")
    p.add_argument("--out", default="dlm-image-out", help="output folder (default: dlm-image-out)")
    p.add_argument("--scale", type=positive_int, default=8, help="upscale factor of the PNGs (default: 8)")
    p.add_argument("--json", action="store_true", help="print a JSON summary instead of text")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress bar on stderr (default: on when stderr is a terminal, off when redirected)")
    # the shipped digits transformer: --threads defaults to 2 (0.10 s against 0.14 s on one thread for
    # the default 10 digits x 20 steps, on a shared 2-core machine), or 1 on a one-core machine
    p.set_defaults(func=run, builtin_threads=min(2, os.cpu_count() or 1))


def denoiser_steps(scheduler, steps: int) -> int:
    """How many denoiser steps a run of ``steps`` makes, as ``caching`` counts them: runs of equal
    timesteps are one step (Heun-type and PRK schedulers evaluate some timesteps twice)."""
    import torch

    scheduler.set_timesteps(steps)
    return int(torch.unique_consecutive(torch.as_tensor(scheduler.timesteps)).numel())


def run(args) -> int:
    """`dlm image`: check the arguments, set up the pipeline, sample (or search), write and report."""
    requested, out_dir, cache_config = _checked(args)
    pipe, solver = _pipeline(args, cache_config)
    images, nfe, search_info = _sample(args, pipe, requested)
    summary = _write(args, images, requested, solver, out_dir, nfe, search_info)
    _report(args, summary, out_dir)
    return 0


def _checked(args):
    """Every mistake that needs no model, before any work: `(requested digits, out_dir, cache_config)`."""
    digits = parse_digit_list(args.digits)
    n = args.num_samples or len(digits)
    requested = [digits[i % len(digits)] for i in range(n)]
    if args.budget is not None and args.search is None:
        raise ValueError("--budget needs --search random|zero-order|paths")
    if not 0.0 <= args.guidance <= 50.0:
        raise ValueError(f"--guidance must be in [0, 50], got {args.guidance}")
    out_dir = check_output_dir(args.out)
    cache_config = None
    if args.cache is not None:  # parsed before loading anything: a bad spec fails fast
        import caching

        # DigitsPipeline batches the conditional half first (T-GATE keeps that half after its gate)
        cache_config = caching.parse_spec(args.cache, cond_index=0)
    return requested, out_dir, cache_config


def _pipeline(args, cache_config):
    """The digits pipeline with the solver (checked against --steps) and the cache applied: `(pipe, solver)`."""
    from dlm.image.digits_model import load_digits_pipeline

    solver = args.solver or ("ddim" if "ddim" in solver_names() else "diffusers-ddim")
    quiet_diffusers()
    pipe = load_digits_pipeline()
    pipe.scheduler = make_scheduler(pipe, solver)
    fitted = getattr(pipe.scheduler, "fitted_steps", None)  # a learned solver exists for some step counts only
    if fitted is not None and args.steps not in fitted():
        raise ValueError(f"solver {solver!r} has learned tables for --steps {fitted()} only, got --steps {args.steps}")
    need = min_steps(pipe.scheduler)
    if args.steps < need:
        raise ValueError(f"--steps {args.steps} is below the order of solver {solver!r}; use --steps >= {need}")
    if cache_config is not None:
        import caching

        if args.search is None:  # forecast: count its schedule back from the run's last step (ForecastConfig.num_steps)
            cache_config = caching.parse_spec(args.cache, cond_index=0, num_steps=denoiser_steps(pipe.scheduler, args.steps))
        caching.apply(pipe, cache_config)
    return pipe, solver


def _sample(args, pipe, requested):
    """`(images [N, C, H, W], nfe, search summary or None)`: one batched denoising, or a noise search per image."""
    import torch
    from tqdm.auto import tqdm

    gen = torch.Generator().manual_seed(args.seed)
    if args.search is not None:
        return _search(args, pipe, requested, gen)
    bar = tqdm(total=args.steps, desc="dlm image", unit="step", file=sys.stderr,
               disable=not show_progress(args.progress), leave=False)
    out = pipe(digits=torch.tensor(requested), num_inference_steps=args.steps, guidance_scale=args.guidance,
               generator=gen, callback=lambda i, total: bar.update(1))
    bar.close()
    return out.images, out.nfe, None


def _search(args, pipe, requested, gen):
    import torch
    from tqdm.auto import tqdm

    from dlm.image.digits_classifier import digits_verifier
    from samplers.search.noise_search import run_search

    one = pipe.denoiser(0, args.steps, args.guidance).num_steps  # NFE of one full denoising
    budget = args.budget if args.budget is not None else 8 * one
    if budget < one:
        raise ValueError(f"--budget {budget} is below one full denoising ({one} NFE at --steps {args.steps})")
    results = []
    for d in tqdm(requested, desc=f"{args.search} search", unit="image", file=sys.stderr,
                  disable=not show_progress(args.progress), leave=False):
        den = pipe.denoiser(d, args.steps, args.guidance)
        results.append(run_search(args.search, den, digits_verifier(d), budget_nfe=budget, generator=gen))
    images = torch.stack([r.best_sample for r in results]).clamp(-1, 1)
    info = {"method": args.search, "budget_nfe_per_image": budget, "verifier": "digits-cnn",
            "best_scores": [round(r.best_score, 4) for r in results], "nfe_per_image": [r.nfe for r in results]}
    return images, sum(r.nfe for r in results), info


def _write(args, images, requested, solver, out_dir, nfe, search_info) -> dict:
    """Each image, the captioned grid (what the classifier reads), and the run's summary."""
    from dlm.image.digits_classifier import load_digits_classifier
    from dlm.image.digits_model import labeled_grid, to_pil

    predicted = load_digits_classifier("cnn").predict(images).tolist()
    out_dir.mkdir(parents=True, exist_ok=True)
    files = []
    for i, (im, d) in enumerate(zip(to_pil(images, args.scale), requested)):
        path = out_dir / f"digit_{i:03d}_{d}.png"
        im.save(path)
        files.append(str(path))
    grid_path = out_dir / "grid.png"
    title = f"{solver}, {args.steps} steps, guidance {args.guidance:g}" + (f", {args.search} search" if args.search else "")
    captions = [f"asked {d} / got {p}" for d, p in zip(requested, predicted)]
    labeled_grid(images, captions, title, scale=max(args.scale, 12)).save(grid_path)
    return {
        "solver": solver, "cache": args.cache, "steps": args.steps, "guidance": args.guidance, "seed": args.seed,
        "digits": requested, "predicted": predicted,
        "accuracy": sum(int(p == d) for p, d in zip(predicted, requested)) / len(requested),
        "nfe": nfe, "nfe_unit": "model calls (batched)" if search_info is None else "per-image model evaluations",
        "files": files, "grid": str(grid_path), "search": search_info,
    }


def _report(args, summary: dict, out_dir) -> None:
    if args.json:
        print(json.dumps(summary))
        return
    print(f"wrote {len(summary['files'])} images and {summary['grid']} to {out_dir}/")
    print(f"solver {summary['solver']}, {args.steps} steps, guidance {args.guidance}: NFE {summary['nfe']} "
          f"({summary['nfe_unit']})")
    print(f"classifier reads {summary['accuracy']:.0%} of them as the requested digit")
