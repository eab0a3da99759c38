"""Real-size replicas (dlm.replicas): published shapes and parameter counts (built on meta, nothing
allocated), exactness of the masked wrapper's KV-cache window and attention pattern, the engine on tiny
replicas (same tokens with and without the cache; DiffusionGemma equal to transformers' generate), the
bytes-per-forward model, bad input, and the GPU report section in smoke mode."""
from __future__ import annotations

import itertools
import time

import pytest
import torch

import dlm
from dlm.replicas import (REPLICA_NAMES, TINY_OVERRIDES, ReplicaTooLarge, expected_distinct_experts, forward_cost,
                          parameter_counts)

# The table of published config.json values (issue 40), written out here independently of the JSON
# shapes so an edit to either shows. Keys are the transformers config fields of the replica's class.
PUBLISHED = {
    "llada-8b": dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32,
                     intermediate_size=12288, vocab_size=126464, mask_token_id=126336),
    "dream-7b": dict(hidden_size=3584, num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
                     intermediate_size=18944, vocab_size=152064, mask_token_id=151666, shift_logits=True),
    "llada2-mini": dict(hidden_size=2048, num_hidden_layers=20, num_attention_heads=16, num_key_value_heads=4,
                        n_routed_experts=256, moe_intermediate_size=512, num_experts_per_tok=8, n_shared_experts=1,
                        first_k_dense_replace=1, vocab_size=157184),
    "diffusiongemma-26b-a4b": dict(hidden_size=2816, num_hidden_layers=30, num_experts=128, moe_intermediate_size=704,
                                   top_k_experts=8, intermediate_size=2112, vocab_size=262144, num_attention_heads=16,
                                   sliding_window=1024, final_logit_softcapping=30.0),
}
# DiffusionGemma's kv heads and head dims differ per layer kind (sliding 8 x 256, full 2 x 512, K = V): checked
# on the built modules in test_weight_shapes_are_the_checkpoints.
# Published parameter counts (total, active per token; None where no figure is published) and the relative
# tolerance: LLaDA 8B (LLaDA paper), Qwen2.5-7B 7.61B (Dream's base; Qwen2.5 card), LLaDA2.0-mini "16B" with
# 1.4B activated (LLaDA2.0 report; both rounded, hence 3%), Gemma 4 26B-A4B 25.2B total / 3.8B active (model
# card figures), the same text stack as DiffusionGemma-26B-A4B.
PUBLISHED_PARAMS = {
    "llada-8b": (8.0e9, None, 0.01),
    "dream-7b": (7.61e9, None, 0.005),
    "llada2-mini": (16.0e9, 1.4e9, 0.03),
    "diffusiongemma-26b-a4b": (25.2e9, 3.8e9, 0.02),
}


@pytest.fixture(scope="module")
def meta_models():
    return {name: dlm.replica(name, device="meta") for name in REPLICA_NAMES}


def tiny(name, **kw):
    return dlm.replica(name, layers=kw.pop("layers", 2), overrides=TINY_OVERRIDES[name], **kw)


def _text_config(model):
    return model.config.get_text_config()


@pytest.mark.parametrize("name", REPLICA_NAMES)
def test_full_size_config_is_the_published_one(meta_models, name):
    config = _text_config(meta_models[name])
    for key, value in PUBLISHED[name].items():
        assert getattr(config, key) == value, (name, key)
    info = meta_models[name].replica_info
    assert info.layers == info.full_layers == PUBLISHED[name]["num_hidden_layers"] and info.overrides == {}


