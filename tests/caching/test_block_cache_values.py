"""Block caching's skipped steps add exactly the cached middle residual, to both streams.

On SD3 (a dual-stream transformer: every joint block updates the image and the text stream) with one
last block computed, a skipped step must hand the last block `input of the middle + (output - input of
the middle at the last computed step)` for the image stream *and* the text stream. Both sides are
observed with forward hooks on the blocks themselves, not read from the cache. Mutation testing found
the text-stream residual unchecked (dropping it left every test green: docs/testing.md).
"""
from __future__ import annotations

import torch

import caching
from tests.caching.tiny import sample, tiny_sd3

STEPS = 8


@torch.no_grad()
def test_skipped_steps_add_the_last_computed_middle_residual_to_both_streams():
    model = tiny_sd3()
    blocks = model.transformer_blocks
    assert len(blocks) == 4  # block 0 the probe, 1-2 the middle, 3 the last block (always computed here)
    calls = []  # (block index, image in, text in, output)
    hooks = [b.register_forward_hook(lambda m, args, kwargs, out, k=k: calls.append(
        (k, kwargs["hidden_states"].clone(), kwargs["encoder_hidden_states"].clone(), out)), with_kwargs=True)
        for k, b in enumerate(blocks)]
    try:
        caching.apply(model, caching.BlockCacheConfig(threshold=10.0, last_blocks=1, warmup_steps=2,
                                                      max_cached_steps=2))
        sample(model, STEPS, guidance=4.0)
    finally:
        for h in hooks:
            h.remove()
        caching.remove(model)
    steps = [calls[i:i + 4] for i in range(0, len(calls), 4)]
    assert len(steps) == STEPS and all([c[0] for c in s] == [0, 1, 2, 3] for s in steps)
    skipped = [2, 3, 5, 6]  # threshold 10 skips whenever allowed: 2 warm-up steps, runs of at most 2
    residual = None
    for index, step in enumerate(steps):
        (_, h_mid, e_mid, _), (_, _, _, middle_out), (_, h_last, e_last, _) = step[1], step[2], step[3]
        if index in skipped:
            torch.testing.assert_close(h_last, h_mid + residual[0], atol=1e-6, rtol=0)
            torch.testing.assert_close(e_last, e_mid + residual[1], atol=1e-6, rtol=0)
        else:
            e_out, h_out = middle_out  # SD3's joint blocks return (text, image)
            residual = (h_out - h_mid, e_out - e_mid)
            assert torch.equal(h_last, h_out) and torch.equal(e_last, e_out)  # a computed step passes them on
