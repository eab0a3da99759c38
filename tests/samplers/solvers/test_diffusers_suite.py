"""diffusers' own scheduler checks for PNDM and the multistep DPM solvers, adapted to ours.

diffusers' tests/schedulers/test_scheduler_pndm.py and test_scheduler_dpm_multi.py (v0.42 line) check
a scheduler against a copy of itself: direct ``step_prk`` / ``step_plms`` calls at arbitrary timesteps
with a hand-set history ``ets``, the ``prk_timesteps`` / ``plms_timesteps`` loops, every DPM
``algorithm_type`` x ``solver_type`` x ``solver_order`` x ``prediction_type``, and full loops of their
deterministic dummy model. Here the same calls run on our scheduler AND on diffusers' one with the same
inputs, and the outputs must agree (a stronger check than self-consistency). Refusals are tested where
diffusers refuses the same input.
"""

import inspect

import numpy as np
import pytest
import torch
from diffusers import DPMSolverMultistepScheduler, PNDMScheduler

from samplers.solvers.dpmpp_2m import DPMSolverPP2M
from samplers.solvers.pndm import PNDMSolver

torch.set_num_threads(1)


def _sample_deter(shape=(4, 3, 8, 8)):
    """A deterministic sample in [0, 1) (diffusers' tests use the same kind of ramp)."""
    n = int(np.prod(shape))
    return (torch.arange(n, dtype=torch.float32) / n).reshape(shape[1], shape[2], shape[3], shape[0]).permute(3, 0, 1, 2)


def _model(sample, t):
    """A smooth stand-in for a denoiser: ``x * t / (t + 1)``."""
    t = torch.as_tensor(t, dtype=sample.dtype)
    return sample * t / (t + 1)


def _rand(seed, shape=(4, 3, 8, 8)):
    return torch.rand(shape, generator=torch.Generator().manual_seed(seed))


def _close(a, b, tol=1e-4):
    """Equal up to float32 rounding (diffusers computes in float32, ours in float64), relative to scale."""
    err = (a.double() - b.double()).abs().max().item()
    assert err <= tol * max(1.0, b.abs().max().item()), err


# ---------------------------------------------------------------- PNDM: direct step_prk / step_plms
PNDM_CONFIGS = [
    {},
    {"num_train_timesteps": 100},
    {"beta_start": 0.001, "beta_end": 0.02},
    {"beta_schedule": "squaredcos_cap_v2"},
    {"prediction_type": "v_prediction"},
    {"steps_offset": 1},
    {"set_alpha_to_one": True, "beta_start": 0.01},
]


def _pndm_pair(steps, **cfg):
    pair = [PNDMSolver(**cfg), PNDMScheduler(**cfg)]
    for s in pair:
        s.set_timesteps(steps)
    return pair


@pytest.mark.parametrize("cfg", PNDM_CONFIGS)
@pytest.mark.parametrize("time_step", [0, 1, 5, 10])
@pytest.mark.parametrize("steps", [10, 50])
def test_pndm_direct_prk_then_plms_with_set_history_matches_diffusers(cfg, time_step, steps):
    # diffusers' check_over_configs / check_over_forward: set ets by hand, then one step_prk and one
    # step_plms at a timestep that is not the planned one.
    x = _rand(0)
    residual = 0.1 * x
    ets = [residual + 0.2, residual + 0.15, residual + 0.1, residual + 0.05]
    outs = []
    for s in _pndm_pair(steps, **cfg):
        s.ets = list(ets)
        a = s.step_prk(residual, time_step, x).prev_sample
        b = s.step_plms(residual, time_step, x).prev_sample
        c = s.step_plms(residual, time_step, x).prev_sample  # counter 2: the new output joins the history
        outs.append((a, b, c, s.counter))
    (a1, b1, c1, n1), (a2, b2, c2, n2) = outs
    _close(a1, a2)
    _close(b1, b2)
    _close(c1, c2)
    assert n1 == n2 == 3