def test_weight_shapes_are_the_checkpoints(meta_models):
    """The modules transformers built have the checkpoint tensors' shapes (nn.Linear weights are [out, in])."""
    llada = meta_models["llada-8b"].lm.model
    assert llada.layers[0].self_attn.k_proj.weight.shape == (4096, 4096)  # 32 kv heads x 128
    assert llada.layers[0].mlp.up_proj.weight.shape == (12288, 4096)
    assert meta_models["llada-8b"].lm.lm_head.weight is not llada.embed_tokens.weight  # weight_tying false
    dream = meta_models["dream-7b"].lm.model.layers[0].self_attn
    assert dream.k_proj.weight.shape == (512, 3584) and dream.q_proj.bias is not None and dream.o_proj.bias is None
    llada2 = meta_models["llada2-mini"].lm.model.layers
    assert not hasattr(llada2[0].mlp, "experts") and llada2[0].mlp.up_proj.weight.shape == (5120, 2048)
    moe = llada2[1].mlp
    assert moe.experts.gate_up_proj.shape == (256, 2 * 512, 2048) and moe.shared_experts.up_proj.weight.shape == (512, 2048)
    assert llada2[1].self_attn.q_norm.weight.shape == (128,)  # per-head qk norm, as LLaDA2's query_layernorm
    dg = meta_models["diffusiongemma-26b-a4b"].model.decoder.layers
    types = meta_models["diffusiongemma-26b-a4b"].config.text_config.layer_types
    assert types == (["sliding_attention"] * 5 + ["full_attention"]) * 5
    assert dg[0].self_attn.k_proj.weight.shape == (8 * 256, 2816) and dg[0].self_attn.v_proj is not None
    assert dg[5].self_attn.k_proj.weight.shape == (2 * 512, 2816) and dg[5].self_attn.v_proj is None  # k = v
    assert dg[5].self_attn.q_proj.weight.shape == (16 * 512, 2816)
    assert dg[0].experts.gate_up_proj.shape == (128, 2 * 704, 2816) and dg[0].mlp.up_proj.weight.shape == (2112, 2816)


@pytest.mark.parametrize("name", REPLICA_NAMES)
def test_parameter_counts_match_the_published_ones(meta_models, name):
    total, active, tolerance = PUBLISHED_PARAMS[name]
    counts = parameter_counts(meta_models[name])
    assert counts["total"] == pytest.approx(total, rel=tolerance)
    if active is not None:
        assert counts["active"] == pytest.approx(active, rel=max(tolerance, 0.03))
    else:
        assert counts["active"] == counts["total"]


def test_parameter_counts_by_hand():
    """Independent arithmetic for LLaDA-8B: 32 x (4 x 4096^2 + 3 x 4096 x 12288 + 2 x 4096) + 2 x 126464 x 4096
    + 4096 (untied embedding and head, RMSNorm weights)."""
    h, f, v, n = 4096, 12288, 126464, 32
    expected = n * (4 * h * h + 3 * h * f + 2 * h) + 2 * v * h + h
    assert parameter_counts(dlm.replica("llada-8b", device="meta"))["total"] == expected


def test_expected_distinct_experts_against_enumeration():
    """E * (1 - (1 - k/E)^N) against the exact mean over every assignment of N tokens to k of E experts."""
    for E, k, N in [(4, 2, 2), (5, 2, 3), (6, 3, 2)]:
        choices = list(itertools.combinations(range(E), k))
        mean = sum(len(set().union(*picks)) for picks in itertools.product(choices, repeat=N)) / len(choices) ** N
        assert expected_distinct_experts(N, E, k) == pytest.approx(mean, rel=1e-12)
    assert expected_distinct_experts(256, 128, 8) > 127.99  # a DiffusionGemma canvas reads every expert


