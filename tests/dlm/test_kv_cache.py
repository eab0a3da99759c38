"""Prefix and dual KV caches (Fast-dLLM) in the decoding loop, on the tiny model's architecture."""
from __future__ import annotations

import pytest
import torch

import dlm
from dlm.tiny import TinyCharTokenizer, TinyDLMConfig, TinyDLMModel


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    tok = TinyCharTokenizer()
    config = TinyDLMConfig(vocab_size=tok.vocab_size, hidden_size=64, num_hidden_layers=2,
                           num_attention_heads=4, intermediate_size=128)
    return TinyDLMModel(config).eval()


def prompts():
    ids = torch.randint(3, 40, (3, 9), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[0, :4] = 0  # a left-padded row
    ids[0, :4] = 0
    return ids, mask


@pytest.mark.parametrize("mode", ["prefix", "dual"])
@pytest.mark.parametrize("sampler", ["confidence", "threshold"])
def test_cache_refreshed_every_step_equals_no_cache(model, mode, sampler):
    ids, mask = prompts()
    kw = dict(gen_length=24, block_length=8, steps=12, sampler=sampler, attention_mask=mask)
    plain = dlm.generate(model, ids, **kw)
    cached = dlm.generate(model, ids, kv_cache=mode, cache_refresh_every=1, **kw)
    assert torch.equal(plain.sequences, cached.sequences)
    assert plain.nfe == cached.nfe


@pytest.mark.parametrize("mode", ["prefix", "dual"])
def test_first_cached_step_of_each_block_is_exact(model, mode):
    """With one step per block every forward is a full refresh: identical to no cache."""
    ids, mask = prompts()
    kw = dict(gen_length=24, block_length=8, steps=3, attention_mask=mask)
    assert torch.equal(dlm.generate(model, ids, **kw).sequences,
                       dlm.generate(model, ids, kv_cache=mode, **kw).sequences)


def test_windows_process_fewer_positions(model):
    ids, mask = prompts()
    kw = dict(gen_length=16, block_length=8, steps=16, attention_mask=mask, return_trace=True)
    runs = {m: dlm.generate(model, ids, kv_cache=m, **kw) for m in ("none", "prefix", "dual")}
    assert runs["none"].forward_tokens > runs["prefix"].forward_tokens > runs["dual"].forward_tokens
    full = [r.full_forward for r in runs["dual"].trace]
    assert full.count(True) == 2 and len(full) == 16  # one refresh per block
    for m in ("prefix", "dual"):
        assert not (runs[m].sequences == model.config.mask_token_id).any()


def test_cache_window_call_matches_full_forward(model):
    """The model-level property the driver relies on, through the adapter."""
    ids, mask = prompts()
    x = torch.cat([ids, torch.full((3, 16), model.config.mask_token_id)], dim=1)
    full_mask = torch.cat([mask, torch.ones(3, 16, dtype=torch.long)], dim=1)
    positions = (full_mask.cumsum(1) - 1).clamp_min(0)
    adapter = dlm.DLMAdapter.wrap(model)
    raw, cache = adapter.full(x, full_mask, positions, use_cache=True)
    window = adapter.window(x, cache, 13, 21, full_mask, positions)
    torch.testing.assert_close(window, raw[:, 13:21], atol=1e-5, rtol=1e-5)


@pytest.fixture(scope="module")
def restart_model():
    torch.manual_seed(0)
    tok = TinyCharTokenizer()
    config = TinyDLMConfig(vocab_size=tok.vocab_size, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                           intermediate_size=128, position_restart_token_id=tok.encode("\n")[0])
    return TinyDLMModel(config).eval(), tok


def test_positions_restart_after_the_separator(restart_model):
    model, tok = restart_model
    ids = torch.tensor([[0, 0] + tok.encode("ab\n") + [1, 1, 1]])
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1, 1]])
    assert model.dlm_position_ids(ids, mask).tolist() == [[0, 0, 0, 1, 2, 0, 1, 2]]
    no_sep = torch.tensor([tok.encode("abc") + [1, 1]])
    assert model.dlm_position_ids(no_sep).tolist() == [[0, 1, 2, 3, 4]]


@pytest.mark.parametrize("mode", ["prefix", "dual"])
def test_cache_with_restarted_positions_is_exact_when_refreshed(restart_model, mode):
    model, tok = restart_model
    prompts = [tok.encode("copy: ana bo\n"), tok.encode("sort: tom\n")]
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = (ids != 0).long()
    kw = dict(gen_length=16, block_length=8, steps=8, attention_mask=mask)
    plain = dlm.generate(model, ids, **kw)
    assert torch.equal(plain.sequences, dlm.generate(model, ids, kv_cache=mode, cache_refresh_every=1, **kw).sequences)
    # A row alone decodes like the same row inside the padded batch.
    alone = dlm.generate(model, torch.tensor([prompts[1]]), gen_length=16, block_length=8, steps=8)
    assert torch.equal(alone.sequences[0], plain.sequences[1, width - len(prompts[1]):])


