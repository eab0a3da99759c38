"""Streamed decode of the causal video VAEs of Wan and CogVideoX into one output buffer, exact.

Both VAEs already decode a clip in temporal pieces with carried state (diffusers 0.42.1):
``AutoencoderKLWan`` runs its decoder one latent frame at a time with a feature cache (the last
input frames of every causal 3D convolution), ``AutoencoderKLCogVideoX`` runs it on batches of
``num_latent_frames_batch_size`` latent frames with a convolution cache. That piecewise decode *is*
the model (CogVideoX's GroupNorms see one frame batch at a time, so a whole-clip decode would be
a different function). What diffusers then does with the pieces costs memory: Wan grows its output
with ``torch.cat([out, piece])`` once per latent frame (two copies of the output at the end, O(F^2)
copying) and clamps out of place (a third), CogVideoX keeps a list of pieces and concatenates them
(two copies). Here every piece is written straight into one preallocated output (clamped in place
for Wan), so the output exists once; the decoder calls, their order and their caches are
diffusers' own, so the result is bit-identical to ``vae.decode(z).sample`` (non-tiled path).

``AutoencoderKLHunyuanVideo`` is not streamable exactly: its decoder's GroupNorms and mid-block
attention span all frames of the clip, so any frame-chunked decode (diffusers' framewise decoding,
on by default above 4 latent frames, blends overlapping chunks) differs from the whole-clip one;
a ValueError says so.

Streamlined Inference's operator grouping (Zhan et al., ECCV 2024) applied to the VAE's output.
"""

import torch

STREAMED = ("AutoencoderKLWan", "AutoencoderKLCogVideoX")


class _FrameWriter:
    """Writes decoded pieces ``[B, C, t_i, H, W]`` along frames into one buffer. The buffer's length is
    known once the first two pieces are: every piece after the first has the same input size, so the
    same output length (checked)."""

    def __init__(self, n_pieces: int):
        self.n, self.i, self.out, self.held, self.t = n_pieces, 0, None, None, 0

    def put(self, piece: torch.Tensor) -> None:
        if self.n == 1:
            self.out = piece
        elif self.held is None and self.out is None:
            self.held = piece  # the first piece may differ in length (causal first frame)
        else:
            if self.out is None:
                total = self.held.shape[2] + (self.n - 1) * piece.shape[2]
                self.out = piece.new_empty(piece.shape[:2] + (total,) + piece.shape[3:])
                self.out[:, :, :self.held.shape[2]] = self.held
                self.t, self.step, self.held = self.held.shape[2], piece.shape[2], None
            if piece.shape[2] != self.step:
                raise RuntimeError(f"video.vae_stream: piece {self.i} decoded to {piece.shape[2]} frames, expected "
                                   f"{self.step}; use vae.decode")
            self.out[:, :, self.t:self.t + self.step] = piece
            self.t += self.step
        self.i += 1


@torch.no_grad()
def decode_streamed(vae, z: torch.Tensor) -> torch.Tensor:
    """latents ``z [B, C, F, h, w]`` (already unscaled, as ``vae.decode`` takes them) -> video
    ``[B, 3, T, H, W]``, equal bit for bit to ``vae.decode(z).sample`` without tiling.

    vae: ``AutoencoderKLWan`` or ``AutoencoderKLCogVideoX``; anything else is a ValueError naming
    the class and the supported list (``AutoencoderKLHunyuanVideo``: frames are coupled, see module
    docstring).
    """
    name = type(vae).__name__
    if name not in STREAMED:
        why = (" (its GroupNorms and mid-block attention span the whole clip, so no frame-chunked decode is "
               "exact)") if name == "AutoencoderKLHunyuanVideo" else ""
        raise ValueError(f"decode_streamed does not support {name}{why}; supported: {', '.join(STREAMED)}")
    if z.dim() != 5:
        raise ValueError(f"z must be [B, C, F, h, w], got {tuple(z.shape)}")
    if getattr(vae, "use_tiling", False):
        raise ValueError("decode_streamed reproduces the non-tiled decode; call vae.disable_tiling() first")
    return _decode_wan(vae, z) if name == "AutoencoderKLWan" else _decode_cogvideox(vae, z)


def _decode_wan(vae, z):
    """AutoencoderKLWan._decode: one latent frame per decoder call, feature cache carried."""
    from diffusers.models.autoencoders.autoencoder_kl_wan import unpatchify

    n = z.shape[2]
    writer = _FrameWriter(n)
    vae.clear_cache()
    try:
        x = vae.post_quant_conv(z)
        for i in range(n):
            vae._conv_idx = [0]
            extra = {"first_chunk": True} if i == 0 else {}
            piece = vae.decoder(x[:, :, i:i + 1], feat_cache=vae._feat_map, feat_idx=vae._conv_idx, **extra)
            if vae.config.patch_size is not None:  # Wan 2.2's VAE: pixel unshuffle, per frame
                piece = unpatchify(piece, patch_size=vae.config.patch_size)
            writer.put(piece.clamp_(min=-1.0, max=1.0))
    finally:
        vae.clear_cache()
    return writer.out


def _decode_cogvideox(vae, z):
    """AutoencoderKLCogVideoX._decode: batches of latent frames (the first takes the remainder),
    convolution cache carried."""
    n = z.shape[2]
    size = vae.num_latent_frames_batch_size
    batches = max(n // size, 1)
    rem = n % size
    writer = _FrameWriter(batches)
    conv_cache = None
    for i in range(batches):
        a = size * i + (0 if i == 0 else rem)
        piece = z[:, :, a:size * (i + 1) + rem]
        if vae.post_quant_conv is not None:
            piece = vae.post_quant_conv(piece)
        piece, conv_cache = vae.decoder(piece, conv_cache=conv_cache)
        writer.put(piece)
    return writer.out
