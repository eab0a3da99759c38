"""Exact sliced blocks for full-3D-attention video DiTs: Wan, CogVideoX, HunyuanVideo (diffusers).

Streamlined Inference (Zhan et al., ECCV 2024) slices operators and groups those that follow so
that no full-size intermediate of a block exists at once. In a full-attention DiT the peak is the
attention over every token of the clip and the FFN's widened hidden state, so the slice is a span
of *tokens* and attention is computed per query span against all keys (exact softmax, see
``video.dit_attention``). Each block forward below is a two-pass rewrite of diffusers' own:

- pass 1, per token span: norm + adaLN modulation -> key/value projections -> qk-norm -> RoPE
  into full K/V buffers;
- pass 2, per token span: the same norm -> query -> attention against all keys, into one
  attention-output buffer;
- pass 3, per token span: output projection -> gated residual -> (cross-attention) -> norm -> FFN
  -> gated residual, written over the span's own rows of that buffer (the block output).

Norms, modulation, RoPE and the FFN are per token, so every value equals diffusers' up to float
rounding of the smaller matrix products. Text tokens of CogVideoX / HunyuanVideo (joint
attention) are one more span; video tokens are cut into ``chunks`` spans.

Each ``*_block_forward(block, chunks, head_slices)`` returns a function with the block's forward
signature; ``head_slices`` > 1 runs the attention one group of heads at a time (less memory for
K/V, the norm and q/k/v projections recomputed per group).
"""

import torch

from video.dit_attention import attend, attention_by_spans, head_linear, query_chunks, rows, token_spans

SUPPORTED_DIT = ("WanTransformer3DModel", "CogVideoXTransformer3DModel", "HunyuanVideoTransformer3DModel")


