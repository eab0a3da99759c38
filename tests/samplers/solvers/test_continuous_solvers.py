"""Continuous solvers: exactness against diffusers, drop-in use in pipelines, NFE accounting, errors."""

import copy
import math

import numpy as np
import pytest
import torch
from diffusers import (
    DDIMScheduler,
    DDPMPipeline,
    PNDMPipeline,
    DPMSolverMultistepScheduler,
    FlowMatchEulerDiscreteScheduler,
    FlowMatchHeunDiscreteScheduler,
    PNDMScheduler,
    UNet2DModel,
)

from dlm.oracles.gaussian_mixture import image_oracle, plane_oracle
from samplers.solvers.ddim import DDIMSolver, sample_ddim
from samplers.solvers.dpmpp_2m import DPMSolverPP2M, sample_dpmpp_2m
from samplers.solvers.flow import FlowMatchSolverScheduler, flow_sigmas, sample_flow
from samplers.solvers.pndm import PNDMSolver, pndm_nfe, pndm_steps_for_nfe, sample_pndm
from samplers.solvers import SOLVERS, get_sample_fn, get_solver, solver_from_pipeline

torch.set_num_threads(1)

ORACLE = plane_oracle()
FLOW_ORACLE = plane_oracle(prediction_type="flow")


def _noise(dtype, n=256, shape=(2,), seed=0):
    return torch.randn((n,) + shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def _loop(sched, steps, x, model=ORACLE, seed=None, set_kw=None, **step_kw):
    if steps is None:
        sched.set_timesteps(**set_kw)
    else:
        sched.set_timesteps(steps, **(set_kw or {}))
    g = None if seed is None else torch.Generator().manual_seed(seed)
    for t in sched.timesteps:
        kw = dict(step_kw)
        if g is not None:
            kw["generator"] = g
        x = sched.step(model(x, t).sample, t, x, **kw).prev_sample
    return x


def _tol(dtype):
    # diffusers forms its step coefficients as float32 scalars even for float64 samples, so float64
    # agreement is limited to about 1e-6 by their rounding, not ours.
    return dict(atol=1e-5, rtol=0) if dtype == torch.float64 else dict(atol=1e-4, rtol=0)


# ---------------------------------------------------------------- exactness against diffusers
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("steps", [10, 50])
@pytest.mark.parametrize("skip_prk", [True, False])
def test_pndm_matches_diffusers(dtype, steps, skip_prk):
    ours = PNDMSolver.from_config(PNDMScheduler(skip_prk_steps=skip_prk).config)
    ref = PNDMScheduler(skip_prk_steps=skip_prk)
    ours.set_timesteps(steps)
    ref.set_timesteps(steps)
    assert ours.timesteps.tolist() == ref.timesteps.tolist()
    x = _noise(dtype)
    torch.testing.assert_close(_loop(ours, steps, x), _loop(ref, steps, x), **_tol(dtype))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("eta", [0.0, 0.5])
@pytest.mark.parametrize("spacing", ["leading", "trailing"])
def test_ddim_matches_diffusers(dtype, eta, spacing):
    cfg = dict(clip_sample=False, timestep_spacing=spacing)
    x = _noise(dtype)
    a = _loop(DDIMSolver(**cfg), 20, x, seed=7, eta=eta)
    b = _loop(DDIMScheduler(**cfg), 20, x, seed=7, eta=eta)
    torch.testing.assert_close(a, b, **_tol(dtype))


def test_ddim_clipping_and_v_prediction_match_diffusers():
    x = _noise(torch.float64) * 3
    a = _loop(DDIMSolver(clip_sample=True, clip_sample_range=0.5), 10, x)
    b = _loop(DDIMScheduler(clip_sample=True, clip_sample_range=0.5), 10, x)
    torch.testing.assert_close(a, b, **_tol(torch.float64))
    vo = plane_oracle(prediction_type="v_prediction")
    a = _loop(DDIMSolver(prediction_type="v_prediction", clip_sample=False), 10, x, model=vo)
    b = _loop(DDIMScheduler(prediction_type="v_prediction", clip_sample=False), 10, x, model=vo)
    torch.testing.assert_close(a, b, **_tol(torch.float64))


@pytest.mark.parametrize("steps", [5, 10, 20, 50])
@pytest.mark.parametrize(
    "cfg",
    [
        {},
        {"timestep_spacing": "trailing"},
        {"final_sigmas_type": "sigma_min"},
        {"final_sigmas_type": "sigma_min", "lower_order_final": False},
        {"beta_schedule": "squaredcos_cap_v2", "lambda_min_clipped": -5.1},
    ],
)
@pytest.mark.parametrize("order", [2, 3])
def test_dpmpp_multistep_matches_diffusers(steps, cfg, order):
    # diffusers computes DPM-Solver in float32 whatever the input dtype: compare at float32 tolerance.
    x = _noise(torch.float32)
    ref = DPMSolverMultistepScheduler(algorithm_type="dpmsolver++", solver_order=order, **cfg)
    ours = DPMSolverPP2M.from_config(ref.config)
    a, b = _loop(ours, steps, x), _loop(ref, steps, x)
    assert ours.timesteps.tolist() == ref.timesteps.tolist()
    torch.testing.assert_close(a, b, **_tol(torch.float32))


@pytest.mark.parametrize("steps", [5, 10, 20, 50])
@pytest.mark.parametrize("cfg", [{}, {"timestep_spacing": "trailing"},
                                 {"final_sigmas_type": "sigma_min", "lower_order_final": False},
                                 {"prediction_type": "v_prediction"}])
@pytest.mark.parametrize("order", [2, 3])
def test_dpmpp_sde_matches_diffusers_with_the_same_generator(steps, cfg, order):
    x = _noise(torch.float32)
    model = plane_oracle(prediction_type=cfg.get("prediction_type", "epsilon"))
    ref = DPMSolverMultistepScheduler(algorithm_type="sde-dpmsolver++", solver_order=order, **cfg)
    ours = DPMSolverPP2M.from_config(ref.config)
    a, b = _loop(ours, steps, x, model=model, seed=3), _loop(ref, steps, x, model=model, seed=3)
    torch.testing.assert_close(a, b, **_tol(torch.float32))
    c = _loop(DPMSolverPP2M.from_config(ref.config), steps, x, model=model, seed=4)
    assert (a - c).abs().max() > 1e-3  # the noise is really drawn from the generator: another seed, another path
    ode = _loop(DPMSolverPP2M(solver_order=order, **cfg), steps, x, model=model)
    assert (a - ode).abs().max() > 1e-3  # and it is not the ODE solver


def test_dpmpp_sde_takes_variance_noise_and_registry_names():
    from samplers.solvers import get_solver

    x = _noise(torch.float32)
    sched = get_solver("dpmpp-2m-sde")
    assert sched.config.algorithm_type == "sde-dpmsolver++" and get_solver("dpmpp-3m-sde").config.solver_order == 3
    sched.set_timesteps(4)
    t = sched.timesteps[0]
    z = torch.zeros_like(x)
    zero_noise = sched.step(ORACLE(x, t).sample, t, x, variance_noise=z).prev_sample
    sched.set_timesteps(4)
    with_noise = sched.step(ORACLE(x, t).sample, t, x, variance_noise=torch.ones_like(x)).prev_sample
    a_t = sched._alpha_of_sigma(float(sched.sigmas[1]))
    a_s = sched._alpha_of_sigma(float(sched.sigmas[0]))
    h = 0.5 * (math.log(a_t / (1 - a_t)) - math.log(a_s / (1 - a_s)))
    expected = math.sqrt(1 - a_t) * math.sqrt(1 - math.exp(-2 * h))  # sigma_t sqrt(1 - e^-2h) per unit of noise
    torch.testing.assert_close(with_noise - zero_noise, torch.full_like(x, expected), atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="sde-dpmsolver"):
        DPMSolverPP2M(algorithm_type="sde-dpmsolver", solver_order=3, final_sigmas_type="sigma_min")


@pytest.mark.parametrize("steps", [5, 10, 20, 50])
@pytest.mark.parametrize(
    "cfg",
    [
        {},
        {"solver_order": 3},
        {"timestep_spacing": "trailing"},
        {"final_sigmas_type": "sigma_min", "lower_order_final": False},
        {"disable_corrector": [0, 2]},
        {"prediction_type": "v_prediction"},
    ],
)
def test_unipc_matches_diffusers(steps, cfg):
    from diffusers import UniPCMultistepScheduler
    from samplers.solvers.unipc import UniPCSolver

    x = _noise(torch.float32)
    ref = UniPCMultistepScheduler(**cfg)
    ours = UniPCSolver.from_config(ref.config)
    a, b = _loop(ours, steps, x), _loop(ref, steps, x)
    assert ours.timesteps.tolist() == ref.timesteps.tolist()
    torch.testing.assert_close(a, b, **_tol(torch.float32))


def test_unipc_corrector_changes_the_result_and_bad_configs():
    from diffusers import UniPCMultistepScheduler
    from samplers.solvers.unipc import UniPCSolver

    x = _noise(torch.float32)
    with_c = _loop(UniPCSolver(), 10, x)
    without = _loop(UniPCSolver(disable_corrector=list(range(10))), 10, x)
    assert (with_c - without).abs().max() > 1e-3  # the corrector is not a no-op
    with pytest.raises(ValueError, match="predict_x0=True"):
        UniPCSolver.from_config(UniPCMultistepScheduler(predict_x0=False).config)
    with pytest.raises(ValueError, match="solver_type"):
        UniPCSolver(solver_type="midpoint")
    # Flow sigmas are implemented (test_diffusers_suite.py); what cannot shape a flow grid is refused.
    with pytest.raises(ValueError, match="use_exponential_sigmas cannot be combined with use_flow_sigmas"):
        UniPCSolver(use_flow_sigmas=True, use_exponential_sigmas=True)
    with pytest.raises(ValueError, match="shift_terminal need"):
        UniPCSolver(shift_terminal=0.1)
    with pytest.raises(ValueError, match="flow_prediction'? need"):
        UniPCSolver(prediction_type="flow_prediction")
    with pytest.raises(ValueError, match="use_karras_sigmas and use_beta_sigmas"):
        UniPCSolver(use_karras_sigmas=True, use_beta_sigmas=True)


def test_dpmpp_2m_lu_lambdas_grid_matches_diffusers():
    # Same timesteps (the samples are compared in test_scheduler_common.py).
    ref = DPMSolverMultistepScheduler(use_lu_lambdas=True)
    ours = DPMSolverPP2M.from_config(ref.config)
    for n in (10, 20):
        ref.set_timesteps(n)
        ours.set_timesteps(n)
        assert ours.timesteps.tolist() == ref.timesteps.tolist()


@pytest.mark.parametrize("cfg,set_kw", [({}, {}), ({"shift": 3.0}, {}), ({"use_dynamic_shifting": True}, {"mu": 0.7})])
@pytest.mark.parametrize("steps", [4, 28])
def test_flow_euler_matches_diffusers(cfg, set_kw, steps):
    x = _noise(torch.float32)
    ref = FlowMatchEulerDiscreteScheduler(**cfg)
    ours = FlowMatchSolverScheduler.from_config(ref.config)
    a = _loop(ours, steps, x, model=FLOW_ORACLE, set_kw=set_kw)
    b = _loop(ref, steps, x, model=FLOW_ORACLE, set_kw=set_kw)
    torch.testing.assert_close(ours.timesteps, ref.timesteps)
    torch.testing.assert_close(a, b, **_tol(torch.float32))


def test_flow_heun_matches_diffusers():
    x = _noise(torch.float32)
    ours = FlowMatchSolverScheduler(solver="heun")
    ref = FlowMatchHeunDiscreteScheduler()
    a = _loop(ours, 10, x, model=FLOW_ORACLE)
    b = _loop(ref, 10, x, model=FLOW_ORACLE)
    assert ours.nfe == len(ref.timesteps) == 19
    torch.testing.assert_close(a, b, **_tol(torch.float32))


# ---------------------------------------------------------------- drop-in in a real pipeline
def _tiny_unet():
    torch.manual_seed(0)
    return UNet2DModel(
        sample_size=8,
        in_channels=1,
        out_channels=1,
        layers_per_block=1,
        block_out_channels=(8, 16),
        norm_num_groups=4,
        down_block_types=("DownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "UpBlock2D"),
    ).eval()


@pytest.mark.parametrize(
    "ours_cls,ref",
    [
        (PNDMSolver, PNDMScheduler(skip_prk_steps=True)),
        (PNDMSolver, PNDMScheduler()),
        (DDIMSolver, DDIMScheduler()),
        (DPMSolverPP2M, DPMSolverMultistepScheduler()),
    ],
)
def test_drop_in_ddpm_pipeline_with_random_unet(ours_cls, ref):
    unet = _tiny_unet()
    outs = []
    # diffusers' PNDMScheduler.step takes no generator, so it only runs in PNDMPipeline; ours runs in both.
    pipe_cls = PNDMPipeline if isinstance(ref, PNDMScheduler) else DDPMPipeline
    for sched in (ref, ours_cls.from_config(ref.config)):
        pipe = pipe_cls(unet=unet, scheduler=sched)
        pipe.set_progress_bar_config(disable=True)
        with torch.no_grad():
            out = pipe(batch_size=2, num_inference_steps=6, output_type="np", generator=torch.Generator().manual_seed(0))
        outs.append(out.images)
    assert outs[1].shape == (2, 8, 8, 1)
    np.testing.assert_allclose(outs[1], outs[0], atol=1e-4)
    pipe = DDPMPipeline(unet=unet, scheduler=ours_cls.from_config(ref.config))
    pipe.set_progress_bar_config(disable=True)
    with torch.no_grad():
        out = pipe(batch_size=2, num_inference_steps=6, output_type="np", generator=torch.Generator().manual_seed(0))
    assert np.isfinite(out.images).all()


def test_solver_from_pipeline_and_oracle_pipeline():
    o = image_oracle(num_modes=4)
    pipe = DDPMPipeline(unet=o, scheduler=PNDMScheduler(beta_schedule="linear"))
    pipe.set_progress_bar_config(disable=True)
    for name in ("ddim", "pndm", "plms", "dpmpp-2m"):
        pipe.scheduler = solver_from_pipeline(pipe, name)
        out = pipe(batch_size=4, num_inference_steps=10, output_type="np", generator=torch.Generator().manual_seed(0))
        assert np.isfinite(out.images).all()
    assert pipe.scheduler.config.beta_schedule == "linear"
    with pytest.raises(ValueError, match="flow"):
        solver_from_pipeline(pipe, "flow-euler")
    pipe.scheduler = FlowMatchEulerDiscreteScheduler()
    with pytest.raises(ValueError, match="vp solver"):
        solver_from_pipeline(pipe, "pndm")
    assert isinstance(solver_from_pipeline(pipe, "flow-lpl"), FlowMatchSolverScheduler)


# ---------------------------------------------------------------- functional forms
def test_functional_forms_equal_schedulers():
    # A consistency check of the two public forms (a plain function, a scheduler), not of the values:
    # those are pinned against diffusers here and, for PNDM's custom grids, in test_pndm_reference.py.
    x = _noise(torch.float64)
    for skip in (True, False):
        s = PNDMSolver(skip_prk_steps=skip, set_alpha_to_one=True)
        s.set_timesteps(12)
        grid = [int(t) for t in s._grid]
        r = sample_pndm(ORACLE.eps_fn, x, s.alphas_cumprod, grid, skip_prk_steps=skip)
        # T // 12 is odd, so diffusers' PRK midpoints differ from the grid plan: compare on the custom grid.
        torch.testing.assert_close(r.sample, _loop(s, None, x, set_kw={"timesteps": grid}))
        assert r.nfe == pndm_nfe(12, skip) == len(s.timesteps)
    s = DDIMSolver(clip_sample=False)
    s.set_timesteps(12)
    r = sample_ddim(ORACLE.eps_fn, x, s.alphas_cumprod, s.timesteps.tolist())
    torch.testing.assert_close(r.sample, _loop(s, 12, x))
    s = DPMSolverPP2M()
    s.set_timesteps(12)
    r = sample_dpmpp_2m(ORACLE.eps_fn, x, s.alphas_cumprod, s.timesteps.tolist())
    torch.testing.assert_close(r.sample, _loop(s, 12, x))
    s = FlowMatchSolverScheduler(solver="heun")
    r = sample_flow(lambda z, sig: FLOW_ORACLE.velocity_at(z, torch.tensor(sig)), x, flow_sigmas(8), solver="heun")
    torch.testing.assert_close(r.sample, _loop(s, 8, x, model=FLOW_ORACLE), atol=1e-6, rtol=0)
    assert r.nfe == 15
    assert get_sample_fn("pndm") is sample_pndm


# ---------------------------------------------------------------- NFE accounting and state
def test_pndm_nfe_counts_and_budget():
    assert [pndm_nfe(n) for n in (1, 2, 3, 4, 10, 50)] == [4, 8, 12, 13, 19, 59]
    assert [pndm_nfe(n, True) for n in (1, 2, 10, 50)] == [1, 3, 11, 51]
    for budget in range(4, 120):
        n = pndm_steps_for_nfe(budget)
        assert pndm_nfe(n) <= budget < pndm_nfe(n + 1)
    for budget in range(1, 120):
        n = pndm_steps_for_nfe(budget, True)
        assert pndm_nfe(n, True) <= budget and (n == 1 or budget < pndm_nfe(n + 1, True))
    s = PNDMSolver()
    s.set_timesteps(nfe=50)
    assert len(s.timesteps) == s.nfe == 50 and s.num_inference_steps == 41
    with pytest.raises(ValueError, match="skip_prk_steps"):
        s.set_timesteps(nfe=3)


def test_set_timesteps_resets_history_and_deepcopy_branches():
    x = _noise(torch.float64)
    for sched in (PNDMSolver(), DPMSolverPP2M(), FlowMatchSolverScheduler(solver="heun")):
        model = FLOW_ORACLE if isinstance(sched, FlowMatchSolverScheduler) else ORACLE
        first = _loop(sched, 10, x, model=model)
        again = _loop(sched, 10, x, model=model)  # set_timesteps inside must wipe the history
        torch.testing.assert_close(first, again)
        # Branch half-way (noise search): a deep copy continues exactly like the original.
        sched.set_timesteps(10)
        y = x
        ts = list(sched.timesteps)
        for t in ts[: len(ts) // 2]:
            y = sched.step(model(y, t).sample, t, y).prev_sample
        twin, y2 = copy.deepcopy(sched), y.clone()
        for t in ts[len(ts) // 2 :]:
            y = sched.step(model(y, t).sample, t, y).prev_sample
            y2 = twin.step(model(y2, t).sample, t, y2).prev_sample
        torch.testing.assert_close(y, first)
        torch.testing.assert_close(y2, first)


def test_lpl_leaps_and_saves_calls():
    o = image_oracle(num_modes=4, prediction_type="flow")
    x = _noise(torch.float64, 128, (1, 8, 8))
    vf = lambda z, s: o.velocity_at(z, torch.tensor(s))  # noqa: E731
    full = sample_flow(vf, x, flow_sigmas(50))
    leap = sample_flow(vf, x, flow_sigmas(50), leap_tolerance=0.05)
    assert full.nfe == 50 and 25 < leap.nfe < 50
    assert torch.isfinite(leap.sample).all()
    sched = get_solver("flow-lpl")
    y = _loop(sched, 50, x, model=o)
    assert sched.leaped and sched.leap_step == leap.nfe - 1
    torch.testing.assert_close(y, leap.sample)


# ---------------------------------------------------------------- bad input
def test_registry_and_bad_input():
    assert {"ddim", "pndm", "plms", "dpmpp-2m", "dpmpp-3m", "unipc", "flow-euler", "flow-heun", "flow-lpl"} <= set(SOLVERS)
    with pytest.raises(ValueError, match="valid names: .*pndm"):
        get_solver("pndm2")
    for name in ("ddim", "pndm", "plms", "dpmpp-2m", "flow-euler"):
        with pytest.raises(ValueError, match="num_inference_steps"):
            get_solver(name).set_timesteps(0)
    with pytest.raises(ValueError, match="prediction_type"):
        get_solver("pndm", prediction_type="flow_prediction")
    with pytest.raises(ValueError, match="use_flow_sigmas"):
        DPMSolverPP2M.from_config(DPMSolverMultistepScheduler(use_flow_sigmas=True).config)
    with pytest.raises(ValueError, match="use_exponential_sigmas and use_lu_lambdas"):
        DPMSolverPP2M(use_exponential_sigmas=True, use_lu_lambdas=True)
    with pytest.raises(ValueError, match="solver_order"):
        DPMSolverPP2M(solver_order=4)
    with pytest.raises(ValueError, match="no plain-function sampler"):
        get_sample_fn("dpmpp-3m")
    with pytest.raises(ValueError, match="dynamic_thresholding_ratio"):
        DDIMSolver(thresholding=True, dynamic_thresholding_ratio=2.0)
    with pytest.raises(ValueError, match="leap"):
        FlowMatchSolverScheduler(solver="heun", leap_tolerance=0.1)
    with pytest.raises(ValueError, match="beta_schedule"):
        DDIMSolver(beta_schedule="sigmoid")
    s = PNDMSolver()
    with pytest.raises(ValueError, match="set_timesteps"):
        s.step(torch.zeros(1, 2), 0, torch.zeros(1, 2))
    s.set_timesteps(10)
    with pytest.raises(ValueError, match="expected timestep"):
        s.step(torch.zeros(1, 2), 5, torch.zeros(1, 2))
    with pytest.raises(ValueError, match="eta"):
        s.step(torch.zeros(1, 2), s.timesteps[0], torch.zeros(1, 2), eta=0.5)
