"""UniPC on flow-matching models (``use_flow_sigmas``) and UniPC's ``sigma_min`` / ``sigma_max``, against
diffusers' ``UniPCMultistepScheduler`` on the same inputs.

diffusers' test_scheduler_unipc.py checks ``use_flow_sigmas`` + ``use_karras_sigmas`` (a scheduler
against a copy of itself) and the Karras flow grid's values; here every flow grid diffusers' UniPC
builds (shifted, dynamically shifted with ``mu``, stretched to ``shift_terminal``, Karras, custom
``sigmas=``) and the full sampling loops on it (every prediction type, orders 1-3, bh1/bh2, corrector
off) must give diffusers' timesteps, sigmas and samples.
"""

import numpy as np
import pytest
import torch
from diffusers import UniPCMultistepScheduler

from samplers.solvers.unipc import UniPCSolver

torch.set_num_threads(1)


def _sample_deter(shape=(4, 3, 8, 8)):
    n = int(np.prod(shape))
    return (torch.arange(n, dtype=torch.float32) / n).reshape(shape[1], shape[2], shape[3], shape[0]).permute(3, 0, 1, 2)


def _model(sample, t):
    """A smooth stand-in for a model output at timestep ``t``."""
    t = torch.as_tensor(t, dtype=sample.dtype)
    return sample * t / (t + 1) - 0.2


def _close(a, b, tol=2e-4):
    """Equal up to float32 rounding (diffusers computes in float32, ours in float64), relative to scale."""
    err = (a.double() - b.double()).abs().max().item()
    assert err <= tol * max(1.0, b.abs().max().item()), err


def _loop(s, steps=None, **set_kw):
    s.set_timesteps(steps, **set_kw)
    s.set_begin_index(0)
    x = _sample_deter()
    for t in s.timesteps:
        x = s.step(_model(x, t), t, x).prev_sample
    return x


def _pair(**cfg):
    ref = UniPCMultistepScheduler(**cfg)
    return UniPCSolver.from_config(ref.config), ref


FLOW = dict(use_flow_sigmas=True)
FLOW_CONFIGS = [
    dict(FLOW),
    dict(FLOW, flow_shift=3.0, prediction_type="flow_prediction"),
    dict(FLOW, flow_shift=5.0, prediction_type="flow_prediction", final_sigmas_type="sigma_min"),
    dict(FLOW, flow_shift=3.0, prediction_type="flow_prediction", solver_order=3),
    dict(FLOW, flow_shift=3.0, prediction_type="flow_prediction", solver_order=1),
    dict(FLOW, flow_shift=2.0, prediction_type="v_prediction"),
    # bh1 ends at sigma_min: at zero noise diffusers' bh1 weights are inf / inf (NaN samples, also on VP grids).
    dict(FLOW, flow_shift=2.0, prediction_type="flow_prediction", solver_type="bh1", final_sigmas_type="sigma_min"),
    dict(FLOW, flow_shift=2.0, prediction_type="sample", disable_corrector=[0, 1, 2]),
    dict(FLOW, prediction_type="flow_prediction", shift_terminal=0.1),
    dict(FLOW, use_karras_sigmas=True),
    dict(FLOW, use_karras_sigmas=True, final_sigmas_type="sigma_min", prediction_type="flow_prediction"),
    dict(FLOW, use_karras_sigmas=True, sigma_min=0.01, sigma_max=200.0, prediction_type="flow_prediction"),
    dict(FLOW, flow_shift=3.0, prediction_type="flow_prediction", thresholding=True, dynamic_thresholding_ratio=0.9),
]


# One sigma of 1 cannot be stretched to shift_terminal (refused: test_flow_refusals).
FLOW_CASES = [(i, n) for i, cfg in enumerate(FLOW_CONFIGS) for n in (1, 2, 5, 10, 25)
              if not (n == 1 and cfg.get("shift_terminal"))]


@pytest.mark.parametrize("case,steps", FLOW_CASES)
def test_flow_grids_and_samples_match_diffusers(case, steps):
    # With epsilon prediction the first flow level has alpha = 1e-6 (diffusers moves sigma = 1 to 1 - 1e-6),
    # so x0 = (x - sigma eps) / alpha magnifies float32 rounding a million times; the configs above keep
    # the corrections of such steps small (bh2) or predict the velocity, whose x0 = x - sigma v is exact.
    ours, ref = _pair(**FLOW_CONFIGS[case])
    a, b = _loop(ours, steps), _loop(ref, steps)
    assert ours.timesteps.tolist() == ref.timesteps.tolist()
    torch.testing.assert_close(ours.sigmas.float(), ref.sigmas, rtol=1e-6, atol=0)
    assert torch.isfinite(a).all()
    _close(a, b)


