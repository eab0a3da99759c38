"""Caching benchmark: speed-up and fidelity of the caching package vs uncached and diffusers' caches.

    python scripts/bench_caching.py --out bench-caching          # CPU, a few minutes

For each model (tiny random 2-level SD UNet, PixArt and SD3 at 32x32 latents; ``unet-sd``, SD 1.5's
4-level layout at a 16x16 latent; the shipped digits model) and
step count (20, 50) it samples once uncached and once per cache, after one warm-up call each (``--repeats`` timed calls), and
reports: CPU time per call (best and median of ``--repeats`` calls; one thread, so not counting
the waits for other processes), best wall time, speed-ups over uncached, PSNR of the final latents against the uncached ones
(peak = the uncached latents' range), and on digits the classifier accuracy. Diffusers' built-in
caches (FirstBlockCache, TaylorSeer) run inside ``model.cache_context("cfg")`` with their state reset
before each call -- what a pipeline that supports them does; where they raise, the error is recorded.
Writes ``caching.json``, ``caching.csv`` and ``caching.png`` to ``--out``.

``--runs K`` repeats the whole measurement K times (each run timing every row against its own
uncached row) and writes ``spread.json``/``spread.md``: per row the median, min and max speed-up over
the runs, and a verdict against the noise, read off all never-skip rows of the same runs (every model
and step count: the same output as uncached, with the cache's hooks attached, so their speed-ups are
what identical work reads on this machine): ``gain`` only when the row's slowest run beats 1.0 and the
fastest never-skip reading, ``loss`` when its fastest run is below 1.0 and the slowest never-skip
reading, else ``noise``.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import csv
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import caching  # noqa: E402
from tests.caching.tiny import sample, tiny_pixart, tiny_sd3, tiny_sd_unet, tiny_unet  # noqa: E402


def tgate_gates(steps: int) -> list:
    """T-GATE's gate steps in the bench: 40% of the steps (the paper's 10 of 25) and an earlier 25%
    (faster: CFG dropped sooner); ours and the tgate package's rows use the same ones."""
    return list(dict.fromkeys((max(2, int(0.4 * steps)), max(2, steps // 4))))


def ours(kind: str, steps: int) -> dict:
    unet = kind.startswith("unet")
    never = caching.DeepCacheConfig(interval=1) if unet else caching.BlockCacheConfig(threshold=0.0)
    out = {"never-skip": never,
           "deepcache:interval=2": caching.DeepCacheConfig(interval=2),
           "deepcache:interval=3": caching.DeepCacheConfig(interval=3)}
    if not unet:
        # last_blocks=1: the rows of docs/caching.md's main table (measured before the default became 0);
        # the default's operating points are in its sweep section (--extra)
        out["block:threshold=0.1,last_blocks=1"] = caching.BlockCacheConfig(threshold=0.1, last_blocks=1,
                                                                            warmup_steps=2, max_cached_steps=3)
        out["block:threshold=0.2,last_blocks=1"] = caching.BlockCacheConfig(threshold=0.2, last_blocks=1,
                                                                            warmup_steps=2, max_cached_steps=5)
        # TaylorSeer-style first-order forecast of the skipped residual (caching.block_cache docstring)
        out["block:threshold=0.15,last_blocks=1,taylor=1"] = caching.BlockCacheConfig(
            threshold=0.15, last_blocks=1, warmup_steps=2, max_cached_steps=5, taylor=1)
        out["deepcache:interval=3,taylor=1"] = caching.DeepCacheConfig(interval=3, taylor=1)
        # per-module forecasts (caching.module_forecast): fixed interval as TaylorSeer, and adaptive
        out["forecast:interval=4"] = caching.ForecastConfig(interval=4)
        out["forecast:threshold=0.2,interval=6"] = caching.ForecastConfig(threshold=0.2, interval=6)
    if kind == "sd3":  # the tiny random SD3's probe residual moves by more than 0.2 every step
        out["block:threshold=0.4,last_blocks=1"] = caching.BlockCacheConfig(threshold=0.4, last_blocks=1,
                                                                            warmup_steps=2, max_cached_steps=5)
    if unet:  # Step Rehash needs a UNet's down/mid/up blocks
        out["rehash:threshold=0.1"] = caching.StepRehashConfig(threshold=0.1, warmup_steps=2, max_reuse=2)
        out["rehash:threshold=0.2"] = caching.StepRehashConfig(threshold=0.2, warmup_steps=2, max_reuse=3)
    if kind != "sd3":
        for g in tgate_gates(steps):
            out[f"tgate:gate_step={g}"] = caching.TGateConfig(gate_step=g, cond_index=0 if kind == "digits" else 1)
    out = {k: v for k, v in out.items() if ONLY is None or k == "never-skip" or k.split(":")[0] in ONLY}
    for spec, cfg in EXTRA.items():  # --extra: operating points named on the command line
        name = spec.split(":")[0]
        if (name == "block" and unet) or (name == "rehash" and not unet) or (name == "tgate" and kind == "sd3"):
            continue  # block needs a transformer's block list, rehash a UNet, T-GATE cross-attention
        out[spec] = cfg
    return out


def diffusers_caches() -> dict:
    """diffusers' caches at their defaults (FirstBlockCache at 0.1, the value its docs use), and with
    --diffusers-sweep a grid of their settings, so that each side's frontier can be compared."""
    from diffusers import FirstBlockCacheConfig, TaylorSeerCacheConfig
    from diffusers.hooks import apply_first_block_cache, apply_taylorseer_cache
    out = {"diffusers FirstBlockCache(0.1)": (apply_first_block_cache, FirstBlockCacheConfig(threshold=0.1)),
           "diffusers TaylorSeer": (apply_taylorseer_cache, TaylorSeerCacheConfig())}
    if DIFFUSERS_SWEEP:
        for th in (0.05, 0.2, 0.3):
            out[f"diffusers FirstBlockCache({th})"] = (apply_first_block_cache, FirstBlockCacheConfig(threshold=th))
        for interval, before, order in ((3, 3, 1), (4, 3, 1), (5, 3, 2), (3, 3, 2)):
            cfg = TaylorSeerCacheConfig(cache_interval=interval, disable_cache_before_step=before, max_order=order)
            out[f"diffusers TaylorSeer(interval={interval},order={order})"] = (apply_taylorseer_cache, cfg)
        # its default identifiers hook only modules named `attn` (none on PixArt, digits or SD UNets,
        # whose are attn1/attn2) and store factors in bfloat16; this row hooks every attention and
        # feed-forward module of the transformer blocks (a UNet's too) in float32, the same coverage
        # as our `forecast` rows
        every = [r"^(.*\.)?(single_)?transformer_blocks\.\d+\.(attn\d?|ff|ff_context)$"]
        for interval in (2, 3, 4, 5):
            cfg = TaylorSeerCacheConfig(cache_interval=interval, cache_identifiers=every,
                                        taylor_factors_dtype=torch.float32)
            out[f"diffusers TaylorSeer(interval={interval},attn+ff,fp32)"] = (apply_taylorseer_cache, cfg)
    return out


def psnr(x: torch.Tensor, ref: torch.Tensor) -> float:
    mse = (x.float() - ref.float()).pow(2).mean().item()
    peak = (ref.max() - ref.min()).item()
    return math.inf if mse == 0 else 10 * math.log10(peak ** 2 / mse)


REPEATS = 3  # set by --repeats
# unet-sd: SD 1.5's layout at width 32 on a 16x16 latent keeps the outer level's attention-to-conv
# cost ratio (tokens / (9 x channels) = 0.9) near SD 1.5's at 512 px (1.4); at 32x32 the toy width
# makes outer-level attention most of the compute and no deep-branch cache could show anything
LATENT_SIZE = {"unet-sd": 16}
DIGIT_REPEATS = 3  # set by --digit-repeats
WITH_DIFFUSERS = True  # unset by --no-diffusers
ONLY = None  # set by --caches: names of our caches to run
EXTRA: dict = {}  # set by --extra: more of our configs, cache spec -> parsed config
DIFFUSERS_SWEEP = False  # set by --diffusers-sweep
PEERS = False  # set by --peers
PAIRED = False  # set by --paired


def timed(fn, repeats: int | None = None):
    """Output and timings of ``repeats`` calls after one warm-up call.

    Returns ``(out, cpu_best, cpu_median, wall_best)``. The process CPU time (``time.process_time``)
    is the primary measure: the benchmark runs on one thread, so CPU time counts this process's work
    only, while wall time on a shared machine also counts the waits for the other processes on the
    cores (it varied by +-30% between identical calls in an earlier run).
    """
    fn()
    cpu, wall = [], []
    for _ in range(repeats or REPEATS):
        t, c = time.perf_counter(), time.process_time()
        out = fn()
        cpu.append(time.process_time() - c)
        wall.append(time.perf_counter() - t)
    return out, min(cpu), statistics.median(cpu), min(wall)


def paired(fn, ref_fn, repeats: int | None = None):
    """``timed`` for a cached call and the uncached one, alternating ``ref, cached`` ``repeats``
    times after a warm-up of each, so that both see the same machine load (--paired).

    Returns ``(out, (cpu_best, cpu_median, wall_best), (ref_cpu_best, ref_cpu_median, ref_wall_best),
    pair_ratio)``: ``pair_ratio`` is the median over the repeats of (uncached CPU time / cached CPU
    time) of the two back-to-back calls, which cancels drifts of the machine's speed slower than a
    pair (the best-of ratios do not: the uncached best can come from a fast minute, the cached best
    from a slow one).
    """
    fn(), ref_fn()
    times: dict = {"row": ([], []), "ref": ([], [])}
    out = None
    for _ in range(repeats or REPEATS):
        for key, f in (("ref", ref_fn), ("row", fn)):
            t, c = time.perf_counter(), time.process_time()
            y = f()
            times[key][0].append(time.process_time() - c)
            times[key][1].append(time.perf_counter() - t)
            out = y if key == "row" else out
    stats = {k: (min(cpu), statistics.median(cpu), min(wall)) for k, (cpu, wall) in times.items()}
    pair_ratio = statistics.median(r / c for r, c in zip(times["ref"][0], times["row"][0]))
    return out, stats["row"], stats["ref"], pair_ratio


def run_model(kind: str, model, steps: int, rows: list) -> None:
    if kind == "digits":
        from dlm.image.metrics import digit_accuracy
        pipe, digits = model, torch.arange(10).repeat(DIGIT_REPEATS)

        def call(net):
            pipe.transformer = net
            return pipe(digits=digits, num_inference_steps=steps, generator=torch.Generator().manual_seed(0)).images

        def acc(x):
            return round(100 * digit_accuracy(x, digits), 1)
        net = pipe.transformer
    else:
        def call(net):
            return sample(net, steps, batch=2, size=LATENT_SIZE.get(kind, 32))

        def acc(x):
            return None
        net = model
    plain = copy.deepcopy(net)  # the uncached twin timed beside every row with --paired
    ref, t0, m0, w0 = timed(lambda: call(plain))
    rows.append(dict(model=kind, steps=steps, cache="uncached", seconds=round(t0, 3), median=round(m0, 3),
                     wall=round(w0, 3), speedup=1.0, median_speedup=1.0, wall_speedup=1.0, psnr=math.inf,
                     accuracy=acc(ref)))

    def measure(name, run, ref_run=None):
        """One row: ``run()`` (a sampling call with a cache attached) timed against uncached: ``ref_run()``
        when the row runs its own sampling loop (the same loop without the cache), else ``call(plain)``."""
        if PAIRED:
            x, (t, m, w), (rt, rm, rw), pair = paired(run, ref_run or (lambda: call(plain)))
        else:
            x, t, m, w = timed(run)
            rt, rm, rw = timed(ref_run)[1:] if ref_run is not None else (t0, m0, w0)
        return dict(model=kind, steps=steps, cache=name, seconds=round(t, 3), median=round(m, 3), wall=round(w, 3),
                    speedup=round(rt / t, 2), median_speedup=round(rm / m, 2), wall_speedup=round(rw / w, 2),
                    psnr=round(psnr(x, ref), 2), accuracy=acc(x),
                    **({"ref_seconds": round(rt, 3), "pair_speedup": round(pair, 2)} if PAIRED else {}))

    try:
        for name, cfg in ours(kind, steps).items():
            caching.apply(net, cfg)
            try:
                rows.append(measure(name, lambda: call(net)))
            finally:
                caching.remove(net)
            print(rows[-1], flush=True)
        for name, (attach, before_call) in peer_caches(kind, steps).items():
            twin = copy.deepcopy(plain)  # the peers' hooks have no clean removal across all of them
            try:
                attach(twin)

                def run(twin=twin, before_call=before_call):
                    with before_call(twin):
                        return call(twin)
                rows.append(measure(name, run))
            except Exception as err:  # recorded: the point is where the peers' caches do not apply
                rows.append(dict(model=kind, steps=steps, cache=name, error=f"{type(err).__name__}: {str(err)[:80]}"))
            print(rows[-1], flush=True)
        for name, (run, ref_run) in (tgate_package_loops(kind, steps, plain) if PEERS else {}).items():
            try:
                rows.append(measure(name, run, ref_run))
            except Exception as err:
                rows.append(dict(model=kind, steps=steps, cache=name, error=f"{type(err).__name__}: {str(err)[:80]}"))
            print(rows[-1], flush=True)
    finally:
        if kind == "digits":
            model.transformer = net


def peer_caches(kind: str, steps: int) -> dict:
    """``{row name: (attach(model), before_call(model) -> context manager)}`` for the field's caches:
    diffusers' (unless --no-diffusers) and, with --peers, the cache-dit package's DBCache on the
    transformers and the DeepCache package on the UNets."""
    out = {}
    if WITH_DIFFUSERS:
        for name, (apply_fn, cfg) in diffusers_caches().items():
            out[name] = ((lambda net, f=apply_fn, c=cfg: f(net, c)), diffusers_call)
        if DIFFUSERS_SWEEP and not kind.startswith("unet"):  # MagCache hooks a transformer's block lists
            out.update(mag_caches(steps))
    if PEERS:  # cache-dit does not support SD UNets; the DeepCache package supports only them
        out.update(deepcache_package_caches(steps) if kind.startswith("unet") else cache_dit_caches(kind, steps))
    return out


def deepcache_package_caches(steps: int) -> dict:
    """The ``DeepCache`` package's ``DeepCacheSDHelper`` (``pip install DeepCache``) on a bare UNet.

    The helper wraps ``pipe.unet``'s blocks and finds the step index by looking the timestep up in
    ``pipe.scheduler.timesteps``, so it gets a stand-in pipeline holding the UNet and the scheduler
    ``tests.caching.tiny.sample`` uses. It reads the timestep with ``.item()`` (a pipeline passes one
    scalar), and ``sample`` passes one per batch row, so the UNet's forward gets the first row's value
    (all rows share it). Rows: its README's setting (interval 3, branch 0) and interval 2."""
    try:
        from DeepCache import DeepCacheSDHelper
    except ImportError:
        print("--peers: DeepCache is not installed (pip install DeepCache); its rows are skipped", flush=True)
        return {}
    from types import SimpleNamespace

    from tests.caching.tiny import ddim_scheduler

    def attach(interval, branch):
        def run(net):
            sched = ddim_scheduler()
            sched.set_timesteps(steps)
            helper = DeepCacheSDHelper(pipe=SimpleNamespace(unet=net, scheduler=sched))
            helper.set_params(cache_interval=interval, cache_branch_id=branch)
            helper.enable()
            wrapped = net.forward

            def one_timestep(sample, timestep, *args, **kwargs):
                return wrapped(sample, timestep.reshape(-1)[0], *args, **kwargs)
            net.forward = one_timestep
        return run

    return {f"DeepCache package(interval={i},branch={b})": (attach(i, b), lambda net: contextlib.nullcontext())
            for i, b in ((3, 0), (2, 0))}


def tgate_package_loops(kind: str, steps: int, plain) -> dict:
    """The ``tgate`` package (``pip install tgate``) on the UNets: ``{row name: (run, ref_run)}``.

    Its T-GATE is a sampling loop of its own (``pipe.tgate(...)`` on a ``StableDiffusionPipeline``), so
    both calls run a stand-in ``StableDiffusionPipeline`` holding only the UNet and the DDIM scheduler
    ``tests.caching.tiny.sample`` uses (prompt embeddings passed in, latents out: no text encoder, no
    VAE), from ``sample``'s inputs; ``ref_run`` is the same pipeline's plain call on the uncached twin,
    so the speed-up compares like with like (that call equals ``sample``'s output exactly). Rows: the
    gates of our T-GATE rows with cross-attention caching only (``sp_interval=fi_interval=1``), and the
    package's v2 defaults (``sp_interval=5, fi_interval=1, warm_up=2``) at the first gate."""
    if not kind.startswith("unet"):
        return {}
    try:
        from tgate import TgateSDLoader
    except ImportError:
        print("--peers: tgate is not installed (pip install tgate); its rows are skipped", flush=True)
        return {}
    from diffusers import StableDiffusionPipeline

    from tests.caching.tiny import ddim_scheduler, sample_inputs

    size = LATENT_SIZE.get(kind, 32)
    cond, uncond, noise = sample_inputs(2, size, torch.Generator().manual_seed(0))
    kw = dict(prompt_embeds=cond, negative_prompt_embeds=uncond, height=8 * size, width=8 * size,
              num_inference_steps=steps, guidance_scale=4.0, output_type="latent")

    def pipeline(net):
        pipe = StableDiffusionPipeline(vae=None, text_encoder=None, tokenizer=None, unet=net, scheduler=ddim_scheduler(),
                                       safety_checker=None, feature_extractor=None, image_encoder=None,
                                       requires_safety_checker=False)
        pipe.set_progress_bar_config(disable=True)
        return pipe

    base = pipeline(plain)

    def ref_run():
        with torch.no_grad():
            return base(latents=noise.clone(), **kw).images

    gated = TgateSDLoader(pipeline(copy.deepcopy(plain)))
    gates = tgate_gates(steps)
    settings = [(g, 1, 1) for g in gates] + [(gates[0], 5, 1)]
    out = {}
    for gate, sp, fi in settings:
        name = f"tgate package(gate_step={gate}" + (",sp=5,fi=1,warm_up=2)" if sp > 1 else ")")
        out[name] = ((lambda g=gate, s=sp, f=fi: gated.tgate(latents=noise.clone(), gate_step=g, sp_interval=s,
                                                             fi_interval=f, warm_up=2, **kw).images), ref_run)
    return out


@contextlib.contextmanager
def diffusers_call(net):
    """What a pipeline that supports diffusers' caches does around a call: fresh state, a cache context."""
    from diffusers.hooks import HookRegistry
    from diffusers.hooks.hooks import CacheContext, _set_cache_context

    HookRegistry.check_if_exists_or_initialize(net).reset_stateful_hooks()
    _set_cache_context(net, CacheContext("cfg"))
    try:
        yield
    finally:
        _set_cache_context(net, None)


def mag_caches(steps: int, thresholds=(0.06, 0.12, 0.24)) -> dict:
    """Diffusers' MagCache at its default threshold (0.06) and two faster ones, each calibrated on
    the model the way its docs say: one call with ``calibrate=True`` (nothing skipped; it measures
    the magnitude ratio of consecutive steps' residuals), whose ratios then become ``mag_ratios``.
    The calibration is the row's untimed warm-up call (``timed``/``paired`` make one first) on the
    same inputs; later calls skip. Retention (no skipping in the first 20% of steps) and
    ``max_skip_steps=3`` are its defaults."""
    from diffusers import MagCacheConfig
    from diffusers.hooks import apply_mag_cache
    from diffusers.hooks import mag_cache as mc

    def rows(threshold):
        cfg = MagCacheConfig(calibrate=True, num_inference_steps=steps, threshold=threshold)

        @contextlib.contextmanager
        def before_call(net):
            with diffusers_call(net):
                if not cfg.calibrate:
                    yield
                    return
                ratios, original = [], mc.MagCacheBlockHook._perform_calibration_step

                def record(hook, state, residual):
                    original(hook, state, residual)
                    ratios.append(state.calibration_ratios[-1])
                mc.MagCacheBlockHook._perform_calibration_step = record
                try:
                    yield
                finally:
                    mc.MagCacheBlockHook._perform_calibration_step = original
                cfg.calibrate, cfg.mag_ratios = False, torch.tensor(ratios)  # the hooks share this config
        return (lambda net: apply_mag_cache(net, cfg)), before_call
    return {f"diffusers MagCache({th})": rows(th) for th in thresholds}


def cache_dit_caches(kind: str, steps: int) -> dict:
    """cache-dit's DBCache (``pip install cache-dit``), transformer-only use: ``enable_cache`` on the
    transformer (SD3 through a ``BlockAdapter``, its joint blocks return ``(encoder, hidden)``), and
    ``refresh_context`` before every call. One first and no last compute block (``F1B0``: its default
    ``F8`` is more than these 4-8 block models have). Its TaylorSeer calibrator fails on SD3 (a missing
    state, cache-dit 1.5.3), so SD3 rows run without it."""
    try:
        import cache_dit
    except ImportError:
        print("--peers: cache-dit is not installed (pip install cache-dit); its rows are skipped", flush=True)
        return {}
    from cache_dit import BlockAdapter, DBCacheConfig, ForwardPattern, TaylorSeerCalibratorConfig

    def attach(threshold, taylor):
        def run(net):
            target = net if kind != "sd3" else BlockAdapter(transformer=net, blocks=net.transformer_blocks,
                                                            forward_pattern=ForwardPattern.Pattern_1)
            cache_dit.enable_cache(target, cache_config=DBCacheConfig(
                Fn_compute_blocks=1, Bn_compute_blocks=0, residual_diff_threshold=threshold,
                num_inference_steps=steps),
                calibrator_config=TaylorSeerCalibratorConfig(taylorseer_order=1) if taylor else None)
        return run

    @contextlib.contextmanager
    def refresh(net):
        cache_dit.refresh_context(net, num_inference_steps=steps)
        yield

    grid = [(0.08, False), (0.2, False), (0.5, False)] if kind == "sd3" else \
        [(0.08, False), (0.12, True), (0.2, True), (0.3, True)]
    return {f"cache-dit DBCache({th}{',TaylorSeer' if taylor else ''})": (attach(th, taylor), refresh)
            for th, taylor in grid}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="bench-caching")
    ap.add_argument("--steps", default="20,50")
    ap.add_argument("--models", default="digits,pixart,unet,unet-sd,sd3")
    ap.add_argument("--repeats", type=int, default=3, help="timed calls per row after the warm-up (best and median)")
    ap.add_argument("--digit-repeats", type=int, default=3, help="digits model: samples per digit class")
    ap.add_argument("--no-diffusers", action="store_true", help="skip diffusers' own caches (peers)")
    ap.add_argument("--caches", default=None,
                    help=f"comma-separated subset of our caches to run ({', '.join(caching.CACHES)}), or none (only "
                         "--extra); default all")
    ap.add_argument("--extra", default="",
                    help="more of our operating points, ';'-separated cache specs as `dlm image --cache` takes "
                         "them, e.g. 'block:threshold=0.2,last_blocks=0,taylor=1;deepcache:interval=4'")
    ap.add_argument("--diffusers-sweep", action="store_true",
                    help="also run diffusers' FirstBlockCache at thresholds 0.05/0.2/0.3 and TaylorSeer at "
                         "several intervals and orders (their frontier, not just their defaults)")
    ap.add_argument("--peers", action="store_true",
                    help="also run the peer packages where they are installed: cache-dit's DBCache (with its "
                         "TaylorSeer calibrator where it works) on the transformers (pip install cache-dit), "
                         "the DeepCache and tgate packages on the UNets (pip install DeepCache tgate)")
    ap.add_argument("--paired", action="store_true",
                    help="time an uncached call beside every cached one (alternating) and take each row's "
                         "speed-up against its own uncached calls: ratios robust to load that drifts during "
                         "the run (twice the time)")
    ap.add_argument("--runs", type=int, default=1,
                    help="repeat the whole measurement this many times and report each row's spread of speed-ups "
                         "over the runs against the never-skip rows' (spread.json, spread.md)")
    args = ap.parse_args(argv)
    if args.runs < 1:
        ap.error("--runs must be >= 1")
    global REPEATS, DIGIT_REPEATS, WITH_DIFFUSERS, ONLY, EXTRA, DIFFUSERS_SWEEP, PEERS, PAIRED
    PEERS, PAIRED = args.peers, args.paired
    try:
        EXTRA = {s.strip(): caching.parse_spec(s.strip()) for s in args.extra.split(";") if s.strip()}
    except ValueError as err:
        ap.error(f"--extra: {err}")
    DIFFUSERS_SWEEP = args.diffusers_sweep
    if args.repeats < 1 or args.digit_repeats < 1:
        ap.error("--repeats and --digit-repeats must be >= 1")
    REPEATS, DIGIT_REPEATS, WITH_DIFFUSERS = args.repeats, args.digit_repeats, not args.no_diffusers
    if args.caches is not None:
        ONLY = set() if args.caches == "none" else set(args.caches.split(","))  # none: only --extra
        if not ONLY <= set(caching.CACHES):
            ap.error(f"--caches: unknown {sorted(ONLY - set(caching.CACHES))}; choose from {', '.join(caching.CACHES)}")
    torch.set_num_threads(1)
    builders = {"unet": lambda: tiny_unet(width=32), "unet-sd": lambda: tiny_sd_unet(width=32), "pixart": lambda: tiny_pixart(layers=8, heads=4, head_dim=32),
                "sd3": lambda: tiny_sd3(layers=8, heads=4, head_dim=32, max_latent=32)}
    rows: list = []
    models = {}
    for kind in args.models.split(","):
        if kind == "digits":
            from dlm.image.digits_model import load_digits_pipeline
            models[kind] = load_digits_pipeline()
        else:
            models[kind] = builders[kind]()
    for run in range(args.runs):
        for kind, model in models.items():
            for steps in (int(s) for s in args.steps.split(",")):
                start = len(rows)
                run_model(kind, model, steps, rows)
                for r in rows[start:]:
                    r["run"] = run
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.runs > 1:
        table = spread(rows)
        (out / "spread.json").write_text(json.dumps(table, indent=1))
        (out / "spread.md").write_text(spread_markdown(table))
        print(spread_markdown(table), flush=True)
    (out / "caching.json").write_text(json.dumps(rows, indent=1))
    keys = ["run", "model", "steps", "cache", "seconds", "median", "wall", "speedup", "median_speedup", "wall_speedup", "psnr",
            "accuracy", "ref_seconds", "pair_speedup", "error"]
    with open(out / "caching.csv", "w", newline="") as f:
        w = csv.DictWriter(f, keys)
        w.writeheader()
        w.writerows(rows)
    plot(rows, out / "caching.png")
    summary = head_to_head([r for r in rows if r.get("run", 0) == 0])  # rows of one run against each other
    (out / "head_to_head.json").write_text(json.dumps(summary, indent=1))
    for r in summary:
        print(r, flush=True)
    return 0


def spread(rows) -> list:
    """Per (model, steps, cache) over the runs of ``--runs``: the speed-ups (pair medians under --paired),
    their median, min and max, PSNR and accuracy of the first run, and a verdict against the noise band
    of identical output: the min and max of every never-skip row's speed-up in ``rows`` (all models and
    step counts: pooled, since three runs of one row say little about the spread). ``gain``: the row's
    min is above both 1.0 and the band's max; ``loss``: its max is below both 1.0 and the band's min;
    else ``noise``. A row that raised in any run keeps its error."""
    def speed(r):
        return r.get("pair_speedup", r["speedup"])
    groups: dict = {}
    for r in rows:
        groups.setdefault((r["model"], r["steps"], r["cache"]), []).append(r)
    band = [speed(r) for r in rows if r["cache"] == "never-skip" and "error" not in r]
    out = []
    for (model, steps, cache), rs in groups.items():
        errors = [r["error"] for r in rs if "error" in r]
        if errors:
            out.append(dict(model=model, steps=steps, cache=cache, error=errors[0]))
            continue
        ups = [speed(r) for r in rs]
        verdict = None
        if cache not in ("uncached", "never-skip") and band:
            verdict = ("gain" if min(ups) > max(1.0, max(band)) else
                       "loss" if max(ups) < min(1.0, min(band)) else "noise")
        out.append(dict(model=model, steps=steps, cache=cache, runs=len(rs), speedups=ups,
                        median=round(statistics.median(ups), 2), min=min(ups), max=max(ups),
                        seconds=round(statistics.median(r["seconds"] for r in rs), 3), psnr=rs[0]["psnr"],
                        accuracy=rs[0]["accuracy"], verdict=verdict))
    return out


def spread_markdown(table) -> str:
    """``spread`` as the markdown table docs/caching.md shows."""
    lines = ["| model | steps | cache | CPU s / call (median) | speed-up median (min-max over runs) | verdict | PSNR dB | digits acc % |",
             "|---|---|---|---|---|---|---|---|"]
    for r in table:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['steps']} | {r['cache']} | error: `{r['error'][:60]}` | | | | |")
            continue
        psnr = "identical" if r["psnr"] == math.inf else r["psnr"]
        acc = "" if r["accuracy"] is None else r["accuracy"]
        lines.append(f"| {r['model']} | {r['steps']} | {r['cache']} | {r['seconds']} | {r['median']:.2f}x "
                     f"({r['min']:.2f}-{r['max']:.2f}) | {r['verdict'] or ''} | {psnr} | {acc} |")
    return "\n".join(lines) + "\n"


def is_peer(cache: str) -> bool:
    """A row of the field's code (diffusers' caches, cache-dit, the DeepCache and tgate packages), not of ours."""
    return cache.startswith(("diffusers", "cache-dit", "DeepCache package", "tgate package"))


def head_to_head(rows) -> list:
    """For each peer row (diffusers, cache-dit) that skipped something: our fastest row on the same model and step
    count, in the same run, that skipped something with PSNR at least as high (equal or better
    fidelity), and the speed ratio ours / theirs. Speed-ups are the back-to-back pair medians under
    --paired (``pair_speedup``), else the best-of ratios."""
    def speed(r):
        return r.get("pair_speedup", r["speedup"])
    out = []
    done = [r for r in rows if "psnr" in r and r["cache"] not in ("uncached", "never-skip")]
    for d in (r for r in done if is_peer(r["cache"]) and math.isfinite(r["psnr"])):
        rivals = [r for r in done if not is_peer(r["cache"]) and r["model"] == d["model"]
                  and r["steps"] == d["steps"] and d["psnr"] <= r["psnr"] < math.inf]  # inf: skipped nothing
        best = max(rivals, key=speed, default=None)
        out.append(dict(model=d["model"], steps=d["steps"], theirs=d["cache"], their_speedup=speed(d),
                        their_psnr=d["psnr"], ours=best and best["cache"], our_speedup=best and speed(best),
                        our_psnr=best and best["psnr"],
                        ratio=best and round(speed(best) / speed(d), 2)))
    return out


def plot(rows, path) -> None:
    """One panel per model: speed-up over uncached vs PSNR, ours as squares, the peers' as circles,
    colour by step count; never-skip rows and rows that skipped nothing (PSNR inf) are left out."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    ok = [r for r in rows if "psnr" in r and math.isfinite(r["psnr"])]
    models = list(dict.fromkeys(r["model"] for r in ok))
    if not models:
        return
    cols = min(3, len(models))
    rows_n = -(-len(models) // cols)
    fig, axes = plt.subplots(rows_n, cols, figsize=(4.6 * cols, 3.8 * rows_n), squeeze=False)
    colours = {20: "tab:blue", 50: "tab:orange"}
    for ax, model in zip(axes.flat, models):
        for r in (r for r in ok if r["model"] == model):
            ours = not is_peer(r["cache"])
            ax.scatter(r["psnr"], r.get("pair_speedup", r["speedup"]), marker="s" if ours else "o", s=22,
                       color=colours.get(r["steps"], "tab:gray"), edgecolor="k" if not ours else None)
            label = r["cache"].replace("diffusers ", "d:").replace("cache-dit ", "cd:").replace("threshold=", "").replace("interval=", "")
            ax.annotate(f"{label}", (r["psnr"], r.get("pair_speedup", r["speedup"])), fontsize=5, xytext=(3, 2), textcoords="offset points")
        ax.set_title(model, fontsize=9)
        ax.set_xlabel("PSNR vs uncached (dB)", fontsize=8)
        ax.set_ylabel("speed-up (CPU time)", fontsize=8)
        ax.axhline(1.0, color="gray", lw=0.5)
    for ax in list(axes.flat)[len(models):]:
        ax.axis("off")
    handles = [plt.Line2D([], [], marker="s", ls="", color=colours[20], label="ours, 20 steps"),
               plt.Line2D([], [], marker="s", ls="", color=colours[50], label="ours, 50 steps"),
               plt.Line2D([], [], marker="o", ls="", color="w", markeredgecolor="k", label="the field's caches")]
    fig.legend(handles=handles, loc="lower center", ncol=3, fontsize=8)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    fig.savefig(path, dpi=130)


if __name__ == "__main__":
    raise SystemExit(main())
