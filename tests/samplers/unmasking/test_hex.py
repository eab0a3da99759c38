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


def test_published_plan_gives_every_expert_gen_over_2_passes():
    assert published_ladder(256) == [8, 16, 32, 64, 128]
    assert published_ladder(128) == [4, 8, 16, 32, 64]
    # Published (default): every expert of the ladder, the block-2 expert included, gets gen/2
    # passes; steps is the ensemble's total and None means exactly experts x gen/2.
    assert plan_experts(256, None, HexConfig()) == [(b, 128) for b in (8, 16, 32, 64, 128)]
    assert plan_experts(64, None, HexConfig()) == [(b, 32) for b in (2, 4, 8, 16, 32)]
    assert plan_experts(64, 160, HexConfig()) == plan_experts(64, 1000, HexConfig())  # a cap the experts do not reach
    # A ladder block that cannot take 2 tokens per pass (block 1 at gen 16) is left out.
    assert plan_experts(16, None, HexConfig()) == [(b, 8) for b in (2, 4, 8)]
    assert plan_experts(64, None, HexConfig(block_lengths=(4, 16), tokens_per_step=4)) == [(4, 16), (16, 16)]
    # Uniform noise: the rule per canvas, the passes and steps counted over every canvas.
    assert plan_experts(16, None, HexConfig(), canvases=2) == [(2, 16), (4, 16), (8, 16)]
    assert plan_experts(16, 48, HexConfig(), canvases=2) == plan_experts(16, None, HexConfig(), canvases=2)
    with pytest.raises(ValueError, match=r"steps=47 .* x 2 canvases = 48 forward passes"):
        plan_experts(16, 47, HexConfig(), canvases=2)


def test_split_budget_is_the_old_shared_total():
    # The pre-published rule, kept behind budget="split": steps (default gen_length) is shared
    # evenly; experts whose blocks cannot all get a pass are dropped, smallest block first.
    split = HexConfig(budget="split")
    plan = plan_experts(64, 64, split)
    assert plan == [(4, 16), (8, 16), (16, 16), (32, 16)] and sum(s for _, s in plan) <= 64
    assert plan_experts(64, None, split) == plan
    assert plan_experts(64, 4, split) == [(32, 4)]
    assert plan_experts(64, 160, split) == plan_experts(64, None, HexConfig())  # 160 = 5 x 32: the published plan


def test_config_with_experts_round_trips_through_json():
    config = HexConfig(block_lengths=(4, 8), expert="margin", tokens_per_step=1, budget="split")
    assert HexConfig.from_json(config.to_json()) == config
    assert HexConfig(block_lengths="4/8", expert="margin", tokens_per_step=1, budget="split") == config  # the CLI's form
    with pytest.raises(ValueError, match="4/8/16"):
        HexConfig(block_lengths="4,x")


def test_experts_are_plain_generations_and_the_vote_picks_one():
    model = ToyDLM()
    config = HexConfig(block_lengths=(2, 4, 8, 16), tokens_per_step=1)
    # A coarse extractor (first generated token) so that experts agree and disagree.
    extract = lambda row, ids: int(ids[0])
    out = hex_generate(model, PROMPT, gen_length=16, steps=64, config=config, extract=extract)  # 4 x 16 = 64
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
    assert a.experts.block_lengths == [4, 8, 16] and a.experts.steps == [8, 8, 8]  # gen/2 each, 24 <= 32


def test_default_is_the_published_setting_and_nfe_is_the_total():
    """No steps: every expert of the gen-32 ladder (block 1, gen/32, cannot take 2 tokens per pass
    and is left out) decodes with 16 passes, exactly as `dlm.generate` alone would; the result's
    nfe / forward_tokens are their sums."""
    model = ToyDLM()
    out = dlm.generate(model, PROMPT, gen_length=32, sampler="hex", eos_early_stop=False)
    ex = out.experts
    assert ex.block_lengths == [2, 4, 8, 16] and ex.steps == [16] * 4
    alone = [dlm.generate(model, PROMPT, gen_length=32, block_length=b, steps=16, sampler="confidence",
                          eos_early_stop=False) for b in ex.block_lengths]
    for e, one in enumerate(alone):
        assert torch.equal(ex.sequences[e], one.sequences) and ex.nfe[e] == one.nfe == 16
    assert out.nfe == 64 == sum(ex.nfe) and out.tpf == 32 / 64
    assert out.forward_tokens == sum(o.forward_tokens for o in alone)
    # split keeps the old shared budget: 32 in total, 32 // 3 = 10 passes for each of the three experts that fit.
    split = dlm.generate(model, PROMPT, gen_length=32, steps=32, sampler="hex", sampler_config={"budget": "split"},
                         eos_early_stop=False)
    assert split.experts.block_lengths == [4, 8, 16] and split.experts.steps == [10] * 3 and split.nfe == 30
