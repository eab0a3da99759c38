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

Stable Video Diffusion (``UNetSpatioTemporalConditionModel``) is handled the same way: its spatial
ResNet blocks, up/down samplers and the spatial transformer blocks of each
``TransformerSpatioTemporalModel`` run per batch x frames slice; the temporal transformer blocks run
per slice of spatial tokens (their attention is over frames only); each ``TemporalResnetBlock`` (a
frames-only 3D convolution between two GroupNorms over channels x frames x height x width) runs per
slice of image rows with both norms made exact by the same two-pass statistics.

Latte (``LatteTransformer3DModel``, a video transformer alternating spatial and temporal blocks):
each spatial block sees ``[B*F, HW, C]`` and attends within a frame, each temporal block attends
over frames; both are exact per slice, so spatial blocks run on ``slices`` pieces of batch x frames
and temporal blocks on ``temporal_slices`` pieces of batch x spatial tokens, gathered from the
spatial layout so the model never makes diffusers' full-size permuted copies (``video.latte``).

Peak memory drops because attention scores and the MLP hidden states are only ever slice-sized.

Full-3D-attention video DiTs (``WanTransformer3DModel``, ``CogVideoXTransformer3DModel``,
``HunyuanVideoTransformer3DModel``): every transformer block runs in ``slices`` spans of video
tokens, attention per query span against all keys (exact softmax), the rest of the block fused per
span (``video.dit``).

