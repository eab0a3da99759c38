"""Every step policy runs whole on the device of its inputs, without a host sync.

The meta device has shapes but no data: a tensor a policy makes on the default device (CPU) instead of
the logits' device meets a meta tensor and raises, as it would on a GPU, and reading a value on the host
(`.item()`, `bool(t)`, `int(t)`) raises too. So this checks on a CPU-only machine what the CPU tests
cannot: device placement (mutation testing found `device=` arguments no test noticed) and the
no-host-sync rule of the hot path (DESIGN.md, "Conventions").
"""
from __future__ import annotations

import pytest
import torch

from samplers import StepContext, available_samplers, get_sampler

NOT_STEP_POLICIES = {"hex", "joint"}  # an ensemble over generations; a policy prepared on a model
POLICIES = [name for name in available_samplers() if name not in NOT_STEP_POLICIES]
META = torch.device("meta")


def _step(name, temperature, **config):
    sampler = get_sampler(name, **config)
    rows, length, vocab = 2, 4, 9
    x = torch.empty(rows, length, dtype=torch.long, device=META)
    ctx = StepContext(x=x, candidates=torch.empty(rows, length, dtype=torch.bool, device=META),
                      num_transfer=torch.empty(rows, dtype=torch.long, device=META), step=1, steps_in_block=4,
                      last_step=False, temperature=temperature, generator=None, mask_token_id=7,
                      state=sampler.init_state(rows, 12, META), block_start=8,
                      rows=torch.empty(rows, dtype=torch.long, device=META))
    return sampler.step(torch.empty(rows, length, vocab, device=META), ctx)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("name", POLICIES)
def test_a_step_stays_on_the_logits_device(name, temperature):
    if temperature > 0 and get_sampler(name).drafts_and_verifies:
        with pytest.raises(ValueError, match="temperature=0"):  # a greedy decode only
            _step(name, temperature)
        return
    result = _step(name, temperature)
    assert result.x.device == META and result.proposal.device == META and result.confidence.device == META
    assert result.x.shape == (2, 4) and result.proposal.shape == (2, 4) and result.confidence.shape == (2, 4)


@pytest.mark.parametrize("name", ["confidence", "margin", "entropy", "position"])
def test_alg_temp_draws_on_the_logits_device(name):
    assert _step(name, 0.0, alg_temp=0.5).x.device == META


def test_the_policies_not_run_here_are_not_step_policies():
    with pytest.raises(RuntimeError, match="ensemble"):
        _step("hex", 0.0)
    with pytest.raises(ValueError, match="prepared"):
        _step("joint", 0.0)


def test_the_factor_rule_stays_on_the_logits_device():
    assert _step("threshold", 0.0, factor=1.0).x.device == META


@pytest.mark.parametrize("stability", [0, 2])
def test_adaptive_stopping_stays_on_the_canvas_device(stability):
    from samplers.unmasking.entropy_bound import StableConfidentStop

    stop = StableConfidentStop(stability, 0.1)
    stop.reset(3, 5, META)
    canvas = torch.empty(3, 5, dtype=torch.long, device=META)
    assert stop(canvas, torch.empty(3, 5, device=META)).device == META


@pytest.mark.parametrize("name", ["saber", "lopa", "threshold"])
def test_rows_default_to_the_whole_batch_on_the_device(name):
    """A hand-built context without `rows` (all rows in this step): the full-batch row indices the stateful
    policies keep are made on the device of the inputs too."""
    sampler = get_sampler(name)
    rows, length, vocab = 2, 4, 9
    ctx = StepContext(x=torch.empty(rows, length, dtype=torch.long, device=META),
                      candidates=torch.empty(rows, length, dtype=torch.bool, device=META),
                      num_transfer=torch.empty(rows, dtype=torch.long, device=META), step=1, steps_in_block=4,
                      last_step=False, temperature=0.0, generator=None, mask_token_id=7,
                      state=sampler.init_state(rows, 12, META), block_start=8, rows=None)
    assert sampler.step(torch.empty(rows, length, vocab, device=META), ctx).x.device == META


def test_step_rows_without_rows_are_every_row_on_the_context_device():
    from samplers.unmasking._state import step_rows

    ctx = StepContext(x=torch.empty(3, 4, dtype=torch.long, device=META), candidates=None, num_transfer=None, step=0,
                      steps_in_block=1, last_step=True, temperature=0.0, generator=None, mask_token_id=7)
    assert step_rows(ctx).device == META and step_rows(ctx).shape == (3,)
    given = torch.tensor([4, 6])
    assert step_rows(StepContext(x=torch.zeros(2, 4, dtype=torch.long), candidates=None, num_transfer=None, step=0,
                                 steps_in_block=1, last_step=True, temperature=0.0, generator=None, mask_token_id=7,
                                 rows=given)) is given
