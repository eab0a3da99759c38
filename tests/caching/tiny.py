"""Tiny random-weight diffusers denoisers and a minimal CFG sampling loop (text-to-image, img2img).

The loop does what diffusers' pipelines do around the denoiser -- ``torch.cat([latents] * 2)`` with
the negative condition first, one batched call per step, ``uncond + s (cond - uncond)`` -- without
tokenizers or VAEs, which cannot be downloaded here.
"""
from __future__ import annotations

import torch
from diffusers import (DDIMScheduler, FlowMatchEulerDiscreteScheduler, PixArtTransformer2DModel,
                       SD3Transformer2DModel, UNet2DConditionModel)

TEXT_DIM = 32


def tiny_unet(seed: int = 0, width: int = 16) -> UNet2DConditionModel:
    torch.manual_seed(seed)
    return UNet2DConditionModel(
        sample_size=8, in_channels=4, out_channels=4, layers_per_block=1,
        block_out_channels=(width, 2 * width), norm_num_groups=8, cross_attention_dim=TEXT_DIM,
        down_block_types=("CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D"), attention_head_dim=8).eval()


def tiny_sd_unet(seed: int = 0, width: int = 16) -> UNet2DConditionModel:
    """Stable Diffusion 1.5's block layout at toy width: 4 levels (channels 1:2:4:4 as SD's
    320/640/1280/1280), 2 layers per block, cross-attention on the three outer levels. Deep-branch
    caches (DeepCache, Step Rehash) depend on this shape: in the 2-level ``tiny_unet`` the outer level
    is most of the compute, in SD's layout the deep levels carry most of it."""
    torch.manual_seed(seed)
    return UNet2DConditionModel(
        sample_size=8, in_channels=4, out_channels=4, layers_per_block=2,
        block_out_channels=(width, 2 * width, 4 * width, 4 * width), norm_num_groups=8,
        cross_attention_dim=TEXT_DIM, attention_head_dim=8,
        down_block_types=("CrossAttnDownBlock2D",) * 3 + ("DownBlock2D",),
        up_block_types=("UpBlock2D",) + ("CrossAttnUpBlock2D",) * 3).eval()


def tiny_pixart(seed: int = 0, layers: int = 4, heads: int = 2, head_dim: int = 16) -> PixArtTransformer2DModel:
    torch.manual_seed(seed)
    return PixArtTransformer2DModel(
        num_attention_heads=heads, attention_head_dim=head_dim, in_channels=4, out_channels=4,
        num_layers=layers, cross_attention_dim=TEXT_DIM, sample_size=8, patch_size=2,
        norm_type="ada_norm_single", use_additional_conditions=False, caption_channels=None).eval()


def tiny_sd3(seed: int = 0, layers: int = 4, heads: int = 2, head_dim: int = 16,
             max_latent: int = 16) -> SD3Transformer2DModel:
    """max_latent: the largest latent side it accepts (SD3 crops a fixed positional table)."""
    torch.manual_seed(seed)
    return SD3Transformer2DModel(
        sample_size=8, patch_size=2, in_channels=4, out_channels=4, num_layers=layers,
        attention_head_dim=head_dim, num_attention_heads=heads, joint_attention_dim=TEXT_DIM,
        caption_projection_dim=heads * head_dim, pooled_projection_dim=TEXT_DIM, pos_embed_max_size=max_latent // 2).eval()


def kind_of(model) -> str:
    return {"UNet2DConditionModel": "unet", "PixArtTransformer2DModel": "pixart",
            "SD3Transformer2DModel": "sd3"}[type(model).__name__]


def sample_inputs(batch: int, size: int, generator: torch.Generator):
    """``sample``'s draws, in its order: text embeddings ``cond`` ``[batch, 6, TEXT_DIM]``, the zero
    negative embeddings and the start noise ``[batch, 4, size, size]`` (the generator then goes on to
    SD3's pooled projections). Lets a peer's own pipeline loop start from exactly the same inputs."""
    cond = torch.randn(batch, 6, TEXT_DIM, generator=generator)
    noise = torch.randn(batch, 4, size, size, generator=generator)
    return cond, torch.zeros_like(cond), noise


def ddim_scheduler() -> DDIMScheduler:
    """SD 1.5's DDIM configuration, the scheduler `sample` uses for every model but SD3."""
    return DDIMScheduler(beta_schedule="scaled_linear", beta_start=0.00085, beta_end=0.012,
                         clip_sample=False, set_alpha_to_one=False, steps_offset=1)


@torch.no_grad()
def sample(model, steps: int = 10, seed: int = 0, batch: int = 1, guidance: float = 4.0,
           init: torch.Tensor | None = None, strength: float = 1.0, size: int = 8) -> torch.Tensor:
    """Latents ``[batch, 4, size, size]`` after ``steps`` CFG steps; img2img when ``init`` is given."""
    kind = kind_of(model)
    g = torch.Generator().manual_seed(seed)
    cond, uncond, noise = sample_inputs(batch, size, g)
    enc = torch.cat([uncond, cond])
    if kind == "sd3":
        sched = FlowMatchEulerDiscreteScheduler(shift=3.0)
        pooled = torch.cat([torch.zeros(batch, TEXT_DIM), torch.randn(batch, TEXT_DIM, generator=g)])
    else:
        sched = ddim_scheduler()
    sched.set_timesteps(steps)
    timesteps = sched.timesteps
    if init is None:
        x = noise * getattr(sched, "init_noise_sigma", 1.0)
    else:  # img2img: start part-way down the schedule from the noised init latents
        start = steps - int(steps * strength)
        timesteps = timesteps[start:]
        if kind == "sd3":
            sched.set_begin_index(start)
            x = sched.scale_noise(init, timesteps[:1], noise)
        else:
            x = sched.add_noise(init, noise, timesteps[:1])
    for t in timesteps:
        x_in = torch.cat([x, x])
        tt = t.expand(x_in.shape[0])
        if kind == "unet":
            out = model(x_in, tt, encoder_hidden_states=enc).sample
        elif kind == "pixart":
            out = model(x_in, encoder_hidden_states=enc, timestep=tt,
                        added_cond_kwargs={"resolution": None, "aspect_ratio": None}).sample
        else:
            out = model(hidden_states=x_in, encoder_hidden_states=enc, pooled_projections=pooled, timestep=tt).sample
        if out.shape[1] != x.shape[1]:  # learned-sigma heads: keep the epsilon half
            out = out[:, : x.shape[1]]
        u, c = out.chunk(2)
        x = sched.step(u + guidance * (c - u), t, x).prev_sample
    return x
