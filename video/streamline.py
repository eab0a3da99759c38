"""Streamlined Inference for diffusers video models: Feature Slicer with exact temporal GroupNorm.

Zhan et al., "Streamlined Inference: Low-Latency, Memory-Efficient Video Diffusion" (ECCV 2024).
Every spatial operator (ResNet block, spatial transformer, up/down sampler) sees its input
``[B*F, C, H, W]`` one slice of the batch x frames dimension at a time; GroupNorm there is per frame,
so this is exact. Every temporal transformer (AnimateDiff motion module) is run one slice of image
rows at a time: its attention runs over frames only and LayerNorm is per token, so only its input
GroupNorm couples slices. That norm is made exact with two passes (kernels.group_norm): per-group
sums over all slices first, then each slice normalised with the global statistics, and the slice
goes straight on through proj_in, the transformer blocks and proj_out (operator grouping), so the
full-size ``[B*H*W, F, inner]`` intermediates of the motion module never exist at once.

Peak memory drops because attention scores and the MLP hidden states are only ever slice-sized.
"""

import types
from dataclasses import dataclass

import torch

import kernels
from kernels.group_norm import combine_stats, group_norm_apply, group_stats

kernels.check_ours(kernels)

SUPPORTED = ("UNetMotionModel",)
_ATTR = "_dlm_streamline"


@dataclass(frozen=True)
class StreamlineConfig:
    """slices: pieces of the batch x frames dimension for spatial operators.
    temporal_slices: pieces of the image rows for temporal (motion) modules; None means ``slices``.
    Either one above the dimension it slices raises ValueError at call time (never clamped silently).
    """

    slices: int = 4
    temporal_slices: int | None = None

    def validate(self) -> "StreamlineConfig":
        if not isinstance(self.slices, int) or self.slices < 1:
            raise ValueError(f"slices must be an int >= 1, got {self.slices!r}")
        t = self.temporal_slices
        if t is not None and (not isinstance(t, int) or t < 1):
            raise ValueError(f"temporal_slices must be an int >= 1 or None, got {t!r}")
        return self

    @property
    def t_slices(self) -> int:
        return self.slices if self.temporal_slices is None else self.temporal_slices


def _unet_of(pipe_or_model):
    m = getattr(pipe_or_model, "unet", pipe_or_model)
    name = type(m).__name__
    if name not in SUPPORTED:
        raise ValueError(f"streamline does not know model type {name}; supported: {', '.join(SUPPORTED)}")
    return m


def _check_slices(n: int, slices: int, what: str) -> None:
    if slices > n:
        raise ValueError(f"{what}={slices} is larger than the dimension it slices ({n}); use at most {n}")


def _cat(outs):
    """Concatenate per-slice outputs: tensors, tuples of tensors, or diffusers outputs (.sample)."""
    first = outs[0]
    if isinstance(first, torch.Tensor):
        return torch.cat(outs, 0)
    if isinstance(first, tuple):
        return (torch.cat([o[0] for o in outs], 0),) + tuple(first[1:])
    first.sample = torch.cat([o.sample for o in outs], 0)
    return first


def _spatial_forward(orig, slices):
    """Run ``orig`` per slice of dim 0 of its first input; other tensors with that dim 0 follow."""

    def forward(*args, **kwargs):
        x = args[0] if args else next(kwargs[k] for k in ("hidden_states", "input_tensor", "sample") if k in kwargs)
        n = x.shape[0]
        _check_slices(n, slices, "slices")
        bounds = torch.arange(n).chunk(slices)

        def part(v, a, b):
            return v[a:b] if isinstance(v, torch.Tensor) and v.dim() > 0 and v.shape[0] == n else v

        outs = []
        for idx in bounds:
            a, b = int(idx[0]), int(idx[-1]) + 1
            outs.append(orig(*[part(v, a, b) for v in args],
                             **{k: part(v, a, b) for k, v in kwargs.items()}))
        return _cat(outs)

    return forward


