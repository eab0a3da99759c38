"""DDIM (Song, Meng & Ermon 2021, "Denoising Diffusion Implicit Models"), eq. 12.

``x0 = (x - sqrt(1-a) e) / sqrt(a)``;  ``x' = sqrt(a') x0 + sqrt(1 - a' - s^2) e + s z`` with
``s = eta * sqrt((1-a')/(1-a)) * sqrt(1 - a/a')``. ``eta = 0`` is the deterministic ODE sampler (the
first-order case of PNDM, see ``samplers/pndm.py``); ``eta = 1`` matches DDPM's posterior variance.

Two forms share the math: :class:`DDIMSolver`, a drop-in diffusers scheduler
(``pipe.scheduler = DDIMSolver.from_config(pipe.scheduler.config)``), and :func:`sample_ddim`, a plain
loop over an ``eps_fn(x, t)`` denoiser.

Grid: ``set_timesteps(N)`` reproduces diffusers' ``DDIMScheduler`` exactly, including its step target
``t - T // N`` (which for ``linspace`` spacing, or ``trailing`` when ``N`` does not divide ``T``, is not
the next grid point: diffusers' own behaviour, kept so that the scheduler is a drop-in).
``set_timesteps(timesteps=[...])`` takes a custom descending grid (e.g. a fitted schedule, see
``samplers/solvers/schedules.py``) and then each step goes to the next grid point, the last one to
``final_alpha_cumprod``.
"""

from __future__ import annotations

import math
from typing import Callable, Optional, Sequence

import numpy as np
import torch
from diffusers.configuration_utils import ConfigMixin, register_to_config
from diffusers.schedulers.scheduling_utils import SchedulerMixin

from samplers.solvers._finite import check_model_output
from samplers.solvers.schedules import fitted_or_default, load_schedule
from samplers.solvers._vp import (
    VPNoiseMixin,
    VP_COMPATIBLES,
    SampleResult,
    SolverOutput,
    as_index,
    check_prediction_type,
    check_thresholding,
    dynamic_threshold,
    make_schedule,
    randn_like_gen,
    to_eps_x0,
    check_one_grid_source,
    check_schedule_covers,
    custom_timesteps,
    vp_timesteps,
)

def ddim_update(x, eps, x0, a: float, a_prev: float, eta: float = 0.0, noise=None):
    """One DDIM step from level ``a`` to ``a_prev`` given the ``eps`` and ``x0`` predictions."""
    sigma = 0.0
    if eta > 0:
        sigma = eta * math.sqrt((1 - a_prev) / (1 - a)) * math.sqrt(1 - a / a_prev)
    out = math.sqrt(a_prev) * x0 + math.sqrt(max(1 - a_prev - sigma**2, 0.0)) * eps
    if sigma > 0:
        if noise is None:
            raise ValueError("eta > 0 needs noise (pass a generator or variance_noise)")
        out = out + sigma * noise
    return out


