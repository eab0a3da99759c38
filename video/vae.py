"""VAE decode with sliced operators, exact.

- Frame-independent VAEs (``AutoencoderKL``, AnimateDiff's): only ``slices`` pieces of the [B*F]
  frames are decoded at once.
- Stable Video Diffusion's ``AutoencoderKLTemporalDecoder``: its decoder mixes frames (temporal
  ResNet blocks with (3, 1, 1) convolutions and GroupNorm over frames, a final temporal
  convolution), so decoding frames in chunks -- what diffusers' ``decode_chunk_size`` does -- changes
  the output. Here the whole clip is decoded in one pass while every operator runs on slices, as in
  ``video.streamline`` (Zhan et al., "Streamlined Inference", ECCV 2024): spatial operators (ResNet
  blocks, upsamplers, the mid-block attention, the output norm + conv) per slice of batch x frames,
  temporal ResNet blocks per slice of image rows with exact two-pass GroupNorm statistics, and the
  spatial/temporal blend per row slice. The result equals the unsliced decode to float tolerance.
"""

import contextlib

import torch


def decode_sliced(vae, latents: torch.Tensor, slices: int, temporal_slices: int | None = None) -> torch.Tensor:
    """latents [B, C, F, h, w] -> frames [B, 3, F, H, W], exact.

    slices: pieces of the batch x frames dimension. temporal_slices: pieces of the image rows for
    the temporal operators of a temporal decoder (default: ``slices``, capped at the latent height).
    """
    if latents.dim() != 5:
        raise ValueError(f"latents must be [B, C, F, h, w], got {tuple(latents.shape)}")
    b, c, f, h, w = latents.shape
    flat = latents.permute(0, 2, 1, 3, 4).reshape(b * f, c, h, w) / vae.config.scaling_factor
    if not 1 <= slices <= b * f:
        raise ValueError(f"slices={slices} must be in 1..{b * f} (batch x frames)")
    if type(vae).__name__ == "AutoencoderKLTemporalDecoder":
        t_slices = min(slices, h) if temporal_slices is None else temporal_slices
        if not 1 <= t_slices <= h:
            raise ValueError(f"temporal_slices={t_slices} must be in 1..{h} (latent rows)")
        x = _decode_temporal(vae, flat, f, slices, t_slices)
    else:
        x = torch.cat([vae.decode(z).sample for z in flat.chunk(slices)])
    return x.reshape(b, f, *x.shape[1:]).permute(0, 2, 1, 3, 4)


def _decoder_targets(decoder):
    """(module, kind) pairs of a TemporalDecoder that run sliced (kinds of ``video.streamline``)."""
    from diffusers.models.resnet import ResnetBlock2D, SpatioTemporalResBlock, TemporalResnetBlock, Upsample2D

    for m in decoder.modules():
        if isinstance(m, SpatioTemporalResBlock):
            yield m, "spatiotemporal_res"
        elif isinstance(m, TemporalResnetBlock):
            yield m, "temporal_res"
        elif isinstance(m, (ResnetBlock2D, Upsample2D)):
            yield m, "spatial"
    for attn in getattr(decoder.mid_block, "attentions", []):  # attention within each frame
        yield attn, "spatial"


@contextlib.contextmanager
def _sliced_decoder(decoder, slices: int, t_slices: int):
    """Patch the decoder's operators for the duration of one decode; always restored."""
    from video.streamline import StreamlineConfig, _sliced_forward

    cfg = StreamlineConfig(slices, t_slices)
    patched = []
    try:
        for m, kind in _decoder_targets(decoder):
            m.forward = _sliced_forward(m, kind, cfg)
            patched.append(m)
        yield
    finally:
        for m in patched:
            m.__dict__.pop("forward", None)


@torch.no_grad()
def _decode_temporal(vae, z: torch.Tensor, num_frames: int, slices: int, t_slices: int) -> torch.Tensor:
    """TemporalDecoder.forward with sliced operators; z [B*F, C, h, w] -> [B*F, 3, H, W]."""
    dec = vae.decoder
    iio = torch.zeros(z.shape[0] // num_frames, num_frames, dtype=z.dtype, device=z.device)
    with _sliced_decoder(dec, slices, t_slices):
        x = dec.conv_in(z)
        x = dec.mid_block(x, image_only_indicator=iio).to(next(dec.up_blocks.parameters()).dtype)
        for up in dec.up_blocks:
            x = up(x, image_only_indicator=iio)
    # output norm -> activation -> conv per frame slice: only the 3-channel result is full size
    x = torch.cat([dec.conv_out(dec.conv_act(dec.conv_norm_out(p))) for p in x.chunk(slices)])
    bf, ch, hh, ww = x.shape
    x = x.reshape(bf // num_frames, num_frames, ch, hh, ww).permute(0, 2, 1, 3, 4)
    x = dec.time_conv_out(x)
    return x.permute(0, 2, 1, 3, 4).reshape(bf, ch, hh, ww)
