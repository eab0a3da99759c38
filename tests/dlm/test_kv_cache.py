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
