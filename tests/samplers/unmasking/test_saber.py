"""Saber's rules on hand-built logits, and its remasking through the driver."""
from __future__ import annotations

import pytest
import torch

import dlm
from samplers import StepContext, get_sampler
from samplers.unmasking.saber import backtrack_count, running_mean_threshold
from toy_models import ToyDLM, peaked_logits

MASK = 9
V = 10


def logits_for(top_probs, tokens=None):
    return peaked_logits(top_probs, tokens, vocab=V, mask_id=MASK)


def ctx_for(x, state, step=0, k=1, last=False):
    return StepContext(x=x, candidates=x == MASK, num_transfer=torch.tensor([k]), step=step, steps_in_block=8,
                       last_step=last, temperature=0.0, generator=None, mask_token_id=MASK, state=state,
                       rows=torch.tensor([0]))


def fresh(sampler, length):
    return sampler.init_state(1, length, torch.device("cpu"))


def test_first_step_commits_the_top_n_since_the_threshold_starts_at_one():
    s = get_sampler("saber")  # n = 2
    x = torch.full((1, 5), MASK)
    out = s.step(logits_for([0.5, 0.9, 0.3, 0.99, 0.2]), ctx_for(x, fresh(s, 5)))
    assert out.x.tolist() == [[MASK, 1, MASK, 3, MASK]]


def test_threshold_is_the_running_mean_of_commit_time_confidences():
    s = get_sampler("saber", n=1)
    state = fresh(s, 5)
    x = torch.full((1, 5), MASK)
    out = s.step(logits_for([0.6, 0.8, 0.3, 0.3, 0.3]), ctx_for(x, state))
    # Threshold 1.0: only the floor of n = 1 (position 1, p 0.8).
    assert out.x.tolist() == [[MASK, 1, MASK, MASK, MASK]]
    out = s.step(logits_for([0.6, 0.8, 0.3, 0.3, 0.3]), ctx_for(out.x, state, step=1))
    # Mean so far 0.8: position 0 (0.6) does not pass, the floor commits it anyway, mean -> 0.7.
    assert out.x.tolist() == [[0, 1, MASK, MASK, MASK]]
    assert running_mean_threshold(state["commit_conf"]).item() == pytest.approx(0.7)
    out = s.step(logits_for([0.6, 0.8, 0.75, 0.72, 0.5]), ctx_for(out.x, state, step=2))
    # 0.75 and 0.72 pass the mean 0.7; 0.5 does not.
    assert out.x.tolist() == [[0, 1, 2, 3, MASK]]


def test_the_running_mean_counts_every_committed_confidence_from_the_first():
    """Rows of commit-time confidences (NaN: not committed) -> their mean, 1.0 for a row with none;
    a single commitment is its own mean (worked by hand)."""
    nan = float("nan")
    conf = torch.tensor([[nan, nan, nan], [nan, 0.8, nan], [0.6, 0.8, nan], [0.5, 0.25, 0.75]])
    assert running_mean_threshold(conf).tolist() == pytest.approx([1.0, 0.8, 0.7, 0.5])


def test_backtracking_remasks_the_largest_drop():
    s = get_sampler("saber", n=2)
    state = fresh(s, 6)
    x = torch.full((1, 6), MASK)
    out = s.step(logits_for([0.9, 0.9, 0.1, 0.1, 0.1, 0.1]), ctx_for(x, state))
    assert out.x.tolist() == [[0, 1, MASK, MASK, MASK, MASK]]
    # Next step: token 0 falls 0.9 -> 0.5, token 1 falls 0.9 -> 0.8; two new tokens committed (fix = 2),
    # r = min(max(1, ceil(2/8)), 2 - 1) = 1: only token 0 is masked again.
    out = s.step(logits_for([0.5, 0.8, 0.95, 0.94, 0.1, 0.1]), ctx_for(out.x, state, step=1))
    assert out.x.tolist() == [[MASK, 1, 2, 3, MASK, MASK]]


@pytest.mark.parametrize("measure, remasked", [("token", True), ("top1", False)])
def test_measure_token_sees_an_overtaken_token_top1_does_not(measure, remasked):
    """Position 0 now predicts token 5 with 0.95: the committed token 0 fell to ~0.006, the top-1 rose."""
    s = get_sampler("saber", n=2, measure=measure)
    state = fresh(s, 5)
    x = torch.full((1, 5), MASK)
    out = s.step(logits_for([0.9, 0.85, 0.1, 0.1, 0.1]), ctx_for(x, state))
    assert out.x.tolist() == [[0, 1, MASK, MASK, MASK]]
    # position 1: committed token 1 falls 0.85 -> 0.8 under both readings
    out = s.step(logits_for([0.95, 0.8, 0.9, 0.9, 0.1], tokens=[5, 1, 2, 3, 4]), ctx_for(out.x, state, step=1))
    assert (out.x[0, 0].item() == MASK) is remasked
    assert (out.x[0, 1].item() == MASK) is not remasked