@pytest.mark.parametrize("kind,mu", [("exponential", 0.5), ("exponential", 1.15), ("linear", 1.5)])
@pytest.mark.parametrize("steps", [4, 20])
def test_flow_dynamic_shift_matches_diffusers(kind, mu, steps):
    ours, ref = _pair(**FLOW, use_dynamic_shifting=True, time_shift_type=kind, prediction_type="flow_prediction")
    a, b = _loop(ours, steps, mu=mu), _loop(ref, steps, mu=mu)
    assert ours.timesteps.tolist() == ref.timesteps.tolist()
    torch.testing.assert_close(ours.sigmas.float(), ref.sigmas, rtol=1e-6, atol=0)
    _close(a, b)
    with pytest.raises(ValueError, match="mu"):
        ours.set_timesteps(steps)


@pytest.mark.parametrize("shift", [1.0, 3.0])
@pytest.mark.parametrize("sigmas", [[1.0, 0.8, 0.5, 0.2], [0.9, 0.6, 0.3, 0.1, 0.05], [0.5]])
def test_flow_custom_sigmas_match_diffusers(shift, sigmas):
    ours, ref = _pair(**FLOW, flow_shift=shift, prediction_type="flow_prediction", final_sigmas_type="sigma_min")
    a, b = _loop(ours, sigmas=np.array(sigmas)), _loop(ref, sigmas=np.array(sigmas))  # diffusers needs an array
    assert ours.num_inference_steps == len(sigmas)
    assert ours.timesteps.tolist() == ref.timesteps.tolist()
    torch.testing.assert_close(ours.sigmas.float(), ref.sigmas, rtol=1e-6, atol=0)
    _close(a, b)


def test_flow_karras_sigma_values_as_diffusers_tests_them():
    # diffusers' test_flow_and_karras_sigmas_values, on ours.
    s = UniPCSolver(sigma_min=0.01, sigma_max=200.0, use_flow_sigmas=True, use_karras_sigmas=True)
    s.set_timesteps(num_inference_steps=5)
    expected = torch.tensor([0.9950248599052429, 0.9787454605102539, 0.8774884343147278, 0.3604971766471863,
                             0.009900986216962337, 0.0])
    torch.testing.assert_close(s.sigmas.float(), expected)
    assert s.timesteps.tolist() == (expected * 1000).to(torch.int64)[:-1].tolist()


def test_flow_is_not_the_vp_solver():
    # The same model outputs on a flow grid and a VP grid give different samples (the levels are used).
    a = _loop(UniPCSolver(**FLOW), 10)
    b = _loop(UniPCSolver(), 10)
    assert (a - b).abs().max() > 1e-2


