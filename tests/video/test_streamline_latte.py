"""Streamlining a video transformer (Latte): exact against the unsliced model, removable."""
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
from video_tiny import latte_inputs, tiny_latte  # noqa: E402

import video  # noqa: E402


@pytest.fixture(scope="module")
def model():
    return tiny_latte()


def call(model, inputs):
    x, t, ehs = inputs
    return model(x, timestep=t, encoder_hidden_states=ehs).sample


@pytest.mark.parametrize("slices,tslices", [(4, 8), (7, 3), (32, 128)])
def test_sliced_latte_equals_unsliced(model, slices, tslices):
    inputs = latte_inputs(batch=2, frames=16, size=16)  # 2*16 frames, 2*64 spatial tokens
    with torch.no_grad():
        ref = call(model, inputs)
        video.streamline(model, slices=slices, temporal_slices=tslices)
        try:
            got = call(model, inputs)
        finally:
            video.unstreamline(model)
        again = call(model, inputs)
    assert ref.abs().max() > 0.1
    torch.testing.assert_close(got, ref, atol=2e-5, rtol=1e-4)
    assert torch.equal(again, ref)


def test_latte_blocks_run_once_per_slice(model):
    counts = {"spatial": 0, "temporal": 0}
    h1 = model.transformer_blocks[0].norm1.register_forward_hook(lambda *a: counts.__setitem__("spatial", counts["spatial"] + 1))
    h2 = model.temporal_transformer_blocks[0].norm1.register_forward_hook(lambda *a: counts.__setitem__("temporal", counts["temporal"] + 1))
    video.streamline(model, slices=4, temporal_slices=8)
    try:
        with torch.no_grad():
            call(model, latte_inputs(batch=1, frames=16, size=16))
    finally:
        video.unstreamline(model)
        h1.remove()
        h2.remove()
    assert counts == {"spatial": 4, "temporal": 8}


def test_latte_from_a_pipeline_like_object_and_bad_slices(model):
    class Pipe:
        unet = None
        transformer = model

    video.streamline(Pipe(), slices=33)
    try:
        with pytest.raises(ValueError, match="slices=33 is larger than the dimension"):
            with torch.no_grad():
                call(model, latte_inputs(batch=2, frames=16, size=16))
    finally:
        video.unstreamline(Pipe())