@pytest.mark.parametrize("cfg", PNDM_CONFIGS)
@pytest.mark.parametrize("skip_prk", [False, True])
def test_pndm_prk_and_plms_timestep_loops_match_diffusers(cfg, skip_prk):
    # diffusers' full_loop: iterate prk_timesteps with step_prk, then plms_timesteps with step_plms.
    results = []
    for s in _pndm_pair(10, skip_prk_steps=skip_prk, **cfg):
        assert s.prk_timesteps.tolist() + s.plms_timesteps.tolist() == s.timesteps.tolist()
        x = _sample_deter()
        for t in s.prk_timesteps:
            x = s.step_prk(_model(x, t), t, x).prev_sample
        for t in s.plms_timesteps:
            x = s.step_plms(_model(x, t), t, x).prev_sample
        results.append((x, s.prk_timesteps.tolist(), s.plms_timesteps.tolist()))
    (x1, p1, q1), (x2, p2, q2) = results
    assert (p1, q1) == (p2, q2)
    _close(x1, x2)
    assert (len(p1), len(q1)) == ((0, 11) if skip_prk else (12, 7))


def test_pndm_direct_calls_without_history_match_diffusers():
    # skip_prk_steps: step_plms at unplanned timesteps walks diffusers' Heun warm start then AB2..AB4.
    outs = []
    for s in _pndm_pair(20, skip_prk_steps=True):
        x = _rand(1)
        for t in (700, 650, 600, 550, 500, 450):
            x = s.step_plms(_model(x, t), t, x).prev_sample
        outs.append(x)
    _close(*outs)


def test_pndm_pow_of_3_steps_first_prk_calls_match_diffusers():
    outs = []
    for s in _pndm_pair(27):
        x = _rand(2)
        for t in s.prk_timesteps[:2]:
            x = s.step_prk(0.1 * x, t, x).prev_sample
        outs.append(x)
    _close(*outs)


def test_pndm_step_shapes_at_arbitrary_timesteps():
    s = PNDMSolver()
    s.set_timesteps(50)
    x = _rand(3)
    s.ets = [0.1 * x + d for d in (0.2, 0.15, 0.1, 0.05)]
    for fn in (s.step_prk, s.step_prk, s.step_plms, s.step_plms):
        for t in (0, 1):
            assert fn(0.1 * x, t, x).prev_sample.shape == x.shape


def test_pndm_direct_call_refusals_match_diffusers():
    x = _rand(4)
    # Before set_timesteps both refuse.
    for s in (PNDMSolver(), PNDMScheduler()):
        with pytest.raises(ValueError):
            s.step_plms(x, 1, x)
    # step_plms before the Runge-Kutta warm start has produced 3 outputs: both refuse.
    for s in _pndm_pair(10):
        with pytest.raises(ValueError):
            s.step_plms(x, int(s.timesteps[0]), x)
    # skip_prk_steps=True has no Runge-Kutta stage: diffusers fails indexing its empty prk_timesteps
    # (IndexError); ours says so with a ValueError.
    ours, ref = _pndm_pair(10, skip_prk_steps=True)
    with pytest.raises(ValueError, match="skip_prk_steps"):
        ours.step_prk(x, 500, x)
    with pytest.raises(IndexError):
        ref.step_prk(x, 500, x)
    # After the 12 warm-start calls, a direct step_prk has no stage left: diffusers indexes past the end.
    ours, ref = _pndm_pair(10)
    for s in (ours, ref):
        y = x
        for t in s.timesteps[:12]:
            y = s.step(_model(y, t), t, y).prev_sample
    with pytest.raises(ValueError, match="warm start"):
        ours.step_prk(x, 5, x)
    with pytest.raises(IndexError):
        ref.step_prk(x, 5, x)


def test_pndm_mixed_step_and_direct_calls_keep_planned_results():
    # On planned calls step_prk / step_plms are step(): a loop that mixes them equals the step() loop.
    a, b = PNDMSolver(), PNDMSolver()
    x = y = _sample_deter()
    for s in (a, b):
        s.set_timesteps(15)
    for k, t in enumerate(a.timesteps):
        x = a.step(_model(x, t), t, x).prev_sample
        fn = b.step_prk if k < 12 else b.step_plms
        y = fn(_model(y, t), t, y).prev_sample
    torch.testing.assert_close(x, y, atol=0, rtol=0)


# ---------------------------------------------------------------- DPM: every algorithm x solver type x order
def _dpm_pair(**cfg):
    return DPMSolverPP2M(**cfg), DPMSolverMultistepScheduler(**cfg)


