"""Noise search against budget: the searched verifier next to held-out metrics.

    /work/venv/bin/python scripts/bench_noise_search.py                 # digits + GMM, ~10 min on 1 CPU thread
    /work/venv/bin/python scripts/bench_noise_search.py --quick         # smoke run

Digits: the shipped transformer, DDIM (eta 0) with --steps grid steps and guidance --guidance; one
search per (digit, repeat); verifier = log p(requested digit) under the shipped CNN. Held out: the
MLP classifier (different architecture and seed) -- its accuracy and log-probability -- the
Frechet distance in the MLP's feature space to the real test digits, and within-digit diversity
(mean pairwise L2 between the chosen samples of the same digit).

GMM: the project's exact Gaussian-mixture oracle shaped like 1x8x8 images, DDIM with the same grid;
verifier = exact log-density; held out: sliced Wasserstein distance to true samples and mode
coverage of the set of search winners (one per search).

Budgets are in candidates (full denoisings): NFE = candidates x steps per sample. Writes
``docs/figures/noise_search_<digits|gmm|all>[_<tag>].json`` (folder: --out) and
``docs/figures/noise_search_digits.png``, ``docs/figures/noise_search_gmm.png``.
"""
from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch

from samplers.search.noise_search import SchedulerDenoiser, run_search
from samplers.search.verifiers import gmm_verifier  # noqa: E402
from dlm.image.digits_classifier import digits_verifier

METHODS = ("random", "zero-order", "paths")
ROOT = Path(__file__).resolve().parents[1]


def search_kwargs(method: str) -> dict:
    if method == "zero-order":
        return {"num_neighbors": 4, "lam": 0.95}
    if method == "paths":
        return {"num_branches": 2}
    return {}


def try_search(method, den, verifier, budget, gen):
    try:
        return run_search(method, den, verifier, budget_nfe=budget, generator=gen, **search_kwargs(method))
    except ValueError as err:  # budget below one path
        if "budget" in str(err):
            return None
        raise


def diversity(images: torch.Tensor, labels: torch.Tensor) -> float:
    vals = []
    for d in labels.unique():
        x = images[labels == d].flatten(1)
        if x.shape[0] > 1:
            dist = torch.cdist(x, x)
            n = x.shape[0]
            vals.append((dist.sum() / (n * (n - 1))).item())
    return sum(vals) / len(vals) if vals else float("nan")


def bench_digits(args) -> list[dict]:
    from dlm.image.digits_classifier import load_digits_classifier
    from dlm.image.digits_model import load_digits_pipeline
    from dlm.image.metrics import frechet_distance

    pipe = load_digits_pipeline()
    mlp = load_digits_classifier("mlp")
    verifiers = {d: digits_verifier(d) for d in range(10)}
    rows = []
    for method in METHODS:
        for cands in args.budgets:
            t0 = time.time()
            imgs, labels, vscores, nfes = [], [], [], []
            for rep in range(args.repeats):
                for d in range(10):
                    den = pipe.denoiser(d, args.steps, args.guidance)
                    gen = torch.Generator().manual_seed(1000 * rep + d)
                    res = try_search(method, den, verifiers[d], cands * den.num_steps, gen)
                    if res is None:
                        break
                    imgs.append(res.best_sample)
                    labels.append(d)
                    vscores.append(res.best_score)
                    nfes.append(res.nfe)
                else:
                    continue
                break
            if not imgs:
                rows.append({"bench": "digits", "method": method, "candidates": cands, "feasible": False})
                print(f"digits {method:10s} {cands:3d} cand: budget below one search unit")
                continue
            x, y = torch.stack(imgs), torch.tensor(labels)
            mlp_logp = torch.log_softmax(mlp.logits(x), -1).gather(1, y[:, None])[:, 0]
            row = {"bench": "digits", "method": method, "candidates": cands, "feasible": True,
                   "budget_nfe": cands * args.steps, "nfe_mean": sum(nfes) / len(nfes), "searches": len(labels),
                   "verifier_logp": sum(vscores) / len(vscores),
                   "verifier_accuracy": (torch.tensor(vscores) > math.log(0.5)).float().mean().item(),
                   "heldout_mlp_accuracy": (mlp.predict(x) == y).float().mean().item(),
                   "heldout_mlp_logp": mlp_logp.mean().item(),
                   "heldout_frechet_mlp": frechet_distance(x, classifier=mlp),
                   "diversity_l2": diversity(x, y), "seconds": round(time.time() - t0, 1)}
            rows.append(row)
            print(f"digits {method:10s} {cands:3d} cand: cnn logp {row['verifier_logp']:.3f}  mlp acc "
                  f"{row['heldout_mlp_accuracy']:.3f}  mlp logp {row['heldout_mlp_logp']:.3f}  FD(mlp) "
                  f"{row['heldout_frechet_mlp']:.2f}  div {row['diversity_l2']:.2f}  ({row['seconds']}s)", flush=True)
    return rows


