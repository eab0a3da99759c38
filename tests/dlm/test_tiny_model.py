import pytest
import torch
from transformers import AutoConfig, AutoModel

from dlm.tiny import (BUILTIN_MODELS, CHECKPOINT_DIR, TinyCharTokenizer, TinyDLMConfig,
                      TinyDLMModel, load_tiny_dlm)


def small_model(seed=0):
    torch.manual_seed(seed)
    cfg = TinyDLMConfig(vocab_size=58, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=64)
    m = TinyDLMModel(cfg).eval()
    # Larger weights than the init so that the logits are not all near zero.
    with torch.no_grad():
        for p in m.parameters():
            if p.dim() >= 2:
                p.normal_(0, 0.3)
    return m


def test_config_validation():
    with pytest.raises(ValueError):
        TinyDLMConfig(hidden_size=30, num_attention_heads=4)
    with pytest.raises(ValueError):
        TinyDLMConfig(mask_token_id=0, pad_token_id=0)


def test_forward_shapes_and_cache():
    m = small_model()
    x = torch.randint(3, 58, (2, 20))
    out = m(x)
    assert out.logits.shape == (2, 20, 58) and out.logits.dtype == torch.float32
    assert out.past_key_values is None
    out = m(x, use_cache=True)
    assert len(out.past_key_values) == 2
    k, v = out.past_key_values[0]
    assert k.shape == v.shape == (2, 4, 20, 8)
    assert TinyDLMModel.supports_dlm_kv_cache is True
    # dict- and tuple-style access, as with transformers' ModelOutput, whatever its version
    assert out["logits"] is out.logits and out["past_key_values"] is out.past_key_values
    assert out[0] is out.logits and out[1] is out.past_key_values and len(out.to_tuple()) == 2
    with pytest.raises(KeyError):
        out["cache"]


def test_bidirectional():
    m = small_model()
    x = torch.randint(3, 58, (1, 10))
    y = x.clone()
    y[0, -1] = (x[0, -1] - 3 + 1) % 55 + 3
    assert not torch.allclose(m(x).logits[0, 0], m(y).logits[0, 0])


def _padded_batch():
    g = torch.Generator().manual_seed(1)
    x = torch.randint(3, 58, (3, 24), generator=g)
    att = torch.ones(3, 24, dtype=torch.long)
    att[1, :5] = 0
    att[2, :9] = 0
    x[att == 0] = 0
    x[:, 14:] = 1  # masked response slots, as the decoder sees them
    return x, att


@pytest.mark.parametrize("window", [(14, 24), (14, 18), (18, 22), (0, 24), (23, 24), (5, 14)])
def test_windowed_cache_matches_full_forward(window):
    m = small_model()
    x, att = _padded_batch()
    full = m(x, attention_mask=att, use_cache=True)
    cache = full.past_key_values
    saved = [(k.clone(), v.clone()) for k, v in cache]
    s, e = window
    win = m(x[:, s:e], attention_mask=att, past_key_values=cache, cache_window=(s, e),
            use_cache=True)
    assert win.logits.shape == (3, e - s, 58)
    torch.testing.assert_close(win.logits, full.logits[:, s:e], atol=1e-5, rtol=1e-5)
    assert torch.equal(win.logits.argmax(-1), full.logits[:, s:e].argmax(-1))
    for (k, v), (k0, v0), (k1, v1) in zip(cache, saved, win.past_key_values):
        assert torch.equal(k, k0) and torch.equal(v, v0)  # input cache untouched
        assert k1.shape == k0.shape
        torch.testing.assert_close(k1, k0, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(v1, v0, atol=1e-5, rtol=1e-5)


def test_window_updates_with_new_tokens():
    """Feeding new window tokens against an old cache equals a full forward whose other
    positions use the old K/V; with a one-layer model that is exactly the new full forward
    on the window."""
    torch.manual_seed(0)
    cfg = TinyDLMConfig(vocab_size=58, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                        intermediate_size=64)
    m = TinyDLMModel(cfg).eval()
    x, att = _padded_batch()
    cache = m(x, attention_mask=att, use_cache=True).past_key_values
    y = x.clone()
    y[:, 14:18] = torch.randint(3, 58, (3, 4))
    win = m(y[:, 14:18], attention_mask=att, past_key_values=cache, cache_window=(14, 18))
    # In one layer, keys outside the window depend only on their own tokens, unchanged.
    torch.testing.assert_close(win.logits, m(y, attention_mask=att).logits[:, 14:18],
                               atol=1e-5, rtol=1e-5)


def test_explicit_position_ids_window():
    m = small_model()
    x, att = _padded_batch()
    pos = (att.cumsum(1) - 1).clamp(min=0)
    full = m(x, attention_mask=att, position_ids=pos, use_cache=True)
    win = m(x[:, 10:20], attention_mask=att, position_ids=pos[:, 10:20],
            past_key_values=full.past_key_values, cache_window=(10, 20))
    torch.testing.assert_close(win.logits, full.logits[:, 10:20], atol=1e-5, rtol=1e-5)


def test_left_padding_does_not_change_real_rows():
    m = small_model()
    x = torch.randint(3, 58, (1, 12))
    ref = m(x).logits
    xp = torch.cat([torch.zeros(1, 4, dtype=torch.long), x], 1)
    att = torch.cat([torch.zeros(1, 4), torch.ones(1, 12)], 1).long()
    # rotary is relative, so a shift of all positions leaves the logits unchanged
    torch.testing.assert_close(m(xp, attention_mask=att).logits[:, 4:], ref, atol=1e-5, rtol=1e-5)


def test_bad_inputs():
    m = small_model()
    x = torch.randint(3, 58, (1, 12))
    cache = m(x, use_cache=True).past_key_values
    with pytest.raises(ValueError):
        m(x[:, 2:6], past_key_values=cache, cache_window=(2, 5))
    with pytest.raises(ValueError):
        m(x[:, 2:6], past_key_values=cache)
    with pytest.raises(ValueError):
        m(x, attention_mask=torch.ones(1, 5))


def test_auto_round_trip(tmp_path):
    m = small_model()
    m.save_pretrained(tmp_path)
    cfg = AutoConfig.from_pretrained(tmp_path)
    assert isinstance(cfg, TinyDLMConfig) and cfg.model_type == "tiny-dlm"
    assert cfg.mask_token_id == 1
    m2 = AutoModel.from_pretrained(tmp_path).eval()
    assert isinstance(m2, TinyDLMModel)
    x = torch.randint(3, 58, (2, 9))
    torch.testing.assert_close(m2(x).logits, m(x).logits)


def test_builtin_registry():
    assert BUILTIN_MODELS["tiny-dlm"] == str(CHECKPOINT_DIR)


def test_load_missing_checkpoint(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_tiny_dlm(tmp_path)


@pytest.mark.skipif(not (CHECKPOINT_DIR / "model.safetensors").is_file(),
                    reason="tiny-dlm checkpoint not trained yet (scripts/train_tiny_dlm.py)")
def test_shipped_checkpoint_loads():
    model, tok = load_tiny_dlm()
    assert isinstance(tok, TinyCharTokenizer)
    assert not model.training
    assert next(model.parameters()).dtype == torch.float32
    assert model.config.mask_token_id == tok.mask_token_id
    assert model.config.vocab_size == tok.vocab_size
    assert (CHECKPOINT_DIR / "model.safetensors").stat().st_size < 8 * 2**20
    ids = torch.tensor([tok.encode("copy: ana bo\n") + [tok.mask_token_id] * 8])
    assert model(ids).logits.shape == (1, ids.shape[1], tok.vocab_size)
