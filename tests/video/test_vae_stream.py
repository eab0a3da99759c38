"""Streamed decode of Wan's and CogVideoX's causal VAEs: bit-identical to diffusers' decode."""

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
from video_tiny import tiny_cogvideox_vae, tiny_hunyuan_vae, tiny_wan_vae  # noqa: E402

from video.vae_stream import decode_streamed  # noqa: E402


@pytest.mark.parametrize("make,frames", [(tiny_wan_vae, 4), (tiny_cogvideox_vae, 5), (tiny_cogvideox_vae, 1)])
def test_streamed_decode_is_bit_identical(make, frames):
    """Wan: the first latent frame decodes to 1 frame, the others to 2; CogVideoX with 5 latent frames:
    a first batch of 3 (the remainder), then one of 2; 1 frame: a single piece."""
    vae = make()
    z = torch.randn(1, 4, frames, 4, 4, generator=torch.Generator().manual_seed(frames))
    with torch.no_grad():
        ref = vae.decode(z).sample
    got = decode_streamed(vae, z)
    assert got.shape == ref.shape and got.shape[2] > frames - 1
    assert torch.equal(got, ref)
    with torch.no_grad():
        assert torch.equal(vae.decode(z).sample, ref)  # caches were left clean


def test_cogvideox_frame_batches_are_the_model():
    """CogVideoX's GroupNorms see one frame batch at a time: a whole-clip decode is another function,
    so the frame batching (kept by decode_streamed) is part of the model, not an approximation."""
    vae = tiny_cogvideox_vae()
    z = torch.randn(1, 4, 6, 6, 6, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        batched = vae.decode(z).sample
        vae.num_latent_frames_batch_size = 6
        whole = vae.decode(z).sample
    assert (whole - batched).abs().max() > 1e-3


def test_bad_input():
    with pytest.raises(ValueError, match="AutoencoderKLHunyuanVideo .*span the whole clip.*supported: "
                                         "AutoencoderKLWan, AutoencoderKLCogVideoX"):
        decode_streamed(tiny_hunyuan_vae(), torch.randn(1, 4, 2, 4, 4))
    vae = tiny_wan_vae()
    with pytest.raises(ValueError, match="z must be"):
        decode_streamed(vae, torch.randn(4, 2, 4, 4))
    vae.enable_tiling()
    with pytest.raises(ValueError, match="disable_tiling"):
        decode_streamed(vae, torch.randn(1, 4, 2, 4, 4))