def test_windowed_call_without_positions_is_refused(restart_model):
    model, tok = restart_model
    x = torch.tensor([tok.encode("ab\n") + [1, 1, 1]])
    _, cache = dlm.DLMAdapter.wrap(model).full(x, None, None, use_cache=True)
    with pytest.raises(ValueError, match="dlm_position_ids"):
        model(x[:, 3:], past_key_values=cache, cache_window=(3, 6))


@pytest.fixture(scope="module")
def prompt_only_model():
    """The restart model's architecture with `prompt_attends_response=False`."""
    torch.manual_seed(0)
    tok = TinyCharTokenizer()
    config = TinyDLMConfig(vocab_size=tok.vocab_size, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                           intermediate_size=128, position_restart_token_id=tok.encode("\n")[0],
                           prompt_attends_response=False)
    return TinyDLMModel(config).eval(), tok


def test_prompt_attends_response_needs_a_separator():
    with pytest.raises(ValueError, match="position_restart_token_id"):
        TinyDLMConfig(prompt_attends_response=False)
    assert TinyDLMConfig().prompt_attends_response is True  # bidirectional unless asked


def test_prompt_logits_ignore_the_response(prompt_only_model, restart_model):
    """Changing a response token moves every response logit's input but no prompt position's."""
    model, tok = prompt_only_model
    x = torch.tensor([tok.encode("copy: ab\n") + [1, 1, 1, 1]])
    y = x.clone()
    y[0, -2] = tok.encode("z")[0]
    P = len(tok.encode("copy: ab\n"))
    a, b = model(x).logits, model(y).logits
    torch.testing.assert_close(a[:, :P], b[:, :P], atol=0, rtol=0)
    assert not torch.allclose(a[:, P:], b[:, P:])
    # the same weights with a bidirectional prompt: the prompt does see the response
    bidirectional, _ = restart_model
    assert not torch.allclose(bidirectional(x).logits[:, :P], bidirectional(y).logits[:, :P])


@pytest.mark.parametrize("cut", [False, True])
def test_prompt_cache_is_exact_when_the_prompt_ignores_the_response(prompt_only_model, cut):
    """One block: the cached prompt K/V are what a fresh forward computes, so a prefix cache that is
    never refreshed inside the block decodes exactly like no cache (with or without the cut)."""
    model, tok = prompt_only_model
    prompts = [tok.encode("copy: ana bo\n"), tok.encode("sort: tom\n")]
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = (ids != 0).long()
    kw = dict(gen_length=8, block_length=8, steps=8, attention_mask=mask, cut_trailing_masks=cut)
    plain = dlm.generate(model, ids, **kw)
    cached = dlm.generate(model, ids, kv_cache="prefix", return_trace=True, **kw)
    assert torch.equal(plain.sequences, cached.sequences)
    assert [t.full_forward for t in cached.trace].count(True) == 1  # the cache was used, not rebuilt


@pytest.mark.parametrize("cut", [False, True])
@pytest.mark.parametrize("sampler", ["confidence", "threshold"])
def test_prompt_cache_decodes_exactly_like_no_cache_over_several_blocks(prompt_only_model, cut, sampler):
    """kv_cache='prompt' on a model whose prompt ignores the response: one full forward for the whole
    generation, then windows over the response only, and the same output as the uncached engine."""
    model, tok = prompt_only_model
    prompts = [tok.encode("copy: ana bo\n"), tok.encode("sort: tom\n"), tok.encode("rev: a b c d\n")]
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = (ids != 0).long()
    kw = dict(gen_length=24, block_length=8, steps=12, sampler=sampler, attention_mask=mask, cut_trailing_masks=cut,
              eos_early_stop=False)
    plain = dlm.generate(model, ids, kv_cache="none", **kw)
    cached = dlm.generate(model, ids, kv_cache="prompt", return_trace=True, **kw)
    assert torch.equal(plain.sequences, cached.sequences) and plain.nfe == cached.nfe
    assert [t.full_forward for t in cached.trace].count(True) == 1
    assert cached.forward_tokens < plain.forward_tokens
    # the response windows: every cached step recomputes exactly the positions after the prompt
    if not cut:
        assert cached.forward_tokens == 3 * (width + 24) + (cached.nfe - 1) * 3 * 24


