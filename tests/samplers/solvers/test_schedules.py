"""Fitted schedules: file round trip, the fitted_schedule config key, the coordinate-descent fit, and
the shipped schedules (valid grids that beat the default grid on held-out noises)."""

import json

import pytest
import torch

from dlm.oracles.gaussian_mixture import plane_oracle
from samplers.solvers import get_solver
from samplers.solvers.ddim import DDIMSolver
from samplers.solvers.dpmpp_2m import DPMSolverPP2M
from samplers.solvers.pndm import PNDMSolver
from samplers.solvers.schedules import (
    fit_timesteps,
    load_schedule,
    save_schedule,
    saved_timesteps,
    shipped_schedules,
)

torch.set_num_threads(1)
VP = dict(num_train_timesteps=1000, beta_start=0.0001, beta_end=0.02, beta_schedule="linear")


def _solve(sched, x, model, **set_kw):
    sched.set_timesteps(**set_kw)
    for t in sched.timesteps:
        x = sched.step(model(x, t).sample, t, x).prev_sample
    return x


def test_save_load_round_trip_and_config_key(tmp_path):
    path = tmp_path / "toy.json"
    save_schedule(str(path), "toy", "dpmpp-2m", [999, 500, 100], {"loss_fit": 0.1})
    save_schedule(str(path), "toy", "dpmpp-2m", [999, 600, 200, 20], {"loss_fit": 0.2})
    save_schedule(str(path), "toy", "dpmpp-2m", [999, 400, 90], {"loss_fit": 0.05})  # replaces the 3-step grid
    data = json.loads(path.read_text())
    assert data["schedules"]["dpmpp-2m"] == {"3": [999, 400, 90], "4": [999, 600, 200, 20]}
    assert [f["steps"] for f in data["fits"]] == [4, 3]
    assert saved_timesteps(str(path), "dpmpp-2m", 4) == [999, 600, 200, 20]
    assert saved_timesteps(str(path), "plms", 4) is None
    save_schedule(str(path), "toy", "plms", [999, 700, 300], {})
    save_schedule(str(path), "toy", "ddim", [999, 700, 300], {})
    model = plane_oracle()
    x = torch.randn(32, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    # fitted_schedule=... makes set_timesteps(N) use the saved grid; a step count without one keeps the default
    for cls, solver, extra in ((DPMSolverPP2M, "dpmpp-2m", {}), (PNDMSolver, "plms", {"skip_prk_steps": True}), (DDIMSolver, "ddim", {})):
        fitted = cls(fitted_schedule=str(path), **extra)
        steps = 4 if solver == "dpmpp-2m" else 3
        grid = saved_timesteps(str(path), solver, steps)
        torch.testing.assert_close(
            _solve(fitted, x, model, num_inference_steps=steps), _solve(cls(**extra), x, model, timesteps=grid), atol=0, rtol=0
        )
        torch.testing.assert_close(
            _solve(fitted, x, model, num_inference_steps=7), _solve(cls(**extra), x, model, num_inference_steps=7), atol=0, rtol=0
        )
        # the key survives a config round trip, so a pipeline saved with it reloads with it
        assert cls.from_config(fitted.config).config.fitted_schedule == str(path)


def test_unknown_schedule_is_refused_with_the_shipped_names():
    with pytest.raises(ValueError, match="shipped: .*gmm_ring2d"):
        DPMSolverPP2M(fitted_schedule="no-such-model")


def test_fit_timesteps_finds_a_known_optimum():
    # A loss with its minimum at a known grid: coordinate descent must reach it exactly.
    target = [999, 700, 420, 150, 30]
    loss = lambda ts: float(sum((a - b) ** 2 for a, b in zip(ts, target)))  # noqa: E731
    ts, trace = fit_timesteps(loss, [999, 800, 600, 400, 200], 1000, deltas=(64, 16, 4, 1), sweeps=20)
    assert ts == target and trace[-1] == 0.0
    assert all(b < a for a, b in zip(trace, trace[1:]))  # only improving moves are kept
    assert ts[0] == 999 and all(a > b for a, b in zip(ts, ts[1:]))


def test_fit_lowers_the_trajectory_error_on_the_oracle():
    model = plane_oracle()
    x_T = torch.randn(256, 2, generator=torch.Generator().manual_seed(3))
    ref = _solve(get_solver("dpmpp-2m", **VP), x_T, model, num_inference_steps=200)

    def loss(ts):
        return float(((_solve(get_solver("dpmpp-2m", **VP), x_T, model, timesteps=ts) - ref) ** 2).mean())

    init = [999, 800, 600, 400, 200, 0]
    ts, trace = fit_timesteps(loss, init, 1000, deltas=(128, 32), sweeps=1)
    assert trace[-1] < 0.5 * trace[0]
    assert loss(ts) == trace[-1]


@pytest.mark.parametrize("name", ["gmm_ring2d", "gmm_image8x8", "digits"])
def test_shipped_schedules_are_valid_grids(name):
    assert name in shipped_schedules()
    data = load_schedule(name)
    assert data["schedules"]
    for solver, table in data["schedules"].items():
        for steps, ts in table.items():
            assert len(ts) == int(steps) and ts[0] <= 999
            assert all(a > b for a, b in zip(ts, ts[1:])) and ts[-1] >= 0
            fit = next(f for f in data["fits"] if f["solver"] == solver and f["steps"] == int(steps))
            assert fit["loss_fit"] <= min(fit["loss_init"].values())
            assert fit["command"].startswith("python scripts/fit_schedule.py")


def test_shipped_ring_schedule_generalises_to_held_out_noise():
    # Fitted on the fit seed; on other noises it must still beat the default grid at the same NFE.
    model = plane_oracle(num_modes=8, radius=0.7, std=0.05)
    fit_seed = load_schedule("gmm_ring2d")["fits"][0]["fit_seed"]
    x_T = torch.randn(1000, 2, generator=torch.Generator().manual_seed(fit_seed + 100))
    ref = _solve(get_solver("dpmpp-2m", **VP), x_T, model, num_inference_steps=200)
    err = lambda x: float(((x - ref) ** 2).mean())  # noqa: E731
    fitted = _solve(get_solver("dpmpp-2m", **VP, fitted_schedule="gmm_ring2d"), x_T, model, num_inference_steps=8)
    default = _solve(get_solver("dpmpp-2m", **VP), x_T, model, num_inference_steps=8)
    logsnr = _solve(get_solver("dpmpp-2m", **VP, use_lu_lambdas=True), x_T, model, num_inference_steps=8)
    assert err(fitted) < 0.5 * err(logsnr) < err(default)