def test_forward_cost_counts_every_weight_once(meta_models):
    """Bytes read against a plain count: LLaDA reads every parameter but its input embedding (only the fed
    rows); DiffusionGemma's decoder reads its own parameters with the tied table twice (self-conditioning,
    head), and a 256-token canvas routes to all but ~1e-5 of its experts."""
    llada = meta_models["llada-8b"]
    cost = forward_cost(llada, rows=2, query_tokens=32, cached_positions=256, dtype=torch.bfloat16)
    embed = llada.lm.model.embed_tokens.weight
    total = sum(p.numel() for p in llada.parameters())
    assert cost.weight_bytes == 2 * (total - embed.numel() + 2 * 32 * 4096) == cost.weight_bytes_all_experts
    assert cost.kv_bytes == 2 * 256 * 32 * 2 * 4096 * 2  # rows x positions x layers x (K, V) x width x bytes
    assert cost.floor_ms(3000.0) == pytest.approx(cost.bytes / 3e12 * 1e3)
    dg = meta_models["diffusiongemma-26b-a4b"]
    decoder = dg.model.decoder
    params = {id(p): p for p in decoder.parameters()}
    table = decoder.embed_tokens.weight
    expected_all = 2 * (sum(p.numel() for p in params.values()) + table.numel() + 256 * 2816)
    cost = forward_cost(dg, rows=1, query_tokens=256, cached_positions=256, dtype=torch.bfloat16)
    assert cost.weight_bytes_all_experts == expected_all
    assert cost.weight_bytes == pytest.approx(expected_all, rel=1e-5)
    moe = forward_cost(meta_models["llada2-mini"], rows=1, query_tokens=1, dtype=torch.bfloat16)
    assert moe.experts_per_layer == pytest.approx(8) and moe.weight_bytes < moe.weight_bytes_all_experts / 10


def test_forward_flops_by_hand(meta_models):
    """Matmul FLOPs against the arithmetic: LLaDA-8B, 2 rows of 288 tokens: 2 x tokens x (32 x (4 x 4096^2 +
    3 x 4096 x 12288) + 126464 x 4096) + attention 4 x rows x 288 x 288 x 4096 x 32. LLaDA2, one token:
    its layer-0 dense MLP, 19 MoE layers with 8 of 256 experts + the shared one + the router, the head."""
    h, f, v, n, L = 4096, 12288, 126464, 32, 288
    cost = forward_cost(meta_models["llada-8b"], rows=2, query_tokens=L, dtype=torch.bfloat16)
    assert cost.flops == 2 * 2 * L * (n * (4 * h * h + 3 * h * f) + v * h) + 4 * 2 * L * L * h * n
    assert cost.compute_floor_ms(700.0) == pytest.approx(cost.flops / 700e12 * 1e3)
    h, heads, kv = 2048, 16 * 128, 4 * 128
    attention = 2 * h * heads + 2 * h * kv
    moe_layer = attention + 8 * 3 * h * 512 + 3 * h * 512 + 256 * h
    expected = 2 * (attention + 3 * h * 5120 + 19 * moe_layer + 157184 * h) + 4 * 1 * 1 * 1 * heads * 20
    assert forward_cost(meta_models["llada2-mini"], rows=1, query_tokens=1, dtype=torch.bfloat16).flops == expected