def _dpm_loop(s, steps=10, seed=0, timesteps=None, dtype=torch.float32):
    if timesteps is None:
        s.set_timesteps(steps)
    else:
        s.set_timesteps(timesteps=timesteps)
    # A grid can repeat its first timestep (cosine schedule, sigma grids): without a begin index both
    # schedulers would enter at the repeat, as pipelines avoid by calling set_begin_index(0).
    s.set_begin_index(0)
    g = torch.Generator().manual_seed(seed)
    kw = {"generator": g} if "generator" in inspect.signature(s.step).parameters else {}
    x = _sample_deter().to(dtype)
    for t in s.timesteps:
        x = s.step(_model(x, t), t, x, **kw).prev_sample
    return x


DPM_CASES = [
    (algo, kind, order, pred)
    for algo in ("dpmsolver", "dpmsolver++", "sde-dpmsolver", "sde-dpmsolver++")
    for kind in ("midpoint", "heun")
    for order in (1, 2, 3)
    for pred in ("epsilon", "sample", "v_prediction")
    if not (algo == "sde-dpmsolver" and order == 3)
]


@pytest.mark.parametrize("algo,kind,order,pred", DPM_CASES)
@pytest.mark.parametrize("steps", [4, 10, 20])
def test_dpm_algorithms_orders_solver_types_match_diffusers(algo, kind, order, pred, steps):
    cfg = dict(algorithm_type=algo, solver_type=kind, solver_order=order, prediction_type=pred,
               final_sigmas_type="sigma_min", lower_order_final=False)
    ours, ref = _dpm_pair(**cfg)
    a, b = _dpm_loop(ours, steps), _dpm_loop(ref, steps)
    assert torch.isfinite(a).all()
    # diffusers forms its coefficients in float32; ours in float64.
    tol = 2e-3 if pred == "sample" and algo in ("dpmsolver", "sde-dpmsolver") else 2e-4
    assert (a.double() - b.double()).abs().max().item() < tol * max(1.0, b.abs().max().item())


@pytest.mark.parametrize("algo", ["dpmsolver", "sde-dpmsolver"])
@pytest.mark.parametrize("order", [1, 2])
def test_dpm_noise_prediction_custom_timesteps_equal_the_same_grid(algo, order):
    # diffusers' test_custom_timesteps, for the noise-prediction forms: timesteps= reproduces N steps.
    cfg = dict(algorithm_type=algo, solver_order=order, final_sigmas_type="sigma_min")
    s = DPMSolverPP2M(**cfg)
    s.set_timesteps(10)
    grid = s.timesteps.tolist()
    a = _dpm_loop(DPMSolverPP2M(**cfg), 10)
    b = _dpm_loop(DPMSolverPP2M(**cfg), timesteps=grid)
    torch.testing.assert_close(a, b, atol=0, rtol=0)


def test_dpm_order_one_is_ddim_in_both_forms():
    # DPM-Solver-1 is DDIM whichever quantity the solver integrates: data and noise forms agree.
    a = _dpm_loop(DPMSolverPP2M(solver_order=1, final_sigmas_type="sigma_min"))
    b = _dpm_loop(DPMSolverPP2M(solver_order=1, algorithm_type="dpmsolver", final_sigmas_type="sigma_min"))
    torch.testing.assert_close(a, b, atol=1e-5, rtol=0)


def test_dpm_refusals_that_diffusers_shares():
    # Noise-prediction forms cannot end at zero noise.
    for algo in ("dpmsolver", "sde-dpmsolver"):
        for cls in (DPMSolverPP2M, DPMSolverMultistepScheduler):
            with pytest.raises(ValueError, match="final_sigmas_type"):
                cls(algorithm_type=algo, final_sigmas_type="zero")
    # The noise-prediction SDE solver has no third order: we refuse at construction, diffusers fails at
    # the first third-order step.
    with pytest.raises(ValueError, match="sde-dpmsolver"):
        DPMSolverPP2M(algorithm_type="sde-dpmsolver", solver_order=3, final_sigmas_type="sigma_min")
    ref = DPMSolverMultistepScheduler(algorithm_type="sde-dpmsolver", solver_order=3, final_sigmas_type="sigma_min",
                                      lower_order_final=False)
    with pytest.raises(UnboundLocalError):
        _dpm_loop(ref, 10)


# ---------------------------------------------------------------- DPM / UniPC: sigma grids and thresholding
# diffusers' test_beta_sigmas / test_exponential_sigmas / test_full_loop_with_karras* / test_thresholding /
# test_fp16_support, run here against diffusers' own scheduler on the same inputs.
GRIDS = ["use_karras_sigmas", "use_exponential_sigmas", "use_beta_sigmas"]


