"""VAE decode sliced over frames: only ``slices`` pieces of the [B*F] frames are decoded at once."""

import torch


def decode_sliced(vae, latents: torch.Tensor, slices: int) -> torch.Tensor:
    """latents [B, C, F, h, w] -> frames [B, 3, F, H, W]; exact (each frame decodes independently)."""
    if latents.dim() != 5:
        raise ValueError(f"latents must be [B, C, F, h, w], got {tuple(latents.shape)}")
    b, c, f, h, w = latents.shape
    flat = latents.permute(0, 2, 1, 3, 4).reshape(b * f, c, h, w)
    if not 1 <= slices <= b * f:
        raise ValueError(f"slices={slices} must be in 1..{b * f} (batch x frames)")
    outs = [vae.decode(z / vae.config.scaling_factor).sample for z in flat.chunk(slices)]
    x = torch.cat(outs)
    return x.reshape(b, f, *x.shape[1:]).permute(0, 2, 1, 3, 4)
