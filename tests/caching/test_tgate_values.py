"""T-GATE without CFG: each sample of a batch keeps its own cached cross-attention.

Without classifier-free guidance the batch holds different samples, so the cross-attention output
cached at the gate step must stay per sample: a batch of two gives, row for row, what each sample gives
alone. (With CFG the two halves are averaged; test_caching.py checks that path. Mutation testing found
that averaging without CFG went unnoticed: docs/testing.md.)
"""
from __future__ import annotations

import torch

import caching
from tests.caching.tiny import tiny_pixart


def _run(model, x, enc):
    outs = []
    tracker = caching.apply(model, caching.TGateConfig(gate_step=2))
    try:
        for t in (900, 600, 300, 100):
            outs.append(model(x, encoder_hidden_states=enc, timestep=torch.full((x.shape[0],), t),
                              added_cond_kwargs={"resolution": None, "aspect_ratio": None}).sample)
        assert tracker.counters["xattn_cached"] > 0  # the gate passed: later steps reuse the cache
    finally:
        caching.remove(model)
    return outs


@torch.no_grad()
def test_a_batch_without_cfg_equals_its_samples_alone():
    model = tiny_pixart()
    g = torch.Generator().manual_seed(0)
    x, enc = torch.randn(2, 4, 8, 8, generator=g), torch.randn(2, 6, 32, generator=g)
    batch = _run(model, x, enc)
    for row in range(2):
        alone = _run(model, x[row:row + 1], enc[row:row + 1])
        for step, (b, a) in enumerate(zip(batch, alone)):
            torch.testing.assert_close(b[row:row + 1], a, atol=1e-5, rtol=1e-4, msg=f"row {row}, step {step}")