def _diffusers_in_float64(monkeypatch, sched):
    """Make diffusers' DPMSolverMultistepScheduler compute in float64 (it casts the sample to float32 and
    keeps float32 sigmas): its module's `torch.float32` is swapped for float64 for this test only."""
    import types

    import diffusers.schedulers.scheduling_dpmsolver_multistep as module

    shim = types.SimpleNamespace(**{k: getattr(torch, k) for k in dir(torch) if not k.startswith("__")})
    shim.float32 = torch.float64
    monkeypatch.setattr(module, "torch", shim)
    original = sched.set_timesteps

    def set_timesteps(*args, **kwargs):
        original(*args, **kwargs)
        sched.sigmas = sched.sigmas.double()

    sched.set_timesteps = set_timesteps


# dpmsolver with final_sigmas_type="zero" is refused by both (tested above), so it is not a case here
SIGMA_GRID_CASES = [(algo, cfg) for algo in ("dpmsolver++", "dpmsolver", "sde-dpmsolver++")
                    for cfg in (dict(), dict(prediction_type="v_prediction"), dict(beta_schedule="squaredcos_cap_v2"),
                                dict(solver_order=3, final_sigmas_type="zero"))
                    if not (algo == "dpmsolver" and cfg.get("final_sigmas_type") == "zero")]


@pytest.mark.parametrize("grid", GRIDS)
@pytest.mark.parametrize("algo,cfg", SIGMA_GRID_CASES)
@pytest.mark.parametrize("steps", [5, 10, 25])
def test_dpm_sigma_grids_match_diffusers(grid, algo, cfg, steps, monkeypatch):
    # The grids start at the training schedule's largest sigma (157 linear, 594 cosine): there the
    # noise-prediction update is a difference of terms up to ~2000 times larger than its result, so in
    # float32 both schedulers round differently by up to a few 1e-3 of the output. The comparison is
    # therefore made with both computing in float64 (samples, sigmas, coefficients), where they agree
    # to 1e-7; the float32 runs agree to 2e-4 for the data-prediction forms.
    cfg = {"final_sigmas_type": "sigma_min", **cfg, grid: True, "algorithm_type": algo}
    ours, ref = _dpm_pair(**cfg)
    a32, b32 = _dpm_loop(ours, steps), _dpm_loop(ref, steps)
    assert ours.timesteps.tolist() == ref.timesteps.tolist() and torch.isfinite(a32).all()
    torch.testing.assert_close(ours.sigmas.float(), ref.sigmas.float(), rtol=1e-6, atol=0)
    if algo.startswith("sde-") or (algo == "dpmsolver++" and cfg.get("beta_schedule") != "squaredcos_cap_v2"):
        _close(a32, b32, 2e-4)
    if not algo.startswith("sde-"):  # the SDE form is checked in float32 only: float64 would change diffusers' noise draws
        _diffusers_in_float64(monkeypatch, ref)
        a, b = _dpm_loop(ours, steps, dtype=torch.float64), _dpm_loop(ref, steps, dtype=torch.float64)
        assert ours.timesteps.tolist() == ref.timesteps.tolist()
        assert a.dtype == b.dtype == torch.float64 and torch.isfinite(a).all()
        _close(a, b, 1e-7)


@pytest.mark.parametrize("grid", GRIDS)
@pytest.mark.parametrize("cfg", [dict(), dict(final_sigmas_type="sigma_min"), dict(solver_order=3)])
@pytest.mark.parametrize("steps", [5, 10, 25])
def test_unipc_sigma_grids_match_diffusers(grid, cfg, steps):
    from diffusers import UniPCMultistepScheduler

    from samplers.solvers.unipc import UniPCSolver

    ours, ref = UniPCSolver(**cfg, **{grid: True}), UniPCMultistepScheduler(**cfg, **{grid: True})
    a, b = _dpm_loop(ours, steps), _dpm_loop(ref, steps)
    assert ours.timesteps.tolist() == ref.timesteps.tolist()
    assert torch.isfinite(a).all()
    _close(a, b, 2e-4)


