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


def tiny_latte(seed: int = 0, frames: int = 16, size: int = 16):
    """A random LatteTransformer3DModel (video transformer: spatial and temporal blocks alternate)."""
    from diffusers import LatteTransformer3DModel

    torch.manual_seed(seed)
    return LatteTransformer3DModel(
        num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=8, num_layers=2,
        cross_attention_dim=32, sample_size=size, patch_size=2, caption_channels=24, video_length=frames,
        activation_fn="gelu-approximate", num_embeds_ada_norm=1000, norm_type="ada_norm_single",
        norm_elementwise_affine=False, norm_eps=1e-6,
    ).eval()


def latte_inputs(batch=1, frames=16, size=16, seed=1):
    """(latents [B, 4, F, h, w], timestep [B], caption embeddings [B, 7, 24])."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, 4, frames, size, size, generator=g)
    return x, torch.full((batch,), 500), torch.randn(batch, 7, 24, generator=g)


# ------------------------------------------------------------------------- full-attention video DiTs
def tiny_wan(seed: int = 0, heads: int = 4, head_dim: int = 16, layers: int = 2, ffn_mult: int = 4,
             text_dim: int = 24):
    """A random WanTransformer3DModel (Wan 2.x: self-attention over all tokens, text cross-attention)."""
    from diffusers import WanTransformer3DModel

    torch.manual_seed(seed)
    dim = heads * head_dim
    return WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=heads, attention_head_dim=head_dim, in_channels=4,
        out_channels=4, text_dim=text_dim, freq_dim=32, ffn_dim=ffn_mult * dim, num_layers=layers,
        cross_attn_norm=True, rope_max_seq_len=64,
    ).eval()


def wan_inputs(batch=1, frames=4, size=8, text_dim=24, text_len=7, seed=1):
    """(latents [B, 4, F, h, w], timestep [B], text states [B, L, text_dim])."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, 4, frames, size, size, generator=g)
    return x, torch.full((batch,), 500), torch.randn(batch, text_len, text_dim, generator=g)


def tiny_cogvideox(seed: int = 0, heads: int = 4, head_dim: int = 16, layers: int = 2, text_dim: int = 24):
    """A random CogVideoXTransformer3DModel (joint [text, video] attention, RoPE as in CogVideoX 1.5)."""
    from diffusers import CogVideoXTransformer3DModel

    torch.manual_seed(seed)
    return CogVideoXTransformer3DModel(
        num_attention_heads=heads, attention_head_dim=head_dim, in_channels=4, out_channels=4,
        time_embed_dim=32, text_embed_dim=text_dim, num_layers=layers, sample_width=16, sample_height=16,
        sample_frames=9, patch_size=2, max_text_seq_length=16, use_rotary_positional_embeddings=True,
    ).eval()


def cogvideox_inputs(batch=1, frames=4, size=8, text_dim=24, text_len=7, head_dim=16, seed=1):
    """(latents [B, F, 4, h, w], text states, timestep, (cos, sin) RoPE [F*h/2*w/2, head_dim])."""
    from diffusers.models.embeddings import get_3d_rotary_pos_embed

    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, frames, 4, size, size, generator=g)
    ehs = torch.randn(batch, text_len, text_dim, generator=g)
    gh = size // 2
    rope = get_3d_rotary_pos_embed(embed_dim=head_dim, crops_coords=((0, 0), (gh, gh)), grid_size=(gh, gh),
                                   temporal_size=frames, device=x.device)
    return x, ehs, torch.full((batch,), 500), rope


def tiny_hunyuan(seed: int = 0, heads: int = 4, head_dim: int = 16, layers: int = 1, single_layers: int = 1,
                 text_dim: int = 24):
    """A random HunyuanVideoTransformer3DModel (dual-stream then single-stream blocks, masked text)."""
    from diffusers import HunyuanVideoTransformer3DModel

    torch.manual_seed(seed)
    return HunyuanVideoTransformer3DModel(
        in_channels=4, out_channels=4, num_attention_heads=heads, attention_head_dim=head_dim,
        num_layers=layers, num_single_layers=single_layers, num_refiner_layers=1, mlp_ratio=4.0,
        patch_size=2, patch_size_t=1, guidance_embeds=False, text_embed_dim=text_dim,
        pooled_projection_dim=8, rope_axes_dim=(head_dim // 4, head_dim * 3 // 8, head_dim * 3 // 8),
    ).eval()


def hunyuan_inputs(batch=1, frames=4, size=8, text_dim=24, text_len=7, seed=1):
    """(latents [B, 4, F, h, w], timestep, text states, text mask [B, L] with padding, pooled [B, 8])."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, 4, frames, size, size, generator=g)
    ehs = torch.randn(batch, text_len, text_dim, generator=g)
    mask = torch.ones(batch, text_len, dtype=torch.long)
    mask[:, text_len - 2:] = 0  # two padding tokens: the attention mask is exercised
    return x, torch.full((batch,), 500), ehs, mask, torch.randn(batch, 8, generator=g)


# ------------------------------------------------------------------------------- causal video VAEs
def tiny_wan_vae(seed: int = 0):
    """A random AutoencoderKLWan (2x spatial, 2x temporal compression, causal 3D convolutions)."""
    from diffusers import AutoencoderKLWan

    torch.manual_seed(seed)
    return AutoencoderKLWan(base_dim=16, z_dim=4, dim_mult=[1, 2], num_res_blocks=1, temperal_downsample=[True],
                            latents_mean=[0.0] * 4, latents_std=[1.0] * 4).eval()


def tiny_cogvideox_vae(seed: int = 0):
    """A random AutoencoderKLCogVideoX (2x spatial and temporal compression, frame-batched decode)."""
    from diffusers import AutoencoderKLCogVideoX

    torch.manual_seed(seed)
    return AutoencoderKLCogVideoX(down_block_types=("CogVideoXDownBlock3D",) * 2,
                                  up_block_types=("CogVideoXUpBlock3D",) * 2, block_out_channels=(32, 64),
                                  latent_channels=4, layers_per_block=1, norm_num_groups=8,
                                  temporal_compression_ratio=2, sample_height=64, sample_width=64).eval()


def tiny_hunyuan_vae(seed: int = 0):
    """A random AutoencoderKLHunyuanVideo (4x spatial and temporal compression)."""
    from diffusers import AutoencoderKLHunyuanVideo

    torch.manual_seed(seed)
    return AutoencoderKLHunyuanVideo(latent_channels=4, down_block_types=("HunyuanVideoDownBlock3D",) * 3,
                                     up_block_types=("HunyuanVideoUpBlock3D",) * 3, block_out_channels=(16, 32, 32),
                                     layers_per_block=1, norm_num_groups=8, spatial_compression_ratio=4,
                                     temporal_compression_ratio=4).eval()
