"""The engine at the GPU's limits (issue 40), checked on CPU:

- vocabulary-wide work in chunks of positions gives the values of the unchunked computation (and
  transformers' tokens), whatever the chunk size;
- at most one device->host read per decoding step in both loops (`HostSyncCounter`), none in a
  sampler's scoring.
Memory itself is a benchmark (scripts/bench_decode_memory.py), not a unit test.
"""
from __future__ import annotations

import pytest
import torch

import dlm
import samplers.unmasking._common as common
from dlm.bench.syncs import HostSyncCounter
from samplers import StepContext, get_sampler
from samplers.unmasking._common import rows_per_chunk, step_stats
from samplers.unmasking.entropy_bound import (categorical_entropy, exponential_race, race_entropy_argmax,
                                              stream_segments)
from tests.dlm.dgemma_models import generation_config, left_padded_prompts, tiny_diffusion_gemma


# --- chunk sizes and stream segments ------------------------------------------------------------
def test_rows_per_chunk_fits_the_byte_cap_in_multiples_of_16(monkeypatch):
    monkeypatch.setattr(common, "CHUNK_BYTES", 64 * 2**20)
    assert rows_per_chunk(256, 262_144) == 64  # 64 rows x 262,144 x 4 B = 64 MiB
    assert rows_per_chunk(100, 300) == 100  # the whole table fits: one chunk
    assert rows_per_chunk(256, 262_144, itemsize=8) == 32
    assert rows_per_chunk(10_000, 5_000_000) == 16  # never below the multiple
    assert rows_per_chunk(240, 262_144, divides=240) == 48  # 64 does not divide 240; 48 does
    assert rows_per_chunk(250, 262_144, divides=250) == 250  # no multiple of 16 divides 250


@pytest.mark.parametrize("batch, live, expected", [
    (4, None, [(4, 0)]),
    (4, [1, 2], [(1, None), (2, 0), (1, None)]),
    (5, [0, 3, 4], [(1, 0), (2, None), (2, 1)]),
    (3, [], [(3, None)]),
    (3, [0, 2], [(1, 0), (1, None), (1, 1)]),
])
def test_stream_segments(batch, live, expected):
    assert stream_segments(batch, live) == expected


def test_cpu_exponential_stream_is_chunk_invariant():
    """What the chunked race relies on for exactness on CPU: consecutive row chunks drawn from a
    generator give the numbers one call gives."""
    whole = torch.empty(64, 5000).exponential_(1, generator=torch.Generator().manual_seed(7))
    g = torch.Generator().manual_seed(7)
    parts = torch.cat([torch.empty(16, 5000).exponential_(1, generator=g) for _ in range(4)])
    assert torch.equal(whole, parts)


@pytest.mark.parametrize("one_draw", [False, True], ids=["chunked-draws", "one-draw"])
@pytest.mark.parametrize("live", [None, [1], [0, 2]])
def test_race_entropy_argmax_equals_the_unchunked_rule(monkeypatch, live, one_draw):
    """Against the unchunked computation (softmax over the whole table, one exponential draw for
    every stream row, `exponential_race`'s selection), with chunks of 16 positions. `one_draw`: the
    path of devices whose stream depends on the launch shape (CUDA), which draws the whole table in
    one call and reads each segment at its stream offset (forced here on the CPU)."""
    if one_draw:
        import samplers.unmasking.entropy_bound as entropy_bound
        monkeypatch.setattr(entropy_bound, "stream_invariant", lambda device: False)
    batch, C, V = 3, 32, 1000
    scaled = torch.randn(batch, C, V, generator=torch.Generator().manual_seed(1)) * 3
    rows = list(range(batch)) if live is None else live
    table = scaled[rows].reshape(len(rows) * C, V)
    flat_rows = torch.cat([torch.arange(r * C, (r + 1) * C) for r in rows])
    reference_sample = exponential_race(torch.softmax(table, dim=-1), torch.Generator().manual_seed(3),
                                        rows=flat_rows, total_rows=batch * C)
    monkeypatch.setattr(common, "CHUNK_BYTES", 16 * V * 4)
    sampled, entropy, argmax = race_entropy_argmax(table, C, stream_segments(batch, live),
                                                   torch.Generator().manual_seed(3))
    assert torch.equal(sampled, reference_sample)
    assert torch.equal(entropy, categorical_entropy(table))
    assert torch.equal(argmax, table.argmax(dim=-1))


