"""HEX (hidden semi-autoregressive experts): expert planning, the vote, and the driver-level ensemble."""
from __future__ import annotations

import pytest
import torch

import dlm
from dlm.ensemble import hex_generate
from samplers import get_sampler
from samplers.unmasking.hex import HexConfig, majority_vote, plan_experts, published_ladder
from toy_models import ToyDLM

PROMPT = torch.tensor([[1, 2, 3, 4, 5], [6, 7, 8, 9, 10], [3, 1, 4, 1, 5]])


def test_vote_drops_none_and_breaks_ties_by_first_seen():
    assert majority_vote(["7", None, "7", "3"]) == 0
    assert majority_vote([None, "3", "7", "7", "3"]) == 1  # 2-2 tie: "3" was seen first
    assert majority_vote([None, "5", "6", "6"]) == 2
    assert majority_vote([None, None]) is None


def test_published_ladder_and_budget_split():
    assert published_ladder(256) == [8, 16, 32, 64, 128]
    assert published_ladder(128) == [4, 8, 16, 32, 64]
    # Published budget: gen/2 passes per expert, summed over the five experts.
    assert plan_experts(256, 640, HexConfig()) == [(b, 128) for b in (8, 16, 32, 64, 128)]
    # A smaller total budget is shared; experts whose blocks cannot all get a pass are dropped,
    # smallest block first; the sum never exceeds the budget.
    plan = plan_experts(64, 64, HexConfig())
    assert plan == [(4, 16), (8, 16), (16, 16), (32, 16)] and sum(s for _, s in plan) <= 64
    assert plan_experts(64, 4, HexConfig()) == [(32, 4)]


def test_bad_settings_fail_with_the_fix():
    with pytest.raises(ValueError, match="do not divide gen_length"):
        plan_experts(64, 64, HexConfig(block_lengths=(5, 8)))
    with pytest.raises(ValueError, match="raise steps"):
        plan_experts(64, 8, HexConfig(block_lengths=(4, 8)))
    with pytest.raises(ValueError, match="cannot run a HEX expert"):
        get_sampler("hex", expert="hex")
    with pytest.raises(ValueError, match="duplicates"):
        get_sampler("hex", block_lengths=(8, 8))
    with pytest.raises(ValueError, match="per expert"):
        hex_generate(ToyDLM(), PROMPT, gen_length=16, block_length=8)


def test_config_with_experts_round_trips_through_json():
    config = HexConfig(block_lengths=(4, 8), expert="margin", tokens_per_step=1)
    assert HexConfig.from_json(config.to_json()) == config
    assert HexConfig(block_lengths="4/8", expert="margin", tokens_per_step=1) == config  # the CLI's form
    with pytest.raises(ValueError, match="4/8/16"):
        HexConfig(block_lengths="4,x")


def test_experts_are_plain_generations_and_the_vote_picks_one():
    model = ToyDLM()
    config = HexConfig(block_lengths=(2, 4, 8, 16), tokens_per_step=1)
    # A coarse extractor (first generated token) so that experts agree and disagree.
    extract = lambda row, ids: int(ids[0])
    out = hex_generate(model, PROMPT, gen_length=16, steps=64, config=config, extract=extract)
    ex = out.experts
    assert ex.block_lengths == [2, 4, 8, 16] and ex.steps == [16] * 4
    for e, block in enumerate(ex.block_lengths):
        alone = dlm.generate(model, PROMPT, gen_length=16, block_length=block, steps=16, sampler="confidence")
        assert torch.equal(ex.sequences[e], alone.sequences)
        assert ex.nfe[e] == alone.nfe
    assert out.nfe == sum(ex.nfe) == out.branch_forwards and out.nfe <= 64
    for r in range(PROMPT.shape[0]):
        answers = ex.answers[r]
        assert answers == [int(ex.sequences[e, r, 5]) for e in range(4)]
        assert ex.votes[r] == answers[ex.winner[r]]
        assert answers.count(ex.votes[r]) == max(answers.count(a) for a in answers)
        assert answers.index(ex.votes[r]) == ex.winner[r]  # the first expert with that answer
        assert torch.equal(out.sequences[r], ex.sequences[ex.winner[r], r])


def test_generate_by_name_runs_the_ensemble():
    model = ToyDLM()
    a = dlm.generate(model, PROMPT, gen_length=16, steps=32, sampler="hex", sampler_config={"block_lengths": (4, 8, 16)})
    b = hex_generate(model, PROMPT, gen_length=16, steps=32, config=HexConfig(block_lengths=(4, 8, 16)))
    assert torch.equal(a.sequences, b.sequences) and a.nfe == b.nfe
    assert a.experts.block_lengths == [4, 8, 16]
