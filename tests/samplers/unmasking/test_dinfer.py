"""dInfer's credit and hierarchical decoders on hand-built logits (the project's algorithm notes, 1.5)."""
from __future__ import annotations

import pytest
import torch

import dlm
from samplers import StepContext, get_sampler
from samplers.unmasking.credit import update_credit
from samplers.unmasking.hierarchical import best_of_each_run, run_ids
from toy_models import ToyDLM, peaked_logits

MASK = 9
V = 10


def logits_for(top_probs, tokens=None):
    return peaked_logits(top_probs, tokens, vocab=V, mask_id=MASK)


def ctx_for(x, state=None, step=0, k=1, rows=None):
    return StepContext(x=x, candidates=x == MASK, num_transfer=torch.full((x.shape[0],), k), step=step,
                       steps_in_block=8, last_step=False, temperature=0.0, generator=None, mask_token_id=MASK,
                       state={} if state is None else state, rows=rows)


# ---------------------------------------------------------------- credit

def test_credit_accumulates_decays_and_boosts_the_top1():
    credit = torch.zeros(1, 2, 3)
    probs = torch.tensor([[[0.7, 0.2, 0.1], [0.1, 0.6, 0.3]]])
    cand = torch.tensor([[True, False]])
    credit = update_credit(credit, probs, cand, decay=0.8, boost=0.2)
    assert torch.allclose(credit, torch.tensor([[[0.7 ** 0.2, 0, 0], [0, 0, 0]]]))
    credit = update_credit(credit, probs, cand, decay=0.8, boost=0.2)
    assert torch.allclose(credit, torch.tensor([[[1.8 * 0.7 ** 0.2, 0, 0], [0, 0, 0]]]))


def fused_top_prob(p, credit, alpha=0.7):
    """The probability of the boosted token after logits + alpha * log(1 + credit), by hand."""
    boosted = p * (1 + credit) ** alpha
    return boosted / (boosted + (1 - p))


def test_credit_commits_a_steady_token_that_plain_threshold_would_not():
    s = get_sampler("credit")  # tau 0.9, decay 0.8, boost 0.2, alpha 0.7
    state = s.init_state(1, 3, torch.device("cpu"))
    x = torch.full((1, 3), MASK)
    logits = logits_for([0.99, 0.84, 0.5])
    plain = get_sampler("threshold", tau=0.9).step(logits, ctx_for(x))
    assert plain.x.tolist() == [[0, MASK, MASK]]
    # Step 0: credit of position 1 is 0.84**0.2; fused p is below 0.9, so only the top-1 commits.
    c0 = 0.84 ** 0.2
    assert fused_top_prob(0.84, c0) < 0.9
    out = s.step(logits, ctx_for(x, state))
    assert out.x.tolist() == [[0, MASK, MASK]]
    assert out.confidence[0, 1].item() == pytest.approx(fused_top_prob(0.84, c0), rel=1e-5)
    # Step 1: the same prediction again: credit 1.8 * 0.84**0.2 lifts it over 0.9; position 2 stays below.
    c1 = 1.8 * c0
    assert fused_top_prob(0.84, c1) >= 0.9 > fused_top_prob(0.5, 1.8 * 0.5 ** 0.2)
    out = s.step(logits, ctx_for(out.x, state, step=1))
    assert out.x.tolist() == [[0, 1, MASK]]


def test_credit_resets_at_each_block_and_is_kept_per_row():
    s = get_sampler("credit")
    state = s.init_state(3, 6, torch.device("cpu"))
    x = torch.full((1, 3), MASK)
    logits = logits_for([0.99, 0.8, 0.5])
    s.step(logits, ctx_for(x, state, rows=torch.tensor([2])))
    first = state["credit"].clone()
    assert first[:2].abs().sum() == 0 and first[2].abs().sum() > 0  # only row 2 earned credit
    s.step(logits, ctx_for(x, state, step=0, rows=torch.tensor([2])))  # a new block: starts from zero
    assert torch.allclose(state["credit"], first)


