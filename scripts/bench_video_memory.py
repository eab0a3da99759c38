"""Peak activation memory and time of one denoising step (or VAE decode): unsliced, streamlined, and
diffusers' own memory options, on the same model in the same run.

Each configuration runs in its own subprocess. Memory: Linux peak resident set size (VmHWM) of
that subprocess, reset via /proc/self/clear_refs after the model and inputs exist and ``--warmup``
forwards (default 1) have run, minus the resident size at that moment -> peak activation memory of
the UNet forward (the warm-up keeps lazy imports and one-time kernel set-up out of it). Time: best of --reps
forwards in CPU seconds of the process (``time.process_time``, one thread: on a shared machine the
wall clock also counts other processes; ``wall_s`` is reported beside it). Output equality: max abs
difference of every run's output vs the unsliced one.

Allocator (``--allocator``, default ``live``): with glibc's default policy, memory freed by the
unsliced run's large temporaries is kept in the heap and counted in its peak RSS, which overstated
the ratio (AnimateDiff at 48x48: 3.66x with the default policy, 2.36x live). ``live`` sets
``MALLOC_MMAP_THRESHOLD_=65536`` in the child so that every tensor over 64 KiB is its own mapping,
returned to the OS when freed: peak RSS then tracks the peak of live tensor memory.

    OMP_NUM_THREADS=1 python scripts/bench_video_memory.py --frames 16 --size 32
    OMP_NUM_THREADS=1 python scripts/bench_video_memory.py --model svd --frames 16 --size 48
    OMP_NUM_THREADS=1 python scripts/bench_video_memory.py --model latte --frames 16 --size 32

    OMP_NUM_THREADS=1 python scripts/bench_video_memory.py --model wan --frames 16 --size 32 --slices 32 --head-slices 2
    OMP_NUM_THREADS=1 python scripts/bench_video_memory.py --model hunyuan-vae --frames 16 --size 32

Every run measures, in the same invocation and on the same model: ``unsliced`` (diffusers' default
forward), ``streamlined`` (``video.streamline``) and each of diffusers' own memory options that
applies to the model (``--options``, default: all that apply): ``forward_chunking``
(``enable_forward_chunking(chunk_size=1)``, UNets that offer it), ``backend:_native_math``
(``set_attention_backend``: attention through the math kernel, which materialises the scores; the
default ``native`` SDPA already runs a flash kernel on CPU), ``vae_tiling`` / ``vae_framewise`` for
the causal video VAEs (``--model wan-vae / cogvideox-vae / hunyuan-vae``: diffusers' decode modes
only; ``unsliced`` is the exact reference: diffusers' decode for Wan and CogVideoX, the whole clip at
once for HunyuanVideo). VAE slicing splits the batch and does nothing at batch 1.

--model animatediff: a tiny random UNetMotionModel; --model svd: a tiny random
UNetSpatioTemporalConditionModel (Stable Video Diffusion's UNet); --model latte: a tiny random
LatteTransformer3DModel (video transformer, patch size 2); --model svd-vae: a tiny random
AutoencoderKLTemporalDecoder (SVD's VAE, channels 32/64) decoding the whole clip, unsliced vs
``video.vae.decode_sliced`` (one pass, sliced operators; --size is the latent size, pixels 2x);
--model wan / cogvideox / hunyuan: tiny random full-attention video DiTs (WanTransformer3DModel,
CogVideoXTransformer3DModel, HunyuanVideoTransformer3DModel; 12 heads x --head-dim (16: 192 wide), 2 blocks
(HunyuanVideo: 1 dual-stream + 1 single-stream), patch 2, 7 text tokens), ``--slices`` token spans.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _kb(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1])
    raise RuntimeError(field)


DITS = ("wan", "cogvideox", "hunyuan")
OPTIONS = {"animatediff": ("forward_chunking",), "svd": ("forward_chunking",), "latte": (), "svd-vae": (),
           "wan": ("backend:_native_math",), "cogvideox": (), "hunyuan": ("backend:_native_math",),
           "wan-vae": (), "cogvideox-vae": ("vae_tiling",), "hunyuan-vae": ("vae_framewise", "vae_tiling")}
CAUSAL_VAES = ("wan-vae", "cogvideox-vae", "hunyuan-vae")
# wan-vae has no vae_tiling entry: Wan's tiled decode returned a wrongly sized video (124 px wide for
# 64) with this tiny 2x-compression VAE, so it cannot be compared at equal output here.
NO_OURS = CAUSAL_VAES  # diffusers' own decode modes only (see docs/video.md: what is exact)


def _causal_vae(args):
    """A tiny random causal video VAE decoding 16+ latent frames; 'unsliced' is the exact reference:
    diffusers' decode for Wan (frame by frame) and CogVideoX (frame batches), the whole clip at once
    for HunyuanVideo (its default framewise decode blends overlapping chunks)."""
    import torch
    from video_tiny import tiny_cogvideox_vae, tiny_hunyuan_vae, tiny_wan_vae

    vae = {"wan-vae": tiny_wan_vae, "cogvideox-vae": tiny_cogvideox_vae, "hunyuan-vae": tiny_hunyuan_vae}[args.model]()
    z = torch.randn(1, 4, args.frames, args.size, args.size, generator=torch.Generator().manual_seed(1))
    if args.model == "hunyuan-vae":
        vae.use_framewise_decoding = args.variant == "vae_framewise"
    if args.variant == "vae_tiling":  # tiles of half the decoded image overlapping by half a tile
        px = args.size * (4 if args.model == "hunyuan-vae" else 2)
        if args.model == "cogvideox-vae":
            vae.enable_tiling(tile_sample_min_height=px // 2, tile_sample_min_width=px // 2,
                              tile_overlap_factor_height=0.5, tile_overlap_factor_width=0.5)
        else:
            vae.enable_tiling(tile_sample_min_height=px // 2, tile_sample_min_width=px // 2,
                              tile_sample_stride_height=px // 4, tile_sample_stride_width=px // 4)
    return vae, lambda: vae.decode(z).sample


def _dit(args):
    """A tiny random full-attention video DiT and its forward on 16+ frames (``video_tiny`` builders)."""
    from video_tiny import (cogvideox_inputs, hunyuan_inputs, tiny_cogvideox, tiny_hunyuan, tiny_wan,
                            wan_inputs)

    size = dict(frames=args.frames, size=args.size)
    hd = args.head_dim
    if args.model == "wan":
        m = tiny_wan(heads=12, head_dim=hd, layers=2)
        x, t, ehs = wan_inputs(**size)
        return m, lambda: m(x, t, ehs).sample
    if args.model == "cogvideox":
        m = tiny_cogvideox(heads=12, head_dim=hd, layers=2)
        x, ehs, t, rope = cogvideox_inputs(head_dim=hd, **size)
        return m, lambda: m(x, ehs, t, image_rotary_emb=rope).sample
    m = tiny_hunyuan(heads=12, head_dim=hd, layers=1, single_layers=1)
    x, t, ehs, mask, pooled = hunyuan_inputs(**size)
    return m, lambda: m(x, t, ehs, mask, pooled).sample


def child(args):
    import time

    import torch

    torch.set_num_threads(1)
    sys.path.insert(0, os.path.join(ROOT, "tests", "video"))
    sys.path.insert(0, ROOT)
    from video_tiny import latte_inputs, motion_inputs, svd_inputs, tiny_latte, tiny_motion_unet, tiny_svd_unet

    import video

    if args.model in DITS:
        unet, forward = _dit(args)
    elif args.model in CAUSAL_VAES:
        unet, forward = _causal_vae(args)
    elif args.model == "svd-vae":  # Stable Video Diffusion's temporal VAE decoder, whole clip
        from diffusers import AutoencoderKLTemporalDecoder

        from video.vae import decode_sliced

        torch.manual_seed(0)
        unet = AutoencoderKLTemporalDecoder(block_out_channels=(32, 64), layers_per_block=1, latent_channels=4,
                                            down_block_types=("DownEncoderBlock2D",) * 2).eval()
        lat = torch.randn(1, 4, args.frames, args.size, args.size, generator=torch.Generator().manual_seed(1))
        flat = lat.permute(0, 2, 1, 3, 4).reshape(args.frames, 4, args.size, args.size)

        def forward():
            if args.variant == "streamlined":
                return decode_sliced(unet, lat, args.slices, args.tslices)
            return unet.decode(flat / unet.config.scaling_factor, num_frames=args.frames).sample.reshape(
                1, args.frames, 3, 2 * args.size, 2 * args.size).permute(0, 2, 1, 3, 4)
    elif args.model == "svd":
        unet = tiny_svd_unet(channels=(32, 64))
        x, t, ehs, added = svd_inputs(batch=1, frames=args.frames, size=args.size)

        def forward():
            return unet(x, t, encoder_hidden_states=ehs, added_time_ids=added).sample
    elif args.model == "latte":
        unet = tiny_latte(frames=args.frames, size=args.size)
        x, t, ehs = latte_inputs(batch=1, frames=args.frames, size=args.size)

        def forward():
            return unet(x, timestep=t, encoder_hidden_states=ehs).sample
    else:
        unet = tiny_motion_unet(channels=(32, 64))
        x, t, ehs = motion_inputs(batch=1, frames=args.frames, size=args.size)

        def forward():
            return unet(x, t, ehs).sample
    if args.variant == "streamlined" and args.model not in ("svd-vae",) + CAUSAL_VAES:
        if args.model in DITS:
            video.streamline(unet, slices=args.slices, head_slices=args.head_slices)
        else:
            video.streamline(unet, slices=args.slices, temporal_slices=args.tslices)
    elif args.variant == "forward_chunking":
        unet.enable_forward_chunking(chunk_size=1)
    elif args.variant.startswith("backend:"):
        unet.set_attention_backend(args.variant.split(":", 1)[1])
    times = []
    with torch.inference_mode():
        for _ in range(args.warmup):  # lazy imports and one-time kernel set-up are not activations
            forward()
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset VmHWM to the current RSS
        base = _kb("VmRSS")
        cpu = []
        for _ in range(args.reps):
            t0, c0 = time.perf_counter(), time.process_time()
            out = forward()
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
        peak = _kb("VmHWM")
    torch.save(out, args.out)
    print(json.dumps({"act_mib": (peak - base) / 1024, "base_mib": base / 1024, "wall_s": min(times),
                      "time_s": min(cpu)}))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=tuple(OPTIONS), default="animatediff",
                    help="wan-vae / cogvideox-vae / hunyuan-vae: tiny causal video VAEs, --frames latent frames")
    ap.add_argument("--frames", type=int, default=16)
    ap.add_argument("--size", type=int, default=32, help="latent height = width")
    ap.add_argument("--slices", type=int, default=16)
    ap.add_argument("--tslices", type=int, default=4)
    ap.add_argument("--head-slices", type=int, default=2, help="DiTs: groups of attention heads run in turn")
    ap.add_argument("--head-dim", type=int, default=16, help="DiTs: width per head (12 heads)")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=1, help="forwards run before the peak is reset (not timed)")
    ap.add_argument("--options", default=None,
                    help="comma-separated diffusers options to measure beside ours (default: all that apply "
                         "to --model; 'none' for none)")
    ap.add_argument("--allocator", choices=("live", "default"), default="live",
                    help="live: glibc returns every freed block over 64 KiB to the OS at once "
                         "(MALLOC_MMAP_THRESHOLD_=65536), so peak RSS tracks live tensor memory, the "
                         "analogue of torch.cuda.max_memory_allocated; default: glibc's own policy, "
                         "which keeps freed memory and so inflates the unsliced run's peak")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--variant", default="unsliced", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        return child(a)
    import torch

    if a.options is None:
        options = list(OPTIONS[a.model])
    elif a.options == "none":
        options = []
    else:
        options = a.options.split(",")
        bad = [o for o in options if o not in OPTIONS[a.model]]
        if bad:
            sys.exit(f"error: --options {','.join(bad)} does not apply to --model {a.model}; "
                     f"choose from {', '.join(OPTIONS[a.model]) or 'none'}")
    res = {}
    with tempfile.TemporaryDirectory() as d:
        ours = [] if a.model in NO_OURS else ["streamlined"]
        for name in ["unsliced"] + ours + options:
            out = os.path.join(d, name.replace(":", "_") + ".pt")
            cmd = [sys.executable, __file__, "--child", "--model", a.model, "--frames", str(a.frames),
                   "--size", str(a.size), "--slices", str(a.slices), "--tslices", str(a.tslices),
                   "--head-slices", str(a.head_slices), "--head-dim", str(a.head_dim), "--reps", str(a.reps),
                   "--warmup", str(a.warmup), "--variant", name, "--out", out]
            env = dict(os.environ, OMP_NUM_THREADS="1")
            if a.allocator == "live":  # every block over 64 KiB is mmapped and unmapped when freed
                env["MALLOC_MMAP_THRESHOLD_"] = "65536"
            r = subprocess.run(cmd, capture_output=True, text=True, env=env)
            if r.returncode:
                sys.exit(f"error: {name} run failed: {(r.stderr.strip().splitlines() or ['?'])[-1]}")
            res[name] = json.loads(r.stdout.strip().splitlines()[-1])
            res[name]["output"] = torch.load(out)
    ref = res["unsliced"]["output"]
    scale = ref.abs().max().item()
    u = res["unsliced"]
    for name, r in res.items():
        r["max_abs_diff"] = (r.pop("output") - ref).abs().max().item()
        r["act_mem_ratio"] = u["act_mib"] / r["act_mib"]
        r["time_ratio"] = r["time_s"] / u["time_s"]
    summary = {"model": a.model, "allocator": a.allocator, "frames": a.frames, "latent": a.size, "slices": a.slices,
               "temporal_slices": a.tslices, "head_slices": a.head_slices if a.model in DITS else None,
               "width": 12 * a.head_dim if a.model in DITS else None,
               "output_scale": scale, "runs": res}
    if ours:
        s = res["streamlined"]
        summary.update(act_mem_ratio=s["act_mem_ratio"], time_ratio=s["time_ratio"], max_abs_diff=s["max_abs_diff"])
    if options:
        best = min(options, key=lambda n: res[n]["act_mib"])
        summary["best_diffusers_option"] = best
        if ours:
            summary["streamlined_vs_best_option"] = res[best]["act_mib"] / s["act_mib"]
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