@pytest.mark.parametrize("cls_name", ["dpm", "unipc"])
@pytest.mark.parametrize("pred", ["epsilon", "sample", "v_prediction"])
@pytest.mark.parametrize("ratio,max_value", [(0.995, 1.0), (0.87, 0.5), (0.5, 2.0), (0.0, 1.0)])
def test_dynamic_thresholding_matches_diffusers(cls_name, pred, ratio, max_value):
    from diffusers import UniPCMultistepScheduler

    from samplers.solvers.unipc import UniPCSolver

    cfg = dict(thresholding=True, dynamic_thresholding_ratio=ratio, sample_max_value=max_value, prediction_type=pred)
    pairs = {"dpm": (DPMSolverPP2M, DPMSolverMultistepScheduler), "unipc": (UniPCSolver, UniPCMultistepScheduler)}
    ours_cls, ref_cls = pairs[cls_name]
    outs = []
    for s in (ours_cls(**cfg), ref_cls(**cfg)):
        s.set_timesteps(10)
        x = _sample_deter() * 3  # pushes the data predictions past [-1, 1] so the threshold acts
        for t in s.timesteps:
            x = s.step(_model(x, t) - 1.5, t, x).prev_sample
        outs.append(x)
    _close(*outs, 2e-4)
    plain = DPMSolverPP2M(prediction_type=pred) if cls_name == "dpm" else UniPCSolver(prediction_type=pred)
    plain.set_timesteps(10)
    y = _sample_deter() * 3
    for t in plain.timesteps:
        y = plain.step(_model(y, t) - 1.5, t, y).prev_sample
    assert (outs[0] - y).abs().max() > 1e-3  # the threshold changed the result


@pytest.mark.parametrize("algo", ["dpmsolver++", "dpmsolver"])
def test_dpm_fp16_with_thresholding_keeps_dtype_and_matches(algo):
    cfg = dict(thresholding=True, dynamic_thresholding_ratio=0, algorithm_type=algo, final_sigmas_type="sigma_min")
    outs = []
    for s in _dpm_pair(**cfg):
        s.set_timesteps(10)
        x = _sample_deter().half()
        for t in s.timesteps:
            x = s.step(_model(x, t), t, x).prev_sample
        assert x.dtype == torch.float16
        outs.append(x)
    _close(*outs, 2e-3)


def test_sigma_grid_refusals():
    for cls in (DPMSolverPP2M, DPMSolverMultistepScheduler):
        with pytest.raises(ValueError):
            cls(use_karras_sigmas=True, use_exponential_sigmas=True)
    s = DPMSolverPP2M(use_karras_sigmas=True)
    with pytest.raises(ValueError, match="use_karras_sigmas"):
        s.set_timesteps(timesteps=[900, 500, 100])
    with pytest.raises(ValueError, match="dynamic_thresholding_ratio"):
        DPMSolverPP2M(thresholding=True, dynamic_thresholding_ratio=1.5)


# ---------------------------------------------------------------- DDIM: off-grid timesteps, variance, thresholding
# diffusers' test_scheduler_ddim.py steps at timesteps that are not on the grid (test_time_indices,
# test_eta, test_inference_steps, test_steps_offset, test_timestep_spacing), reads _get_variance and turns
# dynamic thresholding on.
@pytest.mark.parametrize("spacing,offset", [("leading", 0), ("leading", 1), ("trailing", 0), ("linspace", 0)])
@pytest.mark.parametrize("t,eta", [(1, 0.0), (10, 0.5), (49, 1.0), (777, 0.3)])
@pytest.mark.parametrize("steps", [10, 50])
def test_ddim_steps_at_any_timestep_like_diffusers(spacing, offset, t, eta, steps):
    from diffusers import DDIMScheduler

    from samplers.solvers.ddim import DDIMSolver

    cfg = dict(timestep_spacing=spacing, steps_offset=offset, clip_sample=False)
    x, noise = _rand(5), _rand(6) - 0.5
    outs = []
    for s in (DDIMSolver(**cfg), DDIMScheduler(**cfg)):
        s.set_timesteps(steps)
        outs.append(s.step(_model(x, t), t, x, eta=eta, variance_noise=noise).prev_sample)
    _close(*outs, 1e-5)


def test_ddim_off_grid_timestep_on_a_custom_grid_is_refused():
    from samplers.solvers.ddim import DDIMSolver

    s = DDIMSolver()
    s.set_timesteps(timesteps=[900, 500, 100])
    with pytest.raises(ValueError, match="custom grid"):
        s.step(torch.zeros(1, 2), 501, torch.zeros(1, 2))


