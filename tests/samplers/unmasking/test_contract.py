"""The contract every registered dLLM sampler must honour (DESIGN.md, "Conventions").

Parametrised over the registry at collection time, so a newly registered sampler is tested too.
"""
from __future__ import annotations

import pytest
import torch

import dlm
from samplers import SAMPLERS, available_samplers, get_sampler
from toy_models import ToyDLM

ALL = available_samplers()
PROMPT = torch.tensor([[1, 2, 3, 4, 5], [6, 7, 8, 9, 10]])


def _sampler(name, model):
    """A sampler that carries a layer trained for one model (`joint`) gets one made for the toy."""
    if name == "joint":
        from joint_toy import toy_joint_sampler
        return toy_joint_sampler(model)
    return name


def run(name, model=None, steps=16, temperature=1.0, seed=0, prompt=PROMPT, **kw):
    model = model or ToyDLM()
    gen = torch.Generator().manual_seed(seed)
    kw.setdefault("gen_length", 16)
    kw.setdefault("block_length", 8)
    return dlm.generate(model, prompt, steps=steps, sampler=_sampler(name, model), temperature=temperature,
                        generator=gen, **kw)


@pytest.mark.parametrize("name", ALL)
def test_shapes_prompt_and_no_mask_left(name):
    out = run(name)
    assert out.sequences.shape == (2, 5 + 16)
    assert torch.equal(out.sequences[:, :5], PROMPT)
    assert not (out.sequences == ToyDLM().config.mask_token_id).any()


@pytest.mark.parametrize("name", ALL)
def test_seeded_determinism(name):
    a, b = run(name, seed=3), run(name, seed=3)
    assert torch.equal(a.sequences, b.sequences)


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("steps", [2, 5, 8, 16])
def test_budget_is_never_exceeded(name, steps):
    out = run(name, steps=steps)
    assert out.nfe <= steps
    assert sum(out.steps_per_block) == out.nfe
    if not SAMPLERS[name].adaptive:
        assert out.nfe == steps  # fixed schedules use exactly the budget they are given


@pytest.mark.parametrize("name", ALL)
def test_committed_tokens_stay_and_every_step_progresses(name):
    model = ToyDLM()
    out = run(name, model=model, steps=16, return_trace=True)
    mask_id = model.config.mask_token_id
    inputs = model.calls
    assert len(inputs) == out.nfe
    for before, after in zip(inputs, inputs[1:] + [out.sequences]):
        assert torch.equal(before[:, :5], after[:, :5])
        committed = before != mask_id
        if not SAMPLERS[name].remasks:
            assert torch.equal(before[committed], after[committed])
    for record in out.trace:
        progressed = record.committed[record.masks_left + record.committed > 0]
        assert (progressed >= 1).all()


@pytest.mark.parametrize("name", [n for n in ALL if n not in ("random", "joint")])  # random order draws depend on the batch
def test_left_padded_batch_matches_rows_alone(name):
    """Greedy decoding of a left-padded batch equals decoding each prompt on its own."""
    model = ToyDLM()
    short, long = torch.tensor([[3, 4, 5]]), torch.tensor([[1, 2, 3, 4, 5, 6]])
    pad = model.config.pad_token_id
    batch = torch.tensor([[pad, pad, pad, 3, 4, 5], [1, 2, 3, 4, 5, 6]])
    mask = (torch.arange(6) >= torch.tensor([[3], [0]])).long()
    together = run(name, model=model, prompt=batch, attention_mask=mask, temperature=0.0, steps=8)
    alone_short = run(name, model=model, prompt=short, temperature=0.0, steps=8)
    alone_long = run(name, model=model, prompt=long, temperature=0.0, steps=8)
    assert torch.equal(together.sequences[0, 3:], alone_short.sequences[0])
    assert torch.equal(together.sequences[1], alone_long.sequences[0])


@pytest.mark.parametrize("name", ALL)
def test_config_round_trips_through_json(name):
    sampler = get_sampler(name)
    config = type(sampler.config).from_json(sampler.config.to_json())
    assert config == sampler.config


def test_unknown_sampler_lists_valid_names():
    with pytest.raises(ValueError, match="valid samplers: .*confidence"):
        get_sampler("nope")