# ----------------------------------------------------------------------------------------------- Wan
def _wan_rope(x, cos, sin):
    """Wan's interleaved rotary embedding on ``x [B, n, H, d]`` with ``cos, sin [1, n, 1, d]``."""
    pairs = x.unflatten(-1, (-1, 2))
    even, odd = pairs[..., 0], pairs[..., 1]
    c, s = cos[..., 0::2], sin[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = even * c - odd * s
    out[..., 1::2] = even * s + odd * c
    return out


def _wan_cross_kv(attn, ctx):
    """Keys/values of the cross-attention context, computed once per block call (diffusers recomputes
    nothing per query, so neither do we): ``[(k, v)]`` for text, plus image context for I2V."""
    heads = attn.heads
    ctx_img = None
    if attn.add_k_proj is not None:  # I2V: the first tokens are image context, the last 512 text
        n_img = ctx.shape[1] - 512
        ctx_img, ctx = ctx[:, :n_img], ctx[:, n_img:]
    kv = [(attn.norm_k(attn.to_k(ctx)).unflatten(2, (heads, -1)), attn.to_v(ctx).unflatten(2, (heads, -1)))]
    if ctx_img is not None:
        k_img = attn.norm_added_k(attn.add_k_proj(ctx_img)).unflatten(2, (heads, -1))
        kv.append((k_img, attn.add_v_proj(ctx_img).unflatten(2, (heads, -1))))
    return kv


def _wan_cross(attn, h, kv):
    """WanAttnProcessor's cross-attention for one span of queries ``h [B, n, D]``."""
    q = attn.norm_q(attn.to_q(h)).unflatten(2, (attn.heads, -1))
    backend = attn.processor._attention_backend
    out = None
    for k, v in reversed(kv):  # image context first, then text: the order diffusers adds them in
        o = attend(q, k, v, backend=backend).flatten(2, 3).type_as(q)
        out = o if out is None else o + out
    return attn.to_out[1](attn.to_out[0](out))


def _output_over(buf, like):
    """Pass 3 writes each span's block output over its own rows of the attention-output buffer when
    dtypes agree (rows a:b of the output depend on rows a:b of the buffer only); else a new tensor."""
    return buf if buf.dtype == like.dtype else buf.new_empty(buf.shape, dtype=like.dtype)


def wan_block_forward(block, chunks: int, head_slices: int = 1):
    """Sliced ``WanTransformerBlock.forward(hidden_states [B, N, D], encoder_hidden_states, temb,
    rotary_emb)`` -> ``[B, N, D]``."""
    attn, heads = block.attn1, block.attn1.heads

    def forward(hidden_states, encoder_hidden_states, temb, rotary_emb):
        n = hidden_states.shape[1]
        segs = [(None, a, b, a, b) for a, b in token_spans(n, chunks)]
        qsegs = [(None, a, b, a, b) for a, b in token_spans(n, query_chunks(n, chunks))]
        if temb.ndim == 4:  # per-token modulation (Wan 2.2 TI2V): [B, N, 6, D]
            mods = [m.squeeze(2) for m in (block.scale_shift_table.unsqueeze(0) + temb.float()).chunk(6, dim=2)]
        else:
            mods = (block.scale_shift_table + temb.float()).chunk(6, dim=1)
        shift, scale, gate, c_shift, c_scale, c_gate = mods
        cos, sin = rotary_emb

        def norm1(seg):
            _, a, b, _, _ = seg
            x = hidden_states[:, a:b]
            return (block.norm1(x.float()) * (1 + rows(scale, a, b, n)) + rows(shift, a, b, n)).type_as(x)

        # Wan's qk RMSNorm spans all heads, so q and k are projected whole and sliced; v per group
        def kv_of(seg, h0, h1):
            h, a, b = norm1(seg), seg[1], seg[2]
            k = attn.norm_k(attn.to_k(h)).unflatten(2, (heads, -1))[:, :, h0:h1]
            return _wan_rope(k, cos[:, a:b], sin[:, a:b]), head_linear(attn.to_v, h, h0, h1, heads)

        def q_of(seg, h0, h1):
            a, b = seg[1], seg[2]
            q = attn.norm_q(attn.to_q(norm1(seg))).unflatten(2, (heads, -1))[:, :, h0:h1]
            return _wan_rope(q, cos[:, a:b], sin[:, a:b])

        backend = attn.processor._attention_backend
        o_all = attention_by_spans(segs, n, heads, head_slices, kv_of, q_of,
                                   lambda q, k, v: attend(q, k, v, backend=backend), qsegs)
        cross = _wan_cross_kv(block.attn2, encoder_hidden_states)
        out = _output_over(o_all, hidden_states)
        for _, a, b, _, _ in segs:  # pass 3: the rest of the block, span by span
            x = hidden_states[:, a:b]
            o = attn.to_out[1](attn.to_out[0](o_all[:, a:b]))
            x = (x.float() + o * rows(gate, a, b, n)).type_as(x)
            x = x + _wan_cross(block.attn2, block.norm2(x.float()).type_as(x), cross)
            h = (block.norm3(x.float()) * (1 + rows(c_scale, a, b, n)) + rows(c_shift, a, b, n)).type_as(x)
            out[:, a:b] = (x.float() + block.ffn(h).float() * rows(c_gate, a, b, n)).type_as(x)
        return out

    return forward


# ------------------------------------------------------------------------------------------ CogVideoX
def _segments(video_len: int, text_len: int, chunks: int, text_first: bool):
    """Spans of a joint [text, video] (or [video, text]) sequence: ``(is_text, local a, local b,
    global a, global b)``; the video is cut into ``chunks`` spans, the (short) text is one span."""
    video = [(False, a, b) for a, b in token_spans(video_len, chunks)]
    text = [(True, 0, text_len)] if text_len else []
    order = text + video if text_first else video + text
    out, g = [], 0
    for is_text, a, b in order:
        out.append((is_text, a, b, g, g + b - a))
        g += b - a
    return out


def cogvideox_block_forward(block, chunks: int, head_slices: int = 1):
    """Sliced ``CogVideoXBlock.forward(hidden_states [B, N, D], encoder_hidden_states [B, T, D], temb,
    image_rotary_emb=None, attention_kwargs=None)`` -> (video ``[B, N, D]``, text ``[B, T, D]``)."""
    from diffusers.models.embeddings import apply_rotary_emb

    attn = block.attn1
    heads = attn.heads

    def forward(hidden_states, encoder_hidden_states, temb, image_rotary_emb=None, attention_kwargs=None):
        if attention_kwargs and attention_kwargs.get("attention_mask") is not None:
            raise ValueError("video.streamline: CogVideoXBlock with an attention_mask cannot be sliced; "
                             "call video.unstreamline")
        n, t = hidden_states.shape[1], encoder_hidden_states.shape[1]
        segs = _segments(n, t, chunks, text_first=True)
        qsegs = _segments(n, t, query_chunks(n, chunks), text_first=True)
        m1 = block.norm1.linear(block.norm1.silu(temb)).chunk(6, dim=1)
        m2 = block.norm2.linear(block.norm2.silu(temb)).chunk(6, dim=1)

        def src(seg):
            return (encoder_hidden_states if seg[0] else hidden_states)[:, seg[1]:seg[2]]

        def modulate(norm, mods, x, is_text):
            shift, scale = (mods[3], mods[4]) if is_text else (mods[0], mods[1])
            return norm.norm(x) * (1 + scale)[:, None, :] + shift[:, None, :]

        def project(lin, norm, h, seg, h0, h1):
            # diffusers applies the per-head LayerNorm and RoPE on [B, H, n, d]; ours is [B, n, H, d]
            y = head_linear(lin, h, h0, h1, heads).transpose(1, 2)
            if norm is not None:
                y = norm(y)
            if image_rotary_emb is not None and not seg[0]:
                y = apply_rotary_emb(y, (image_rotary_emb[0][seg[1]:seg[2]], image_rotary_emb[1][seg[1]:seg[2]]))
            return y.transpose(1, 2)

        def kv_of(seg, h0, h1):
            h = modulate(block.norm1, m1, src(seg), seg[0])
            return project(attn.to_k, attn.norm_k, h, seg, h0, h1), head_linear(attn.to_v, h, h0, h1, heads)

        def q_of(seg, h0, h1):
            return project(attn.to_q, attn.norm_q, modulate(block.norm1, m1, src(seg), seg[0]), seg, h0, h1)

        def sdpa(q, k, v):  # CogVideoXAttnProcessor2_0 calls torch's SDPA directly on [B, H, S, d]
            o = torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                                                 v.transpose(1, 2), dropout_p=0.0, is_causal=False)
            return o.transpose(1, 2)

        o_all = attention_by_spans(segs, n + t, heads, head_slices, kv_of, q_of, sdpa, qsegs)
        out_all = _output_over(o_all, hidden_states)
        for seg in segs:  # pass 3
            is_text, _, _, ga, gb = seg
            x = src(seg)
            o = attn.to_out[1](attn.to_out[0](o_all[:, ga:gb]))
            x = x + (m1[5] if is_text else m1[2])[:, None, :] * o
            ff = block.ff(modulate(block.norm2, m2, x, is_text))
            out_all[:, ga:gb] = x + (m2[5] if is_text else m2[2])[:, None, :] * ff
        return out_all[:, t:], out_all[:, :t]

    return forward