def test_race_discarded_rows_still_advance_the_stream(monkeypatch):
    """Rows that stopped denoising draw (and drop) their exponentials: dropping the draw would shift
    every later row's sample (the mutation this test exists for)."""
    C, V = 16, 400
    table = torch.randn(C, V, generator=torch.Generator().manual_seed(2))
    monkeypatch.setattr(common, "CHUNK_BYTES", 16 * V * 4)
    with_gap = race_entropy_argmax(table, C, [(1, None), (1, 0)], torch.Generator().manual_seed(5))[0]
    no_gap = race_entropy_argmax(table, C, [(1, 0)], torch.Generator().manual_seed(5))[0]
    g = torch.Generator().manual_seed(5)
    torch.empty(C, V).exponential_(1, generator=g)
    q = torch.empty(C, V).exponential_(1, generator=g)
    assert torch.equal(with_gap, (torch.softmax(table, dim=-1) / q).argmax(dim=-1))
    assert not torch.equal(with_gap, no_gap)


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_step_stats_chunked_equals_whole(monkeypatch, temperature):
    logits = torch.randn(2, 40, 500, generator=torch.Generator().manual_seed(4)) * 2

    def ctx():
        return StepContext(x=torch.zeros(2, 40, dtype=torch.long), candidates=torch.ones(2, 40, dtype=torch.bool),
                           num_transfer=torch.ones(2, dtype=torch.long), step=0, steps_in_block=1, last_step=False,
                           temperature=temperature, generator=torch.Generator().manual_seed(9), mask_token_id=499,
                           block_start=0, state={}, rows=torch.arange(2))
    whole = step_stats(logits, ctx(), margin=True, entropy=True)
    monkeypatch.setattr(common, "CHUNK_BYTES", 16 * 500 * 8)
    chunked = step_stats(logits, ctx(), margin=True, entropy=True)
    for name in ("proposal", "confidence", "margin", "entropy"):
        assert torch.equal(getattr(whole, name), getattr(chunked, name)), name


@pytest.mark.parametrize("seed", [0, 1])
def test_chunked_canvas_loop_still_equals_transformers(monkeypatch, seed):
    """A chunk of 16 positions on a 32-token canvas (two chunks per row; the soft embeddings too),
    left padding and rows stopping at different steps: transformers' tokens from the same seed."""
    model = tiny_diffusion_gemma(seed, canvas_length=32, layers=2)
    ids, mask = left_padded_prompts(3, 9, seed)
    gc = generation_config(max_new_tokens=64, eos_token_id=list(range(1, 15)), max_denoising_steps=10,
                           entropy_bound=1.5, stability_threshold=0, confidence_threshold=3.5)
    torch.manual_seed(seed)
    reference = model.generate(ids, generation_config=gc, attention_mask=mask)
    monkeypatch.setattr(common, "CHUNK_BYTES", 16 * model.config.text_config.vocab_size * 4)
    torch.manual_seed(seed)
    ours = dlm.generate(model, ids, generation_config=gc, attention_mask=mask)
    assert torch.equal(ours.sequences, reference.sequences)
    assert ours.nfe < 10 * (ours.sequences.shape[1] - ids.shape[1]) // 32  # rows did stop early


def test_accept_rule_self_conditioning_unchanged_by_chunking(monkeypatch):
    """Our samplers on a canvas: the soft embeddings are computed in chunks; same tokens."""
    model = tiny_diffusion_gemma(3, canvas_length=32, layers=2)
    ids, mask = left_padded_prompts(2, 9, 3)
    kw = dict(attention_mask=mask, sampler="threshold", steps=8, gen_length=64,
              generation_config=generation_config(max_new_tokens=64))
    whole = dlm.generate(model, ids, generator=torch.Generator().manual_seed(1), **kw)
    monkeypatch.setattr(common, "CHUNK_BYTES", 16 * model.config.text_config.vocab_size * 4)
    chunked = dlm.generate(model, ids, generator=torch.Generator().manual_seed(1), **kw)
    assert torch.equal(whole.sequences, chunked.sequences)


