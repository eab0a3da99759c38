"""Full-attention video DiTs (Wan, CogVideoX, HunyuanVideo): sliced blocks equal diffusers' own."""

import os
import sys
import types

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
from video_tiny import (cogvideox_inputs, hunyuan_inputs, tiny_cogvideox, tiny_hunyuan, tiny_wan,  # noqa: E402
                        wan_inputs)

import video  # noqa: E402


def _wan():
    m = tiny_wan()
    x, t, ehs = wan_inputs(frames=4, size=8)
    return m, (lambda: m(x, t, ehs).sample), list(m.blocks)


def _cogvideox():
    m = tiny_cogvideox()
    x, ehs, t, rope = cogvideox_inputs(frames=4, size=8)
    return m, (lambda: m(x, ehs, t, image_rotary_emb=rope).sample), list(m.transformer_blocks)


def _hunyuan(batch=1):
    m = tiny_hunyuan()
    x, t, ehs, mask, pooled = hunyuan_inputs(batch=batch, frames=4, size=8)
    if batch > 1:
        mask[1, 2:] = 0  # a different number of padding tokens per sample
    blocks = list(m.transformer_blocks) + list(m.single_transformer_blocks)
    return m, (lambda: m(x, t, ehs, mask, pooled).sample), blocks


FAMILIES = {"wan": _wan, "cogvideox": _cogvideox, "hunyuan": _hunyuan}
TOKENS = 4 * 4 * 4  # 4 frames of 8x8 latents, patch 2


def _close(got, ref):
    """The issue's bar: max abs difference <= 1e-5 of the output scale."""
    scale = ref.abs().max().item()
    assert scale > 0.1
    assert (got - ref).abs().max().item() <= 1e-5 * scale


