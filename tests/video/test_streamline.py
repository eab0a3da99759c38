import importlib
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
from video_tiny import motion_inputs, tiny_motion_unet  # noqa: E402

import video  # noqa: E402


@pytest.fixture(scope="module")
def unet():
    return tiny_motion_unet()


@pytest.mark.parametrize("slices,tslices", [(4, 3), (5, 4), (32, 1)])
def test_sliced_equals_unsliced(unet, slices, tslices):
    x, t, ehs = motion_inputs(batch=2, frames=16, size=8)
    with torch.no_grad():
        ref = unet(x, t, ehs).sample
        video.streamline(unet, slices=slices, temporal_slices=tslices)
        try:
            got = unet(x, t, ehs).sample
        finally:
            video.unstreamline(unet)
        again = unet(x, t, ehs).sample
    torch.testing.assert_close(got, ref, atol=2e-5, rtol=1e-4)
    assert torch.equal(again, ref)  # removal restores the original forward exactly
    assert (got - ref).abs().max() < 2e-5 and ref.abs().max() > 0.1


def test_temporal_norm_is_global_not_per_slice(unet):
    """Per-slice GroupNorm (the released code's approximation) would differ; ours must not."""
    import torch.nn.functional as F
    from kernels.group_norm import group_norm_sliced

    x = torch.randn(1, 32, 16, 8, 8) * 2 + torch.linspace(-3, 3, 8)[None, None, None, :, None]
    gn = F.group_norm(x, 8, eps=1e-6)
    naive = torch.cat([F.group_norm(c, 8, eps=1e-6) for c in x.chunk(4, 3)], 3)
    assert (naive - gn).abs().max() > 0.1
    torch.testing.assert_close(group_norm_sliced(x, 8, None, None, 1e-6, 3, 4), gn, atol=1e-5, rtol=1e-5)


def test_bad_input(unet):
    with pytest.raises(ValueError, match="supported: UNetMotionModel"):
        video.streamline(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="slices"):
        video.streamline(unet, slices=0)
    x, t, ehs = motion_inputs(batch=1, frames=16, size=8)
    video.streamline(unet, slices=17)
    try:
        with pytest.raises(ValueError, match="slices=17 is larger than the dimension"):
            unet(x, t, ehs)
        with pytest.raises(ValueError, match="already streamlined"):
            video.streamline(unet)
    finally:
        video.unstreamline(unet)
    video.streamline(unet, slices=2, temporal_slices=9)
    try:
        with pytest.raises(ValueError, match="temporal_slices=9"):
            unet(x, t, ehs)
    finally:
        video.unstreamline(unet)


def test_kernels_name_clash_detected():
    import types

    import kernels
    kernels.check_ours(kernels)
    with pytest.raises(ImportError, match="Hugging Face"):
        kernels.check_ours(types.ModuleType("kernels"))


def _spy_cat_resnet(monkeypatch):
    """Record (input spatial size, whether an upsampler was handed over) of every fused skip concat."""
    vs = importlib.import_module("video.streamline")  # the package re-exports a function of that name

    calls, real = [], vs._cat_resnet

    def spy(resnet, x, skip, temb, slices, upsample=None):
        calls.append((tuple(x.shape[-2:]), upsample is not None))
        return real(resnet, x, skip, temb, slices, upsample)

    monkeypatch.setattr(vs, "_cat_resnet", spy)
    return calls


def test_upsample_moves_into_next_up_block(unet, monkeypatch):
    """Inside a UNet call, up block 0 hands its upsampler to block 1's first slice loop: block 1 gets
    the 4x4 pre-upsample tensor, never the full-size 8x8 one, and the output is unchanged."""
    calls = _spy_cat_resnet(monkeypatch)
    x, t, ehs = motion_inputs(batch=1, frames=16, size=8)
    with torch.no_grad():
        ref = unet(x, t, ehs).sample
        video.streamline(unet, slices=4, temporal_slices=2)
        try:
            got = unet(x, t, ehs).sample
            # called on its own (not inside a UNet call) the block still upsamples itself
            h = torch.randn(16, 64, 4, 4)
            res = (torch.randn(16, 32, 4, 4), torch.randn(16, 64, 4, 4))  # used last to first
            alone = unet.up_blocks[0](h, res, temb=torch.randn(16, 128), num_frames=16)
        finally:
            video.unstreamline(unet)
    # block 0 (4x4, two ResNets), then block 1: first ResNet takes the 4x4 tensor plus the upsampler
    assert calls[:4] == [((4, 4), False), ((4, 4), False), ((4, 4), True), ((8, 8), False)]
    assert alone.shape[-2:] == (8, 8)
    torch.testing.assert_close(got, ref, atol=2e-5, rtol=1e-4)
    assert not unet._forward_hooks and not unet._forward_pre_hooks  # unstreamline removed the handoff hooks


def test_hooked_up_block_keeps_its_upsample(unet, monkeypatch):
    """A hook on an up block sees the block's real (upsampled) output: no handoff then, same result."""
    calls = _spy_cat_resnet(monkeypatch)
    seen = []
    x, t, ehs = motion_inputs(batch=1, frames=16, size=8)
    with torch.no_grad():
        ref = unet(x, t, ehs).sample
        video.streamline(unet, slices=4, temporal_slices=2)
        handle = unet.up_blocks[0].register_forward_hook(lambda m, a, out: seen.append(tuple(out.shape[-2:])))
        try:
            got = unet(x, t, ehs).sample
        finally:
            handle.remove()
            video.unstreamline(unet)
    assert seen == [(8, 8)]
    assert not any(handed for _, handed in calls)
    torch.testing.assert_close(got, ref, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("streamline_first", [False, True])
def test_streamline_composes_with_deepcache_in_either_order(unet, streamline_first):
    """A cache applied before or after streamline (its hooks wrap the up blocks, so the upsample handoff
    must stand down) gives the cached model's outputs, step for step."""
    import caching

    x, t, ehs = motion_inputs(batch=1, frames=16, size=8)

    def run():
        with torch.no_grad():
            return [unet(x, torch.tensor(step), ehs).sample for step in (900, 700, 500, 300)]

    cfg = caching.DeepCacheConfig(interval=2)
    plain = run()
    caching.apply(unet, cfg)
    ref = run()
    caching.remove(unet)
    if streamline_first:
        video.streamline(unet, slices=4, temporal_slices=2)
        caching.apply(unet, cfg)
    else:
        caching.apply(unet, cfg)
        video.streamline(unet, slices=4, temporal_slices=2)
    try:
        got = run()
    finally:
        caching.remove(unet)
        video.unstreamline(unet)
    assert [torch.equal(a, b) for a, b in zip(ref, plain)] == [True, True, False, True]  # step 3 is cached
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, atol=2e-5, rtol=1e-4)


def test_no_upsample_handoff_with_autograd_on(unet, monkeypatch):
    """With gradients enabled (training, gradient checkpointing) every up block keeps its upsampler."""
    calls = _spy_cat_resnet(monkeypatch)
    x, t, ehs = motion_inputs(batch=1, frames=16, size=8)
    with torch.no_grad():
        ref = unet(x, t, ehs).sample
    video.streamline(unet, slices=4, temporal_slices=2)
    try:
        got = unet(x, t, ehs).sample
    finally:
        video.unstreamline(unet)
    assert calls and not any(handed for _, handed in calls)
    torch.testing.assert_close(got.detach(), ref, atol=2e-5, rtol=1e-4)