@pytest.mark.parametrize("name", ["llada-8b", "dream-7b", "llada2-mini"])
def test_cache_window_reproduces_the_full_forward(name):
    """A window call against a cache built on the same sequence gives the full forward's logits (float64:
    to rounding), for prefix windows (to the end) and dual windows (one block), with a left-padded row."""
    model = tiny(name, dtype=torch.float64, experts_implementation="eager")
    ids = torch.randint(3, 400, (3, 64), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[0, :5] = 0
    positions = (mask.cumsum(1) - 1).clamp_min(0)
    adapter = dlm.DLMAdapter.wrap(model)
    raw, cache = adapter.full(ids, mask, positions, use_cache=True)
    assert len(cache) == 2 and cache[0][0].shape[2] == 64
    for s, e in [(32, 64), (32, 48), (40, 56)]:
        torch.testing.assert_close(adapter.window(ids, cache, s, e, mask, positions), raw[:, s:e], atol=1e-12, rtol=0)


def test_bidirectional_and_block_causal_attention():
    """LLaDA and Dream positions see later tokens; LLaDA2's positions before a 32-token block boundary see
    none after it (its generate's block mask) but do see later tokens of their own block."""
    ids = torch.randint(3, 400, (2, 64), generator=torch.Generator().manual_seed(2))
    later = ids.clone()
    later[:, 40] = 7
    for name in REPLICA_NAMES[:3]:
        model = tiny(name, dtype=torch.float64, experts_implementation="eager")
        a, b = model(ids).logits, model(later).logits
        early = (a[:, :32] - b[:, :32]).abs().max().item()
        same_block = (a[:, 32:40] - b[:, 32:40]).abs().max().item()
        if name == "llada2-mini":
            assert early == 0.0 and same_block > 1e-3
        else:
            assert early > 1e-3
    assert dlm.DLMAdapter.wrap(tiny("dream-7b")).shift_logits
    assert dlm.DLMAdapter.wrap(tiny("llada2-mini")).block_causal


def test_masked_replica_equals_the_tiny_model_with_the_same_weights():
    """The wrapper over transformers' Llama layers computes LLaDA's bidirectional transformer: the project's
    own implementation of it (TinyDLMModel: fused qkv, RMSNorm, rotary, SwiGLU, tied head) given the same
    weights returns the same logits, full and windowed."""
    from dlm.tiny import TinyDLMConfig, TinyDLMModel

    model = dlm.replica("llada-8b", layers=2, dtype=torch.float64,
                        overrides={**TINY_OVERRIDES["llada-8b"], "tie_word_embeddings": True})
    lm = model.lm
    config = TinyDLMConfig(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                           intermediate_size=128, max_position_embeddings=4096, rope_theta=500000.0,
                           rms_norm_eps=1e-5, mask_token_id=500, eos_token_id=501, pad_token_id=0)
    reference = TinyDLMModel(config).double().eval()
    with torch.no_grad():
        reference.embed_tokens.weight.copy_(lm.model.embed_tokens.weight)
        reference.norm.weight.copy_(lm.model.norm.weight)
        for ours, ref in zip(lm.model.layers, reference.layers):
            a = ours.self_attn
            ref.attn.qkv.weight.copy_(torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]))
            ref.attn.o_proj.weight.copy_(a.o_proj.weight)
            ref.mlp.gate_up.weight.copy_(torch.cat([ours.mlp.gate_proj.weight, ours.mlp.up_proj.weight]))
            ref.mlp.down.weight.copy_(ours.mlp.down_proj.weight)
            ref.attn_norm.weight.copy_(ours.input_layernorm.weight)
            ref.mlp_norm.weight.copy_(ours.post_attention_layernorm.weight)
    assert lm.lm_head.weight is lm.model.embed_tokens.weight
    ids = torch.randint(3, 400, (2, 40), generator=torch.Generator().manual_seed(3))
    # the tiny model returns float32 logits: the float64 computations agree to float32 rounding
    torch.testing.assert_close(model(ids).logits.float(), reference(ids).logits, atol=2e-6, rtol=0)


@pytest.mark.parametrize("name", ["llada-8b", "dream-7b", "llada2-mini"])
def test_generate_with_the_prefix_cache_refreshed_every_step_equals_no_cache(name):
    """The engine through the wrapper's cache: refreshed every step it must give the uncached tokens; with the
    cache kept across a block (refresh 0, prefix and dual) it runs to the end within the budget. Prompts are
    a multiple of 32 long, so LLaDA2's engine blocks line up with its model blocks."""
    model = tiny(name)
    ids = torch.randint(3, 400, (2, 32), generator=torch.Generator().manual_seed(4))
    kw = dict(gen_length=64, block_length=32, steps=16, sampler="confidence", eos_early_stop=False)
    plain = dlm.generate(model, ids, **kw)
    refreshed = dlm.generate(model, ids, kv_cache="prefix", cache_refresh_every=1, **kw)
    assert torch.equal(plain.sequences, refreshed.sequences) and plain.nfe == refreshed.nfe == 16
    mask_id = model.config.mask_token_id
    for mode in ("prefix", "dual"):
        cached = dlm.generate(model, ids, kv_cache=mode, **kw)
        assert cached.nfe <= 16 and not (cached.sequences == mask_id).any()
        assert cached.forward_tokens < plain.forward_tokens


