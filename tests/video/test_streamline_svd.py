"""Streamlining Stable Video Diffusion's UNet: exact against the unsliced model, removable."""
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
from video_tiny import svd_inputs, tiny_svd_unet  # noqa: E402

import video  # noqa: E402


@pytest.fixture(scope="module")
def unet():
    return tiny_svd_unet()


def call(unet, inputs):
    x, t, ehs, added = inputs
    return unet(x, t, encoder_hidden_states=ehs, added_time_ids=added).sample


@pytest.mark.parametrize("slices,tslices", [(4, 3), (5, 2), (32, 1)])
def test_sliced_svd_equals_unsliced(unet, slices, tslices):
    inputs = svd_inputs(batch=2, frames=16, size=8)
    with torch.no_grad():
        ref = call(unet, inputs)
        video.streamline(unet, slices=slices, temporal_slices=tslices)
        try:
            got = call(unet, inputs)
        finally:
            video.unstreamline(unet)
        again = call(unet, inputs)
    assert ref.abs().max() > 0.1
    torch.testing.assert_close(got, ref, atol=2e-5, rtol=1e-4)
    assert torch.equal(again, ref)  # removal restores the original forwards exactly


def test_every_svd_operator_family_is_sliced(unet):
    """Counting sliced calls proves the slicer reaches each operator family, not only some."""
    from diffusers.models.attention import TemporalBasicTransformerBlock
    from diffusers.models.resnet import TemporalResnetBlock

    video.streamline(unet, slices=4, temporal_slices=2)
    try:
        patched = unet._dlm_streamline[1]
        kinds = {type(m).__name__ for m in patched}
        assert {"ResnetBlock2D", "TemporalResnetBlock", "BasicTransformerBlock",
                "TemporalBasicTransformerBlock", "Downsample2D", "Upsample2D"} <= kinds
        calls = {"res": 0, "tok": 0}
        res = next(m for m in unet.modules() if isinstance(m, TemporalResnetBlock))
        tok = next(m for m in unet.modules() if isinstance(m, TemporalBasicTransformerBlock))
        res.conv1.register_forward_hook(lambda *a: calls.__setitem__("res", calls["res"] + 1))
        tok.norm_in.register_forward_hook(lambda *a: calls.__setitem__("tok", calls["tok"] + 1))
        with torch.no_grad():
            call(unet, svd_inputs(batch=1, frames=16, size=8))
        assert calls == {"res": 2, "tok": 2}  # one call per temporal slice
    finally:
        video.unstreamline(unet)
        for m in unet.modules():
            m._forward_hooks.clear()


def test_svd_slices_larger_than_rows_raise(unet):
    video.streamline(unet, slices=2, temporal_slices=9)
    try:
        with pytest.raises(ValueError, match="temporal_slices=9 is larger than the dimension"):
            with torch.no_grad():
                call(unet, svd_inputs(batch=1, frames=16, size=8))
    finally:
        video.unstreamline(unet)
