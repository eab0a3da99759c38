"""Solvers on the digits transformer: requested-digit accuracy and Frechet distance against NFE.

    /work/venv/bin/python scripts/bench_digits_solvers.py              # ~10 min on 1 CPU thread
    /work/venv/bin/python scripts/bench_digits_solvers.py --quick

Every solver gets the same initial noises (seeded) and labels (--samples images, cycling 0-9),
guidance --guidance, and the largest step count whose real NFE (counted model calls; CFG halves in
one call) fits each target in --nfe. Solvers: the project's registry (``samplers.solvers``: ddim,
pndm, plms, dpmpp-2m) and diffusers' DDIM, PNDM (skip_prk_steps, i.e. PLMS), DPMSolverMultistep
(dpmsolver++, order 2) and UniPC. Metrics: accuracy under the shipped CNN and under the held-out
MLP; Frechet distance to the real test digits in CNN feature space. References: DDIM with 250 steps,
and real train digits (the floor of the FD at this sample count).

Writes ``docs/figures/digits_solvers.json`` and ``docs/figures/digits_solvers.png``.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
DIFFUSERS = {
    "diffusers-ddim": ("DDIMScheduler", {}),
    "diffusers-pndm": ("PNDMScheduler", {"skip_prk_steps": True}),
    "diffusers-dpm": ("DPMSolverMultistepScheduler", {"algorithm_type": "dpmsolver++", "solver_order": 2}),
    "diffusers-unipc": ("UniPCMultistepScheduler", {}),
}
OURS = ("ddim", "pndm", "plms", "dpmpp-2m")


def make(pipe, name):
    if name in DIFFUSERS:
        import diffusers

        cls, extra = DIFFUSERS[name]
        return getattr(diffusers, cls).from_config(pipe.scheduler.config, **extra)
    from samplers.solvers import solver_from_pipeline

    return solver_from_pipeline(pipe, name)


def nfe_of(pipe, name: str, steps: int) -> int:
    """Model calls for ``steps`` inference steps, read from the scheduler's timestep grid."""
    sched = make(pipe, name)
    sched.set_timesteps(steps)
    return len(sched.timesteps)


def steps_for(pipe, name: str, target: int) -> int | None:
    best = None
    for s in range(1, target + 1):
        try:
            n = nfe_of(pipe, name, s)
        except Exception:
            continue
        if n <= target:
            best = s
    return best


