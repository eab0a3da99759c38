"""Counts and row bookkeeping of the masked loop, checked against what the model was actually given.

`forward_tokens` (the query positions processed, the compute proxy the benchmarks report) must equal the
positions of every model call, lookahead branches included; a row that committed its EOS in one block
must not be fed to the model in later blocks. Mutation testing found both unchecked (docs/testing.md).
"""
from __future__ import annotations

import pytest
import torch

import dlm
from samplers import get_sampler
from test_engine_skips import RowEos
from toy_models import ToyDLM


@pytest.mark.parametrize("sampler", ["confidence", "threshold", "lopa"])
@pytest.mark.parametrize("eos_early_stop", [False, True])
def test_forward_tokens_count_every_position_the_model_reads(sampler, eos_early_stop):
    model = ToyDLM(seed=2)
    ids = torch.randint(0, 13, (3, 5), generator=torch.Generator().manual_seed(0))
    out = dlm.generate(model, ids, gen_length=16, block_length=8, steps=8, sampler=sampler, kv_cache="none",
                       eos_early_stop=eos_early_stop)
    assert out.forward_tokens == sum(call.numel() for call in model.calls)
    assert out.forward_tokens > 0


def test_lookahead_branches_are_counted_in_forward_tokens():
    model = ToyDLM(seed=4)
    ids = torch.randint(0, 13, (2, 5), generator=torch.Generator().manual_seed(1))
    out = dlm.generate(model, ids, gen_length=16, block_length=16, steps=8, sampler=get_sampler("lopa", branches=3),
                       kv_cache="none", eos_early_stop=False)
    assert out.branch_forwards > out.nfe  # the branches really ran
    assert out.forward_tokens == sum(call.numel() for call in model.calls)


def test_a_row_finished_in_one_block_is_not_decoded_in_the_next_ones():
    ids = torch.arange(2).unsqueeze(1).repeat(1, 4)
    model = RowEos(prompt_length=4, n=[1, 10])  # row 0 commits EOS in block 0, row 1 runs to block 2
    out = dlm.generate(model, ids, gen_length=16, block_length=4, steps=16, eos_early_stop=True, sampler="confidence")
    first_block_calls = out.steps_per_block[0]
    assert all(rows == [1] for rows in model.rows_seen[first_block_calls:])
    assert out.sequences[0, 4:].tolist() == [5] + [8] * 15


def test_the_loop_ends_when_every_row_has_finished():
    ids = torch.arange(2).unsqueeze(1).repeat(1, 4)
    model = RowEos(prompt_length=4, n=[1, 2])  # both rows commit their EOS inside block 0
    out = dlm.generate(model, ids, gen_length=16, block_length=4, steps=16, eos_early_stop=True, sampler="confidence")
    assert len(out.steps_per_block) == 1 and out.nfe == out.steps_per_block[0] == len(model.rows_seen)
    assert out.sequences[:, 4:].tolist() == [[5] + [8] * 15, [5, 5] + [8] * 14]


@pytest.mark.parametrize("across_blocks", [False, True])
@pytest.mark.parametrize("kv_cache", ["prefix", "dual"])
@pytest.mark.parametrize("sampler", ["confidence", "lopa"])
def test_forward_tokens_with_a_kv_cache_count_the_positions_embedded(kv_cache, sampler, across_blocks):
    # With a cache only the window's positions enter the model: count them where they are embedded.
    # `cache_across_blocks` starts each later block by extending the cache (from the previous block's
    # start to the end) instead of a full forward: those positions are counted too.
    from dlm.tiny import TinyCharTokenizer, TinyDLMConfig, TinyDLMModel

    torch.manual_seed(0)
    config = TinyDLMConfig(vocab_size=TinyCharTokenizer().vocab_size, hidden_size=32, num_hidden_layers=1,
                           num_attention_heads=2, intermediate_size=64)
    model = TinyDLMModel(config).eval()
    embedded = []
    model.get_input_embeddings().register_forward_hook(lambda module, args, out: embedded.append(args[0].numel()))
    ids = torch.randint(3, 40, (2, 6), generator=torch.Generator().manual_seed(1))
    out = dlm.generate(model, ids, gen_length=16, block_length=8, steps=8, sampler=sampler, kv_cache=kv_cache,
                       eos_early_stop=False, cache_across_blocks=across_blocks)
    assert out.forward_tokens == sum(embedded)
    if across_blocks:  # the second block opened on an extension: 2 rows x (16 + 6 - 6) positions, not 2 x 22
        assert 2 * 16 in embedded and embedded.count(2 * 22) == 1


