"""`kv_cache="elastic"` (dlm.engine.masked.elastic): the drift test against a plain-math reference, the
refresh it triggers, the forward tokens of its schedule, its exact setting, and its refusals."""
import math

import pytest
import torch

import dlm
from dlm.engine.masked import elastic
from dlm.engine.masked.elastic import DriftTest


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def _replica(layers=2):
    """A random-weight LLaDA-shaped model, small: its prompt attends to the response, so every cache
    but the refreshed one is an approximation."""
    return dlm.replica("llada-8b", layers=layers, overrides=dict(
        hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=4, vocab_size=300,
        mask_token_id=299, eos_token_id=298, pad_token_id=298))


def _cosine(a, b):
    dot = sum(x * y for x, y in zip(a, b))
    return dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))


def test_the_drift_test_is_the_smallest_key_or_value_cosine_on_the_probes():
    """Caches of 2 layers, [1, 1, 4, 2]: positions 1 and 2 are probed; layer 1's value at position 2
    turns by a known angle, the key at position 3 (outside the probes) turns far more."""
    torch.manual_seed(0)
    old = tuple((torch.randn(1, 1, 4, 2), torch.randn(1, 1, 4, 2)) for _ in range(2))
    new = tuple((k.clone(), v.clone()) for k, v in old)
    new[0][0][0, 0, 3] = -old[0][0][0, 0, 3]  # outside [1, 3): ignored
    v = old[1][1][0, 0, 2].tolist()
    turned = [v[0] * math.cos(0.1) - v[1] * math.sin(0.1), v[0] * math.sin(0.1) + v[1] * math.cos(0.1)]
    new[1][1][0, 0, 2] = torch.tensor(turned)
    similarity = _cosine(v, turned)  # cos(0.1) = 0.99500
    assert bool(DriftTest(threshold=similarity + 1e-4, probe=2).stale(old, new, 1, 3))
    assert not bool(DriftTest(threshold=similarity - 1e-4, probe=2).stale(old, new, 1, 3))
    assert not bool(DriftTest(threshold=2.0).stale(old, new, 2, 2))  # no probe position: nothing to test
    assert bool(DriftTest(threshold=0.5).stale(old, new, 1, 4))  # the flipped key (cosine -1) once included


def test_probes_start_at_most_probe_positions_before_and_never_in_the_prompt():
    test = DriftTest(probe=4)
    assert test.probe_start(20, 10) == 16 and test.probe_start(12, 10) == 10 and test.probe_start(10, 10) == 10
    assert DriftTest(probe=0).probe_start(20, 10) == 20


def test_above_one_every_step_is_a_full_forward_with_the_uncached_tokens():
    model = _replica()
    ids = torch.randint(0, 290, (3, 9), generator=torch.Generator().manual_seed(0))
    kw = dict(gen_length=32, block_length=16, steps=32, sampler="confidence", eos_early_stop=False)
    none = dlm.generate(model, ids, kv_cache="none", **kw)
    out = dlm.generate(model, ids, kv_cache="elastic", cache_drift_threshold=1.5, return_trace=True, **kw)
    assert torch.equal(out.sequences, none.sequences)
    assert all(t.full_forward for t in out.trace) and out.forward_tokens == none.forward_tokens