def test_prompt_cache_with_rows_leaving_at_eos_matches_no_cache(prompt_only_model):
    """Rows that stop at EOS in different blocks leave the cache's batch; the rest decode unchanged."""
    _, tok = prompt_only_model
    torch.manual_seed(0)
    model = TinyDLMModel(prompt_only_model[0].config).eval()
    with torch.no_grad():  # larger weights than the init: varied outputs, so rows stop at different blocks
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0, 0.3)
    prompts = [tok.encode("copy: ana bo\n"), tok.encode("sort: tom\n"), tok.encode("rev: a b c d\n")]
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    kw = dict(gen_length=24, block_length=8, steps=24, attention_mask=(ids != 0).long(),
              eos_token_id=tok.encode("6")[0], return_trace=True)
    plain = dlm.generate(model, ids, kv_cache="none", **kw)
    last_block = {}
    for t in plain.trace:
        for r in t.rows.tolist():
            last_block[r] = t.block
    assert sorted(last_block.values()) == [0, 1, 2]  # each row stops in a different block
    assert torch.equal(plain.sequences, dlm.generate(model, ids, kv_cache="prompt", **kw).sequences)


def test_prompt_cache_serves_lookahead_branches_exactly(prompt_only_model):
    """LoPA's branch calls reuse the prompt's K/V (repeated per candidate): same output and counts."""
    model, tok = prompt_only_model
    ids = torch.tensor([tok.encode("copy: ana bo\n"), tok.encode("sort: tom bo\n")])
    kw = dict(gen_length=16, block_length=8, steps=8, sampler="lopa")
    plain, cached = dlm.generate(model, ids, kv_cache="none", **kw), dlm.generate(model, ids, kv_cache="prompt", **kw)
    assert torch.equal(plain.sequences, cached.sequences)
    assert (plain.nfe, plain.branch_forwards) == (cached.nfe, cached.branch_forwards) and cached.branch_forwards > plain.nfe
    assert cached.forward_tokens < plain.forward_tokens


def test_prompt_cache_is_an_approximation_on_a_bidirectional_model(restart_model):
    model, tok = restart_model
    ids = torch.tensor([tok.encode("copy: ana bo\n")])
    kw = dict(gen_length=16, block_length=8, steps=16)
    assert not torch.equal(dlm.generate(model, ids, kv_cache="none", **kw).sequences,
                           dlm.generate(model, ids, kv_cache="prompt", **kw).sequences)
    refreshed = dlm.generate(model, ids, kv_cache="prompt", cache_refresh_every=1, **kw)
    assert torch.equal(dlm.generate(model, ids, kv_cache="none", **kw).sequences, refreshed.sequences)


def test_prompt_cache_refuses_cache_across_blocks(prompt_only_model):
    model, tok = prompt_only_model
    with pytest.raises(ValueError, match="drop cache_across_blocks"):
        dlm.generate(model, torch.tensor([tok.encode("ab\n")]), gen_length=8, kv_cache="prompt", cache_across_blocks=True)


def test_shipped_tiny_dlm_is_prompt_causal_and_its_prompt_cache_is_exact():
    """The shipped checkpoint (v2.6) declares a prompt that ignores the response, and on real prompts
    of every suite the prompt cache reproduces the uncached engine token for token (two blocks, rows
    of different lengths stopping at EOS), with fewer forward tokens."""
    model, tok = dlm.load("tiny-dlm")
    assert model.config.prompt_attends_response is False
    texts = ["reverse: ana bo cyd tom", "shuffle: cyd uma jo ana", "insert 2 mia: eli quin sal ned tom",
             "leo has 5 eggs. he loses 1. he gets 9. how many?", "sudoku: 3... .4.2 2.14 412."]
    prompts = [tok.encode_prompt(t) for t in texts]
    width = max(map(len, prompts))
    ids = torch.tensor([[tok.pad_token_id] * (width - len(p)) + p for p in prompts])
    kw = dict(gen_length=64, block_length=32, steps=32, attention_mask=(ids != tok.pad_token_id).long())
    for sampler in ("confidence", "threshold"):
        plain = dlm.generate(model, ids, sampler=sampler, kv_cache="none", **kw)
        cached = dlm.generate(model, ids, sampler=sampler, kv_cache="prompt", **kw)
        assert torch.equal(plain.sequences, cached.sequences) and plain.nfe == cached.nfe
        assert cached.forward_tokens < plain.forward_tokens


def _auto_vs(model, ids, mode, **kw):
    """Outputs and forward tokens of kv_cache='auto' beside the explicit mode it should resolve to."""
    auto = dlm.generate(model, ids, kv_cache="auto", **kw)
    explicit = dlm.generate(model, ids, kv_cache=mode, **kw)
    return auto, explicit