# --------------------------------------------------------------------------------------- HunyuanVideo
def _hunyuan_rope(y, freqs, a, b):
    from diffusers.models.embeddings import apply_rotary_emb

    return apply_rotary_emb(y, (freqs[0][a:b], freqs[1][a:b]), sequence_dim=1)


def _hunyuan_qk(attn, h, seg, freqs, lin, norm, h0, h1):
    """One span's query or key for heads ``h0:h1``: projection, per-head RMSNorm, RoPE on video rows."""
    y = head_linear(lin, h, h0, h1, attn.heads)
    if norm is not None:
        y = norm(y)
    if freqs is not None and not seg[0]:
        y = _hunyuan_rope(y, freqs, seg[1], seg[2])
    return y


def hunyuan_double_block_forward(block, chunks: int, head_slices: int = 1):
    """Sliced ``HunyuanVideoTransformerBlock.forward(hidden_states [B, N, D], encoder_hidden_states
    [B, T, D], temb, attention_mask=None, freqs_cis=None, *args)`` -> (video, text): two streams with
    their own weights, joint attention over [video, text]."""
    attn = block.attn
    heads = attn.heads

    def forward(hidden_states, encoder_hidden_states, temb, attention_mask=None, freqs_cis=None, *args, **kwargs):
        n, t = hidden_states.shape[1], encoder_hidden_states.shape[1]
        segs = _segments(n, t, chunks, text_first=False)
        qsegs = _segments(n, t, query_chunks(n, chunks), text_first=False)
        mv = block.norm1.linear(block.norm1.silu(temb)).chunk(6, dim=1)  # shift, scale, gate (msa, mlp)
        mt = block.norm1_context.linear(block.norm1_context.silu(temb)).chunk(6, dim=1)

        def src(seg):
            return (encoder_hidden_states if seg[0] else hidden_states)[:, seg[1]:seg[2]]

        def norm_in(seg):
            norm, m = (block.norm1_context, mt) if seg[0] else (block.norm1, mv)
            return norm.norm(src(seg)) * (1 + m[1][:, None]) + m[0][:, None]

        def kv_of(seg, h0, h1):
            h = norm_in(seg)
            if seg[0]:
                return (_hunyuan_qk(attn, h, seg, None, attn.add_k_proj, attn.norm_added_k, h0, h1),
                        head_linear(attn.add_v_proj, h, h0, h1, heads))
            return (_hunyuan_qk(attn, h, seg, freqs_cis, attn.to_k, attn.norm_k, h0, h1),
                    head_linear(attn.to_v, h, h0, h1, heads))

        def q_of(seg, h0, h1):
            lin, norm = (attn.add_q_proj, attn.norm_added_q) if seg[0] else (attn.to_q, attn.norm_q)
            return _hunyuan_qk(attn, norm_in(seg), seg, freqs_cis, lin, norm, h0, h1)

        backend = attn.processor._attention_backend
        o_all = attention_by_spans(segs, n + t, heads, head_slices, kv_of, q_of,
                                   lambda q, k, v: attend(q, k, v, attention_mask, backend), qsegs)
        out_all = _output_over(o_all, hidden_states)
        for seg in segs:  # pass 3
            is_text, _, _, ga, gb = seg
            x, o = src(seg), o_all[:, ga:gb]
            if is_text:
                o, m, norm2, ff = attn.to_add_out(o), mt, block.norm2_context, block.ff_context
            else:
                o, m, norm2, ff = attn.to_out[1](attn.to_out[0](o)), mv, block.norm2, block.ff
            x = x + o * m[2].unsqueeze(1)
            h = norm2(x) * (1 + m[4][:, None]) + m[3][:, None]
            out_all[:, ga:gb] = x + m[5].unsqueeze(1) * ff(h)
        return out_all[:, :n], out_all[:, n:]

    return forward


