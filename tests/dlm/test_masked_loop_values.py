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


@pytest.mark.parametrize("kv_cache", ["prefix", "dual"])
@pytest.mark.parametrize("sampler", ["confidence", "lopa"])
def test_forward_tokens_with_a_kv_cache_count_the_positions_embedded(kv_cache, sampler):
    # With a cache only the window's positions enter the model: count them where they are embedded.
    from dlm.tiny import TinyCharTokenizer, TinyDLMConfig, TinyDLMModel

    torch.manual_seed(0)
    config = TinyDLMConfig(vocab_size=TinyCharTokenizer().vocab_size, hidden_size=32, num_hidden_layers=1,
                           num_attention_heads=2, intermediate_size=64)
    model = TinyDLMModel(config).eval()
    embedded = []
    model.get_input_embeddings().register_forward_hook(lambda module, args, out: embedded.append(args[0].numel()))
    ids = torch.randint(3, 40, (2, 6), generator=torch.Generator().manual_seed(1))
    out = dlm.generate(model, ids, gen_length=16, block_length=8, steps=8, sampler=sampler, kv_cache=kv_cache,
                       eos_early_stop=False)
    assert out.forward_tokens == sum(embedded)


def test_a_prompt_without_the_separator_is_refused_naming_its_row():
    from dlm.tiny import TinyCharTokenizer, TinyDLMConfig, TinyDLMModel

    torch.manual_seed(0)
    config = TinyDLMConfig(vocab_size=TinyCharTokenizer().vocab_size, hidden_size=32, num_hidden_layers=1,
                           num_attention_heads=2, intermediate_size=64, position_restart_token_id=7)
    ids = torch.tensor([[3, 4, 7], [5, 6, 7], [5, 6, 4]])  # row 2 lacks the separator 7 at its end
    with pytest.raises(ValueError, match="prompt row 2 does not end with the model's prompt separator"):
        dlm.generate(TinyDLMModel(config).eval(), ids, gen_length=8, block_length=8, steps=8)