@pytest.mark.parametrize("pair", [(0, 0), (420, 400), (980, 960), (487, 486), (999, 998), (20, -1)])
def test_ddim_get_variance_matches_diffusers(pair):
    from diffusers import DDIMScheduler

    from samplers.solvers.ddim import DDIMSolver

    a = DDIMSolver(set_alpha_to_one=False)._get_variance(*pair)
    b = DDIMScheduler(set_alpha_to_one=False)._get_variance(*pair)
    assert abs(float(a) - float(b)) < 1e-6


@pytest.mark.parametrize("pred", ["epsilon", "v_prediction", "sample"])
@pytest.mark.parametrize("max_value", [0.5, 1.0, 2.0])
@pytest.mark.parametrize("clipped_output", [False, True])
def test_ddim_thresholding_matches_diffusers(pred, max_value, clipped_output):
    from diffusers import DDIMScheduler

    from samplers.solvers.ddim import DDIMSolver

    cfg = dict(thresholding=True, sample_max_value=max_value, prediction_type=pred, dynamic_thresholding_ratio=0.9)
    outs = []
    for s in (DDIMSolver(**cfg), DDIMScheduler(**cfg)):
        s.set_timesteps(10)
        x = _sample_deter() * 3
        for t in s.timesteps:
            x = s.step(_model(x, t) - 1.5, t, x, use_clipped_model_output=clipped_output).prev_sample
        outs.append(x)
    _close(*outs, 1e-4)


# ---------------------------------------------------------------- trained_betas (all four schedulers)
# diffusers' test_trained_betas builds each scheduler with trained_betas=[0.1, 0.3] (2 betas for 1000
# training steps), saves and reloads it and compares `betas`. Construction takes the betas as given;
# a grid over 1000 steps on 2 betas cannot run (diffusers: IndexError or non-finite samples, below), so
# ours refuses at set_timesteps.
def _vp_pairs():
    from diffusers import DDIMScheduler, UniPCMultistepScheduler

    from samplers.solvers.ddim import DDIMSolver
    from samplers.solvers.unipc import UniPCSolver

    return {"pndm": (PNDMSolver, PNDMScheduler), "ddim": (DDIMSolver, DDIMScheduler),
            "dpm": (DPMSolverPP2M, DPMSolverMultistepScheduler), "unipc": (UniPCSolver, UniPCMultistepScheduler)}


@pytest.mark.parametrize("name,cfg", [("pndm", {}), ("ddim", {}), ("dpm", {}), ("unipc", {}),
                                      ("ddim", {"rescale_betas_zero_snr": True}), ("dpm", {"rescale_betas_zero_snr": True}),
                                      ("unipc", {"rescale_betas_zero_snr": True})])
def test_short_trained_betas_load_save_like_diffusers_and_refuse_a_grid(name, cfg, tmp_path):
    ours_cls, ref_cls = _vp_pairs()[name]
    betas = np.array([0.1, 0.3])
    ours, ref = ours_cls(trained_betas=betas, **cfg), ref_cls(trained_betas=betas, **cfg)
    assert ours.betas.tolist() == ref.betas.tolist()
    torch.testing.assert_close(ours.alphas, ref.alphas, atol=0, rtol=0)
    torch.testing.assert_close(ours.alphas_cumprod, ref.alphas_cumprod, atol=0, rtol=0)
    ours.save_pretrained(tmp_path)
    assert ours_cls.from_pretrained(tmp_path).betas.tolist() == ours.betas.tolist()
    with pytest.raises(ValueError, match="trained_betas has 2 values but num_train_timesteps=1000"):
        ours.set_timesteps(10)
    ref.set_timesteps(10)  # diffusers accepts the grid, then fails or diverges
    x = _sample_deter()
    if name in ("pndm", "ddim"):
        with pytest.raises(IndexError):
            ref.step(_model(x, ref.timesteps[0]), ref.timesteps[0], x)
    else:
        for t in ref.timesteps:
            x = ref.step(_model(x, t), t, x).prev_sample
        assert not torch.isfinite(x).all()


def test_plain_function_schedule_refuses_short_trained_betas_at_once():
    # The plain-function form (oracles, samplers over a denoiser) has no later set_timesteps to refuse at.
    from samplers.solvers._vp import make_alphas_cumprod

    with pytest.raises(ValueError, match="trained_betas has 2 values but num_train_timesteps=1000"):
        make_alphas_cumprod(trained_betas=[0.1, 0.3])
    assert len(make_alphas_cumprod(num_train_timesteps=2, trained_betas=[0.1, 0.3])) == 2


