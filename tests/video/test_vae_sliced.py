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