class DDIMSolver(VPNoiseMixin, SchedulerMixin, ConfigMixin):
    """DDIM as a diffusers scheduler. Config keys are those of diffusers' ``DDIMScheduler``.

    ``eta`` (config, default 0) is used when ``step`` gets no ``eta``; pipelines such as
    ``DDIMPipeline`` pass their own ``eta`` to ``step``. NFE = ``num_inference_steps``.
    """

    _compatibles = VP_COMPATIBLES
    order = 1

    @register_to_config
    def __init__(
        self,
        num_train_timesteps: int = 1000,
        beta_start: float = 0.0001,
        beta_end: float = 0.02,
        beta_schedule: str = "linear",
        trained_betas: Optional[Sequence[float]] = None,
        clip_sample: bool = True,
        set_alpha_to_one: bool = True,
        steps_offset: int = 0,
        prediction_type: str = "epsilon",
        thresholding: bool = False,
        dynamic_thresholding_ratio: float = 0.995,
        clip_sample_range: float = 1.0,
        sample_max_value: float = 1.0,
        timestep_spacing: str = "leading",
        rescale_betas_zero_snr: bool = False,
        eta: float = 0.0,
        fitted_schedule: Optional[str] = None,
    ):
        check_prediction_type(prediction_type, ("epsilon", "v_prediction", "sample"), type(self).__name__)
        check_thresholding(thresholding, dynamic_thresholding_ratio, sample_max_value)
        if fitted_schedule is not None:
            load_schedule(fitted_schedule)  # fail now, naming the shipped schedules, not at set_timesteps
        if eta < 0:
            raise ValueError(f"eta must be >= 0 (0 = deterministic DDIM, 1 = DDPM variance), got {eta}")
        self.betas, self.alphas_cumprod = make_schedule(
            num_train_timesteps, beta_start, beta_end, beta_schedule, trained_betas, rescale_betas_zero_snr
        )
        self.alphas = 1.0 - self.betas
        self.final_alpha_cumprod = 1.0 if set_alpha_to_one else float(self.alphas_cumprod[0])
        self.init_noise_sigma = 1.0
        self.num_inference_steps = None
        self.timesteps = torch.from_numpy(np.arange(num_train_timesteps)[::-1].copy())
        self._prev = {}
        self._custom = False

    def set_timesteps(self, num_inference_steps: Optional[int] = None, device=None, timesteps=None):
        """Fill ``timesteps`` (descending, ``[N]``) from ``num_inference_steps`` (diffusers' grid and step
        targets) or from a custom ``timesteps`` grid (steps go to the next grid point)."""
        check_one_grid_source(num_inference_steps, timesteps)
        check_schedule_covers(self.alphas_cumprod, self.config.num_train_timesteps)
        T = self.config.num_train_timesteps
        if timesteps is None:
            timesteps = fitted_or_default(self.config, "ddim", num_inference_steps)
        if timesteps is not None:
            ts = custom_timesteps(timesteps, T)
            prev = [int(ts[i + 1]) if i + 1 < len(ts) else -1 for i in range(len(ts))]
        else:
            ts = vp_timesteps(num_inference_steps, T, self.config.timestep_spacing, self.config.steps_offset)
            # diffusers' DDIMScheduler steps to t - T // N whatever the spacing; a negative target means
            # the final level (final_alpha_cumprod).
            prev = [max(int(t) - T // len(ts), -1) for t in ts]
        self.num_inference_steps = len(ts)
        self.timesteps = torch.from_numpy(ts).to(device)
        self._prev = {int(t): p for t, p in zip(ts, prev)}
        self._custom = timesteps is not None

    def scale_model_input(self, sample: torch.Tensor, timestep=None) -> torch.Tensor:
        return sample

    def _alpha(self, t: int) -> float:
        return float(self.alphas_cumprod[t]) if t >= 0 else self.final_alpha_cumprod

    def _target(self, t: int) -> int:
        """The level a step from timestep ``t`` goes to. On diffusers' grid any timestep steps to
        ``t - T // N`` as in diffusers' ``DDIMScheduler`` (also one off the grid, as its tests and some
        callers use); on a custom grid only its own points are defined."""
        if t in self._prev:
            return self._prev[t]
        if self._custom:
            raise ValueError(f"timestep {t} is not on the custom grid set by set_timesteps ({self.timesteps.tolist()})")
        if not 0 <= t < self.config.num_train_timesteps:
            raise ValueError(f"timestep {t} is outside [0, {self.config.num_train_timesteps - 1}]")
        return max(t - self.config.num_train_timesteps // self.num_inference_steps, -1)

    def _get_variance(self, timestep: int, prev_timestep: int) -> torch.Tensor:
        """DDPM posterior variance between two levels, ``(1 - a') / (1 - a) * (1 - a / a')`` (DDIM's
        ``sigma^2`` at ``eta = 1``; diffusers' ``DDIMScheduler._get_variance``). 0-dim tensor."""
        a, a_prev = self._alpha(int(timestep)), self._alpha(int(prev_timestep))
        return torch.tensor((1 - a_prev) / (1 - a) * (1 - a / a_prev))

    def step(
        self,
        model_output: torch.Tensor,
        timestep,
        sample: torch.Tensor,
        eta: Optional[float] = None,
        use_clipped_model_output: bool = False,
        generator=None,
        variance_noise: Optional[torch.Tensor] = None,
        return_dict: bool = True,
    ):
        if self.num_inference_steps is None:
            raise ValueError("call set_timesteps(num_inference_steps) before step()")
        t = as_index(timestep)
        target = self._target(t)
        step = list(self._prev).index(t) if t in self._prev else None
        check_model_output(model_output, self, t, step, last=target < 0)
        eta = self.config.eta if eta is None else float(eta)
        a, a_prev = self._alpha(t), self._alpha(target)
        eps, x0 = to_eps_x0(model_output.double(), sample.double(), a, self.config.prediction_type)
        cfg = self.config
        if cfg.thresholding or cfg.clip_sample:
            # Dynamic thresholding takes precedence over plain clipping, as in diffusers.
            if cfg.thresholding:
                x0 = dynamic_threshold(x0, cfg.dynamic_thresholding_ratio, cfg.sample_max_value)
            else:
                x0 = x0.clamp(-cfg.clip_sample_range, cfg.clip_sample_range)
            if use_clipped_model_output:
                eps = (sample.double() - math.sqrt(a) * x0) / math.sqrt(1 - a)
        noise = None
        if eta > 0:
            if variance_noise is not None and generator is not None:
                raise ValueError("pass either generator or variance_noise to step(), not both")
            noise = variance_noise
            if noise is None:
                noise = randn_like_gen(model_output.shape, generator, model_output.device, model_output.dtype)
            noise = noise.double()
        prev = ddim_update(sample.double(), eps, x0, a, a_prev, eta, noise).to(sample.dtype)
        x0 = x0.to(sample.dtype)
        if not return_dict:
            return (prev, x0)
        return SolverOutput(prev_sample=prev, pred_original_sample=x0)


def sample_ddim(
    eps_fn: Callable[[torch.Tensor, int], torch.Tensor],
    x_T: torch.Tensor,
    alphas_cumprod: torch.Tensor,
    timesteps: Sequence[int],
    *,
    eta: float = 0.0,
    generator: Optional[torch.Generator] = None,
    final_alpha_cumprod: float = 1.0,
) -> SampleResult:
    """DDIM over a descending grid of integer ``timesteps``, ending at ``final_alpha_cumprod``.

    Args:
        eps_fn: ``eps_fn(x [B, ...], t: int) -> eps [B, ...]``.
        x_T: ``[B, ...]`` initial noise.
        alphas_cumprod: ``[T]`` training ``alpha_bar``.
    Returns:
        :class:`SampleResult` with NFE = ``len(timesteps)``.
    """
    ts = [int(t) for t in timesteps]
    if len(ts) < 1:
        raise ValueError("sample_ddim needs at least one timestep")
    ac = [float(v) for v in alphas_cumprod]
    x = x_T.double()
    for i, t in enumerate(ts):
        a = ac[t]
        a_prev = ac[ts[i + 1]] if i + 1 < len(ts) else final_alpha_cumprod
        eps = eps_fn(x.to(x_T.dtype), t).double()
        x0 = (x - math.sqrt(1 - a) * eps) / math.sqrt(a)
        noise = None
        if eta > 0:
            noise = torch.randn(x.shape, generator=generator, dtype=torch.float64).to(x.device)
        x = ddim_update(x, eps, x0, a, a_prev, eta, noise)
    return SampleResult(sample=x.to(x_T.dtype), nfe=len(ts))
