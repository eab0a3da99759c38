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


def _cpu_step_inputs(name, temperature, **config):
    """A real step on CPU tensors: 3 rows of 6 positions (some committed), a vocabulary of 11, and for a
    look-ahead sampler a `ctx.forward` that serves fixed random logits and counts its calls."""
    sampler = get_sampler(name, **config)
    rows, length, vocab, mask = 3, 6, 11, 10
    x = torch.full((rows, length), mask)
    x[0, 0], x[2, :2] = 3, 4
    logits = torch.randn(rows, length, vocab, generator=torch.Generator().manual_seed(1))
    served = torch.randn(rows, 16, length, vocab, generator=torch.Generator().manual_seed(2))
    calls = []

    def forward(candidates):
        calls.append(candidates.shape)
        return served[:, :candidates.shape[1]]
    looks = sampler.looks_ahead or sampler.drafts_and_verifies
    ctx = StepContext(x=x, candidates=x == mask, num_transfer=torch.tensor([2, 1, 2]), step=1, steps_in_block=4,
                      last_step=False, temperature=temperature, generator=torch.Generator().manual_seed(0),
                      mask_token_id=mask, state=sampler.init_state(rows, 12, "cpu"), block_start=6,
                      rows=torch.arange(rows), forward=forward if looks else None, forwards_left=3 if looks else 0)
    return sampler, logits, ctx, calls


CPU_STEP_CASES = [(name, t, {}) for name in POLICIES for t in (0.0, 1.0)
                  if not (t > 0 and get_sampler(name).drafts_and_verifies)] + [("lopa", t, {"published": True})
                                                                             for t in (0.0, 1.0)]


@pytest.mark.parametrize("name, temperature, config", CPU_STEP_CASES)
def test_a_step_makes_no_tensor_on_the_default_device(name, temperature, config):
    """The reverse of the meta test above, for the paths it cannot reach (a host read ends a meta step:
    LoPA's branches and their scoring, lossless's verification): CPU inputs with meta as the default
    device, so a tensor made without `device=` lands on meta, as one would land on the CPU beside CUDA
    inputs, and fails or corrupts the step. The step must equal the same step without it, draw for draw."""
    sampler, logits, ctx, calls = _cpu_step_inputs(name, temperature, **config)
    plain = sampler.step(logits, ctx)
    sampler, logits, ctx, meta_calls = _cpu_step_inputs(name, temperature, **config)
    with torch.device(META):
        moved = sampler.step(logits, ctx)
    for field in ("x", "proposal", "confidence"):
        ours, reference = getattr(moved, field), getattr(plain, field)
        assert ours.device.type == "cpu" and torch.equal(ours, reference), field
    assert meta_calls == calls
    if sampler.looks_ahead or sampler.drafts_and_verifies:
        assert calls, "the step never reached its look-ahead call: the case does not test it"