def _spy_sdpa(monkeypatch):
    """Record (heads, queries, keys) of every torch SDPA call (diffusers' native backend and
    CogVideoX's processor both call it)."""
    calls, real = [], torch.nn.functional.scaled_dot_product_attention

    def spy(*args, **kwargs):  # diffusers passes query=, key=, value= by name; CogVideoX by position
        q, k = (args + (None, None))[:2] if args else (kwargs["query"], kwargs["key"])
        calls.append((q.shape[1], q.shape[2], k.shape[2]))
        return real(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    return calls


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("slices,head_slices", [(3, 1), (TOKENS, 4)])
def test_sliced_equals_unsliced(family, slices, head_slices, monkeypatch):
    import video.dit_attention as da

    model, run, blocks = FAMILIES[family]()
    monkeypatch.setattr(da, "QUERY_SPAN", 8)  # 64 tokens: query spans of >= 8 tokens, not one span
    with torch.no_grad():
        ref = run()
        video.streamline(model, slices=slices, head_slices=head_slices)
        calls = _spy_sdpa(monkeypatch)
        try:
            got = run()
        finally:
            monkeypatch.undo()
            video.unstreamline(model)
        again = run()
    _close(got, ref)
    assert torch.equal(again, ref)  # unstreamline restores diffusers' forward bit for bit
    assert not any("forward" in m.__dict__ for m in model.modules())
    # self-attention really ran per query span and head group, each span against every key
    self_attn = [c for c in calls if c[2] >= TOKENS]
    video_q = [c for c in self_attn if c[1] != 7]  # 7 = the text span of the joint-attention models
    spans = min(slices, TOKENS // 8)  # video.dit_attention.query_chunks
    assert len(video_q) == len(blocks) * spans * head_slices
    assert all(q <= -(-TOKENS // spans) and h == 4 // head_slices for h, q, _ in video_q)


def test_wan_per_token_timesteps_and_image_context():
    """Wan 2.2 TI2V (a timestep per token: per-token modulation) and Wan 2.1 I2V (image context with its
    own keys/values in the cross-attention, 512 text tokens after it)."""
    m = tiny_wan(heads=2, layers=1)
    x, _, ehs = wan_inputs(frames=4, size=8)
    t = torch.linspace(0, 999, TOKENS).round().long()[None]
    with torch.no_grad():
        ref = m(x, t, ehs).sample
        video.streamline(m, slices=5, head_slices=2)
        got = m(x, t, ehs).sample
        video.unstreamline(m)
    _close(got, ref)

    from diffusers import WanTransformer3DModel

    torch.manual_seed(0)
    m = WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=16, in_channels=4,
                              out_channels=4, text_dim=24, freq_dim=32, ffn_dim=64, num_layers=1, image_dim=16,
                              added_kv_proj_dim=32, rope_max_seq_len=64).eval()
    g = torch.Generator().manual_seed(3)
    ehs, img = torch.randn(1, 512, 24, generator=g), torch.randn(1, 5, 16, generator=g)
    with torch.no_grad():
        ref = m(x, torch.tensor([300]), ehs, encoder_hidden_states_image=img).sample
        video.streamline(m, slices=4)
        got = m(x, torch.tensor([300]), ehs, encoder_hidden_states_image=img).sample
        video.unstreamline(m)
    _close(got, ref)


def test_attention_backend_and_masked_batch_and_pipeline():
    """The processor's attention backend is used per span (math kernel here), a batch whose samples
    mask different text padding, and a pipeline-like object holding the model as ``.transformer``."""
    m, run, _ = _hunyuan(batch=2)
    m.set_attention_backend("_native_math")
    pipe = types.SimpleNamespace(transformer=m)
    with torch.no_grad():
        ref = run()
        assert video.streamline(pipe, slices=7, head_slices=2) is m
        got = run()
        video.unstreamline(pipe)
    _close(got, ref)


def test_bad_input():
    m, run, _ = _wan()
    with pytest.raises(ValueError, match="supported: .*WanTransformer3DModel, CogVideoXTransformer3DModel, "
                                         "HunyuanVideoTransformer3DModel"):
        video.streamline(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="temporal_slices does not apply"):
        video.streamline(m, slices=2, temporal_slices=2)
    with pytest.raises(ValueError, match="head_slices must be an int"):
        video.streamline(m, head_slices=0)
    for kwargs, msg in (({"slices": TOKENS + 1}, f"slices={TOKENS + 1} is larger than the dimension it slices "
                                                  f"\\({TOKENS}\\); use at most {TOKENS}"),
                        ({"slices": 2, "head_slices": 5}, "head_slices=5 is larger .* use at most 4")):
        video.streamline(m, **kwargs)
        try:
            with pytest.raises(ValueError, match=msg), torch.no_grad():
                run()
        finally:
            video.unstreamline(m)

    class Custom:  # an attention processor we cannot reproduce
        _attention_backend = None

        def __call__(self, *a, **k):
            raise AssertionError

    proc = m.blocks[1].attn1.processor
    m.blocks[1].attn1.processor = Custom()
    with pytest.raises(ValueError, match="attention processor Custom exactly; supported processors: WanAttnProcessor"):
        video.streamline(m)
    m.blocks[1].attn1.processor = proc
    assert not any("forward" in b.__dict__ for b in m.blocks)  # nothing was patched before the error
    m.blocks[0].attn1.fuse_projections()
    with pytest.raises(ValueError, match="fused QKV projections"):
        video.streamline(m)


def test_head_slices_only_for_dits():
    from video_tiny import tiny_latte

    with pytest.raises(ValueError, match="head_slices applies to full-attention DiTs"):
        video.streamline(tiny_latte(), head_slices=2)


def test_wan_output_head_runs_per_token_span():
    """Wan's head (norm_out, adaLN, proj_out) is inline in diffusers' forward; streamlined, proj_out sees
    one token span at a time and the output still equals diffusers' (return_dict=False and the LoRA
    ``attention_kwargs`` path included)."""
    m, run, _ = _wan()
    x, t, ehs = wan_inputs(frames=4, size=8)
    rows_seen = []
    m.proj_out.register_forward_pre_hook(lambda mod, args: rows_seen.append(args[0].shape[1]))
    with torch.no_grad():
        ref = run()
        video.streamline(m, slices=5)
        rows_seen.clear()
        got = m(x, t, ehs, return_dict=False, attention_kwargs={"scale": 1.0})[0]
        video.unstreamline(m)
    _close(got, ref)
    assert rows_seen == [13, 13, 13, 13, 12]  # 64 tokens in 5 spans
    assert "forward" not in m.__dict__


def test_token_spans_match_tensor_split_without_tensors():
    """Spans are torch's tensor_split of range(n), computed without making a tensor (so none lands on an
    accelerator under a device context and costs a host sync per span)."""
    from video.dit_attention import token_spans

    for n, c in ((64, 5), (14040, 16), (7, 7), (1, 1), (100, 3)):
        want = [(int(i[0]), int(i[-1]) + 1) for i in torch.arange(n).tensor_split(c)]
        with torch.device("meta"):  # a tensor made here could not be read back as an int
            assert token_spans(n, c) == want
