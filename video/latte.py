"""Streamlined forward of Latte (``LatteTransformer3DModel``): no full-size layout changes.

diffusers' Latte forward alternates spatial blocks on ``[B*F, HW, C]`` (attention within a frame)
and temporal blocks on ``[B*HW, F, C]`` (attention over frames), and turns one layout into the other
with a full-size permuted copy before and after every temporal block; its output head then makes
three full-size temporaries (norm, scale, shift). Here the hidden states keep the spatial layout
for the whole forward (Streamlined Inference's operator grouping, Zhan et al., ECCV 2024):

- spatial blocks run as ``video.streamline`` patched them (per slice of batch x frames);
- each temporal block runs on ``temporal_slices`` spans of the batch x spatial-token rows: a span
  is gathered from the spatial layout (span-sized copy), gets the temporal position embedding
  before the first block, runs through the block and is written back into a new spatial-layout
  output;
- the output head (norm, adaLN shift/scale, projection) runs per slice of batch x frames.

Every operator sees the same values as in diffusers' forward, so the output matches it to float
rounding.
"""

import torch

from video.dit_attention import token_spans


def _pieces(a: int, b: int, per: int):
    """Split the flat row span ``a:b`` of a ``[B * per]`` index into ``(batch, start, end)`` pieces that
    each stay inside one batch element."""
    while a < b:
        i, p = divmod(a, per)
        e = min(b, (i + 1) * per)
        yield i, p, p + e - a
        a = e


def _temporal_block(block, x4, out4, t_slices, timestep_temp, pos):
    """One temporal block over ``x4 [B, F, HW, C]`` (a view of the spatial layout), written to
    ``out4``, in spans of the B*HW rows; ``pos [1, F, C]`` is added first (first block) or None."""
    b, f, hw, c = x4.shape
    for a, e in token_spans(b * hw, t_slices, "temporal_slices"):
        parts = [x4[i, :, p0:p1].transpose(0, 1) for i, p0, p1 in _pieces(a, e, hw)]  # [n, F, C] each
        h = parts[0] if len(parts) == 1 else torch.cat(parts, 0)
        if pos is not None:
            h = h + pos.to(h.dtype)
        h = block(h, None, None, None, timestep_temp[a:e], None, None)
        k = 0
        for i, p0, p1 in _pieces(a, e, hw):
            out4[i, :, p0:p1] = h[k:k + p1 - p0].transpose(0, 1)
            k += p1 - p0


def latte_forward(model, slices: int, t_slices: int):
    """``LatteTransformer3DModel.forward`` with the hidden states kept in the spatial layout."""
    from diffusers.models.modeling_outputs import Transformer2DModelOutput

    def forward(hidden_states, timestep=None, encoder_hidden_states=None, encoder_attention_mask=None,
                enable_temporal_attentions=True, return_dict=True):
        batch, channels, frames, height, width = hidden_states.shape
        x = hidden_states.permute(0, 2, 1, 3, 4).reshape(-1, channels, height, width)
        p = model.config.patch_size
        h, w = height // p, width // p
        x = model.pos_embed(x)  # [B*F, HW, C]
        timestep, embedded = model.adaln_single(timestep, added_cond_kwargs={"resolution": None, "aspect_ratio": None},
                                                batch_size=batch, hidden_dtype=x.dtype)
        ctx = model.caption_projection(encoder_hidden_states)
        ctx = ctx.repeat_interleave(frames, dim=0).view(-1, ctx.shape[-2], ctx.shape[-1])
        t_spatial = timestep.repeat_interleave(frames, dim=0).view(-1, timestep.shape[-1])
        t_temp = timestep.repeat_interleave(h * w, dim=0).view(-1, timestep.shape[-1])
        for i, (spatial, temporal) in enumerate(zip(model.transformer_blocks, model.temporal_transformer_blocks)):
            x = spatial(x, None, ctx, encoder_attention_mask, t_spatial, None, None)
            if enable_temporal_attentions:
                out = torch.empty_like(x)
                pos = model.temp_pos_embed if i == 0 and frames > 1 else None
                _temporal_block(temporal, x.view(batch, frames, h * w, -1), out.view(batch, frames, h * w, -1),
                                t_slices, t_temp, pos)
                x = out
        embedded = embedded.repeat_interleave(frames, dim=0).view(-1, embedded.shape[-1])
        shift, scale = (model.scale_shift_table[None] + embedded[:, None]).chunk(2, dim=1)
        y = None
        for a, e in token_spans(x.shape[0], slices):  # output head per slice of batch x frames
            s = model.proj_out(model.norm_out(x[a:e]) * (1 + scale[a:e]) + shift[a:e])
            if y is None:
                y = s.new_empty((x.shape[0],) + s.shape[1:])
            y[a:e] = s
        del x
        c_out = model.out_channels
        y = torch.einsum("nhwpqc->nchpwq", y.reshape(-1, h, w, p, p, c_out))
        y = y.reshape(-1, c_out, h * p, w * p)
        y = y.reshape(batch, -1, *y.shape[-3:]).permute(0, 2, 1, 3, 4)
        return Transformer2DModelOutput(sample=y) if return_dict else (y,)

    return forward
