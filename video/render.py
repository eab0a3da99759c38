"""Render a short clip with a tiny random-weight AnimateDiff UNet, streamlined, and save a GIF.

    python -m video.render --frames 16 --size 16 --steps 4 --out /tmp/clip.gif
    python -m video.render --steps 8 --rehash 0.2 --out /tmp/clip.gif   # with Step Rehash

The weights are random (no downloads), so the clip is noise-like: this demonstrates the streamlined
pipeline end to end (DDIM loop, sliced UNet, sliced VAE decode), not image quality.
"""

import argparse
import os
import sys

import torch


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--frames", type=int, default=16)
    ap.add_argument("--size", type=int, default=16, help="latent size; pixels = 2x with the tiny VAE")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--slices", type=int, default=8)
    ap.add_argument("--rehash", type=float, default=None, metavar="THRESHOLD",
                    help="also attach Step Rehash with this threshold (caching.StepRehashConfig)")
    ap.add_argument("--out", default="clip.gif")
    a = ap.parse_args(argv)
    from diffusers import AutoencoderKL, DDIMScheduler
    from PIL import Image

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "video"))
    from video_tiny import tiny_motion_unet

    import video
    from video.vae import decode_sliced

    torch.manual_seed(0)
    unet = tiny_motion_unet()
    vae = AutoencoderKL(block_out_channels=(32, 32), down_block_types=("DownEncoderBlock2D",) * 2,
                        up_block_types=("UpDecoderBlock2D",) * 2, latent_channels=4, norm_num_groups=8).eval()
    import caching

    try:
        rehash = None if a.rehash is None else caching.StepRehashConfig(threshold=a.rehash).validate()
        video.streamline(unet, slices=a.slices, temporal_slices=min(4, a.size // 2), rehash=rehash)
    except ValueError as e:
        sys.exit(f"error: {e}")
    sched = DDIMScheduler()
    sched.set_timesteps(a.steps)
    lat = torch.randn(1, 4, a.frames, a.size, a.size)
    ehs = torch.randn(a.frames, 5, 32)
    with torch.no_grad():
        for t in sched.timesteps:
            lat = sched.step(unet(lat, t, ehs).sample, t, lat).prev_sample
        frames = decode_sliced(vae, lat, slices=min(a.slices, a.frames))
    frames = ((frames[0].clamp(-1, 1) + 1) * 127.5).byte().permute(1, 2, 3, 0).numpy()
    imgs = [Image.fromarray(f) for f in frames]
    imgs[0].save(a.out, save_all=True, append_images=imgs[1:], duration=100, loop=0)
    tracker = video.rehash_tracker(unet)
    extra = "" if tracker is None else f", {tracker.counters['steps_rehashed']} of {a.steps} steps rehashed"
    print(f"wrote {a.out}: {len(imgs)} frames {imgs[0].size}{extra}")


if __name__ == "__main__":
    main()