def _loop(s, steps=10, **kw):
    s.set_timesteps(steps)
    x = _sample_deter()
    for t in s.timesteps:
        x = s.step(_model(x, t), t, x, **kw).prev_sample
    return x


@pytest.mark.parametrize("name", ["pndm", "ddim", "dpm", "unipc"])
@pytest.mark.parametrize("T", [1000, 100])
def test_full_trained_betas_sample_like_diffusers(name, T):
    # A model's own beta table (here a cosine-like ramp that no named schedule produces) replaces the
    # named schedule in every level the solver uses.
    ours_cls, ref_cls = _vp_pairs()[name]
    betas = (0.0001 + 0.03 * np.sin(np.linspace(0, np.pi / 2, T)) ** 2).tolist()
    ours, ref = ours_cls(num_train_timesteps=T, trained_betas=betas), ref_cls(num_train_timesteps=T, trained_betas=betas)
    assert ours.betas.tolist() == ref.betas.tolist()
    a, b = _loop(ours), _loop(ref)
    assert ours.timesteps.tolist() == ref.timesteps.tolist() and torch.isfinite(a).all()
    _close(a, b, 2e-4)
    plain = _loop(ours_cls(num_train_timesteps=T))
    assert (a - plain).abs().max() > 1e-3  # the trained betas were used


# ---------------------------------------------------------------- DPM / UniPC: a first step off the grid
# diffusers' test_inference_steps (UniPC) steps a fresh scheduler at timestep 0, which is not on the
# grid: DPM-Solver and UniPC then take the step as the grid's last one (index_for_timestep), as ours do.
def _off_grid_pairs():
    from diffusers import UniPCMultistepScheduler

    from samplers.solvers.unipc import UniPCSolver

    return [
        (DPMSolverPP2M, DPMSolverMultistepScheduler, {}),
        (DPMSolverPP2M, DPMSolverMultistepScheduler, dict(algorithm_type="dpmsolver", final_sigmas_type="sigma_min")),
        (DPMSolverPP2M, DPMSolverMultistepScheduler, dict(solver_order=3, final_sigmas_type="sigma_min")),
        (UniPCSolver, UniPCMultistepScheduler, {}),
        (UniPCSolver, UniPCMultistepScheduler, dict(final_sigmas_type="sigma_min", solver_order=3)),
        (UniPCSolver, UniPCMultistepScheduler, dict(use_karras_sigmas=True, final_sigmas_type="sigma_min")),
        (UniPCSolver, UniPCMultistepScheduler, dict(use_flow_sigmas=True, flow_shift=3.0, prediction_type="flow_prediction")),
    ]


def _off_grid_cases():
    """(case, t, steps) where t is not on diffusers' grid of that many steps (18 of the 105 combinations
    are on it, e.g. every t at 1000 steps: those are the ordinary on-grid steps the loops above test)."""
    out = []
    for case, (_, ref_cls, cfg) in enumerate(_off_grid_pairs()):
        for steps in (1, 2, 10, 50, 1000):
            ref = ref_cls(**cfg)
            ref.set_timesteps(steps)
            out += [(case, t, steps) for t in (0, 3, 777) if t not in ref.timesteps.tolist()]
    return out


@pytest.mark.parametrize("case,t,steps", _off_grid_cases())
def test_first_step_off_the_grid_is_the_last_step_like_diffusers(case, t, steps):
    ours_cls, ref_cls, cfg = _off_grid_pairs()[case]
    x = _rand(3)
    outs = []
    for s in (ours_cls(**cfg), ref_cls(**cfg)):
        s.set_timesteps(steps)
        assert t not in s.timesteps.tolist()  # ours has diffusers' grid
        outs.append(s.step(_model(x, t) - 0.3, t, x).prev_sample)
        assert s.step_index == steps
    _close(*outs, 2e-4)
    ours = ours_cls(**cfg)
    ours.set_timesteps(steps)
    ours.step(_model(x, t), t, x)
    with pytest.raises(ValueError, match="more times than there are timesteps"):
        ours.step(_model(x, t), t, x)


def test_first_step_off_a_custom_dpm_grid_is_its_last_step_like_diffusers():
    outs = []
    x = _rand(4)
    for s in _dpm_pair():
        s.set_timesteps(timesteps=[900, 600, 300, 100])
        outs.append(s.step(_model(x, 500), 500, x).prev_sample)
    _close(*outs, 2e-4)
