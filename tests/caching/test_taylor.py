"""taylor=1 in the middle-block caches: the skipped steps' residual is a first-order forecast."""
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
from tiny import sample, tiny_pixart, tiny_unet  # noqa: E402

import caching  # noqa: E402
from caching.block_cache import forecast  # noqa: E402


def test_forecast_is_exact_on_a_linear_sequence():
    r0, slope = torch.randn(3, 5), torch.randn(3, 5)
    r = {s: r0 + slope * s for s in range(8)}
    assert torch.allclose(forecast(r[4], r[1], 6, 4, 1), r[6], atol=1e-5)
    assert torch.allclose(forecast(r[4], r[3], 5, 4, 3), r[5], atol=1e-5)
    assert forecast(r[4], None, 6, 4, None) is r[4]  # one computed step: plain reuse


def middle_residuals(model, config, steps=8):
    """Per step, the residual that reaches the last block: its input minus block 0's output."""
    blocks = model.transformer_blocks
    outs, ins = [], []
    h0 = blocks[0].register_forward_hook(lambda m, a, o: outs.append(o.detach().clone()))
    h1 = blocks[-1].register_forward_pre_hook(
        lambda m, a, k: ins.append((a[0] if a else k["hidden_states"]).detach().clone()), with_kwargs=True)
    tracker = caching.apply(model, config)
    try:
        sample(model, steps=steps)
    finally:
        caching.remove(model)
        h0.remove(), h1.remove()
    return [i - o for i, o in zip(ins, outs)], tracker


@pytest.mark.parametrize("taylor", [0, 1])
def test_skipped_steps_add_the_forecast_residual(taylor):
    model = tiny_pixart()
    # warm-up step 0, then full steps 1, 3, 5, 7 and skipped steps 2, 4, 6
    res, tracker = middle_residuals(model, caching.DeepCacheConfig(interval=2, taylor=taylor))
    assert tracker.counters["steps_cached"] == 3
    for s in (2, 4, 6):
        s1, s0 = s - 1, (s - 3 if s > 2 else 0)
        want = forecast(res[s1], res[s0], s, s1, s0) if taylor else res[s1]
        assert torch.allclose(res[s], want, atol=1e-5, rtol=1e-4), s
        assert not torch.allclose(res[s], res[s1] if taylor else forecast(res[s1], res[s0], s, s1, s0), atol=1e-4)


def test_taylor_with_threshold_zero_is_bit_identical():
    model = tiny_pixart()
    ref = sample(model, steps=6)
    caching.apply(model, caching.BlockCacheConfig(threshold=0, taylor=1))
    try:
        assert torch.equal(sample(model, steps=6), ref)
    finally:
        caching.remove(model)


def test_taylor_bad_input():
    with pytest.raises(ValueError, match="taylor must be 0"):
        caching.BlockCacheConfig(taylor=2).validate()
    unet = tiny_unet()
    with pytest.raises(ValueError, match="for a UNet use taylor=0"):
        caching.apply(unet, caching.DeepCacheConfig(taylor=1))
    assert not any(hasattr(m, "_diffusers_hook") for m in unet.modules())
    assert caching.parse_spec("block:threshold=0.15,taylor=1") == caching.BlockCacheConfig(threshold=0.15, taylor=1)