@pytest.mark.parametrize("begin", [None, 0, 3])
def test_flow_add_noise_matches_diffusers(begin):
    x0, noise = _sample_deter(), torch.randn(4, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    outs = []
    for s in _pair(**FLOW, flow_shift=3.0, prediction_type="flow_prediction"):
        s.set_timesteps(10)
        if begin is not None:
            s.set_begin_index(begin)
        t = s.timesteps[[0, 3, 7, 9]] if begin is None else s.timesteps[begin:begin + 1].repeat(4)
        outs.append(s.add_noise(x0, noise, t))
    torch.testing.assert_close(*outs, atol=1e-6, rtol=0)
    s = UniPCSolver(**FLOW)
    s.set_timesteps(10)
    s.set_begin_index(2)
    sig = float(s.sigmas[2])
    torch.testing.assert_close(s.add_noise(x0, noise, s.timesteps[2:3]), (1 - sig) * x0 + sig * noise)


def test_flow_img2img_slice_matches_diffusers():
    # A pipeline's img2img loop: slice the grid, noise the image at the first kept level, step from there.
    outs = []
    for s in _pair(**FLOW, flow_shift=3.0, prediction_type="flow_prediction"):
        s.set_timesteps(20)
        ts = s.timesteps[8:]
        s.set_begin_index(8)
        x = s.add_noise(_sample_deter(), torch.full((4, 3, 8, 8), 0.3), ts[:1])
        for t in ts:
            x = s.step(_model(x, t), t, x).prev_sample
        outs.append(x)
    _close(*outs)


def test_flow_config_round_trip_and_from_diffusers(tmp_path):
    ref = UniPCMultistepScheduler(**FLOW, flow_shift=3.0, prediction_type="flow_prediction")  # Wan-style
    ours = UniPCSolver.from_config(ref.config)
    ours.save_config(tmp_path)
    again = UniPCSolver.from_pretrained(tmp_path)
    assert again.config.use_flow_sigmas and again.config.flow_shift == 3.0
    assert UniPCMultistepScheduler.from_config(ours.config).config.use_flow_sigmas


@pytest.mark.parametrize("grid", ["use_karras_sigmas", "use_exponential_sigmas", "use_beta_sigmas"])
@pytest.mark.parametrize("lo,hi", [(0.05, None), (None, 40.0), (0.1, 20.0)])
def test_vp_sigma_range_matches_diffusers(grid, lo, hi):
    # UniPC's sigma_min / sigma_max set the ends of the VP sigma grids too.
    ours, ref = _pair(**{grid: True}, sigma_min=lo, sigma_max=hi, final_sigmas_type="sigma_min")
    a, b = _loop(ours, 10), _loop(ref, 10)
    assert ours.timesteps.tolist() == ref.timesteps.tolist()
    torch.testing.assert_close(ours.sigmas.float(), ref.sigmas, rtol=1e-6, atol=0)
    _close(a, b)
    plain = _loop(UniPCSolver(**{grid: True}, final_sigmas_type="sigma_min"), 10)
    assert (a - plain).abs().max() > 1e-4  # the range was used


def test_flow_refusals():
    # diffusers refuses shift_terminal without flow sigmas; it accepts exponential / beta sigmas with flow
    # sigmas and then treats VP sigmas > 1 as flow sigmas (alpha = 1 - s < 0): non-finite samples.
    for cls in (UniPCSolver, UniPCMultistepScheduler):
        with pytest.raises(ValueError, match="shift_terminal"):
            cls(shift_terminal=0.1)
    for grid in ("use_exponential_sigmas", "use_beta_sigmas"):
        with pytest.raises(ValueError, match=f"{grid} cannot be combined with use_flow_sigmas"):
            UniPCSolver(**FLOW, **{grid: True})
        assert not torch.isfinite(_loop(UniPCMultistepScheduler(**FLOW, **{grid: True}), 10)).all()
    # Ours only: options that mean nothing on a VP grid, and grids that cannot be flow grids.
    with pytest.raises(ValueError, match="use_dynamic_shifting need"):
        UniPCSolver(use_dynamic_shifting=True)
    with pytest.raises(ValueError, match="fitted_schedule cannot be combined"):
        UniPCSolver(**FLOW, fitted_schedule="digits")
    with pytest.raises(ValueError, match="flow_shift must be > 0"):
        UniPCSolver(**FLOW, flow_shift=0.0)
    with pytest.raises(ValueError, match="shift_terminal needs a last sigma below 1"):
        UniPCSolver(**FLOW, shift_terminal=0.1).set_timesteps(1)
    ref = UniPCMultistepScheduler(**FLOW, shift_terminal=0.1)
    ref.set_timesteps(1)
    assert torch.isnan(ref.sigmas[0])  # diffusers: 0 / 0
    s = UniPCSolver(**FLOW)
    with pytest.raises(ValueError, match="not timesteps="):
        s.set_timesteps(timesteps=[900, 500])
    with pytest.raises(ValueError, match="strictly descending list of flow sigmas"):
        s.set_timesteps(sigmas=[0.5, 0.9])
    with pytest.raises(ValueError, match="strictly descending list of flow sigmas"):
        s.set_timesteps(sigmas=[1.5, 0.9])
    with pytest.raises(ValueError, match="custom sigmas replace use_karras_sigmas"):
        UniPCSolver(**FLOW, use_karras_sigmas=True).set_timesteps(sigmas=[0.9, 0.5])
    with pytest.raises(ValueError, match="set_timesteps"):
        UniPCSolver(**FLOW).add_noise(torch.zeros(1, 2), torch.zeros(1, 2), torch.tensor([500]))
    with pytest.raises(ValueError, match="flow_prediction"):
        s.get_velocity(torch.zeros(1, 2), torch.zeros(1, 2), torch.tensor([500]))


def test_construction_checks_name_the_solver_and_load_the_fitted_schedule():
    """Refusals at construction name the class; a fitted schedule is read at construction (a bad name
    fails there, not at the first set_timesteps)."""
    with pytest.raises(ValueError, match=r"^UniPCSolver does not support prediction_type='x0'"):
        UniPCSolver(prediction_type="x0")
    with pytest.raises(ValueError, match="no saved schedule 'no-such-schedule'"):
        UniPCSolver(fitted_schedule="no-such-schedule")
    assert UniPCSolver(fitted_schedule="digits").config.fitted_schedule == "digits"


def test_get_velocity_is_diffusers_v_target():
    """diffusers' UniPC has no get_velocity; DDPMScheduler's, on the same (default) betas, is the v-target."""
    from diffusers import DDPMScheduler

    ours, theirs = UniPCSolver(), DDPMScheduler()
    g = torch.Generator().manual_seed(0)
    sample, noise = torch.randn(2, 3, 4, 4, generator=g), torch.randn(2, 3, 4, 4, generator=g)
    t = torch.tensor([10, 700])
    torch.testing.assert_close(ours.get_velocity(sample, noise, t), theirs.get_velocity(sample, noise, t))


def test_lpl_stop_callback_interrupts_once_the_scheduler_has_leaped():
    from types import SimpleNamespace

    from samplers.solvers.flow import lpl_stop_callback

    kwargs = {"latents": torch.zeros(1)}
    waiting = SimpleNamespace(scheduler=SimpleNamespace(leaped=False), _interrupt=False)
    assert lpl_stop_callback(waiting, 3, 500, kwargs) is kwargs and waiting._interrupt is False
    leaped = SimpleNamespace(scheduler=SimpleNamespace(leaped=True), _interrupt=False)
    assert lpl_stop_callback(leaped, 4, 400, kwargs) is kwargs and leaped._interrupt is True
    other = SimpleNamespace(scheduler=SimpleNamespace(), _interrupt=False)  # a scheduler that cannot leap
    lpl_stop_callback(other, 4, 400, kwargs)
    assert other._interrupt is False