def hunyuan_single_block_forward(block, chunks: int, head_slices: int = 1):
    """Sliced ``HunyuanVideoSingleTransformerBlock.forward``: one stream over [video, text] with a
    parallel attention + MLP branch; returns views of one ``[B, N + T, D]`` output, as diffusers does."""
    attn = block.attn
    heads = attn.heads

    def forward(hidden_states, encoder_hidden_states, temb, attention_mask=None, image_rotary_emb=None,
                *args, **kwargs):
        n, t = hidden_states.shape[1], encoder_hidden_states.shape[1]
        segs = _segments(n, t, chunks, text_first=False)
        qsegs = _segments(n, t, query_chunks(n, chunks), text_first=False)
        shift, scale, gate = block.norm.linear(block.norm.silu(temb)).chunk(3, dim=1)

        def src(seg):
            return (encoder_hidden_states if seg[0] else hidden_states)[:, seg[1]:seg[2]]

        def norm_in(seg):
            return block.norm.norm(src(seg)) * (1 + scale[:, None]) + shift[:, None]

        def kv_of(seg, h0, h1):
            h = norm_in(seg)
            return (_hunyuan_qk(attn, h, seg, image_rotary_emb, attn.to_k, attn.norm_k, h0, h1),
                    head_linear(attn.to_v, h, h0, h1, heads))

        def q_of(seg, h0, h1):
            return _hunyuan_qk(attn, norm_in(seg), seg, image_rotary_emb, attn.to_q, attn.norm_q, h0, h1)

        backend = attn.processor._attention_backend
        o_all = attention_by_spans(segs, n + t, heads, head_slices, kv_of, q_of,
                                   lambda q, k, v: attend(q, k, v, attention_mask, backend), qsegs)
        out_all = _output_over(o_all, hidden_states)
        for seg in segs:  # pass 3: the MLP branch and the joint output projection, span by span
            ga, gb = seg[3], seg[4]
            mlp = block.act_mlp(block.proj_mlp(norm_in(seg)))
            out_all[:, ga:gb] = gate.unsqueeze(1) * block.proj_out(torch.cat([o_all[:, ga:gb], mlp], dim=2)) + src(seg)
        return out_all[:, :n], out_all[:, n:]

    return forward