def _motion_forward(mod, slices):
    """Exact sliced AnimateDiffTransformer3D.forward: GroupNorm with global stats, rows in slices."""

    def forward(hidden_states, encoder_hidden_states=None, timestep=None, class_labels=None,
                num_frames=1, cross_attention_kwargs=None):
        bf, c, h, w = hidden_states.shape
        b = bf // num_frames
        _check_slices(h, slices, "temporal_slices")
        x = hidden_states.reshape(b, num_frames, c, h, w).permute(0, 2, 1, 3, 4)  # view [B,C,F,H,W]
        norm = mod.norm
        rows = torch.arange(h).chunk(slices)
        spans = [(int(r[0]), int(r[-1]) + 1) for r in rows]
        # pass 1: per-(batch, group) sums of every row slice, combined in float64
        count = c // norm.num_groups * num_frames * h * w
        mean, rstd = combine_stats((group_stats(x[..., a:e, :].contiguous(), norm.num_groups) for a, e in spans),
                                   count, norm.eps)
        out = torch.empty_like(hidden_states)
        o5 = out.view(b, num_frames, c, h, w)
        for a, e in spans:
            # pass 2 + operator grouping: norm -> proj_in -> blocks -> proj_out on this slice only
            s = group_norm_apply(x[..., a:e, :].contiguous(), mean.to(x.dtype), rstd.to(x.dtype),
                                 norm.weight, norm.bias)
            hs = s.permute(0, 3, 4, 2, 1).reshape(b * (e - a) * w, num_frames, c)
            hs = mod.proj_in(hs)
            for blk in mod.transformer_blocks:
                hs = blk(hidden_states=hs, encoder_hidden_states=encoder_hidden_states, timestep=timestep,
                         cross_attention_kwargs=cross_attention_kwargs, class_labels=class_labels)
            hs = mod.proj_out(hs).reshape(b, e - a, w, num_frames, c).permute(0, 3, 4, 1, 2)
            o5[:, :, :, a:e, :] = hs + hidden_states.view(b, num_frames, c, h, w)[:, :, :, a:e, :]
        return out

    return forward


def _targets(unet):
    from diffusers.models.resnet import Downsample2D, ResnetBlock2D, Upsample2D
    from diffusers.models.transformers.transformer_2d import Transformer2DModel
    from diffusers.models.unets.unet_motion_model import AnimateDiffTransformer3D

    for m in unet.modules():
        if isinstance(m, AnimateDiffTransformer3D):
            yield m, "temporal"
        elif isinstance(m, (ResnetBlock2D, Transformer2DModel, Downsample2D, Upsample2D)):
            yield m, "spatial"


def streamline(pipe_or_model, slices: int = 4, temporal_slices: int | None = None, rehash=None):
    """Slice the operators of a diffusers video UNet in place; returns the model.

    pipe_or_model: a UNetMotionModel or a pipeline holding one as ``.unet``.
    Outputs equal the unsliced model's to float tolerance. Undo with :func:`unstreamline`.
    """
    cfg = StreamlineConfig(slices, temporal_slices).validate()
    if rehash is not None:
        raise ValueError("rehash is not implemented yet; pass rehash=None")
    unet = _unet_of(pipe_or_model)
    if getattr(unet, _ATTR, None) is not None:
        raise ValueError("model is already streamlined; call video.unstreamline first")
    patched = []
    for m, kind in _targets(unet):
        if "forward" in m.__dict__:
            raise ValueError(f"{type(m).__name__} already has a patched forward (another hook?)")
        fwd = _motion_forward(m, cfg.t_slices) if kind == "temporal" else _spatial_forward(m.forward, cfg.slices)
        m.forward = fwd
        patched.append(m)
    setattr(unet, _ATTR, (cfg, patched))
    return unet


def unstreamline(pipe_or_model):
    """Remove :func:`streamline`'s patches; the model runs unsliced again."""
    unet = _unet_of(pipe_or_model)
    state = getattr(unet, _ATTR, None)
    if state is None:
        return unet
    for m in state[1]:
        m.__dict__.pop("forward", None)
    setattr(unet, _ATTR, None)
    return unet