def test_a_prompt_without_the_separator_is_refused_naming_its_row():
    from dlm.tiny import TinyCharTokenizer, TinyDLMConfig, TinyDLMModel

    torch.manual_seed(0)
    config = TinyDLMConfig(vocab_size=TinyCharTokenizer().vocab_size, hidden_size=32, num_hidden_layers=1,
                           num_attention_heads=2, intermediate_size=64, position_restart_token_id=7)
    ids = torch.tensor([[3, 4, 7], [5, 6, 7], [5, 6, 4]])  # row 2 lacks the separator 7 at its end
    with pytest.raises(ValueError, match="prompt row 2 does not end with the model's prompt separator"):
        dlm.generate(TinyDLMModel(config).eval(), ids, gen_length=8, block_length=8, steps=8)


def test_a_lookahead_call_on_finished_rows_costs_nothing_and_keeps_the_logits_shape():
    """Every row's candidates end at EOS with nothing masked before it: no model call, and the sampler
    still gets `[R, k, Lb, V]` logits (zeros, the mask token at -inf, as for the driver's own logits)."""
    from dlm.engine.masked.lookahead import BlockLookahead

    R, k, Lb, V, mask_id, eos_id = 2, 3, 4, 10, 9, 1
    logits = torch.randn(R, Lb, V)
    look = BlockLookahead(forward=None, x_rows=torch.zeros(R, 6, dtype=torch.long), start=2, end=2 + Lb,
                             mask_id=mask_id, allowance=5, eos_id=eos_id, like=logits)
    out = look(torch.full((R, k, Lb), eos_id, dtype=torch.long))
    assert out.shape == (R, k, Lb, V) and out.dtype == logits.dtype
    assert (out[..., mask_id] == float("-inf")).all() and (out[..., :mask_id] == 0).all()
    assert (look.calls, look.branches, look.free_calls, look.left) == (0, 0, 1, 5)


def test_host_live_rows_are_made_on_the_loop_device():
    """The host-side live rows index device tensors: they are made on the device given (meta: shape only,
    no data, so a tensor left on the CPU would show), and are None when every row is live."""
    from dlm.engine.driver import Rows, subset_index

    index = subset_index([True, False, True], torch.device("meta"))
    assert index.device.type == "meta" and index.shape == (2,) and index.dtype == torch.long
    assert torch.equal(subset_index([False, True, True], "cpu"), torch.tensor([1, 2]))
    assert subset_index([True, True], "cpu") is None
    rows = Rows.from_flags([False, True, True], torch.device("meta"))
    assert rows.host == [1, 2] and rows.index.device.type == "meta" and not rows.every
    assert Rows.of(None, 3, "cpu").every and Rows.of([0, 2], 3, "cpu").host == [0, 2]
    # every row taken: the index of all rows, or the caller's own `every_index` tensor itself (no new one)
    assert torch.equal(Rows.of(None, 3, "cpu").index, torch.arange(3))
    assert torch.equal(Rows.of([0, 1, 2], 3, "cpu").index, torch.arange(3))
    every = torch.arange(3)
    assert Rows.of(None, 3, "cpu", every_index=every).index is every
    assert Rows.of([0, 1, 2], 3, "cpu", every_index=every).index is every
    assert torch.equal(Rows.of([0, 2], 3, "cpu", every_index=every).index, torch.tensor([0, 2]))
    assert not Rows.of([0, 2], 3, "cpu").every and not Rows.of([], 3, "cpu").every and Rows.of([0, 1, 2], 3, "cpu").every