def test_diffusion_gemma_replica_generates_transformers_tokens():
    """The engine on the DiffusionGemma replica: the tokens of transformers' own generate from the same seed,
    left-padded batch, two canvases."""
    from tests.dlm.dgemma_models import left_padded_prompts

    model = tiny("diffusiongemma-26b-a4b")
    ids, mask = left_padded_prompts(3, 9, seed=5, vocab=500)
    gc = model.generation_config
    torch.manual_seed(5)
    reference = model.generate(ids, attention_mask=mask, generation_config=gc, max_new_tokens=32)
    torch.manual_seed(5)
    ours = dlm.generate(model, ids, attention_mask=mask, generation_config=gc, gen_length=32)
    assert ours.sequences.shape == reference.sequences.shape == (3, 9 + 32)
    assert torch.equal(ours.sequences, reference.sequences)


def test_seed_device_dtype_and_rng():
    """Same seed, same weights; another seed, other weights; the caller's random state is untouched; bfloat16
    weights give finite logits; buffers keep their own dtype."""
    state = torch.random.get_rng_state()
    a, b = tiny("llada2-mini", seed=1), tiny("llada2-mini", seed=1)
    assert torch.equal(torch.random.get_rng_state(), state)
    for (_, p), (_, q) in zip(a.named_parameters(), b.named_parameters()):
        assert torch.equal(p, q)
    c = tiny("llada2-mini", seed=2)
    assert not torch.equal(a.lm.lm_head.weight, c.lm.lm_head.weight)
    assert all(not p.requires_grad for p in a.parameters())
    for name in REPLICA_NAMES[:3]:
        model = tiny(name, dtype=torch.bfloat16)
        assert model.lm.lm_head.weight.dtype == torch.bfloat16
        logits = model(torch.randint(3, 400, (1, 40))).logits
        assert logits.dtype == torch.bfloat16 and torch.isfinite(logits).all()
        assert model.replica_info.fallback_init == ()


@pytest.mark.slow
def test_one_layer_at_real_width_gives_finite_bfloat16_logits():
    """LLaDA-8B's real width (4096, 32 heads, MLP 12288) in bfloat16, one layer, a small vocabulary: the random
    init keeps activations in range (std 0.02 weights, unit norms)."""
    model = dlm.replica("llada-8b", layers=1, dtype=torch.bfloat16,
                        overrides=dict(vocab_size=1024, mask_token_id=1000, eos_token_id=1001, pad_token_id=1001))
    assert model.replica_info.parameters == 4 * 4096 ** 2 + 3 * 4096 * 12288 + 2 * 4096 + 2 * 1024 * 4096 + 4096
    logits = model(torch.randint(3, 1000, (1, 64))).logits
    assert torch.isfinite(logits).all() and logits.float().std() > 0


def test_bad_input():
    with pytest.raises(ValueError, match="llada-8b, dream-7b, llada2-mini, diffusiongemma-26b-a4b"):
        dlm.replica("llada-80b", device="meta")
    for bad in (0, 33, 2.0, True):
        with pytest.raises(ValueError, match="layers must be an integer from 1 to 32"):
            dlm.replica("llada-8b", layers=bad, device="meta")
    with pytest.raises(ValueError, match="overrides: 'hidden' is not a config field"):
        dlm.replica("llada-8b", device="meta", overrides={"hidden": 3})
    with pytest.raises(ValueError, match="dtype must be a floating"):
        dlm.replica("llada-8b", device="meta", dtype=torch.int8)


