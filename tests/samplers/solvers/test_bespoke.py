"""The learned (bespoke) solver: exact tracing of our linear solvers, the scheduler equal to the
functional solve, fitting that lowers its loss, the shipped tables beating their starting solver on
noise they were not fitted on, and clear errors."""

import json

import numpy as np
import pytest
import torch
from diffusers import DDPMPipeline, PNDMScheduler
from diffusers.utils.torch_utils import randn_tensor

from dlm.oracles.gaussian_mixture import image_oracle, plane_oracle
from samplers.solvers import get_solver, solver_from_pipeline
from samplers.solvers.bespoke import (
    BespokeSolver,
    alpha_bar_at,
    bespoke_solve,
    fit_bespoke,
    fit_bespoke_family,
    trace_linear_solver,
)
from samplers.solvers.schedules import save_bespoke, save_schedule, saved_bespoke, saved_timesteps

torch.set_num_threads(1)

RING = plane_oracle(num_modes=8, radius=0.7, std=0.05)
VP = dict(num_train_timesteps=1000, beta_start=0.0001, beta_end=0.02, beta_schedule="linear")


def _noise(n, shape=(2,), seed=0, dtype=torch.float32):
    return torch.randn((n,) + shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def _loop(sched, x, model=RING.eps_fn):
    for t in sched.timesteps:
        x = sched.step(model(x, t), t, x).prev_sample
    return x


def _solver(name, steps=None, timesteps=None):
    extra = {"set_alpha_to_one": True} if name in ("ddim", "plms") else {}
    s = get_solver(name, **VP, **extra)
    if timesteps is not None:
        s.set_timesteps(timesteps=timesteps)
    else:
        s.set_timesteps(steps)
    return s


@pytest.mark.parametrize("name", ["ddim", "plms", "dpmpp-2m", "dpmpp-3m", "unipc"])
@pytest.mark.parametrize("steps", [5, 8])
def test_trace_reproduces_each_linear_solver(name, steps):
    """The traced table, run by the bespoke solve, is the scheduler itself (float64)."""
    x = _noise(300, dtype=torch.float64)
    calls, table = trace_linear_solver(_solver(name, steps))
    assert table.shape == (len(calls) + 1, len(calls) + 1)
    assert torch.all(table.triu(1)[:, 1:].abs() < 1e-12)  # causal: row i uses D_0 .. D_{i-1} only
    got = bespoke_solve(RING.eps_fn, x, torch.tensor(calls, dtype=torch.float64), table, _solver(name, steps).alphas_cumprod)
    want = _loop(_solver(name, steps), x.clone())
    torch.testing.assert_close(got, want, atol=1e-9, rtol=0)


def test_alpha_bar_interpolates_the_table_and_passes_gradients():
    ac = _solver("ddim", 5).alphas_cumprod.double()
    t = torch.tensor([0.0, 10.0, 10.25, 999.0, 1200.0], dtype=torch.float64, requires_grad=True)
    a = alpha_bar_at(ac, t)
    torch.testing.assert_close(a[[0, 1, 3, 4]].detach(), ac[[0, 10, 999, 999]])
    torch.testing.assert_close(a[2].detach(), 0.75 * ac[10] + 0.25 * ac[11])
    a.sum().backward()
    assert t.grad[2] < 0 and t.grad[4] == 0  # alpha_bar falls with t; clamped beyond T - 1


def _tiny_fit(tmp_path, iters=25, samples=400, nfe=6):
    x = _noise(samples, seed=1)
    ref = _loop(_solver("dpmpp-2m", 200), x.clone())
    base = _solver("unipc", nfe)
    calls, table = trace_linear_solver(base)
    fit = fit_bespoke(RING.eps_fn, x, ref, calls, table, base.alphas_cumprod, iters=iters, lr=1e-3, lr_times=0.02)
    path = tmp_path / "tiny.json"
    save_bespoke(str(path), "ring", {"base": "unipc", "timesteps": fit["timesteps"], "coefficients": fit["table"].tolist(),
                                     "noise_schedule": dict(VP)}, {"iters": iters})
    return fit, path, calls


def test_fit_lowers_the_loss_and_the_scheduler_equals_the_functional_solve(tmp_path):
    fit, path, calls = _tiny_fit(tmp_path)
    assert fit["loss_fit"] < 0.8 * fit["loss_start"], (fit["loss_start"], fit["loss_fit"])
    ts = fit["timesteps"]
    assert ts[0] == calls[0] and all(a >= b for a, b in zip(ts, ts[1:])) and ts[-1] >= 0
    assert ts != calls  # the timesteps moved, not only the coefficients
    sched = BespokeSolver(**VP, bespoke=str(path))
    sched.set_timesteps(6)
    assert sched.timesteps.dtype == torch.float32 and len(sched.timesteps) == 6
    x = _noise(500, seed=3)
    want = bespoke_solve(RING.eps_fn, x, sched.timesteps, fit["table"], sched.alphas_cumprod)
    torch.testing.assert_close(_loop(sched, x.clone()), want, atol=0, rtol=0)
    # config round trip (save_config / from_config) keeps the file and reproduces the result
    again = BespokeSolver.from_config(sched.config)
    again.set_timesteps(6)
    torch.testing.assert_close(_loop(again, x.clone()), want, atol=0, rtol=0)
    assert json.loads(path.read_text())["fits"][0]["solver"] == "bespoke"


def test_family_fit_is_the_mean_log_loss_and_lowers_it_on_every_model():
    """``fit_bespoke_family``: with one model its loss is log of ``fit_bespoke``'s; over two models of
    different dimension one table lowers both models' errors from the same start."""
    cube = image_oracle(num_modes=4, size=2, std=0.15, seed=3)  # 1x2x2 samples
    problems = []
    for oracle, shape in ((RING, (2,)), (cube, (1, 2, 2))):
        x = _noise(300, shape=shape, seed=1)
        problems.append((oracle.eps_fn, x, _loop(_solver("dpmpp-2m", 200), x.clone(), oracle.eps_fn)))
    base = _solver("dpmpp-2m", 5)
    calls, table = trace_linear_solver(base)
    single = fit_bespoke_family(problems[:1], calls, table, base.alphas_cumprod, iters=0)
    plain = fit_bespoke(*problems[0], calls, table, base.alphas_cumprod, iters=0)
    assert single["loss_start"] == pytest.approx(np.log(plain["loss_start"]), rel=1e-6)
    fit = fit_bespoke_family(problems, calls, table, base.alphas_cumprod, iters=30, lr=1e-3, lr_times=0.02)
    assert fit["loss_fit"] < fit["loss_start"] - 0.1
    for fn, x, ref in problems:
        mse = lambda ts, tab: float(((bespoke_solve(fn, x, torch.tensor(ts), tab, base.alphas_cumprod) - ref) ** 2).mean())  # noqa: E731
        assert mse(fit["timesteps"], fit["table"]) < mse(calls, table)
    with pytest.raises(ValueError, match="problems is empty"):
        fit_bespoke_family([], calls, table, base.alphas_cumprod)


@pytest.mark.parametrize("model,nfe", [("gmm_ring2d", 8), ("gmm_image8x8", 8)])
def test_shipped_table_beats_its_starting_solver_on_unseen_noise(model, nfe):
    """Seed 7 was used neither for fitting (seed 1) nor in the benchmark (seed 0)."""
    entry = saved_bespoke(model, nfe)
    assert entry is not None, f"no shipped bespoke solver at {nfe} NFE in {model}.json"
    oracle = RING if model == "gmm_ring2d" else image_oracle(num_modes=8, size=8, std=0.1, seed=0)
    x = _noise(2000, shape=oracle._shape, seed=7)
    ref = _loop(_solver("dpmpp-2m", 500), x.clone(), oracle.eps_fn)
    base_grid = saved_timesteps(model, entry["base"], nfe)
    base = _loop(_solver(entry["base"], timesteps=base_grid) if base_grid else _solver(entry["base"], nfe), x.clone(), oracle.eps_fn)
    sched = get_solver("bespoke", **VP, bespoke=model)
    sched.set_timesteps(nfe)
    ours = _loop(sched, x.clone(), oracle.eps_fn)
    rms = lambda y: float(((y - ref) ** 2).mean().sqrt())  # noqa: E731
    assert rms(ours) < 0.9 * rms(base), (rms(ours), rms(base))


def test_runs_in_a_diffusers_pipeline():
    """DDPMPipeline with the image oracle as its UNet: the pipeline's loop equals the functional solve."""
    oracle = image_oracle(num_modes=8, size=8, std=0.1, seed=0)
    pipe = DDPMPipeline(unet=oracle, scheduler=PNDMScheduler(**VP))
    pipe.set_progress_bar_config(disable=True)
    pipe.scheduler = solver_from_pipeline(pipe, "bespoke", bespoke="gmm_image8x8")
    out = pipe(batch_size=3, num_inference_steps=8, output_type="np", generator=torch.Generator().manual_seed(0)).images
    x = randn_tensor((3,) + oracle._shape, generator=torch.Generator().manual_seed(0))
    s = pipe.scheduler
    want = bespoke_solve(oracle.eps_fn, x, s.timesteps, s._table, s.alphas_cumprod)
    want = (want / 2 + 0.5).clamp(0, 1).permute(0, 2, 3, 1).numpy()
    np.testing.assert_allclose(out, want, atol=1e-6)


def test_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="needs bespoke="):
        BespokeSolver(**VP)
    with pytest.raises(ValueError, match="no saved schedule"):
        BespokeSolver(**VP, bespoke="no_such_model")
    grid_only = tmp_path / "grid.json"
    save_schedule(str(grid_only), "m", "unipc", [999, 500, 0], {})
    with pytest.raises(ValueError, match="holds no learned solver"):
        BespokeSolver(**VP, bespoke=str(grid_only))
    s = BespokeSolver(**VP, bespoke="gmm_ring2d")
    with pytest.raises(ValueError, match="before step"):
        s.step(torch.zeros(2, 2), 999, torch.zeros(2, 2))
    with pytest.raises(ValueError, match="fitted: \\["):
        s.set_timesteps(7)
    with pytest.raises(ValueError, match="num_inference_steps only"):
        s.set_timesteps(timesteps=[999, 500])
    with pytest.raises(ValueError, match="img2img"):
        s.set_begin_index(3)
    s.set_timesteps(8)
    with pytest.raises(ValueError, match="img2img"):
        s.step(torch.zeros(2, 2), s.timesteps[2], torch.zeros(2, 2))
    other = BespokeSolver(**{**VP, "beta_end": 0.012}, bespoke="gmm_ring2d")
    with pytest.raises(ValueError, match="another noise schedule"):
        other.set_timesteps(8)