@pytest.mark.parametrize("mode, expected", [("drop", [[0, 1, 2, 3, MASK, MASK]]), ("always", [[0, MASK, 2, 3, MASK, MASK]]),
                                            ("off", [[0, 1, 2, 3, MASK, MASK]])])
def test_the_trap_no_drop_means_no_remask_unless_always(mode, expected):
    s = get_sampler("saber", backtrack=mode)
    state = fresh(s, 6)
    x = torch.full((1, 6), MASK)
    out = s.step(logits_for([0.9, 0.9, 0.1, 0.1, 0.1, 0.1]), ctx_for(x, state))
    # Both committed tokens gain probability (0.9 -> 0.99 and 0.9 -> 0.95): no actual drop.
    out = s.step(logits_for([0.99, 0.95, 0.97, 0.96, 0.1, 0.1]), ctx_for(out.x, state, step=1))
    assert out.x.tolist() == expected


def test_last_step_commits_everything_and_never_remasks():
    s = get_sampler("saber", backtrack="always")
    state = fresh(s, 5)
    x = torch.full((1, 5), MASK)
    out = s.step(logits_for([0.9, 0.9, 0.1, 0.1, 0.1]), ctx_for(x, state))
    out = s.step(logits_for([0.1, 0.2, 0.3, 0.3, 0.3]), ctx_for(out.x, state, step=1, last=True))
    assert out.x.tolist() == [[0, 1, 2, 3, 4]]


def test_no_remask_on_a_step_that_fills_the_block():
    s = get_sampler("saber", backtrack="always")
    state = fresh(s, 4)
    x = torch.full((1, 4), MASK)
    out = s.step(logits_for([0.9, 0.9, 0.1, 0.1]), ctx_for(x, state))
    out = s.step(logits_for([0.2, 0.2, 0.99, 0.99]), ctx_for(out.x, state, step=1))
    assert out.x.tolist() == [[0, 1, 2, 3]]


def test_backtrack_count_keeps_net_progress_at_the_schedule():
    fix = torch.tensor([1, 2, 2, 8, 9, 20, 20, 20, 0])
    k = torch.tensor([1, 1, 2, 1, 1, 1, 18, 19, 0])
    r = backtrack_count(fix, k, n=2, divisor=8)
    # max(n // 2, ceil(fix / 8)), capped at fix - k (the schedule's net progress), never negative
    assert r.tolist() == [0, 1, 0, 1, 2, 3, 2, 1, 0]
    assert ((fix - r) >= k).all()


def test_config_errors_name_the_field():
    with pytest.raises(ValueError, match="backtrack must be one of"):
        get_sampler("saber", backtrack="sometimes")
    with pytest.raises(ValueError, match="n must be"):
        get_sampler("saber", n=0)
    with pytest.raises(ValueError, match="remask_divisor"):
        get_sampler("saber", remask_divisor=0)
    with pytest.raises(ValueError, match="measure must be one of"):
        get_sampler("saber", measure="top2")
    with pytest.raises(ValueError, match="min_drop"):
        get_sampler("saber", min_drop=-0.1)
    with pytest.raises(ValueError, match="valid options.*backtrack"):
        get_sampler("saber", remask=True)  # an unknown key is a ValueError too, not a TypeError


@pytest.mark.parametrize("steps", [4, 16, 32])
def test_driver_run_remasks_yet_ends_in_budget_with_no_mask(steps):
    model = ToyDLM()
    prompt = torch.tensor([[1, 2, 3, 4, 5], [6, 7, 8, 9, 10]])
    out = dlm.generate(model, prompt, gen_length=16, block_length=8, steps=steps, sampler="saber",
                       sampler_config={"backtrack": "always"}, temperature=0.0, return_trace=True)
    mask_id = model.config.mask_token_id
    assert out.nfe <= steps
    assert not (out.sequences == mask_id).any()
    # Some committed generation token went back to the mask between two forward passes.
    inputs = model.calls + [out.sequences]
    remasked = any(((a[:, 5:] != mask_id) & (b[:, 5:] == mask_id)).any() for a, b in zip(inputs, inputs[1:]))
    assert remasked or steps == 4  # with 4 steps for 16 tokens the schedule leaves no room to backtrack
    assert all((r.committed[r.masks_left + r.committed > 0] >= 1).all() for r in out.trace)


def test_seeded_sampling_is_deterministic_and_seed_dependent():
    model = ToyDLM()
    prompt = torch.tensor([[1, 2, 3, 4, 5]])

    def go(seed):
        return dlm.generate(model, prompt, gen_length=16, block_length=8, steps=16, sampler="saber",
                            temperature=1.0, generator=torch.Generator().manual_seed(seed)).sequences

    assert torch.equal(go(1), go(1))
    assert any(not torch.equal(go(1), go(s)) for s in (2, 3, 4))