Step Rehash (the paper's second component, ``rehash=caching.StepRehashConfig(...)``) is the
``caching.step_rehash`` hook on the UNet's deep blocks; it composes with slicing because streamline
patches the operators inside the blocks, never the blocks themselves.
"""

import types
from dataclasses import dataclass

import torch

import kernels
from kernels.group_norm import combine_stats, group_norm_apply, group_stats

kernels.check_ours(kernels)

from video.dit import SUPPORTED_DIT, dit_targets
from video.latte import latte_forward

SUPPORTED = ("UNetMotionModel", "UNetSpatioTemporalConditionModel", "LatteTransformer3DModel") + SUPPORTED_DIT
_ATTR = "_dlm_streamline"


@dataclass(frozen=True)
class StreamlineConfig:
    """slices: pieces of the batch x frames dimension for spatial operators.
    temporal_slices: pieces of the image rows for temporal (motion) modules; None means ``slices``.
    head_slices: groups of attention heads run one after another in a full-attention DiT (None: 1).
    Any of them above the dimension it slices raises ValueError at call time (never clamped silently).
    """

    slices: int = 4
    temporal_slices: int | None = None
    head_slices: int | None = None

    def validate(self) -> "StreamlineConfig":
        if not isinstance(self.slices, int) or self.slices < 1:
            raise ValueError(f"slices must be an int >= 1, got {self.slices!r}")
        t = self.temporal_slices
        if t is not None and (not isinstance(t, int) or t < 1):
            raise ValueError(f"temporal_slices must be an int >= 1 or None, got {t!r}")
        h = self.head_slices
        if h is not None and (not isinstance(h, int) or h < 1):
            raise ValueError(f"head_slices must be an int >= 1 or None, got {h!r}")
        return self

    @property
    def t_slices(self) -> int:
        return self.slices if self.temporal_slices is None else self.temporal_slices


def _unet_of(pipe_or_model):
    """The denoiser: the object itself, or a pipeline's ``.unet`` / ``.transformer``."""
    m = pipe_or_model
    for attr in ("unet", "transformer"):
        if getattr(pipe_or_model, attr, None) is not None:
            m = getattr(pipe_or_model, attr)
            break
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

        outs, full = [], None
        for idx in bounds:
            a, b = int(idx[0]), int(idx[-1]) + 1
            y = orig(*[part(v, a, b) for v in args], **{k: part(v, a, b) for k, v in kwargs.items()})
            if isinstance(y, torch.Tensor):  # write into one output buffer: no list of slices + cat copy
                if full is None:
                    full = y.new_empty((n,) + y.shape[1:])
                full[a:b] = y
            else:
                outs.append(y)
        return full if full is not None else _cat(outs)

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


def _token_forward(orig, slices):
    """Sliced TemporalBasicTransformerBlock.forward: each spatial token attends over frames only, so
    the block runs exactly on one slice of the ``seq_length`` tokens at a time."""

    def forward(hidden_states, num_frames, encoder_hidden_states=None):
        bf, n_tok, _ = hidden_states.shape
        b = bf // num_frames
        _check_slices(n_tok, slices, "temporal_slices")
        ctx = None if encoder_hidden_states is None else encoder_hidden_states.reshape(b, n_tok, *encoder_hidden_states.shape[1:])
        outs = []
        for idx in torch.arange(n_tok).chunk(slices):
            a, e = int(idx[0]), int(idx[-1]) + 1
            c = None if ctx is None else ctx[:, a:e].reshape(b * (e - a), *ctx.shape[2:])
            outs.append(orig(hidden_states[:, a:e], num_frames, encoder_hidden_states=c))
        return torch.cat(outs, 1)

    return forward


def _sliced_group_stats(x, groups, spans, eps):
    """Global GroupNorm statistics of ``x [B, C, F, H, W]`` from row slices (kernels.group_norm)."""
    count = x.shape[1] // groups * x.shape[2] * x.shape[3] * x.shape[4]
    return combine_stats((group_stats(x[..., a:e, :].contiguous(), groups) for a, e in spans), count, eps)


def _temporal_res_forward(mod, slices):
    """Exact sliced TemporalResnetBlock.forward over image rows.

    Both GroupNorms see channels x frames x rows x cols, so each gets global statistics first
    (pass 1) and then normalises one row slice at a time (pass 2); the (3, 1, 1) convolutions mix
    frames only, so they are exact per row slice. Holds the block input, one intermediate and the
    output at full size, never the norm/activation/conv temporaries.
    """

    def norm(x_slice, gn, stats):
        mean, rstd = stats
        return group_norm_apply(x_slice, mean.to(x_slice.dtype), rstd.to(x_slice.dtype), gn.weight, gn.bias)

    def forward(input_tensor, temb):
        b, _, f, h, w = input_tensor.shape
        _check_slices(h, slices, "temporal_slices")
        spans = [(int(r[0]), int(r[-1]) + 1) for r in torch.arange(h).chunk(slices)]
        t = None
        if mod.time_emb_proj is not None:
            t = mod.time_emb_proj(mod.nonlinearity(temb))[:, :, :, None, None].permute(0, 2, 1, 3, 4)
        stats1 = _sliced_group_stats(input_tensor, mod.norm1.num_groups, spans, mod.norm1.eps)
        mid = input_tensor.new_empty(b, mod.out_channels, f, h, w)
        for a, e in spans:
            hs = mod.conv1(mod.nonlinearity(norm(input_tensor[..., a:e, :].contiguous(), mod.norm1, stats1)))
            mid[..., a:e, :] = hs if t is None else hs + t
        stats2 = _sliced_group_stats(mid, mod.norm2.num_groups, spans, mod.norm2.eps)
        out = torch.empty_like(mid)
        for a, e in spans:
            hs = mod.conv2(mod.dropout(mod.nonlinearity(norm(mid[..., a:e, :].contiguous(), mod.norm2, stats2))))
            skip = input_tensor[..., a:e, :]
            out[..., a:e, :] = (skip if mod.conv_shortcut is None else mod.conv_shortcut(skip)) + hs
        return out

    return forward


def _spatiotemporal_res_forward(mod, slices):
    """SpatioTemporalResBlock.forward with the spatial/temporal blend done per slice of image rows.

    The spatial ResNet block and the temporal one run as patched (sliced) themselves; diffusers then
    blends their full-size outputs (``alpha * x_spatial + (1 - alpha) * x_temporal``) and copies the
    result back to ``[B*F, C, H, W]``, two more full-size temporaries. Here each row slice is blended
    and written straight into the output (operator grouping); alpha is per (batch, frame), so the
    slices are exact.
    """

    def forward(hidden_states, temb=None, image_only_indicator=None):
        num_frames = image_only_indicator.shape[-1]
        spatial = mod.spatial_res_block(hidden_states, temb)
        bf, c, h, w = spatial.shape
        b = bf // num_frames
        _check_slices(h, slices, "temporal_slices")
        mix = spatial.view(b, num_frames, c, h, w).permute(0, 2, 1, 3, 4)  # a view: [B, C, F, H, W]
        if temb is not None:
            temb = temb.reshape(b, num_frames, -1)
        temporal = mod.temporal_res_block(mix, temb)
        out = torch.empty_like(spatial)
        o5 = out.view(b, num_frames, c, h, w)
        for idx in torch.arange(h).chunk(slices):
            a, e = int(idx[0]), int(idx[-1]) + 1
            blend = mod.time_mixer(x_spatial=mix[..., a:e, :], x_temporal=temporal[..., a:e, :],
                                   image_only_indicator=image_only_indicator)
            o5[..., a:e, :] = blend.permute(0, 2, 1, 3, 4)
        return out

    return forward


def _freeu_on(up_block) -> bool:
    """FreeU is enabled on this up block (``enable_freeu`` sets all four factors)."""
    return all(getattr(up_block, k, None) for k in ("s1", "s2", "b1", "b2"))


class _UpsampleHandoff:
    """Moves an up block's upsampler into the next up block's first ResNet slice loop (operator grouping).

    In UNetMotionModel the output of up block i (upsampled to the next resolution, ``[B*F, C, 2H, 2W]``)
    is only ever the input of up block i+1, which immediately concatenates it with a skip connection
    and runs a ResNet block per slice. Block i therefore returns its pre-upsample output (a quarter of
    the size) and block i+1 upsamples each slice just before its concatenation, so the full-size
    upsampled tensor never exists. Exact: Upsample2D (interpolation + convolution) is per frame.

    Deferral happens only inside a call of the UNet without autograd (a forward pre-hook opens the
    window), when both blocks still run our forward (no cache hook or torch hook wraps either) and
    FreeU is off; the UNet's forward hook checks that the next block took the tensor, so a broken chain
    fails loudly.
    """

    def __init__(self, up_blocks):
        self.up_blocks = list(up_blocks)
        self.forwards = {}  # id(block) -> the forward streamline installed
        self.pending = None  # (pre-upsample tensor, upsamplers, upsample_size)
        self.in_call = False

    def open(self, *_):
        self.in_call, self.pending = True, None

    def close(self, *_):
        pending, self.in_call, self.pending = self.pending, False, None
        if pending is not None:
            raise RuntimeError("video.streamline: an up block deferred its upsample but the next block never "
                               "took it; call video.unstreamline and report the model")

    def _plain(self, block) -> bool:
        ours = block.__dict__.get("forward") is self.forwards.get(id(block))
        return ours and not _freeu_on(block) and not block._forward_hooks and not block._forward_pre_hooks

    def can_defer(self, block) -> bool:
        # Not with autograd on: gradient checkpointing re-runs a block outside the UNet's call, where
        # the handoff is closed, and would then see a pre-upsample input (pipelines run without grad).
        if torch.is_grad_enabled() or not self.in_call:
            return False
        i = next((k for k, b in enumerate(self.up_blocks) if b is block), None)
        if i is None or i + 1 >= len(self.up_blocks) or len(block.upsamplers or []) != 1:
            return False
        return self._plain(block) and self._plain(self.up_blocks[i + 1])

    def take(self, hidden_states):
        """The (upsampler, size) deferred for ``hidden_states`` by the previous block, or None."""
        if self.pending is None:
            return None
        low, upsamplers, size = self.pending
        if low is not hidden_states:
            raise RuntimeError("video.streamline: an up block's deferred upsample reached a different tensor")
        self.pending = None
        return upsamplers[0], size


def _up_motion_forward(mod, slices, handoff=None):
    """UpBlockMotion / CrossAttnUpBlockMotion.forward with each skip concatenation fused into its
    ResNet block, per slice of batch x frames.

    diffusers concatenates the block input with the skip connection at full size (``[B*F, C + C_skip,
    H, W]``) and then runs the ResNet block; here each slice is concatenated and run through the ResNet
    block on its own (operator grouping), so the widened tensor only ever exists slice-sized. Exact:
    the ResNet block is per frame. With a ``handoff`` the upsampler moves into the next block's first
    slice loop (see ``_UpsampleHandoff``). FreeU falls back to diffusers' forward.
    """
    original = type(mod).forward

    def forward(hidden_states, res_hidden_states_tuple, temb=None, encoder_hidden_states=None,
                cross_attention_kwargs=None, upsample_size=None, attention_mask=None,
                encoder_attention_mask=None, num_frames=1, *args, **kwargs):
        if _freeu_on(mod):  # FreeU rescales the full tensors
            extra = {} if not hasattr(mod, "attentions") else dict(
                encoder_hidden_states=encoder_hidden_states, cross_attention_kwargs=cross_attention_kwargs,
                attention_mask=attention_mask, encoder_attention_mask=encoder_attention_mask)
            return original(mod, hidden_states, res_hidden_states_tuple, temb=temb, upsample_size=upsample_size,
                            num_frames=num_frames, **extra)
        upsample = handoff.take(hidden_states) if handoff is not None else None
        attentions = getattr(mod, "attentions", None) or [None] * len(mod.resnets)
        for resnet, attn, motion in zip(mod.resnets, attentions, mod.motion_modules):
            skip = res_hidden_states_tuple[-1]
            res_hidden_states_tuple = res_hidden_states_tuple[:-1]
            hidden_states = _cat_resnet(resnet, hidden_states, skip, temb, slices, upsample)
            upsample = None
            if attn is not None:
                hidden_states = attn(hidden_states=hidden_states, encoder_hidden_states=encoder_hidden_states,
                                     cross_attention_kwargs=cross_attention_kwargs, attention_mask=attention_mask,
                                     encoder_attention_mask=encoder_attention_mask, return_dict=False)[0]
            hidden_states = motion(hidden_states, num_frames=num_frames)
        if handoff is not None and handoff.can_defer(mod):
            handoff.pending = (hidden_states, mod.upsamplers, upsample_size)
            return hidden_states
        for upsampler in mod.upsamplers or []:
            hidden_states = upsampler(hidden_states=hidden_states, output_size=upsample_size)
        return hidden_states

    if handoff is not None:
        handoff.forwards[id(mod)] = forward
    return forward


def _cat_resnet(resnet, x, skip, temb, slices, upsample=None):
    """``resnet(cat([x, skip], 1), temb)`` computed per slice of dim 0 into one output buffer.

    upsample: None, or ``(Upsample2D, output_size)`` applied to each slice of ``x`` first (the
    previous up block's deferred upsampler).
    """
    n = x.shape[0]
    _check_slices(n, slices, "slices")
    run = type(resnet).forward  # the unpatched block: this loop is the slicing
    out = None
    for idx in torch.arange(n).chunk(slices):
        a, b = int(idx[0]), int(idx[-1]) + 1
        t = temb[a:b] if temb is not None and temb.dim() > 0 and temb.shape[0] == n else temb
        xs = x[a:b]
        if upsample is not None:
            up, size = upsample
            xs = type(up).forward(up, xs, output_size=size)  # unpatched: per slice already
        y = run(resnet, torch.cat([xs, skip[a:b]], dim=1), t)
        if out is None:
            out = y.new_empty((n,) + y.shape[1:])
        out[a:b] = y
    return out


def _targets(unet):
    from diffusers.models.resnet import (Downsample2D, ResnetBlock2D, SpatioTemporalResBlock, TemporalResnetBlock,
                                         Upsample2D)
    from diffusers.models.transformers.transformer_2d import Transformer2DModel
    from diffusers.models.transformers.latte_transformer_3d import LatteTransformer3DModel
    from diffusers.models.transformers.transformer_temporal import TransformerSpatioTemporalModel
    from diffusers.models.unets.unet_motion_model import AnimateDiffTransformer3D, CrossAttnUpBlockMotion, UpBlockMotion

    for m in unet.modules():
        if isinstance(m, AnimateDiffTransformer3D):
            yield m, "temporal"
        elif isinstance(m, (UpBlockMotion, CrossAttnUpBlockMotion)):  # its children are patched too
            yield m, "up_motion"
        elif isinstance(m, SpatioTemporalResBlock):  # its two children are patched too (listed after it)
            yield m, "spatiotemporal_res"
        elif isinstance(m, TemporalResnetBlock):
            yield m, "temporal_res"
        elif isinstance(m, LatteTransformer3DModel):  # its forward keeps the spatial layout (video.latte)
            yield m, "latte_model"
            for blk in m.transformer_blocks:
                yield blk, "spatial"
        elif isinstance(m, TransformerSpatioTemporalModel):
            for blk in m.transformer_blocks:
                yield blk, "spatial"
            for blk in m.temporal_transformer_blocks:
                yield blk, "tokens"
        elif isinstance(m, (ResnetBlock2D, Transformer2DModel, Downsample2D, Upsample2D)):
            yield m, "spatial"


def _sliced_forward(m, kind, cfg, handoff=None):
    if kind == "temporal":
        return _motion_forward(m, cfg.t_slices)
    if kind == "temporal_res":
        return _temporal_res_forward(m, cfg.t_slices)
    if kind == "up_motion":
        return _up_motion_forward(m, cfg.slices, handoff)
    if kind == "spatiotemporal_res":
        return _spatiotemporal_res_forward(m, cfg.t_slices)
    if kind == "tokens":
        return _token_forward(m.forward, cfg.t_slices)
    if kind == "latte_model":
        return latte_forward(m, cfg.slices, cfg.t_slices)
    return _spatial_forward(m.forward, cfg.slices)


def streamline(pipe_or_model, slices: int = 4, temporal_slices: int | None = None, rehash=None,
               head_slices: int | None = None):
    """Slice the operators of a diffusers video UNet in place; returns the model.

    pipe_or_model: a UNetMotionModel (AnimateDiff), UNetSpatioTemporalConditionModel (Stable Video
        Diffusion) or LatteTransformer3DModel (Latte), or a pipeline holding one as ``.unet`` or
        ``.transformer``.
    slices: pieces of the batch x frames dimension for spatial operators.
    temporal_slices: pieces of the image rows (motion modules, temporal ResNet blocks) or of the
        spatial tokens (SVD's and Latte's temporal transformer blocks); None means ``slices``.
    rehash: a ``caching.StepRehashConfig`` to also attach Step Rehash (UNets only: UNetMotionModel,
        UNetSpatioTemporalConditionModel); its tracker is ``video.rehash_tracker(model)``.
    Full-attention DiTs (WanTransformer3DModel, CogVideoXTransformer3DModel,
        HunyuanVideoTransformer3DModel): ``slices`` is the number of video-token spans each block runs
        in (query-sliced exact attention, token-sliced FFN; ``video.dit``); ``head_slices`` groups of
        heads run one after another (K/V memory / head_slices, q/k/v projections recomputed per
        group); ``temporal_slices`` does not apply and must be None.
    Outputs equal the unsliced model's to float tolerance (with ``rehash``: the unsliced model with
    the same Step Rehash). Undo with :func:`unstreamline`.
    """
    cfg = StreamlineConfig(slices, temporal_slices, head_slices).validate()
    unet = _unet_of(pipe_or_model)
    if getattr(unet, _ATTR, None) is not None:
        raise ValueError("model is already streamlined; call video.unstreamline first")
    if type(unet).__name__ in SUPPORTED_DIT:
        return _streamline_dit(unet, cfg, rehash)
    if head_slices is not None:
        raise ValueError(f"head_slices applies to full-attention DiTs ({', '.join(SUPPORTED_DIT)}) only; "
                         f"leave it None for {type(unet).__name__}")
    tracker = _attach_rehash(unet, rehash)
    patched, handles = [], []
    handoff = _UpsampleHandoff(unet.up_blocks) if type(unet).__name__ == "UNetMotionModel" else None
    try:
        for m, kind in _targets(unet):
            if "forward" in m.__dict__:
                if kind == "up_motion":  # wrapped by a cache hook (Step Rehash): keep it, its operators are sliced
                    continue
                raise ValueError(f"{type(m).__name__} already has a patched forward (another hook?)")
            m.forward = _sliced_forward(m, kind, cfg, handoff)
            patched.append(m)
    except ValueError:
        _unpatch(unet, patched, tracker)
        raise
    if handoff is not None:
        handles = [unet.register_forward_pre_hook(handoff.open), unet.register_forward_hook(handoff.close)]
    setattr(unet, _ATTR, (cfg, patched, tracker, handles))
    return unet


def _streamline_dit(model, cfg, rehash):
    """Patch every transformer block of a full-attention DiT with its sliced forward (``video.dit``)."""
    if cfg.temporal_slices is not None:
        raise ValueError("temporal_slices does not apply to full-attention DiTs (no temporal-only operator); "
                         "leave it None and set slices")
    if rehash is not None:
        raise ValueError(f"rehash (Step Rehash) needs a UNet; {type(model).__name__} is a transformer "
                         "(use caching.BlockCacheConfig there)")
    targets = list(dit_targets(model))  # validates every block and processor before patching any
    for block, _ in targets:
        if "forward" in block.__dict__:
            raise ValueError(f"{type(block).__name__} already has a patched forward (another hook?)")
    patched = []
    for block, factory in targets:
        block.forward = factory(block, cfg.slices, cfg.head_slices or 1)
        patched.append(block)
    setattr(model, _ATTR, (cfg, patched, None, []))
    return model


def _attach_rehash(unet, rehash):
    """Attach Step Rehash first (it validates the model and config) so a failure leaves nothing patched."""
    if rehash is None:
        return None
    import caching

    if not isinstance(rehash, caching.StepRehashConfig):
        raise ValueError(f"rehash must be a caching.StepRehashConfig or None, got {type(rehash).__name__}")
    return caching.apply(unet, rehash)


def _unpatch(unet, patched, tracker) -> None:
    for m in patched:
        m.__dict__.pop("forward", None)
    if tracker is not None:
        import caching

        caching.remove(unet)


def rehash_tracker(pipe_or_model):
    """The ``caching.StepTracker`` of the Step Rehash that :func:`streamline` attached, or None."""
    state = getattr(_unet_of(pipe_or_model), _ATTR, None)
    return None if state is None else state[2]


def unstreamline(pipe_or_model):
    """Remove :func:`streamline`'s patches and its Step Rehash; the model runs unsliced again."""
    unet = _unet_of(pipe_or_model)
    state = getattr(unet, _ATTR, None)
    if state is None:
        return unet
    _unpatch(unet, state[1], state[2])
    for handle in state[3]:
        handle.remove()
    setattr(unet, _ATTR, None)
    return unet