# --- host syncs ---------------------------------------------------------------------------------
def test_counter_counts_reads_outside_modules_only():
    layer = torch.nn.Linear(3, 3)

    class Reads(torch.nn.Module):
        def forward(self, x):
            _ = x.sum().item()  # inside a module forward: the model's business, not counted
            return layer(x)

    x = torch.ones(2, 3)
    with HostSyncCounter() as syncs:
        Reads()(x)
        bool(x.any())
        x.tolist()
        _ = x[x > 0]
        x.nonzero()
    assert syncs.count == 4
    assert syncs.by_name["bool-mask index"] == 1


def _per_call_reads(blocks: int, per_block: int) -> int:
    """Reads allowed besides one per step: prompt validation (ids in range, mask token, padding,
    separator), and per block the block's end (masked loop: its last check and the EOS fill) or per
    canvas transformers' own helpers (encoder and decoder mask creation, canvas finalisation read
    the device about six times per canvas). A per-step read more would exceed this in every case
    below (each has more steps than the slack)."""
    return 6 + per_block * blocks


def _reads_between_steps(syncs: HostSyncCounter, records: list) -> list[int]:
    """Device reads between consecutive steps of the same block/canvas, from (block, count) pairs
    taken by the step callback."""
    return [b[1] - a[1] for a, b in zip(records, records[1:]) if a[0] == b[0]]


@pytest.mark.parametrize("kv_cache, sampler, eos", [("none", "confidence", False), ("prompt", "confidence", True),
                                                    ("none", "entropy", True), ("prompt", "margin", False)])
def test_masked_loop_reads_the_host_once_per_step(kv_cache, sampler, eos):
    model, tok = dlm.load("tiny-dlm")
    ids = torch.tensor([tok.encode_prompt("reverse: ana bo cyd tom"), tok.encode_prompt("sort: tom ana bo fay")])
    records = []
    with HostSyncCounter() as syncs:
        out = dlm.generate(model, ids, gen_length=64, block_length=16, steps=32, sampler=sampler, kv_cache=kv_cache,
                           eos_early_stop=eos, callback=lambda r: records.append((r.block, syncs.count)))
    between = _reads_between_steps(syncs, records)
    assert between and max(between) == 1, (between, dict(syncs.by_name))
    assert syncs.count <= out.nfe + _per_call_reads(4, 2), dict(syncs.by_name)


@pytest.mark.parametrize("sampler", [None, "threshold", "entropy_bound"])
def test_uniform_loop_reads_the_host_once_per_step(sampler):
    """Rows leave the decoder batch at different steps here (left padding, adaptive stopping): a
    change of the live set reads nothing either."""
    model = tiny_diffusion_gemma(1, canvas_length=16)
    ids, mask = left_padded_prompts(3, 8, 0)
    gc = generation_config(max_new_tokens=32, max_denoising_steps=12, entropy_bound=1.5, stability_threshold=0,
                           confidence_threshold=3.5, eos_token_id=[1])
    kw = {} if sampler is None else dict(sampler=sampler, steps=16, generator=torch.Generator().manual_seed(0))
    records = []
    torch.manual_seed(0)
    with HostSyncCounter() as syncs:
        out = dlm.generate(model, ids, attention_mask=mask, generation_config=gc,
                           callback=lambda r: records.append((r.block, syncs.count)), **kw)
    between = _reads_between_steps(syncs, records)
    assert between and max(between) == 1, (between, dict(syncs.by_name))
    assert syncs.count <= out.nfe + _per_call_reads(2, 8), dict(syncs.by_name)


@pytest.mark.parametrize("name", ["confidence", "margin", "entropy", "threshold", "eb", "random", "position",
                                  "hierarchical", "credit", "saber", "entropy_bound"])
def test_sampler_scoring_reads_nothing_from_the_device(name):
    policy = get_sampler(name)
    logits = torch.randn(2, 8, 50, generator=torch.Generator().manual_seed(0))
    x = torch.full((2, 8), 49)
    x[:, :2] = 3
    ctx = StepContext(x=x, candidates=x == 49, num_transfer=torch.tensor([2, 2]), step=0, steps_in_block=4,
                      last_step=False, temperature=0.0, generator=torch.Generator().manual_seed(0), mask_token_id=49,
                      block_start=0, state=policy.init_state(2, 8, torch.device("cpu")), rows=torch.arange(2))
    with HostSyncCounter() as syncs:
        policy.step(logits, ctx)
    assert syncs.count == 0, dict(syncs.by_name)