def bench_gmm(args) -> list[dict]:
    from diffusers import DDIMScheduler

    from dlm.oracles.gaussian_mixture import image_oracle

    oracle = image_oracle(num_modes=8, std=args.gmm_std)
    verifier = gmm_verifier(oracle)
    sched = DDIMScheduler(num_train_timesteps=1000, beta_start=1e-4, beta_end=0.02, beta_schedule="linear",
                          clip_sample=False, set_alpha_to_one=True, steps_offset=1)

    def eps_fn(x, t):
        return oracle(x, t).sample.float()

    ref = oracle.reference_metrics(args.gmm_searches)
    rows = [{"bench": "gmm", "method": "exact-samples", "candidates": 0, **ref.to_dict()}]
    print(f"gmm exact samples: logp {ref.mean_log_density:.2f} SW {ref.sliced_wasserstein:.4f} "
          f"coverage {ref.mode_coverage:.2f}")
    for method in METHODS:
        for cands in args.budgets:
            t0 = time.time()
            best, scores = [], []
            for i in range(args.gmm_searches):
                den = SchedulerDenoiser(eps_fn, sched, args.steps, (1, 8, 8))
                res = try_search(method, den, verifier, cands * den.num_steps, torch.Generator().manual_seed(i))
                if res is None:
                    break
                best.append(res.best_sample)
                scores.append(res.best_score)
            if not best:
                rows.append({"bench": "gmm", "method": method, "candidates": cands, "feasible": False})
                continue
            m = oracle.metrics(torch.stack(best))
            row = {"bench": "gmm", "method": method, "candidates": cands, "feasible": True,
                   "budget_nfe": cands * args.steps, "verifier_logp": sum(scores) / len(scores),
                   "heldout_sliced_wasserstein": m.sliced_wasserstein, "heldout_mode_coverage": m.mode_coverage,
                   "searches": len(best), "seconds": round(time.time() - t0, 1)}
            rows.append(row)
            print(f"gmm    {method:10s} {cands:3d} cand: logp {row['verifier_logp']:.2f}  SW "
                  f"{m.sliced_wasserstein:.4f}  coverage {m.mode_coverage:.2f}  ({row['seconds']}s)", flush=True)
    return rows


def plot(rows, out_dir: Path, tag: str = "", cfg: dict | None = None) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    panels = {
        "digits": [("verifier_logp", "searched: CNN log p(digit)"), ("heldout_mlp_logp", "held out: MLP log p(digit)"),
                   ("heldout_frechet_mlp", "held out: Frechet dist. (MLP feats)"),
                   ("diversity_l2", "within-digit diversity (L2)")],
        "gmm": [("verifier_logp", "searched: exact log-density"),
                ("heldout_sliced_wasserstein", "held out: sliced Wasserstein"),
                ("heldout_mode_coverage", "held out: mode coverage")],
    }
    for bench, specs in panels.items():
        if not any(r["bench"] == bench and r.get("feasible") for r in rows):
            continue
        fig, axes = plt.subplots(1, len(specs), figsize=(4.2 * len(specs), 3.4))
        for ax, (key, title) in zip(axes, specs):
            for method, marker in zip(METHODS, "osD"):
                pts = [(r["candidates"], r[key]) for r in rows
                       if r["bench"] == bench and r["method"] == method and r.get("feasible")]
                if pts:
                    ax.plot(*zip(*pts), marker=marker, label=method)
            if bench == "gmm" and key != "verifier_logp":
                ref = next(r for r in rows if r["bench"] == "gmm" and r["method"] == "exact-samples")
                ref_key = {"heldout_sliced_wasserstein": "sliced_wasserstein",
                           "heldout_mode_coverage": "mode_coverage"}[key]
                ax.axhline(ref[ref_key], color="grey", ls="--", lw=1, label="exact samples")
            ax.set_xscale("log", base=2)
            ax.set_xlabel("budget (candidates = NFE / steps)")
            ax.set_title(title, fontsize=10)
            ax.grid(alpha=0.3)
        axes[0].legend(fontsize=8)
        detail = ""
        if cfg:
            detail = f", DDIM {cfg.get('steps')} steps" + (f", guidance {cfg.get('guidance')}" if bench == "digits" else "")
        fig.suptitle(f"noise search on {bench}{detail}{' [' + tag + ']' if tag else ''}", fontsize=11)
        fig.tight_layout()
        path = out_dir / f"noise_search_{bench}{'_' + tag if tag else ''}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(str(path))
    return paths


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--budgets", default="1,4,16,64", help="candidates (full denoisings)")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--guidance", type=float, default=2.0)
    p.add_argument("--repeats", type=int, default=10, help="searches per digit")
    p.add_argument("--gmm-searches", type=int, default=200)
    p.add_argument("--gmm-std", type=float, default=0.1)
    p.add_argument("--only", choices=("digits", "gmm"), default=None)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--replot", type=Path, default=None, help="redraw figures from a JSON this script wrote")
    p.add_argument("--tag", default="", help="suffix for the JSON and figure names (e.g. g1)")
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "figures", help="folder for the JSON")
    p.add_argument("--figures", type=Path, default=ROOT / "docs" / "figures")
    args = p.parse_args()
    args.budgets = [int(b) for b in args.budgets.split(",")]
    if args.replot is not None:
        data = json.loads(args.replot.read_text())
        print(plot(data["rows"], args.figures, data["config"].get("tag", ""), data["config"]))
        return
    if args.quick:
        args.budgets, args.repeats, args.gmm_searches = [1, 4], 1, 10
    torch.set_num_threads(1)
    rows = []
    if args.only in (None, "digits"):
        rows += bench_digits(args)
    if args.only in (None, "gmm"):
        rows += bench_gmm(args)
    args.out.mkdir(parents=True, exist_ok=True)
    args.figures.mkdir(parents=True, exist_ok=True)
    cfg = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    out_json = args.out / f"noise_search_{args.only or 'all'}{'_' + args.tag if args.tag else ''}.json"
    out_json.write_text(json.dumps({"config": cfg, "rows": rows}, indent=1))  # before plotting: keep the numbers
    figs = plot(rows, args.figures, args.tag, cfg)
    out_json.write_text(json.dumps({"config": cfg, "rows": rows, "figures": figs}, indent=1))
    print(f"wrote {out_json} and {', '.join(figs)}")


if __name__ == "__main__":
    main()
