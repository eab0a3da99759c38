import sys, os

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