@pytest.mark.parametrize("name", ["gmm_ring2d", "gmm_image8x8", "digits"])
def test_shipped_tables_are_well_formed(name):
    from samplers.solvers.schedules import load_schedule

    data = load_schedule(name)
    assert data.get("bespoke"), f"{name}.json ships no learned solver"
    for steps, entry in data["bespoke"].items():
        n = int(steps)
        ts, table = entry["timesteps"], torch.tensor(entry["coefficients"])
        assert len(ts) == n and table.shape == (n + 1, n + 1)
        assert all(a >= b for a, b in zip(ts, ts[1:])) and ts[-1] >= 0 and ts[0] <= 999
        assert torch.all(table.triu(1)[:, 1:] == 0) and torch.all(table[0, 1:] == 0)
        fit = next(f for f in data["fits"] if f["solver"] == "bespoke" and f["steps"] == n)
        assert fit["loss_fit"] <= fit["loss_start"] and fit["command"].startswith("python scripts/fit_bespoke.py")


def test_universal_script_fits_one_table_and_reports_every_model(tmp_path, capsys):
    """scripts/fit_universal_solver.py at toy sizes: one table for the family, rows for the two benchmark
    oracles and the held-out mixtures, each with the three solvers' errors; a bad --out fails first."""
    from tests.script_loader import load_script

    script = load_script("fit_universal_solver.py")
    out = tmp_path / "u.json"
    script.main(["--nfe", "5", "--models", "2", "--samples", "64", "--iters", "3", "--heldout", "1",
                 "--eval-samples", "200", "--no-digits", "--out", str(out)])
    result = json.loads(out.read_text())
    assert [r["model"] for r in result["rows"]] == ["gmm-ring2d", "gmm-image8x8", "random-0"]
    for row in result["rows"]:
        assert {"universal", "dpmpp-2m-lu@5", "diffusers DPMSolverMultistep(3M, lu)@20"} <= set(row)
        assert all(v > 0 for k, v in row.items() if k != "model")
    assert result["loss_fit"] <= result["loss_start"] and len(result["timesteps"]) == 5
    # the random family is reproducible from its seed and differs between seeds
    a, b = script.random_mixtures(2, 5), script.random_mixtures(2, 5)
    assert [o.config.means for o in a] == [o.config.means for o in b]
    assert [o.config.means for o in a] != [o.config.means for o in script.random_mixtures(2, 6)]
    with pytest.raises(SystemExit):
        script.main(["--out", str(tmp_path / "missing" / "u.json")])
    assert "--out: folder" in capsys.readouterr().err
