"""LoPA (lookahead parallel decoding): exactness of the lookahead path and of its branch search."""
from __future__ import annotations

import pytest
import torch

import dlm
from samplers import Sampler, StepResult, get_sampler
from samplers.unmasking._common import negative_entropy, token_probs
from samplers.unmasking.lopa import lookahead_branches, readiness
from toy_models import ShiftedToy, ToyDLM
from dlm.tiny import TinyDLMConfig, TinyDLMModel

PROMPT = torch.tensor([[1, 2, 3, 4, 5], [6, 7, 8, 9, 10]])


def tiny_model():
    torch.manual_seed(0)
    config = TinyDLMConfig(vocab_size=16, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                           intermediate_size=64, mask_token_id=15, eos_token_id=14, pad_token_id=0)
    return TinyDLMModel(config).eval()


def gen(model, sampler, **kw):
    kw.setdefault("gen_length", 16)
    kw.setdefault("block_length", 8)
    kw.setdefault("steps", 16)
    return dlm.generate(model, PROMPT, sampler=sampler, **kw)


@pytest.mark.parametrize("case", ["aligned", "shifted", "prefix", "dual", "temperature"])
def test_one_branch_equals_threshold_token_for_token(case):
    """branches=1 runs every pass after a block's first through ctx.forward and reuses its logits:
    the result must be exactly `threshold`'s, with the same number of forward passes."""
    kw = {}
    model = ToyDLM()
    if case == "shifted":
        model = ShiftedToy(ToyDLM())
        kw["shift_logits"] = True
    elif case in ("prefix", "dual"):
        model, kw["kv_cache"] = tiny_model(), case
    elif case == "temperature":
        kw["temperature"] = 1.0
    for tau in (0.9, 0.3):
        seeds = [torch.Generator().manual_seed(5) for _ in range(2)]
        plain = gen(model, get_sampler("threshold", tau=tau), generator=seeds[0], **kw)
        look = gen(model, get_sampler("lopa", branches=1, tau=tau), generator=seeds[1], return_trace=True, **kw)
        assert torch.equal(plain.sequences, look.sequences)
        assert plain.nfe == look.nfe and plain.steps_per_block == look.steps_per_block
        # ... and the lookahead path really ran: steps that reused its logits cost 0 passes.
        assert sum(r.forwards == 0 for r in look.trace) > 0


def test_lookahead_logits_equal_separate_full_forwards():
    """ctx.forward on k candidates per row == the model run on each candidate sequence alone."""
    model = ToyDLM()
    seen = {}

    class Probe(Sampler):
        name = "probe"
        looks_ahead = True

        def step(self, logits, ctx):
            if "cands" not in seen:
                g = torch.Generator().manual_seed(0)
                cands = torch.randint(0, 14, (ctx.x.shape[0], 3, ctx.x.shape[1]), generator=g)
                cands[:, :, ::2] = ctx.mask_token_id
                seen["cands"], seen["out"] = cands, ctx.forward(cands)
                seen["x"] = ctx.x
            x = torch.where(ctx.candidates, logits.argmax(-1), ctx.x)
            return StepResult(x, logits.argmax(-1), torch.ones_like(ctx.x, dtype=torch.float))

    gen(model, Probe(), steps=4, block_length=16)
    cands, out = seen["cands"], seen["out"]
    for r in range(2):
        for j in range(3):
            seq = torch.cat([PROMPT[r], cands[r, j]]).unsqueeze(0)
            ref = model(seq).logits[0, 5:]
            torch.testing.assert_close(out[r, j, :, :14], ref[:, :14])
            assert torch.isinf(out[r, j, :, 15]).all()  # the mask token is never a proposal


def test_branches_fill_the_most_confident_remaining_masks():
    anchor = torch.tensor([[9, 9, 1, 9, 9]])
    proposal = torch.tensor([[3, 4, 5, 6, 7]])
    conf = torch.tensor([[0.5, 0.8, 0.99, 0.2, 0.7]])
    branches = lookahead_branches(anchor, proposal, conf, anchor == 9, 4)
    assert branches.tolist() == [[[9, 9, 1, 9, 9], [9, 4, 1, 9, 9], [9, 9, 1, 9, 7], [3, 9, 1, 9, 9]]]
    # Fewer remaining masks than branches: the spare branches repeat the anchor.
    few = lookahead_branches(anchor, proposal, conf, torch.tensor([[False, True, False, False, False]]), 3)
    assert few.tolist() == [[[9, 9, 1, 9, 9], [9, 4, 1, 9, 9], [9, 9, 1, 9, 9]]]


def test_readiness_is_mean_negative_entropy_of_remaining_masks():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(1, 2, 4, 6, generator=g)
    branches = torch.tensor([[[5, 1, 5, 2], [1, 1, 1, 1]]])
    score = readiness(logits, branches, 5)
    ne = negative_entropy(token_probs(logits))
    assert score[0, 0] == pytest.approx(float((ne[0, 0, 0] + ne[0, 0, 2]) / 2))
    assert score[0, 1] == 0.0  # nothing left to fill: the best possible score


@pytest.mark.parametrize("kv_cache", ["none", "prefix", "dual"])
def test_lookahead_commits_more_per_forward_and_is_counted(kv_cache):
    model = tiny_model() if kv_cache != "none" else ToyDLM()
    plain = gen(model, "threshold", kv_cache=kv_cache, steps=16)
    look = gen(model, "lopa", kv_cache=kv_cache, steps=16, return_trace=True)
    assert look.nfe <= 16 and sum(look.steps_per_block) == look.nfe
    assert look.branch_forwards == sum(r.branch_forwards for r in look.trace)
    assert look.nfe < look.branch_forwards <= 3 * look.nfe
    # Each lookahead round commits the threshold fill plus the winning branch's extra token, so
    # on a model with uncertain outputs it needs no more passes than plain threshold decoding.
    assert look.nfe <= plain.nfe


def test_config_is_validated():
    with pytest.raises(ValueError, match="branches"):
        get_sampler("lopa", branches=0)
    with pytest.raises(ValueError, match="tau"):
        get_sampler("lopa", tau=1.5)
