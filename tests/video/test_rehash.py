"""video.streamline(..., rehash=StepRehashConfig(...)): slicing composed with Step Rehash."""
import os
import sys

import pytest
import torch
from diffusers import DDIMScheduler

sys.path.insert(0, os.path.dirname(__file__))
from video_tiny import latte_inputs, motion_inputs, tiny_latte, tiny_motion_unet  # noqa: E402

import caching  # noqa: E402
import video  # noqa: E402
from caching import StepRehashConfig  # noqa: E402

SLICES = dict(slices=4, temporal_slices=2)


@pytest.fixture(scope="module")
def unet():
    return tiny_motion_unet()


@torch.no_grad()
def denoise(unet, steps=6):
    """A 6-step DDIM loop on a 4-frame 8x8 latent (AnimateDiff's UNet call, no CFG)."""
    x, _, ehs = motion_inputs(batch=1, frames=4, size=8)
    sched = DDIMScheduler(beta_schedule="scaled_linear", beta_start=0.00085, beta_end=0.012, clip_sample=False,
                          set_alpha_to_one=False, steps_offset=1)
    sched.set_timesteps(steps)
    for t in sched.timesteps:
        x = sched.step(unet(x, t, ehs).sample, t, x).prev_sample
    return x


@pytest.fixture(scope="module")
def plain_streamline(unet):
    video.streamline(unet, **SLICES)
    try:
        return denoise(unet)
    finally:
        video.unstreamline(unet)


def test_threshold_zero_equals_plain_streamline(unet, plain_streamline):
    ref = denoise(unet)
    video.streamline(unet, **SLICES, rehash=StepRehashConfig(threshold=0))
    tracker = video.rehash_tracker(unet)
    try:
        out = denoise(unet)
    finally:
        video.unstreamline(unet)
    assert torch.equal(out, plain_streamline)
    assert tracker.counters["steps_computed"] == 6 and tracker.counters["steps_rehashed"] == 0
    # unstreamline removed the slicing and the rehash hooks: the original model, bit for bit
    assert video.rehash_tracker(unet) is None
    assert not any(hasattr(m, "_diffusers_hook") or "forward" in m.__dict__ for m in unet.modules())
    assert torch.equal(denoise(unet), ref)


@pytest.mark.parametrize("cfg", [StepRehashConfig(threshold=0.15, warmup_steps=1, max_reuse=4),
                                 StepRehashConfig(threshold=10.0, warmup_steps=2, max_reuse=1)])
def test_sliced_rehash_matches_unsliced_rehash(unet, cfg):
    tracker = caching.apply(unet, cfg)
    try:
        ref = denoise(unet)
    finally:
        caching.remove(unet)
    video.streamline(unet, **SLICES, rehash=cfg)
    sliced = video.rehash_tracker(unet)
    try:
        out = denoise(unet)
    finally:
        video.unstreamline(unet)
    assert tracker.counters["steps_rehashed"] > 0
    assert dict(sliced.counters) == dict(tracker.counters)  # the same steps and blocks were skipped
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)


def test_rehash_needs_a_unet_and_a_config(unet):
    with pytest.raises(ValueError, match="Step Rehash needs a UNet"):
        video.streamline(tiny_latte(frames=4, size=8), slices=2, rehash=StepRehashConfig())
    with pytest.raises(ValueError, match="rehash must be a caching.StepRehashConfig"):
        video.streamline(unet, slices=2, rehash=0.1)
    caching.apply(unet, caching.DeepCacheConfig())  # another cache already attached
    try:
        with pytest.raises(ValueError, match="already attached"):
            video.streamline(unet, slices=2, rehash=StepRehashConfig())
        assert getattr(unet, "_dlm_streamline", None) is None  # nothing was patched
    finally:
        caching.remove(unet)
    assert not any("forward" in m.__dict__ for m in unet.modules())