def test_the_cache_handed_to_the_next_block_holds_its_rows():
    """Block rows [3, 5, 7]; the cache kept only block rows 0 and 2 (batch rows 3 and 7) after row 5
    finished. The next block decodes batch rows [3, 7] (the cache as it is) or [7] (its second row)."""
    from types import SimpleNamespace

    from dlm.engine.masked.kv_cache import carry_cache

    rows = torch.tensor([3, 5, 7])
    cache = (torch.tensor([[30.0], [70.0]]), [torch.tensor([[31.0], [71.0]])])  # legacy nested [Rc, ...]
    forward = SimpleNamespace(cache=cache, cache_rows=torch.tensor([0, 2]))
    same, start = carry_cache(forward, rows, 12, torch.tensor([3, 7]))
    assert same is cache and start == 12
    only_7, _ = carry_cache(forward, rows, 12, torch.tensor([7]))
    assert torch.equal(only_7[0], torch.tensor([[70.0]])) and torch.equal(only_7[1][0], torch.tensor([[71.0]]))
    every_row = SimpleNamespace(cache=(torch.tensor([[30.0], [50.0], [70.0]]),), cache_rows=None)
    assert torch.equal(carry_cache(every_row, rows, 12, torch.tensor([5, 7]))[0][0], torch.tensor([[50.0], [70.0]]))
    assert carry_cache(SimpleNamespace(cache=None, cache_rows=None), rows, 12, rows) is None


def test_a_lookahead_sampler_is_told_the_forwards_left_in_its_block():
    """`ctx.forwards_left` (the API a lookahead sampler plans with) equals what `ctx.forward` still allows:
    the block's steps not yet taken, 0 at the block's last step (no lookahead there)."""
    from samplers.unmasking.confidence import ConfidenceSampler

    class Spy(ConfidenceSampler):
        looks_ahead = True

        def step(self, logits, ctx):
            seen.append((ctx.forwards_left, None if ctx.forward is None else ctx.forward.left))
            return super().step(logits, ctx)

    seen = []
    ids = torch.randint(0, 13, (1, 5), generator=torch.Generator().manual_seed(1))
    out = dlm.generate(ToyDLM(seed=4), ids, gen_length=16, block_length=8, steps=8, sampler=Spy(),
                       kv_cache="none", eos_early_stop=False)
    assert out.nfe == 8
    assert seen == [(3, 3), (2, 2), (1, 1), (0, None)] * 2


def test_the_progress_bar_counts_forward_passes_unless_told_to_count_units(capsys):
    """The masked loop's bar runs over the forward budget (each pass counts); the uniform loop's,
    with no step budget, over canvases (`per_unit`): one count per finished canvas."""
    from dlm.engine.driver import Tally

    passes = Tally(total=8, desc="passes", unit="nfe", progress=True, callback=None, keep_trace=False)
    passes.forwards(3, 5)
    passes.unit_done(3, 40)
    assert (passes.bar.n, passes.nfe, passes.branch_forwards, passes.forward_tokens) == (3, 3, 5, 40)
    units = Tally(total=2, desc="canvases", unit="canvas", progress=True, callback=None, keep_trace=False,
                  per_unit=True)
    units.forwards(3, 0)
    units.unit_done(3, 40)
    assert (units.bar.n, units.nfe) == (1, 3)
    assert (passes.bar.unit, units.bar.unit) == ("nfe", "canvas")  # the unit the bar shows
    assert passes.bar.leave is False and units.bar.leave is False  # cleared when the call ends
    passes.bar.close()
    units.bar.close()


def test_a_lookahead_call_of_the_wrong_shape_or_dtype_is_refused():
    """`ctx.forward` takes candidates `[rows, k, block_length]` long: every other row count, block length,
    rank or dtype is a ValueError; a call past the budget is the sampler's bug, a RuntimeError."""
    from dlm.engine.driver import check_lookahead_call

    good = torch.zeros(2, 3, 8, dtype=torch.long)
    check_lookahead_call(good, rows=2, block_length=8, left=1, unit="block")  # accepted
    for bad in (torch.zeros(3, 3, 8, dtype=torch.long), torch.zeros(2, 3, 7, dtype=torch.long),
                torch.zeros(2, 8, dtype=torch.long), good.float()):
        with pytest.raises(ValueError, match=r"ctx.forward needs candidates of shape \[2, k, 8\]"):
            check_lookahead_call(bad, rows=2, block_length=8, left=1, unit="block")
    with pytest.raises(RuntimeError, match="the block's step budget is spent"):
        check_lookahead_call(good, rows=2, block_length=8, left=0, unit="block")
