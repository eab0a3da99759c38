import pytest
import torch


def test_decode_sliced_equals_whole():
    from diffusers import AutoencoderKL

    from video.vae import decode_sliced

    torch.manual_seed(0)
    vae = AutoencoderKL(block_out_channels=(8, 8), down_block_types=("DownEncoderBlock2D",) * 2,
                        up_block_types=("UpDecoderBlock2D",) * 2, latent_channels=4, norm_num_groups=4).eval()
    lat = torch.randn(2, 4, 5, 4, 4)
    with torch.no_grad():
        flat = lat.permute(0, 2, 1, 3, 4).reshape(10, 4, 4, 4)
        whole = vae.decode(flat / vae.config.scaling_factor).sample.reshape(2, 5, 3, 8, 8).permute(0, 2, 1, 3, 4)
        got = decode_sliced(vae, lat, slices=3)
    assert got.shape == (2, 3, 5, 8, 8)
    torch.testing.assert_close(got, whole, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="slices=11"):
        decode_sliced(vae, lat, slices=11)


def tiny_temporal_vae():
    from diffusers import AutoencoderKLTemporalDecoder

    torch.manual_seed(0)
    vae = AutoencoderKLTemporalDecoder(block_out_channels=(32, 64), down_block_types=("DownEncoderBlock2D",) * 2,
                                       layers_per_block=1, latent_channels=4).eval()
    with torch.no_grad():  # the blend factors start at 0 (sigmoid 0.5); make each block's distinct
        for i, m in enumerate(x for x in vae.decoder.modules() if hasattr(x, "mix_factor")):
            m.mix_factor.fill_(0.3 * i - 1.0)
    return vae


@pytest.mark.parametrize("slices,t_slices", [(3, 2), (10, 5), (1, 1)])
def test_temporal_decoder_sliced_equals_whole(slices, t_slices):
    """SVD's temporal VAE: one sliced pass equals the unsliced decode (frames are coupled)."""
    from video.vae import decode_sliced

    vae = tiny_temporal_vae()
    lat = torch.randn(2, 4, 5, 6, 6, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        flat = lat.permute(0, 2, 1, 3, 4).reshape(10, 4, 6, 6) / vae.config.scaling_factor
        whole = vae.decode(flat, num_frames=5).sample.reshape(2, 5, 3, 12, 12).permute(0, 2, 1, 3, 4)
        got = decode_sliced(vae, lat, slices=slices, temporal_slices=t_slices)
    assert got.shape == (2, 3, 5, 12, 12)
    torch.testing.assert_close(got, whole, atol=2e-5, rtol=1e-5)
    assert not any("forward" in m.__dict__ for m in vae.modules())  # patches removed


def test_temporal_decoder_slices_really_run_and_chunking_would_not_be_exact():
    from diffusers.models.resnet import TemporalResnetBlock

    from video.vae import decode_sliced

    vae = tiny_temporal_vae()
    lat = torch.randn(1, 4, 6, 6, 6, generator=torch.Generator().manual_seed(2))
    block = next(m for m in vae.decoder.modules() if isinstance(m, TemporalResnetBlock))
    calls = []
    handle = block.conv1.register_forward_hook(lambda *a: calls.append(a[1][0].shape))
    try:
        with torch.no_grad():
            got = decode_sliced(vae, lat, slices=6, temporal_slices=3)
    finally:
        handle.remove()
    assert len(calls) == 3 and all(s[2] == 6 for s in calls)  # row slices, all 6 frames each
    # decoding frames in chunks (diffusers' decode_chunk_size) is not the same decode
    flat = lat.permute(0, 2, 1, 3, 4).reshape(6, 4, 6, 6) / vae.config.scaling_factor
    with torch.no_grad():
        chunked = torch.cat([vae.decode(z, num_frames=2).sample for z in flat.chunk(3)])
    chunked = chunked.reshape(1, 6, 3, 12, 12).permute(0, 2, 1, 3, 4)
    assert (chunked - got).abs().max() > 1e-3


def test_temporal_decoder_bad_slices():
    from video.vae import decode_sliced

    vae = tiny_temporal_vae()
    lat = torch.randn(1, 4, 3, 4, 4)
    with pytest.raises(ValueError, match="temporal_slices=5 must be in 1..4"):
        decode_sliced(vae, lat, slices=2, temporal_slices=5)
    with pytest.raises(ValueError, match="slices=4 must be in 1..3"):
        decode_sliced(vae, lat, slices=4)
