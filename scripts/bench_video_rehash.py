"""Step Rehash on a video UNet: time and fidelity of a DDIM loop with and without deep-branch reuse.

    OMP_NUM_THREADS=1 python scripts/bench_video_rehash.py --frames 16 --size 32 --steps 20

Tiny random-weight AnimateDiff ``UNetMotionModel`` (tests/video/video_tiny.py), batch 1, DDIM with
Stable Diffusion's beta schedule. Configurations, each after one warm-up call, best of ``--reps``:

- ``uncached``: the plain UNet;
- ``rehash:threshold=T``: ``caching.StepRehashConfig(threshold=T)`` (Zhan et al., ECCV 2024, Step
  Rehash: the deep branch's outputs of the last computed step are reused while the probe -- the
  first down block's output -- moves by less than T in relative L1);
- ``streamline``: ``video.streamline(unet, slices, temporal_slices)``, exact slicing alone;
- ``streamline+rehash``: ``video.streamline(unet, slices, temporal_slices, rehash=...)``, the same
  reuse on the sliced model.

Reported: CPU seconds per call (the process's own time: the machine is shared), speed-up over
uncached, steps rehashed, max abs difference and PSNR of the final latents against uncached (peak =
the uncached latents' range). Random weights: the numbers show the mechanism's cost and fidelity, not
perceptual quality of a trained model.

Noise: every run also times the uncached loop a second time (``uncached again``: identical work, so its
speed-up is the timing noise). ``--runs K`` repeats the whole measurement K times and prints each
configuration's median and min-max speed-up over the runs with a verdict against the ``uncached again``
rows: ``gain`` only when its slowest run beats 1.0 and their fastest, ``loss`` when its fastest is below
1.0 and their slowest, else ``noise``.
"""

import argparse
import json
import math
import os
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "video"))


def psnr(x: torch.Tensor, ref: torch.Tensor) -> float:
    mse = (x - ref).pow(2).mean().item()
    peak = (ref.max() - ref.min()).item()
    return math.inf if mse == 0 else 10 * math.log10(peak ** 2 / mse)


@torch.no_grad()
def denoise(unet, latents, ehs, steps: int) -> torch.Tensor:
    from diffusers import DDIMScheduler

    sched = DDIMScheduler(beta_schedule="scaled_linear", beta_start=0.00085, beta_end=0.012, clip_sample=False,
                          set_alpha_to_one=False, steps_offset=1)
    sched.set_timesteps(steps)
    x = latents
    for t in sched.timesteps:
        x = sched.step(unet(x, t, ehs).sample, t, x).prev_sample
    return x


def timed(fn, reps: int):
    """Output and best CPU seconds of ``reps`` calls after one warm-up call."""
    fn()
    best = math.inf
    for _ in range(reps):
        c = time.process_time()
        out = fn()
        best = min(best, time.process_time() - c)
    return out, best


NOISE_ROW = "uncached again"


def verdicts(rows: list) -> list:
    """Per configuration over the runs (rows carry ``run``): speed-ups, their median / min / max, and the
    verdict against the ``uncached again`` rows' band (see the module docstring)."""
    import statistics

    by_config: dict = {}
    for r in rows:
        by_config.setdefault(r["config"], []).append(r)
    band = [r["speedup"] for r in by_config.get(NOISE_ROW, [])]
    out = []
    for config, rs in by_config.items():
        ups = [r["speedup"] for r in rs]
        verdict = None
        if config not in ("uncached", NOISE_ROW) and band:
            verdict = ("gain" if min(ups) > max(1.0, max(band)) else
                       "loss" if max(ups) < min(1.0, min(band)) else "noise")
        out.append(dict(config=config, runs=len(rs), speedups=ups, median=round(statistics.median(ups), 2),
                        min=min(ups), max=max(ups), cpu_s=round(statistics.median(r["cpu_s"] for r in rs), 3),
                        rehashed=rs[0]["rehashed"], max_abs=rs[0]["max_abs"], psnr=rs[0]["psnr"], verdict=verdict))
    return out