def test_never_refreshing_follows_the_cache_schedule_exactly():
    """Threshold 0: one full forward (the first block), then per block an extension from the previous
    block's start less the probes, and per step the block and its probes (in the first block, the end
    of the prompt, which attends to the response here): forward tokens by count."""
    model = _replica()
    B, P, G, Lb, steps, probe = 2, 9, 48, 16, 48, 4
    ids = torch.randint(0, 290, (B, P), generator=torch.Generator().manual_seed(1))
    out = dlm.generate(model, ids, gen_length=G, block_length=Lb, steps=steps, sampler="confidence", kv_cache="elastic",
                       cache_drift_threshold=0.0, cache_drift_probe=probe, eos_early_stop=False, return_trace=True)
    L, per_block = P + G, steps // (G // Lb)
    expected = B * L  # block 0, step 0: full
    expected += (per_block - 1) * B * (Lb + probe)  # block 0's window steps: the prompt's last positions probed
    for block in range(1, G // Lb):
        start = P + block * Lb
        lo = max(0, start - Lb - probe)  # extension from the previous block's start, less the probes
        expected += B * (L - lo) + (per_block - 1) * B * (Lb + probe)
    assert out.forward_tokens == expected
    assert [t.full_forward for t in out.trace].count(True) == G // Lb  # block 0's forward and the 2 extensions


@pytest.mark.parametrize("stale_call, full_steps", [
    # block 0: step 0 full, tests at steps 1, 2, 3 (the third says stale) -> step 4 full; block 1: extension
    (3, [(0, 0), (0, 4), (1, 0)]),
    # block 0: step 0 full, tests at steps 1-15; the 16th test is block 1's extension: stale -> step 1 full
    (16, [(0, 0), (1, 0), (1, 1)]),
])
def test_a_stale_test_makes_the_next_step_a_full_forward(monkeypatch, stale_call, full_steps):
    calls = []
    real = DriftTest.stale

    def stale_at_one_call(self, cached, fresh, lo, hi):
        calls.append(len(calls))
        flag = real(self, cached, fresh, lo, hi)
        return torch.ones_like(flag) if len(calls) == stale_call else torch.zeros_like(flag)

    monkeypatch.setattr(elastic.DriftTest, "stale", stale_at_one_call)
    model = _replica()
    ids = torch.randint(0, 290, (2, 9), generator=torch.Generator().manual_seed(2))
    out = dlm.generate(model, ids, gen_length=32, block_length=16, steps=32, sampler="confidence", kv_cache="elastic",
                       eos_early_stop=False, return_trace=True)
    full = [(t.block, t.step) for t in out.trace if t.full_forward]
    assert full == full_steps


def test_one_host_read_per_step():
    from dlm.bench.syncs import HostSyncCounter

    model, tok = dlm.load("tiny-dlm")
    ids = torch.tensor([tok.encode_prompt("reverse: ana bo cyd tom"), tok.encode_prompt("sort: tom ana bo fay")])
    records = []
    with HostSyncCounter() as syncs:
        dlm.generate(model, ids, gen_length=64, block_length=16, steps=32, sampler="confidence", kv_cache="elastic",
                     callback=lambda r: records.append((r.block, syncs.count)))
    between = [b[1] - a[1] for a, b in zip(records, records[1:]) if a[0] == b[0]]
    assert between and max(between) == 1


def test_refusals():
    model, tok = dlm.load("tiny-dlm")
    ids = torch.tensor([tok.encode_prompt("copy: dex jo")])
    run = dict(gen_length=32, block_length=16, steps=32)
    with pytest.raises(ValueError, match="apply to kv_cache='elastic' only"):
        dlm.generate(model, ids, kv_cache="dual", cache_drift_threshold=0.5, **run)
    with pytest.raises(ValueError, match="already keeps its cache across blocks"):
        dlm.generate(model, ids, kv_cache="elastic", cache_across_blocks=True, **run)
    with pytest.raises(ValueError, match="window_blocks > 1"):
        dlm.generate(model, ids, kv_cache="elastic", window_blocks=2, **run)
    with pytest.raises(ValueError, match="not supported with a KV cache"):
        dlm.generate(model, ids, kv_cache="elastic", cfg_scale=1.0, **run)
    with pytest.raises(ValueError, match="cannot reproduce the elastic cache"):
        dlm.generate(model, ids, kv_cache="elastic", sampler="lossless", **run)
    with pytest.raises(ValueError, match="cache_drift_probe must be an integer >= 0"):
        dlm.generate(model, ids, kv_cache="elastic", cache_drift_probe=-1, **run)
    with pytest.raises(ValueError, match="needs a model with KV-cache support"):
        dlm.generate(lambda x, **kw: torch.zeros(x.shape[0], x.shape[1], 6), ids.clamp(max=4), kv_cache="elastic",
                     mask_token_id=5, **run)


def test_the_first_block_is_tested_for_drift_too():
    """At 0.9999 a step after a commit is stale on this bidirectional model: the second block refreshes every
    other step. Every commit in the first block moves the cached prompt's K/V as much (the prompt attends to
    the response), so the first block refreshes as well: its drift test probes the prompt's last positions."""
    model = _replica()
    ids = torch.randint(0, 290, (2, 9), generator=torch.Generator().manual_seed(3))
    out = dlm.generate(model, ids, gen_length=32, block_length=16, steps=32, sampler="confidence", kv_cache="elastic",
                       cache_drift_threshold=0.9999, eos_early_stop=False, return_trace=True)
    full = {b: [t.step for t in out.trace if t.block == b and t.full_forward] for b in (0, 1)}
    assert len(full[1]) > 4  # the second block's probes see the drift and refresh it
    assert len(full[0]) > 4  # the first block: the prompt's probes see the same drift


def test_a_left_padded_row_decodes_as_it_does_alone():
    """The elastic cache's windowed forwards pass the attention mask: a row left-padded in a batch gives
    the tokens it gives alone (threshold 0: no refresh in either call, so the schedules agree too)."""
    model = _replica()
    g = torch.Generator().manual_seed(4)
    long_row, short_row = torch.randint(0, 290, (9,), generator=g), torch.randint(0, 290, (5,), generator=g)
    ids = torch.stack([long_row, torch.cat([torch.full((4,), 298), short_row])])
    mask = torch.ones_like(ids)
    mask[1, :4] = 0
    run = dict(gen_length=32, block_length=16, steps=32, sampler="confidence", kv_cache="elastic",
               cache_drift_threshold=0.0, eos_early_stop=False)
    batch = dlm.generate(model, ids, attention_mask=mask, **run)
    for row, alone_ids in ((0, long_row), (1, short_row)):
        alone = dlm.generate(model, alone_ids.unsqueeze(0), **run)
        assert torch.equal(batch.sequences[row, 9:], alone.sequences[0, alone_ids.numel():])
