"""Non-finite model outputs and cached features at a random step: our solvers raise a ValueError
that names the step and the fix; the caches never reuse a NaN feature (they recompute)."""
from __future__ import annotations

import random

import pytest
import torch

import caching
from samplers.solvers.bespoke import BespokeSolver
from samplers.solvers.ddim import DDIMSolver
from samplers.solvers.dpmpp_2m import DPMSolverPP2M
from samplers.solvers.flow import FlowMatchSolverScheduler
from samplers.solvers.pndm import PNDMSolver
from samplers.solvers.unipc import UniPCSolver
from tests.caching.tiny import TEXT_DIM, tiny_pixart, tiny_unet

SOLVERS = {
    "ddim": lambda: DDIMSolver(clip_sample=False),
    "pndm": lambda: PNDMSolver(skip_prk_steps=False),
    "plms": lambda: PNDMSolver(skip_prk_steps=True),
    "dpmpp-2m": lambda: DPMSolverPP2M(),
    "unipc": lambda: UniPCSolver(),
    "flow-euler": lambda: FlowMatchSolverScheduler(solver="euler"),
    "flow-heun": lambda: FlowMatchSolverScheduler(solver="heun"),
    "bespoke": lambda: BespokeSolver(bespoke="gmm_ring2d"),
}


def _run(solver, bad_call: int | None, value: float, steps: int = 8):
    """Step `solver` with a smooth fake model output; the output of call `bad_call` holds `value`
    (set_timesteps first, as a pipeline does)."""
    solver.set_timesteps(steps)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 2, generator=g)
    for call, t in enumerate(solver.timesteps):
        out = 0.5 * x
        if call == bad_call:
            out = out.clone()
            out[1, 0] = value
        x = solver.step(out, t, x).prev_sample
    return x


@pytest.mark.parametrize("name", sorted(SOLVERS))
@pytest.mark.parametrize("value", [float("nan"), float("inf")])
@pytest.mark.parametrize("deferred", [False, True], ids=["cpu", "accelerator"])
def test_solver_refuses_a_non_finite_model_output_at_a_random_step(name, value, deferred, monkeypatch):
    """On the CPU the faulty step raises; on an accelerator (simulated: the check defers as it does
    off the CPU) the run's last step raises, naming the first faulty step, without a sync per step."""
    from samplers.solvers import _finite

    monkeypatch.setattr(_finite, "_defer", lambda model_output: deferred)
    assert torch.isfinite(_run(SOLVERS[name](), None, value)).all()  # the fault-free run is fine
    solver = SOLVERS[name]()
    solver.set_timesteps(8)
    bad = random.Random(f"{name}{value}").randrange(1, len(solver.timesteps))
    calls = []
    step = solver.step
    monkeypatch.setattr(solver, "step", lambda *a, **k: calls.append(1) or step(*a, **k))
    with pytest.raises(ValueError, match=r"not finite.*NaN or inf.*float32") as err:
        _run(solver, bad, value)
    assert f"step {bad}" in str(err.value), str(err.value)
    assert type(solver).__name__ in str(err.value)
    assert len(calls) == (len(solver.timesteps) if deferred else bad + 1)
    if deferred:  # the next run on the same solver is clean again
        assert torch.isfinite(_run(solver, None, value)).all()


# ----------------------------------------------------------------------------- caches
# (model maker, config, step): each config computes and stores features at `step` and reuses them
# at the step after (interval 2 with one warm-up step computes steps 0, 1, 3, 5).
CACHES = {
    "deepcache-unet": (tiny_unet, caching.DeepCacheConfig(interval=2, warmup_steps=1), 3),
    "deepcache-pixart": (tiny_pixart, caching.DeepCacheConfig(interval=2, warmup_steps=1), 3),
    "forecast-pixart": (tiny_pixart, caching.ForecastConfig(interval=2, warmup_steps=1), 3),
}
# Adaptive caches (BlockCacheConfig, StepRehashConfig) are left out: a NaN probe makes their change
# measure NaN, which never passes the skip threshold, so they recompute without the guard too.
TIMESTEPS = [900, 800, 700, 600, 500, 400, 300]


def _call(model, x, t):
    enc = torch.randn(x.shape[0], 6, TEXT_DIM, generator=torch.Generator().manual_seed(2))
    tt = torch.full((x.shape[0],), t)
    if hasattr(model, "up_blocks"):
        return model(x, tt, encoder_hidden_states=enc).sample
    return model(x, encoder_hidden_states=enc, timestep=tt, added_cond_kwargs={"resolution": None, "aspect_ratio": None}).sample


@torch.no_grad()
def _outputs(model, bad_step: int) -> list[torch.Tensor]:
    """Model outputs over TIMESTEPS; the input of step `bad_step` holds a NaN, every other is finite."""
    g = torch.Generator().manual_seed(1)
    xs = [torch.randn(2, 4, 8, 8, generator=g) for _ in TIMESTEPS]
    xs[bad_step] = xs[bad_step].clone()
    xs[bad_step][0, 0, 0, 0] = float("nan")
    return [_call(model, x, t) for x, t in zip(xs, TIMESTEPS)]


@pytest.mark.parametrize("name", sorted(CACHES))
def test_a_cached_feature_that_went_non_finite_is_never_reused(name, monkeypatch):
    make, config, bad = CACHES[name]
    model = make()
    tracker = caching.apply(model, config)
    try:
        outs = _outputs(model, bad)
        assert tracker.counters["nonfinite_dropped"] >= 1
        assert not torch.isfinite(outs[bad]).all()  # the fault itself reaches that step's output
        for step in range(bad + 1, len(TIMESTEPS)):
            assert torch.isfinite(outs[step]).all(), f"step {step} reused the NaN feature of step {bad}"
        # The check above can fail: with the guard off, the same run reuses the NaN feature.
        monkeypatch.setattr(caching._core, "stored_nonfinite", lambda states, checked: None)
        caching.reset(model)
        unguarded = _outputs(model, bad)
        assert any(not torch.isfinite(o).all() for o in unguarded[bad + 1:])
    finally:
        caching.remove(model)


@torch.no_grad()
def test_recomputed_step_equals_the_uncached_model():
    """DeepCache on a UNet: the step after the fault recomputes, exactly as the plain model would."""
    model = tiny_unet()
    g = torch.Generator().manual_seed(1)
    x_bad, x_next = torch.randn(2, 2, 4, 8, 8, generator=g)
    x_bad[0, 0, 0, 0] = float("nan")
    reference = _call(model, x_next, 700)
    tracker = caching.apply(model, caching.DeepCacheConfig(interval=2, warmup_steps=1))
    try:
        _call(model, x_next, 900)
        _call(model, x_bad, 800)
        out = _call(model, x_next, 700)
    finally:
        caching.remove(model)
    assert tracker.counters["nonfinite_dropped"] == 1
    torch.testing.assert_close(out, reference, rtol=1e-5, atol=1e-6)