def test_a_replica_too_large_for_the_device_fails_in_one_line(monkeypatch):
    """Checked before anything is allocated: the message names the model, its size in GB and the depth that fits."""
    import dlm.replicas.build as build

    one_layer = dlm.replica("dream-7b", device="meta")
    per_layer = build.parameter_bytes(one_layer.lm.model.layers, torch.float32) / 28
    rest = build.parameter_bytes(one_layer, torch.float32) - 28 * per_layer
    working = build.working_bytes(one_layer, torch.float32)
    free = int(rest + 5.5 * per_layer + working + build.HEADROOM_BYTES)
    monkeypatch.setattr(build, "_free_bytes", lambda device: free)
    with pytest.raises(ReplicaTooLarge) as error:
        dlm.replica("dream-7b", device="cpu")
    message = str(error.value)
    assert "\n" not in message and isinstance(error.value, ValueError)
    more = (working + build.HEADROOM_BYTES) / 1e9
    assert message.startswith(f"dream-7b replica needs 30.5 GB of weights (float32, 28 layers) and {more:.1f} GB "
                              "more to build them and run one 512-token forward")
    assert "pass layers=5 or fewer" in message and error.value.fit_layers == 5
    monkeypatch.setattr(build, "_free_bytes", lambda device: 1000)
    with pytest.raises(ReplicaTooLarge, match="does not fit even with layers=1") as error:
        dlm.replica("dream-7b", device="cpu", layers=2)
    assert error.value.fit_layers == 0


def test_report_section_smoke():
    """The GPU report's replica section, tiny and on CPU: every replica, both batches, every forward of its
    decoding shape, with a floor, a % of it and a peak; the markdown table has a line per measurement."""
    from dlm.bench.gpu import ReportContext, replica_forward

    ctx = ReportContext(device=torch.device("cpu"), dtype=torch.float32, smoke=True,
                        deadline=time.monotonic() + 600, log=lambda line: None)
    result = replica_forward.run(ctx)
    assert result["copy_gbps"] > 0 and ctx.facts["copy_gbps"] == result["copy_gbps"]
    assert result["matmul_tflops"] > 0 and ctx.facts["matmul_tflops"] == result["matmul_tflops"]
    assert [r["name"] for r in result["replicas"]] == list(REPLICA_NAMES)
    for rep in result["replicas"]:
        modes = ["decoder"] if rep["name"].startswith("diffusion") else ["full", "prefix"]
        assert [(row["batch"], row["mode"]) for row in rep["rows"]] == [(b, m) for b in (1, 2) for m in modes]
        assert rep["layers"] == 2 and rep["overrides"] == TINY_OVERRIDES[rep["name"]] and not rep["skipped"]
        for row in rep["rows"]:
            assert row["ms"] > 0 and row["floor_ms"] > 0 and row["compute_floor_ms"] > 0
            assert row["pct_of_floor"] == pytest.approx(100 * row["floor_ms"] / row["ms"])
            assert row["roofline_floor_ms"] == max(row["floor_ms"], row["compute_floor_ms"])
            assert row["bound"] == ("memory" if row["floor_ms"] >= row["compute_floor_ms"] else "compute")
            assert row["bytes"] >= row["weight_bytes"] > 0
            assert row["weight_bytes_all_experts"] >= row["weight_bytes"]
    table = replica_forward.markdown(result)
    assert table.count("\n| llada-8b | 2/32 |") == 4 and table.count("| diffusiongemma-26b-a4b | 2/30 |") == 2