def test_credit_with_alpha_zero_is_dinfers_threshold():
    logits = logits_for([0.95, 0.93, 0.5, 0.2])
    x = torch.full((1, 4), MASK)
    out = get_sampler("credit", alpha=0.0).step(logits, ctx_for(x))
    assert out.x.tolist() == [[0, 1, MASK, MASK]]
    # Nothing above tau: commit every position within 1e-5 of the best (here only the best).
    out = get_sampler("credit", alpha=0.0).step(logits_for([0.5, 0.4, 0.5 - 1e-7, 0.2]), ctx_for(x))
    assert out.x.tolist() == [[0, MASK, 2, MASK]]


# ---------------------------------------------------------------- hierarchical

def test_run_ids_number_contiguous_masks():
    cand = torch.tensor([[True, True, False, True, False, False, True, True]])
    assert run_ids(cand).tolist() == [[0, 0, 8, 1, 8, 8, 2, 2]]


def test_best_of_each_run_is_one_per_run_leftmost_on_ties():
    cand = torch.tensor([[True, True, False, True, True, True]])
    conf = torch.tensor([[0.3, 0.5, 0.99, 0.6, 0.6, 0.2]])
    assert best_of_each_run(conf, cand).tolist() == [[False, True, False, True, False, False]]


def test_hierarchical_commits_one_per_run_above_low():
    x = torch.tensor([[MASK, MASK, 7, MASK, MASK, MASK, 7, MASK]])
    # runs: {0,1}: best 0.6; {3,4,5}: best 0.7; {7}: 0.3 (below low 0.4, not the global top-1)
    logits = logits_for([0.5, 0.6, 0.1, 0.7, 0.45, 0.5, 0.1, 0.3])
    out = get_sampler("hierarchical").step(logits, ctx_for(x))
    assert out.x.tolist() == [[MASK, 1, 7, 3, MASK, MASK, 7, MASK]]


def test_hierarchical_adds_everything_above_tau_and_the_global_top1():
    x = torch.full((1, 6), MASK)
    # one run; its best (0.97) commits, so does 0.95 > tau; 0.85 does not.
    out = get_sampler("hierarchical").step(logits_for([0.97, 0.95, 0.85, 0.2, 0.2, 0.2]), ctx_for(x))
    assert out.x.tolist() == [[0, 1, MASK, MASK, MASK, MASK]]
    # every run's best is below low: only the global top-1 commits.
    x = torch.tensor([[MASK, 7, MASK, 7, MASK, MASK]])
    out = get_sampler("hierarchical").step(logits_for([0.3, 0.1, 0.35, 0.1, 0.2, 0.25]), ctx_for(x))
    assert out.x.tolist() == [[MASK, 7, 2, 7, MASK, MASK]]


def test_config_errors_name_the_field():
    with pytest.raises(ValueError, match="low must be in"):
        get_sampler("hierarchical", low=0.95)
    with pytest.raises(ValueError, match="tau must be in"):
        get_sampler("hierarchical", tau=0.0)
    with pytest.raises(ValueError, match="decay must be in"):
        get_sampler("credit", decay=1.0)
    with pytest.raises(ValueError, match="boost must be in"):
        get_sampler("credit", boost=0.0)
    with pytest.raises(ValueError, match="alpha must be"):
        get_sampler("credit", alpha=-1.0)


@pytest.mark.parametrize("name", ["credit", "hierarchical"])
def test_seeded_sampling_is_deterministic_and_seed_dependent(name):
    model = ToyDLM()
    prompt = torch.tensor([[1, 2, 3, 4, 5], [5, 4, 3, 2, 1]])

    def go(seed):
        return dlm.generate(model, prompt, gen_length=16, block_length=8, steps=16, sampler=name,
                            temperature=1.0, generator=torch.Generator().manual_seed(seed)).sequences

    assert torch.equal(go(1), go(1))
    assert any(not torch.equal(go(1), go(s)) for s in (2, 3, 4))
