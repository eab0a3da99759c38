"""Step Rehash (caching.step_rehash) on tiny random-weight diffusers UNets."""
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "video"))
from tiny import sample, tiny_pixart, tiny_unet  # noqa: E402
from video_tiny import svd_inputs, tiny_svd_unet  # noqa: E402

import caching  # noqa: E402
from caching import StepRehashConfig  # noqa: E402


@pytest.fixture(scope="module")
def unet():
    return tiny_unet()


@pytest.fixture(scope="module")
def ref(unet):
    return sample(unet, steps=8)


def _count_calls(module):
    """A forward hook on a sub-module of the block: it only fires when the block really runs."""
    calls = []
    return calls, module.register_forward_hook(lambda *a: calls.append(1))


def test_threshold_zero_is_bit_identical_and_removal_restores(unet, ref):
    tracker = caching.apply(unet, StepRehashConfig(threshold=0))
    try:
        out = sample(unet, steps=8)
    finally:
        assert caching.remove(unet) > 0
    assert torch.equal(out, ref)
    assert tracker.counters["steps_rehashed"] == 0 and tracker.counters["steps_computed"] == 8
    assert torch.equal(sample(unet, steps=8), ref)  # original forward, bit for bit
    assert not any(hasattr(m, "_diffusers_hook") or "forward" in m.__dict__ for m in unet.modules())


def test_rehashed_steps_skip_the_deep_up_block(unet, ref):
    # threshold far above any probe change: the schedule is set by warm-up and max_reuse alone
    cfg = StepRehashConfig(threshold=10.0, warmup_steps=2, max_reuse=2)
    calls, handle = _count_calls(unet.up_blocks[0].resnets[0])
    shallow_calls, h2 = _count_calls(unet.up_blocks[1].resnets[0])
    tracker = caching.apply(unet, cfg)
    try:
        out = sample(unet, steps=8)
    finally:
        caching.remove(unet)
        handle.remove(), h2.remove()
    # steps 0,1 warm-up; then compute, rehash, rehash, compute, rehash, rehash
    assert tracker.counters["steps_rehashed"] == 4 and tracker.counters["steps_computed"] == 4
    assert len(calls) == 4  # the deep up-block ran only on computed steps
    assert len(shallow_calls) == 8  # the shallow up-block ran every step
    assert tracker.counters["blocks_skipped"] == 4 * 3  # down1, mid, up0 per rehashed step
    diff = (out - ref).abs().max()
    assert 0 < diff < 0.5 * ref.abs().max()  # approximate, not garbage


def test_per_call_reset_two_calls_identical(unet):
    cfg = StepRehashConfig(threshold=0.3, warmup_steps=1, max_reuse=3)
    tracker = caching.apply(unet, cfg)
    try:
        a = sample(unet, steps=8)
        first = dict(tracker.counters)
        b = sample(unet, steps=8)
    finally:
        caching.remove(unet)
    assert torch.equal(a, b)
    assert tracker.counters["runs"] == 2 and tracker.counters["steps_rehashed"] == 2 * first["steps_rehashed"] > 0


def test_threshold_controls_reuse(unet, ref):
    """A larger threshold never rehashes fewer steps and moves the result further from uncached."""
    counts, diffs = [], []
    for th in (0.05, 0.3, 10.0):
        tracker = caching.apply(unet, StepRehashConfig(threshold=th, warmup_steps=1, max_reuse=8))
        try:
            out = sample(unet, steps=8)
        finally:
            caching.remove(unet)
        counts.append(tracker.counters["steps_rehashed"])
        diffs.append(float((out - ref).abs().max()))
    assert counts == sorted(counts) and counts[-1] == 7 and counts[0] < counts[-1]
    assert diffs[-1] > diffs[0]


def test_spatio_temporal_unet():
    """Stable Video Diffusion's UNet: threshold 0 exact; forced reuse skips the deep blocks."""
    model = tiny_svd_unet()
    x, _, ehs, added = svd_inputs(batch=1, frames=4, size=8)
    ts = [torch.tensor(t) for t in (900.0, 800.0, 700.0)]

    def run():
        with torch.no_grad():
            return [model(x, t, ehs, added).sample for t in ts]

    ref = run()
    caching.apply(model, StepRehashConfig(threshold=0))
    got = run()
    caching.remove(model)
    assert all(torch.equal(a, b) for a, b in zip(got, ref))
    tracker = caching.apply(model, StepRehashConfig(threshold=10.0, warmup_steps=1, max_reuse=5))
    got = run()
    caching.remove(model)
    assert tracker.counters["steps_rehashed"] == 2 and tracker.counters["blocks_skipped"] == 2 * 3
    assert torch.equal(got[0], ref[0]) and not torch.equal(got[1], ref[1])


def test_bad_input(unet):
    with pytest.raises(ValueError, match="threshold must be >= 0"):
        caching.apply(unet, StepRehashConfig(threshold=-1))
    with pytest.raises(ValueError, match="shallow must be below"):
        caching.apply(unet, StepRehashConfig(shallow=2))
    with pytest.raises(ValueError, match="max_reuse"):
        StepRehashConfig(max_reuse=0).validate()
    with pytest.raises(ValueError, match="UNetMotionModel"):
        caching.apply(tiny_pixart(), StepRehashConfig())
    assert not any(hasattr(m, "_diffusers_hook") for m in unet.modules())  # nothing half-attached
    assert caching.parse_spec("rehash:threshold=0.1,max_reuse=3") == StepRehashConfig(threshold=0.1, max_reuse=3)