def test_auto_cache_is_the_prompt_cache_on_a_prompt_blind_model(prompt_only_model):
    model, tok = prompt_only_model
    ids = torch.tensor([tok.encode("copy: ana bo\n"), tok.encode("sort: tom bo\n")])
    kw = dict(gen_length=16, block_length=8, steps=8)
    auto, prompt = _auto_vs(model, ids, "prompt", **kw)
    assert torch.equal(auto.sequences, prompt.sequences) and auto.forward_tokens == prompt.forward_tokens
    assert auto.forward_tokens < dlm.generate(model, ids, kv_cache="none", **kw).forward_tokens


def test_auto_cache_is_no_cache_where_the_prompt_cache_would_approximate(restart_model):
    """A bidirectional model: 'auto' never picks an approximation, so it runs uncached."""
    model, tok = restart_model
    ids = torch.tensor([tok.encode("copy: ana bo\n")])
    kw = dict(gen_length=16, block_length=8, steps=16)
    auto, none = _auto_vs(model, ids, "none", **kw)
    assert torch.equal(auto.sequences, none.sequences) and auto.forward_tokens == none.forward_tokens


def test_auto_cache_falls_back_to_no_cache_for_guidance(prompt_only_model):
    """Classifier-free guidance has no cached path: 'auto' runs it uncached instead of refusing."""
    model, tok = prompt_only_model
    ids = torch.tensor([tok.encode("copy: ana bo\n")])
    kw = dict(gen_length=8, block_length=8, steps=8, cfg_scale=1.0)
    auto, none = _auto_vs(model, ids, "none", **kw)
    assert torch.equal(auto.sequences, none.sequences) and auto.forward_tokens == none.forward_tokens


def test_prompt_blindness_is_declared_never_inferred(model, prompt_only_model):
    from dlm.adapters import DLMAdapter

    assert DLMAdapter.wrap(prompt_only_model[0]).prompt_ignores_response
    assert not DLMAdapter.wrap(model).prompt_ignores_response
    model.dlm_prompt_ignores_response = True  # any model may declare it
    try:
        assert DLMAdapter.wrap(model).prompt_ignores_response
    finally:
        del model.dlm_prompt_ignores_response


@pytest.mark.parametrize("mode", ["prefix", "dual", "prompt"])
def test_refresh_every_step_makes_lookahead_exact_on_a_bidirectional_model(restart_model, mode):
    """`cache_refresh_every=1` promises a full forward at every step. LoPA's next step reuses its
    branch call's logits instead of running one, so those branch calls must be full forwards too:
    with them, every cache mode gives the uncached tokens (on a model where a stale cache differs)."""
    model, tok = restart_model
    ids = torch.tensor([tok.encode("copy: ana bo\n"), tok.encode("sort: tom bo\n")])
    kw = dict(gen_length=16, block_length=8, steps=8, sampler="lopa")
    plain = dlm.generate(model, ids, kv_cache="none", **kw)
    refreshed = dlm.generate(model, ids, kv_cache=mode, cache_refresh_every=1, **kw)
    assert torch.equal(plain.sequences, refreshed.sequences)
    assert (plain.nfe, plain.branch_forwards) == (refreshed.nfe, refreshed.branch_forwards)
    assert not torch.equal(plain.sequences, dlm.generate(model, ids, kv_cache=mode, **kw).sequences)


@pytest.mark.parametrize("mode", ["prefix", "dual"])
def test_lookahead_rows_with_another_count_get_their_own_repeated_cache(model, mode):
    """A lookahead call repeats each row's cached K/V k times and keeps that copy for the next call;
    a call with another k must build its own copy: its logits equal those of a forward that never
    made the first call."""
    from dlm.adapters import DLMAdapter
    from dlm.engine.masked.forward import KVCachedForward

    adapter = DLMAdapter.wrap(model)
    ids, _ = prompts()
    P, Lb, mask_id = ids.shape[1], 8, adapter.mask_token_id
    x = torch.cat([ids, torch.full((ids.shape[0], 16), mask_id)], dim=1)

    def cached_forward():
        forward = KVCachedForward(adapter, mode, 0, 0.0, P, None, None)
        forward(x, 0, P, P + Lb)  # the block's first step: a full forward that fills the cache
        return forward

    def candidates(k):  # k copies of each row, copy j with token 5 + j at the block's first position
        rep = x.repeat_interleave(k, dim=0)
        rep[:, P] = 5 + torch.arange(k).repeat(x.shape[0])
        return rep

    first = cached_forward()
    first.branches(candidates(2), 2, P, P + Lb)
    got = first.branches(candidates(3), 3, P, P + Lb)
    want = cached_forward().branches(candidates(3), 3, P, P + Lb)
    assert got.shape[0] == 3 * x.shape[0]
    assert torch.equal(got, want)
