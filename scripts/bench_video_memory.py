"""Peak activation memory and wall time of one denoising step, with and without streamline.

Each configuration runs in its own subprocess. Memory: Linux peak resident set size (VmHWM) of
that subprocess, reset via /proc/self/clear_refs after the model and inputs exist, minus the
resident size at that moment -> peak activation memory of the UNet forward. Time: best of --reps
forwards. Output equality: max abs difference of the sliced output vs the unsliced one.

Allocator (``--allocator``, default ``live``): with glibc's default policy, memory freed by the
unsliced run's large temporaries is kept in the heap and counted in its peak RSS, which overstated
the ratio (AnimateDiff at 48x48: 3.66x with the default policy, 2.36x live). ``live`` sets
``MALLOC_MMAP_THRESHOLD_=65536`` in the child so that every tensor over 64 KiB is its own mapping,
returned to the OS when freed: peak RSS then tracks the peak of live tensor memory.

    OMP_NUM_THREADS=1 python scripts/bench_video_memory.py --frames 16 --size 32
    OMP_NUM_THREADS=1 python scripts/bench_video_memory.py --model svd --frames 16 --size 48
    OMP_NUM_THREADS=1 python scripts/bench_video_memory.py --model latte --frames 16 --size 32

--model animatediff: a tiny random UNetMotionModel; --model svd: a tiny random
UNetSpatioTemporalConditionModel (Stable Video Diffusion's UNet); --model latte: a tiny random
LatteTransformer3DModel (video transformer, patch size 2); --model svd-vae: a tiny random
AutoencoderKLTemporalDecoder (SVD's VAE, channels 32/64) decoding the whole clip, unsliced vs
``video.vae.decode_sliced`` (one pass, sliced operators; --size is the latent size, pixels 2x).
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


def child(args):
    import time

    import torch

    torch.set_num_threads(1)
    sys.path.insert(0, os.path.join(ROOT, "tests", "video"))
    sys.path.insert(0, ROOT)
    from video_tiny import latte_inputs, motion_inputs, svd_inputs, tiny_latte, tiny_motion_unet, tiny_svd_unet

    import video

    if args.model == "svd-vae":  # Stable Video Diffusion's temporal VAE decoder, whole clip
        from diffusers import AutoencoderKLTemporalDecoder

        from video.vae import decode_sliced

        torch.manual_seed(0)
        unet = AutoencoderKLTemporalDecoder(block_out_channels=(32, 64), layers_per_block=1, latent_channels=4,
                                            down_block_types=("DownEncoderBlock2D",) * 2).eval()
        lat = torch.randn(1, 4, args.frames, args.size, args.size, generator=torch.Generator().manual_seed(1))
        flat = lat.permute(0, 2, 1, 3, 4).reshape(args.frames, 4, args.size, args.size)

        def forward():
            if args.slices > 1:
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
    if args.slices > 1 and args.model != "svd-vae":
        video.streamline(unet, slices=args.slices, temporal_slices=args.tslices)
    times = []
    with torch.inference_mode():
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset VmHWM to the current RSS
        base = _kb("VmRSS")
        for _ in range(args.reps):
            t0 = time.perf_counter()
            out = forward()
            times.append(time.perf_counter() - t0)
        peak = _kb("VmHWM")
    torch.save(out, args.out)
    print(json.dumps({"act_mib": (peak - base) / 1024, "base_mib": base / 1024, "time_s": min(times)}))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=("animatediff", "svd", "latte", "svd-vae"), default="animatediff")
    ap.add_argument("--frames", type=int, default=16)
    ap.add_argument("--size", type=int, default=32, help="latent height = width")
    ap.add_argument("--slices", type=int, default=16)
    ap.add_argument("--tslices", type=int, default=4)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--allocator", choices=("live", "default"), default="live",
                    help="live: glibc returns every freed block over 64 KiB to the OS at once "
                         "(MALLOC_MMAP_THRESHOLD_=65536), so peak RSS tracks live tensor memory, the "
                         "analogue of torch.cuda.max_memory_allocated; default: glibc's own policy, "
                         "which keeps freed memory and so inflates the unsliced run's peak")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        return child(a)
    import torch

    res = {}
    with tempfile.TemporaryDirectory() as d:
        for name, sl in (("unsliced", 1), ("streamlined", a.slices)):
            out = os.path.join(d, name + ".pt")
            cmd = [sys.executable, __file__, "--child", "--model", a.model, "--frames", str(a.frames), "--size", str(a.size),
                   "--slices", str(sl), "--tslices", str(a.tslices), "--reps", str(a.reps), "--out", out]
            env = dict(os.environ, OMP_NUM_THREADS="1")
            if a.allocator == "live":  # every block over 64 KiB is mmapped and unmapped when freed
                env["MALLOC_MMAP_THRESHOLD_"] = "65536"
            r = subprocess.run(cmd, capture_output=True, text=True, env=env)
            if r.returncode:
                sys.exit(f"error: {name} run failed: {r.stderr.strip().splitlines()[-1]}")
            res[name] = json.loads(r.stdout.strip().splitlines()[-1])
            res[name]["output"] = torch.load(out)
    diff = (res["streamlined"].pop("output") - res["unsliced"].pop("output")).abs().max().item()
    u, s = res["unsliced"], res["streamlined"]
    summary = {"model": a.model, "allocator": a.allocator, "frames": a.frames, "latent": a.size, "slices": a.slices, "temporal_slices": a.tslices,
               "unsliced": u, "streamlined": s, "act_mem_ratio": u["act_mib"] / s["act_mib"],
               "time_ratio": s["time_s"] / u["time_s"], "max_abs_diff": diff}
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