# -------------------------------------------------------------------------------------- output head
def token_span_forward(module, chunks: int):
    """``module.forward(x [B, N, D], *per_sample_args)`` run per span of the N tokens into one output
    buffer: for the per-token output norms after the last block (LayerNorm, adaLN), so that their
    full-size temporaries (normalised, scaled, shifted copies) exist only span-sized."""
    orig = type(module).forward

    def forward(x, *args, **kwargs):
        out = None
        for a, b in token_spans(x.shape[1], chunks):
            y = orig(module, x[:, a:b], *args, **kwargs)
            if out is None:
                out = y.new_empty((y.shape[0], x.shape[1]) + tuple(y.shape[2:]))
            out[:, a:b] = y
        return out

    return forward


def wan_model_forward(model, chunks: int):
    """``WanTransformer3DModel.forward`` (bound to ``model``) with its output head run per token span.

    diffusers' Wan forward computes the head inline on the whole clip: ``norm_out(x.float())``, then the
    adaLN scale and shift, each a full-size float32 temporary (two hidden widths per token each in bf16,
    more than a sliced block holds) before ``proj_out`` narrows it to ``out_channels * prod(patch)``.
    Here everything before the head is diffusers' sequence (rotary tables, patch embedding, condition
    embedder, the blocks as streamline patched them) and the head runs span by span into one
    ``[B, N, out]`` buffer, then is unpatchified as diffusers does. The head is per token, so each row
    equals diffusers'.
    """
    from diffusers.models.modeling_outputs import Transformer2DModelOutput
    from diffusers.utils import apply_lora_scale

    def head(self, x, temb):
        """norm_out -> adaLN -> proj_out of ``x [B, N, D]`` per span; ``temb [B, D]`` or ``[B, N, D]`` (TI2V)."""
        if temb.ndim == 3:
            shift, scale = (self.scale_shift_table.unsqueeze(0).to(temb.device) + temb.unsqueeze(2)).chunk(2, dim=2)
            shift, scale = shift.squeeze(2), scale.squeeze(2)
        else:
            shift, scale = (self.scale_shift_table.to(temb.device) + temb.unsqueeze(1)).chunk(2, dim=1)
        shift, scale = shift.to(x.device), scale.to(x.device)
        n, out = x.shape[1], None
        for a, b in token_spans(n, chunks):
            y = (self.norm_out(x[:, a:b].float()) * (1 + rows(scale, a, b, n)) + rows(shift, a, b, n)).type_as(x)
            y = self.proj_out(y)
            if out is None:
                out = y.new_empty((y.shape[0], n, y.shape[2]))
            out[:, a:b] = y
        return out

    @apply_lora_scale("attention_kwargs")
    def forward(self, hidden_states, timestep, encoder_hidden_states, encoder_hidden_states_image=None,
                return_dict=True, attention_kwargs=None):
        batch, _, frames, height, width = hidden_states.shape
        p_t, p_h, p_w = self.config.patch_size
        rotary_emb = self.rope(hidden_states)
        x = self.patch_embedding(hidden_states).flatten(2).transpose(1, 2).contiguous()
        ts_seq_len = None
        if timestep.ndim == 2:  # a timestep per token (Wan 2.2 TI2V)
            ts_seq_len = timestep.shape[1]
            timestep = timestep.flatten()
        temb, timestep_proj, ctx, ctx_img = self.condition_embedder(
            timestep, encoder_hidden_states, encoder_hidden_states_image, timestep_seq_len=ts_seq_len)
        timestep_proj = timestep_proj.unflatten(1 if ts_seq_len is None else 2, (6, -1))
        if ctx_img is not None:
            ctx = torch.concat([ctx_img, ctx], dim=1)
        checkpoint = torch.is_grad_enabled() and self.gradient_checkpointing
        for block in self.blocks:
            x = (self._gradient_checkpointing_func(block, x, ctx, timestep_proj, rotary_emb) if checkpoint
                 else block(x, ctx, timestep_proj, rotary_emb))
        y = head(self, x, temb).reshape(batch, frames // p_t, height // p_h, width // p_w, p_t, p_h, p_w, -1)
        out = y.permute(0, 7, 1, 4, 2, 5, 3, 6).flatten(6, 7).flatten(4, 5).flatten(2, 3)
        return Transformer2DModelOutput(sample=out) if return_dict else (out,)

    return forward.__get__(model)


# ------------------------------------------------------------------------------------------- targets
def _check_processor(model_name, attn, allowed):
    """The attention must run diffusers' default processor with separate projections: that is the
    computation the sliced block reproduces."""
    proc = attn.processor
    if type(proc).__name__ not in allowed:
        raise ValueError(f"video.streamline cannot slice {model_name} with attention processor "
                         f"{type(proc).__name__} exactly; supported processors: {', '.join(allowed)}")
    if getattr(attn, "fused_projections", False):
        raise ValueError(f"video.streamline cannot slice {model_name} with fused QKV projections; "
                         "call unfuse_qkv_projections() first")
    if getattr(proc, "_parallel_config", None) is not None:
        raise ValueError(f"video.streamline cannot slice {model_name} under context parallelism")


def dit_targets(model):
    """(module, forward factory) pairs of a supported DiT: its transformer blocks, then the per-token
    norms of its output head (Wan: the model's own forward, whose head is inline); ValueError for a
    block or attention processor we cannot slice exactly (names the class and what is supported)."""
    name = type(model).__name__
    if name == "WanTransformer3DModel":
        pairs = [(b, wan_block_forward, "WanTransformerBlock", [b.attn1, b.attn2], ("WanAttnProcessor",))
                 for b in model.blocks]
    elif name == "CogVideoXTransformer3DModel":
        pairs = [(b, cogvideox_block_forward, "CogVideoXBlock", [b.attn1], ("CogVideoXAttnProcessor2_0",))
                 for b in model.transformer_blocks]
    elif name == "HunyuanVideoTransformer3DModel":
        allowed = ("HunyuanVideoAttnProcessor2_0",)
        pairs = [(b, hunyuan_double_block_forward, "HunyuanVideoTransformerBlock", [b.attn], allowed)
                 for b in model.transformer_blocks]
        pairs += [(b, hunyuan_single_block_forward, "HunyuanVideoSingleTransformerBlock", [b.attn], allowed)
                  for b in model.single_transformer_blocks]
    else:
        raise ValueError(f"not a supported DiT: {name}; supported: {', '.join(SUPPORTED_DIT)}")
    heads = {"CogVideoXTransformer3DModel": ("norm_final", "norm_out"),
             "HunyuanVideoTransformer3DModel": ("norm_out",)}.get(name, ())
    for block, factory, cls, attns, allowed in pairs:
        if type(block).__name__ != cls:
            raise ValueError(f"video.streamline cannot slice {name} block {type(block).__name__}; "
                             f"supported blocks: {cls}")
        for a in attns:
            _check_processor(name, a, allowed)
        yield block, factory
    for attr in heads:  # the output head: per-token norms
        yield getattr(model, attr), lambda mod, chunks, head_slices: token_span_forward(mod, chunks)
    if name == "WanTransformer3DModel":  # Wan's head is inline in its forward: the model forward itself
        yield model, lambda mod, chunks, head_slices: wan_model_forward(mod, chunks)