def measure(unet, run, a, thresholds) -> list:
    """One run: every configuration timed (after a warm-up, best of ``--reps``) against its uncached loop."""
    import caching
    import video
    from caching import StepRehashConfig

    ref, t0 = timed(run, a.reps)
    rows = [dict(config="uncached", cpu_s=round(t0, 3), speedup=1.0, rehashed=0, max_abs=0.0, psnr=math.inf)]
    print(rows[-1], flush=True)
    again, t = timed(run, a.reps)  # identical work: its speed-up is the timing noise
    rows.append(dict(config=NOISE_ROW, cpu_s=round(t, 3), speedup=round(t0 / t, 2), rehashed=0,
                     max_abs=float(f"{(again - ref).abs().max().item():.3g}"), psnr=round(psnr(again, ref), 2)))
    print(rows[-1], flush=True)
    video.streamline(unet, slices=a.slices or a.frames, temporal_slices=a.tslices)
    try:
        out, t = timed(run, a.reps)
    finally:
        video.unstreamline(unet)
    rows.append(dict(config="streamline", cpu_s=round(t, 3), speedup=round(t0 / t, 2), rehashed=0,
                     max_abs=float(f"{(out - ref).abs().max().item():.3g}"), psnr=round(psnr(out, ref), 2)))
    print(rows[-1], flush=True)
    for th in thresholds:
        cfg = StepRehashConfig(threshold=th, max_reuse=a.max_reuse)
        for sliced in (False, True):
            if sliced:
                video.streamline(unet, slices=a.slices or a.frames, temporal_slices=a.tslices, rehash=cfg)
                tracker = video.rehash_tracker(unet)
            else:
                tracker = caching.apply(unet, cfg)
            try:
                out, t = timed(run, a.reps)
            finally:
                video.unstreamline(unet) if sliced else caching.remove(unet)
            calls = tracker.counters["runs"]
            rows.append(dict(config=("streamline+" if sliced else "") + f"rehash:threshold={th}", cpu_s=round(t, 3),
                             speedup=round(t0 / t, 2), rehashed=tracker.counters["steps_rehashed"] // calls,
                             max_abs=float(f"{(out - ref).abs().max().item():.3g}"), psnr=round(psnr(out, ref), 2)))
            print(rows[-1], flush=True)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--frames", type=int, default=16)
    ap.add_argument("--size", type=int, default=32, help="latent height = width")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--thresholds", default="0.05,0.1,0.2", help="comma-separated rehash thresholds")
    ap.add_argument("--max-reuse", type=int, default=2)
    ap.add_argument("--slices", type=int, default=None, help="batch x frames slices (default: frames)")
    ap.add_argument("--tslices", type=int, default=4)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--runs", type=int, default=1, help="repeat the whole measurement; report the spread over runs")
    ap.add_argument("--out", default=None, help="write the rows as JSON here")
    a = ap.parse_args(argv)
    try:
        thresholds = [float(t) for t in a.thresholds.split(",")]
    except ValueError:
        sys.exit(f"error: --thresholds must be comma-separated numbers, got {a.thresholds!r}")
    if a.out and os.path.isfile(os.path.dirname(os.path.abspath(a.out))):
        sys.exit(f"error: --out {a.out}: its folder is a file")
    if a.runs < 1:
        sys.exit("error: --runs must be >= 1")
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))

    from video_tiny import motion_inputs, tiny_motion_unet

    torch.manual_seed(0)
    unet = tiny_motion_unet()
    latents, _, ehs = motion_inputs(batch=1, frames=a.frames, size=a.size)

    def run():
        return denoise(unet, latents, ehs, a.steps)

    rows = []
    for run_index in range(a.runs):
        rows += [dict(r, run=run_index) for r in measure(unet, run, a, thresholds)]
    if a.runs == 1:
        print(f"\n| config | CPU s / call | speed-up | steps rehashed of {a.steps} | max abs diff | PSNR dB |")
        print("|---|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['config']} | {r['cpu_s']} | {r['speedup']}x | {r['rehashed']} | {r['max_abs']} | {r['psnr']} |")
    else:
        print(f"\n| config | CPU s / call (median) | speed-up median (min-max over {a.runs} runs) | verdict | "
              f"steps rehashed of {a.steps} | max abs diff | PSNR dB |")
        print("|---|---|---|---|---|---|---|")
        for r in verdicts(rows):
            print(f"| {r['config']} | {r['cpu_s']} | {r['median']:.2f}x ({r['min']:.2f}-{r['max']:.2f}) | "
                  f"{r['verdict'] or ''} | {r['rehashed']} | {r['max_abs']} | {r['psnr']} |")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