def plot(rows: list[dict], solvers: list[str], guidance: float, samples: int, fig_dir: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ref = next(r for r in rows if str(r["solver"]).startswith("reference"))
    real = next(r for r in rows if r["solver"] == "real-train-digits")
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.6))
    colors = {"ddim": "C0", "pndm": "C1", "plms": "C2", "dpmpp-2m": "C3",
              "diffusers-ddim": "C0", "diffusers-pndm": "C2", "diffusers-dpm": "C3", "diffusers-unipc": "C4"}
    for name in solvers:
        pts = [r for r in rows if r["solver"] == name and "nfe" in r]
        if not pts:
            continue
        ours = name in OURS
        for ax, key in zip(axes, ("accuracy_cnn", "frechet")):
            ax.plot([r["nfe"] for r in pts], [r[key] for r in pts], "-" if ours else "--",
                    marker="o" if ours else "x", ms=6 if ours else 9, color=colors.get(name), alpha=0.9,
                    label=name + (" (ours)" if ours else ""))
    for ax, key, title in zip(axes, ("accuracy_cnn", "frechet"),
                              ("requested-digit accuracy (CNN)", "Frechet distance to test digits (CNN feats)")):
        ax.axhline(ref[key], color="k", lw=1, ls=":", label=ref["solver"])
        ax.axhline(real[key], color="grey", lw=1, ls="-.", label="real train digits")
        ax.set_xscale("log")
        ax.set_xlabel("NFE (model calls)")
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
    axes[1].set_yscale("log")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=5, fontsize=8, frameon=False)
    fig.suptitle(f"digits transformer, guidance {guidance}, {samples} samples "
                 "(solid o: ours, dashed x: diffusers; same colour = same algorithm)", fontsize=10)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    fig_path = fig_dir / "digits_solvers.png"
    fig.savefig(fig_path, dpi=110)
    plt.close(fig)
    return fig_path


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--nfe", default="5,10,20,50")
    p.add_argument("--samples", type=int, default=500)
    p.add_argument("--guidance", type=float, default=3.0)
    p.add_argument("--reference-steps", type=int, default=250)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--sweep-guidance", default=None,
                   help="instead of the NFE sweep: these guidance scales at --sweep-steps for ddim and dpmpp-2m")
    p.add_argument("--sweep-steps", type=int, default=20)
    p.add_argument("--replot", type=Path, default=None, help="redraw the figure from a JSON this script wrote")
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "figures", help="folder for the JSON")
    p.add_argument("--figures", type=Path, default=ROOT / "docs" / "figures")
    args = p.parse_args()
    torch.set_num_threads(1)
    targets = [int(x) for x in args.nfe.split(",")]
    if args.replot is not None:
        data = json.loads(args.replot.read_text())
        solvers = list(dict.fromkeys(r["solver"] for r in data["rows"] if "target_nfe" in r))
        cfg = data["config"]
        print(plot(data["rows"], solvers, cfg["guidance"], cfg["samples"], args.figures))
        return
    if args.quick:
        targets, args.samples, args.reference_steps = [5, 10], 100, 20

    from dlm.image.digits_classifier import digits_split, load_digits_classifier
    from dlm.image.digits_model import load_digits_pipeline
    from dlm.image.metrics import digit_accuracy, frechet_distance

    pipe = load_digits_pipeline()
    mlp = load_digits_classifier("mlp")
    try:
        from samplers.solvers import SOLVERS  # noqa: F401
        solvers = list(OURS) + list(DIFFUSERS)
    except ImportError:
        solvers = list(DIFFUSERS)
    labels = torch.arange(args.samples) % 10
    latents = torch.randn(args.samples, 1, 8, 8, generator=torch.Generator().manual_seed(0))

    def evaluate(name, steps):
        pipe.scheduler = make(pipe, name)
        t0 = time.time()
        out = pipe(digits=labels, num_inference_steps=steps, guidance_scale=args.guidance, latents=latents.clone(),
                   generator=torch.Generator().manual_seed(1))
        return {"solver": name, "steps": steps, "nfe": out.nfe,
                "accuracy_cnn": digit_accuracy(out.images, labels),
                "accuracy_mlp": digit_accuracy(out.images, labels, mlp),
                "frechet": frechet_distance(out.images), "seconds": round(time.time() - t0, 2)}

    if args.sweep_guidance:
        rows = []
        for g in [float(x) for x in args.sweep_guidance.split(",")]:
            args.guidance = g
            for name in ("ddim", "dpmpp-2m"):
                row = {"guidance": g, **evaluate(name, args.sweep_steps)}
                rows.append(row)
                print(json.dumps(row), flush=True)
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "digits_guidance.json").write_text(json.dumps({"samples": args.samples, "rows": rows}, indent=1))
        return

    split = digits_split()
    real = split.train_images[: args.samples]
    rows = [{"solver": "real-train-digits", "nfe": 0, "accuracy_cnn": digit_accuracy(real, split.train_labels[: args.samples]),
             "accuracy_mlp": digit_accuracy(real, split.train_labels[: args.samples], mlp),
             "frechet": frechet_distance(real)}]
    ref = evaluate("diffusers-ddim", args.reference_steps)
    ref["solver"] = f"reference-ddim-{args.reference_steps}"
    rows.append(ref)
    print(json.dumps(rows[0]), json.dumps(ref), sep="\n", flush=True)
    for name in solvers:
        for target in targets:
            steps = steps_for(pipe, name, target)
            if steps is None:
                rows.append({"solver": name, "target_nfe": target, "feasible": False})
                print(f"{name:16s} NFE<={target}: no step count fits")
                continue
            row = {"target_nfe": target, **evaluate(name, steps)}
            rows.append(row)
            print(f"{name:16s} NFE<={target:3d} steps {steps:3d} nfe {row['nfe']:3d}: acc cnn {row['accuracy_cnn']:.3f} "
                  f"mlp {row['accuracy_mlp']:.3f}  FD {row['frechet']:.2f}  ({row['seconds']}s)", flush=True)

    args.out.mkdir(parents=True, exist_ok=True)
    args.figures.mkdir(parents=True, exist_ok=True)
    fig_path = plot(rows, solvers, args.guidance, args.samples, args.figures)
    cfg = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    (args.out / "digits_solvers.json").write_text(json.dumps({"config": cfg, "rows": rows, "figure": str(fig_path)}, indent=1))
    print(f"wrote {args.out / 'digits_solvers.json'} and {fig_path}")


if __name__ == "__main__":
    main()
