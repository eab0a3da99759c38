"""Tiny random-weight diffusers video models for tests and benchmarks (no downloads)."""

import torch


def tiny_motion_unet(seed: int = 0, channels=(32, 64), cross_dim: int = 32):
    from diffusers import UNetMotionModel

    torch.manual_seed(seed)
    return UNetMotionModel(
        block_out_channels=channels, layers_per_block=1, norm_num_groups=8,
        down_block_types=("CrossAttnDownBlockMotion", "DownBlockMotion"),
        up_block_types=("UpBlockMotion", "CrossAttnUpBlockMotion"),
        cross_attention_dim=cross_dim, num_attention_heads=2, motion_num_attention_heads=2,
        motion_max_seq_length=32, in_channels=4, out_channels=4,
    ).eval()


def motion_inputs(batch=1, frames=16, size=8, cross_dim=32, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, 4, frames, size, size, generator=g)
    # UNetMotionModel expects text states already repeated per frame: [B*F, L, D]
    ehs = torch.randn(batch, 5, cross_dim, generator=g).repeat_interleave(frames, 0)
    return x, torch.tensor(500), ehs


def tiny_svd_unet(seed: int = 0, channels=(32, 64), cross_dim: int = 32):
    """A random UNetSpatioTemporalConditionModel (Stable Video Diffusion's UNet), a few hundred K params.

    Channels are multiples of 32 because its temporal ResNet blocks hard-code 32 GroupNorm groups.
    """
    from diffusers import UNetSpatioTemporalConditionModel

    torch.manual_seed(seed)
    return UNetSpatioTemporalConditionModel(
        in_channels=8, out_channels=4, block_out_channels=channels, layers_per_block=1,
        down_block_types=("CrossAttnDownBlockSpatioTemporal", "DownBlockSpatioTemporal"),
        up_block_types=("UpBlockSpatioTemporal", "CrossAttnUpBlockSpatioTemporal"),
        cross_attention_dim=cross_dim, num_attention_heads=(2, 4), addition_time_embed_dim=8,
        projection_class_embeddings_input_dim=24, num_frames=16,
    ).eval()


def svd_inputs(batch=1, frames=16, size=8, cross_dim=32, seed=1):
    """(sample [B, F, 8, h, w], timestep, image embedding [B, 1, D], added_time_ids [B, 3])."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, frames, 8, size, size, generator=g)
    ehs = torch.randn(batch, 1, cross_dim, generator=g)
    added = torch.tensor([[6.0, 127.0, 0.02]]).repeat(batch, 1)
    return x, torch.tensor(500.0), ehs, added