def test_report_section_builds_what_fits(monkeypatch):
    """Too little device memory for a replica: the section builds the deepest `layers=` that fits and says so
    beside its rows; one that does not fit at one layer is skipped with the reason."""
    import dlm.replicas.build as build
    from dlm.bench.gpu import ReportContext, replica_forward

    sizes = {}
    for name in REPLICA_NAMES:
        model = dlm.replica(name, layers=2, device="meta", overrides=TINY_OVERRIDES[name])
        layer = build.parameter_bytes(build._decoder_layers(model), torch.float32) / 2
        rest = build.parameter_bytes(model, torch.float32) - 2 * layer + build.working_bytes(model, torch.float32)
        sizes[name] = rest, layer
    building = []
    monkeypatch.setattr(build, "load_shape", _recording(build.load_shape, building))

    def free(device):  # llada-8b: room for 1.5 layers; dream-7b: not even one
        rest, layer = sizes[building[-1]]
        return int(build.HEADROOM_BYTES + rest + (1.5 * layer if building[-1] == "llada-8b" else 0.5 * layer))

    monkeypatch.setattr(build, "_free_bytes", free)
    ctx = ReportContext(device=torch.device("cpu"), dtype=torch.float32, smoke=True,
                        deadline=time.monotonic() + 600, log=lambda line: None)
    result = replica_forward.run(ctx, names=("llada-8b", "dream-7b"))
    llada, dream = result["replicas"]
    assert llada["layers"] == 1 and "pass layers=1 or fewer" in llada["note"] and len(llada["rows"]) == 4
    assert "rows" not in dream and "does not fit even with layers=1" in dream["skipped"][0]
    assert "| llada-8b | 1/32 | 1 |" in replica_forward.markdown(result)


def _recording(load_shape, names):
    def wrapped(name):
        names.append(name)
        return load_shape(name)
    return wrapped


def test_report_section_records_out_of_memory_and_skips_larger_batches(monkeypatch):
    from dlm.bench.gpu import ReportContext, replica_forward

    measure = replica_forward._measure

    def tight(ctx, model, call, rows, *args):
        if rows >= 2:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 4.00 GiB")
        return measure(ctx, model, call, rows, *args)

    monkeypatch.setattr(replica_forward, "_measure", tight)
    monkeypatch.setattr(replica_forward, "SMOKE", {**replica_forward.SMOKE, "batches": (1, 2, 4)})
    ctx = ReportContext(device=torch.device("cpu"), dtype=torch.float32, smoke=True,
                        deadline=time.monotonic() + 600, log=lambda line: None)
    (rep,) = replica_forward.run(ctx, names=("dream-7b",))["replicas"]
    assert [row["batch"] for row in rep["rows"]] == [1, 1]
    assert rep["skipped"] == ["batch 2: out of memory; larger batches skipped"]


def test_report_section_at_real_size_records_a_failing_replica_and_goes_on(monkeypatch):
    """At real size (not smoke) one replica's failure becomes an error entry and the next replica still runs;
    a replica is not started with too little time left."""
    from dlm.bench.gpu import ReportContext, replica_forward

    def build(ctx, name):
        if name == "llada-8b":
            raise RuntimeError("CUBLAS_STATUS_NOT_SUPPORTED")
        return tiny(name), None

    monkeypatch.setattr(replica_forward, "_build", build)
    monkeypatch.setattr(replica_forward, "BATCHES", (1,))
    ctx = ReportContext(device=torch.device("cpu"), dtype=torch.float32, smoke=False,
                        deadline=time.monotonic() + 600, log=lambda line: None,
                        facts={"copy_gbps": 10.0, "matmul_tflops": 0.1})
    monkeypatch.setattr(replica_forward, "PROMPT", 32)
    monkeypatch.setattr(replica_forward, "BLOCK", 8)
    result = replica_forward.run(ctx, names=("llada-8b", "dream-7b"))
    failed, dream = result["replicas"]
    assert failed["error"] == "RuntimeError: CUBLAS_STATUS_NOT_SUPPORTED" and "Traceback" in failed["traceback"]
    assert [(r["batch"], r["mode"]) for r in dream["rows"]] == [(1, "full"), (1, "prefix")]
    assert result["copy_source"] == result["matmul_source"] == "machine section"
    assert "error: RuntimeError: CUBLAS_STATUS_NOT_SUPPORTED" in replica_forward.markdown(result)
    late = ReportContext(device=torch.device("cpu"), dtype=torch.float32, smoke=False,
                         deadline=time.monotonic() + 5, log=lambda line: None, facts=dict(ctx.facts))
    (skipped,) = replica_forward.run(late, names=("dream-7b",))["replicas"]
    assert skipped == {"name": "dream-7b", "skipped": ["not started: too little time before the deadline"]}
