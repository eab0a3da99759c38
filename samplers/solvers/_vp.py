"""Shared helpers for variance-preserving (VP) noise schedules and for the continuous solvers.

The VP forward process is ``x_t = sqrt(a_t) x0 + sqrt(1 - a_t) eps`` with ``a_t = alpha_bar_t`` the
cumulative product of ``1 - beta_i``. Everything here is a pure function of a scheduler config, so the
scheduler classes in this package and the plain-function samplers share one source of truth.

Numerics: betas and ``alphas_cumprod`` are built in float32 exactly as the trained models' schedules
were (so a model trained with a diffusers scheduler sees the same ``a_t`` bit for bit); the solvers
then do their arithmetic on these values in float64 and cast the result back to the sample's dtype.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np
import torch
from diffusers.utils import BaseOutput

BETA_SCHEDULES = ("linear", "scaled_linear", "squaredcos_cap_v2")
TIMESTEP_SPACINGS = ("linspace", "leading", "trailing")
PREDICTION_TYPES = ("epsilon", "v_prediction", "sample")

VP_COMPATIBLES = [
    "DDIMScheduler",
    "DDPMScheduler",
    "PNDMScheduler",
    "LMSDiscreteScheduler",
    "EulerDiscreteScheduler",
    "HeunDiscreteScheduler",
    "EulerAncestralDiscreteScheduler",
    "DPMSolverMultistepScheduler",
    "DPMSolverSinglestepScheduler",
    "KDPM2DiscreteScheduler",
    "KDPM2AncestralDiscreteScheduler",
    "DEISMultistepScheduler",
    "UniPCMultistepScheduler",
    "DPMSolverSDEScheduler",
]


@dataclass
class SampleResult:
    """Result of a plain-function sampler.

    Attributes:
        sample: ``[B, ...]`` the final sample (``x0`` estimate at the end of the grid).
        nfe: number of denoiser calls made.
    """

    sample: torch.Tensor
    nfe: int


@dataclass
class SolverOutput(BaseOutput):
    """Output of a solver's ``step``.

    Attributes:
        prev_sample: ``[B, ...]`` the sample at the next (less noisy) grid point; feed it back to the model.
        pred_original_sample: ``[B, ...]`` the solver's estimate of ``x0`` at this step, or ``None`` where
            the step does not form one (e.g. an intermediate Runge-Kutta stage).
    """

    prev_sample: torch.Tensor
    pred_original_sample: Optional[torch.Tensor] = None


def _cosine_alpha_bar(t: float) -> float:
    # Nichol & Dhariwal (2021) cosine schedule, offset s = 0.008.
    return math.cos((t + 0.008) / 1.008 * math.pi / 2) ** 2


def make_betas(
    num_train_timesteps: int = 1000,
    beta_start: float = 0.0001,
    beta_end: float = 0.02,
    beta_schedule: str = "linear",
    trained_betas: Optional[Sequence[float]] = None,
) -> torch.Tensor:
    """Betas ``[T]`` (float32) for a named schedule, or ``trained_betas`` (``[T']``) when given.

    As in diffusers, ``trained_betas`` are taken as given, whatever their length: a config is loaded and
    saved with them, and :func:`check_schedule_covers` refuses the mismatch once a grid is asked for."""
    if trained_betas is not None:
        betas = torch.as_tensor(np.asarray(trained_betas), dtype=torch.float32)
        if betas.ndim != 1 or betas.numel() < 1:
            raise ValueError(f"trained_betas must be a non-empty 1-D list of betas, got shape {tuple(betas.shape)}")
        return betas
    if beta_schedule == "linear":
        return torch.linspace(beta_start, beta_end, num_train_timesteps, dtype=torch.float32)
    if beta_schedule == "scaled_linear":
        # Linear in sqrt(beta), the latent-diffusion schedule.
        return torch.linspace(beta_start**0.5, beta_end**0.5, num_train_timesteps, dtype=torch.float32) ** 2
    if beta_schedule == "squaredcos_cap_v2":
        T = num_train_timesteps
        betas = [min(1.0 - _cosine_alpha_bar((i + 1) / T) / _cosine_alpha_bar(i / T), 0.999) for i in range(T)]
        return torch.tensor(betas, dtype=torch.float32)
    raise ValueError(
        f"beta_schedule={beta_schedule!r} is not supported; use one of {BETA_SCHEDULES} or pass trained_betas"
    )


def rescale_zero_terminal_snr(betas: torch.Tensor) -> torch.Tensor:
    """Rescale betas so the last timestep has zero SNR (Lin et al. 2024, "Common diffusion noise
    schedules and sample steps are flawed", Alg. 1): shift ``sqrt(a_t)`` so its last value is 0 and
    rescale so its first value is unchanged."""
    sqrt_ab = torch.cumprod(1.0 - betas, dim=0).sqrt()
    first, last = sqrt_ab[0].clone(), sqrt_ab[-1].clone()
    sqrt_ab = (sqrt_ab - last) * (first / (first - last))
    ab = sqrt_ab**2
    alphas = torch.cat([ab[:1], ab[1:] / ab[:-1]])
    return 1.0 - alphas


def make_schedule(
    num_train_timesteps: int = 1000,
    beta_start: float = 0.0001,
    beta_end: float = 0.02,
    beta_schedule: str = "linear",
    trained_betas: Optional[Sequence[float]] = None,
    rescale_betas_zero_snr: bool = False,
):
    """``(betas [T], alphas_cumprod [T])`` (float32) for a VP config, the betas after any zero-SNR
    rescaling (diffusers' ``scheduler.betas``)."""
    betas = make_betas(num_train_timesteps, beta_start, beta_end, beta_schedule, trained_betas)
    if rescale_betas_zero_snr:
        betas = rescale_zero_terminal_snr(betas)
    return betas, torch.cumprod(1.0 - betas, dim=0)


def make_alphas_cumprod(
    num_train_timesteps: int = 1000,
    beta_start: float = 0.0001,
    beta_end: float = 0.02,
    beta_schedule: str = "linear",
    trained_betas: Optional[Sequence[float]] = None,
    rescale_betas_zero_snr: bool = False,
) -> torch.Tensor:
    """``alpha_bar_t`` ``[T]`` (float32) for a VP config. Unlike the schedulers (which load any
    ``trained_betas`` as diffusers does and refuse at ``set_timesteps``), this plain-function form refuses a
    ``trained_betas`` length other than ``num_train_timesteps`` at once."""
    ac = make_schedule(num_train_timesteps, beta_start, beta_end, beta_schedule, trained_betas,
                       rescale_betas_zero_snr)[1]
    check_schedule_covers(ac, num_train_timesteps)
    return ac


def check_schedule_covers(alphas_cumprod: torch.Tensor, num_train_timesteps: int) -> None:
    """A grid over ``num_train_timesteps`` needs one level per training timestep. ``trained_betas`` of
    another length are accepted at construction (diffusers' rule, so such configs load and save), but a
    grid on them would index past the schedule: diffusers' PNDM and DDIM then fail with ``IndexError``
    at the first step and its DPM-Solver and UniPC run to non-finite samples; we refuse here."""
    if len(alphas_cumprod) != num_train_timesteps:
        raise ValueError(
            f"trained_betas has {len(alphas_cumprod)} values but num_train_timesteps={num_train_timesteps}: "
            "pass one beta per training timestep (or set num_train_timesteps=len(trained_betas))"
        )


def vp_timesteps(
    num_inference_steps: int,
    num_train_timesteps: int = 1000,
    timestep_spacing: str = "leading",
    steps_offset: int = 0,
) -> np.ndarray:
    """Descending integer timesteps ``[N]`` on the training grid (DDIM/PNDM convention).

    - ``linspace``: ``N`` points evenly from ``T-1`` down to ``0`` (both ends included);
    - ``leading``: ``0, r, 2r, ...`` with ``r = T // N``, plus ``steps_offset``;
    - ``trailing``: ``T-1, T-1-T/N, ...`` rounded (starts at the noisiest step; best for few steps).
    """
    T = num_train_timesteps
    N = int(num_inference_steps)
    if N < 1 or N > T:
        raise ValueError(f"num_inference_steps must be in [1, {T}] (num_train_timesteps), got {num_inference_steps}")
    if timestep_spacing == "linspace":
        ts = np.linspace(0, T - 1, N).round()[::-1]
    elif timestep_spacing == "leading":
        ts = (np.arange(N) * (T // N)).round()[::-1] + steps_offset
    elif timestep_spacing == "trailing":
        ts = np.round(np.arange(T, 0, -T / N)) - 1
    else:
        raise ValueError(f"timestep_spacing={timestep_spacing!r} is not supported; use one of {TIMESTEP_SPACINGS}")
    return np.ascontiguousarray(ts).astype(np.int64)


def custom_timesteps(timesteps, num_train_timesteps: int, arg: str = "timesteps") -> np.ndarray:
    """Validate a user grid (e.g. a fitted schedule, see ``samplers/solvers/schedules.py``): strictly
    descending integer training timesteps in ``[0, T - 1]``, at least one. Returns ``[N]`` int64."""
    ts = np.asarray(timesteps.tolist() if isinstance(timesteps, torch.Tensor) else timesteps, dtype=np.float64)
    if ts.ndim != 1 or ts.size < 1:
        raise ValueError(f"{arg} must be a non-empty 1-D list of training timesteps, got shape {ts.shape}")
    if not np.all(ts == np.round(ts)):
        raise ValueError(f"{arg} must be integers (training timesteps), got {ts.tolist()}")
    ts = ts.astype(np.int64)
    if ts.min() < 0 or ts.max() > num_train_timesteps - 1:
        raise ValueError(f"{arg} must lie in [0, {num_train_timesteps - 1}] (num_train_timesteps - 1), got {ts.tolist()}")
    if np.any(np.diff(ts) >= 0):
        raise ValueError(f"{arg} must be strictly descending (noisiest first), got {ts.tolist()}")
    return ts


def check_one_grid_source(num_inference_steps, timesteps, extra_name: str = "", extra=None) -> None:
    """``set_timesteps`` takes exactly one of a step count or a custom grid (diffusers' rule)."""
    given = [n for n, v in (("num_inference_steps", num_inference_steps), ("timesteps", timesteps), (extra_name, extra)) if n and v is not None]
    if len(given) != 1:
        names = "num_inference_steps or timesteps" + (f" or {extra_name}" if extra_name else "")
        raise ValueError(f"pass exactly one of {names} to set_timesteps, got {given or 'none'}")


def as_index(timestep) -> int:
    """A scalar timestep (python number or 0-d/1-element tensor) as a python int."""
    if isinstance(timestep, torch.Tensor):
        if timestep.numel() != 1:
            raise ValueError(f"step() takes one timestep for the whole batch, got a tensor of shape {tuple(timestep.shape)}")
        timestep = timestep.item()
    return int(round(float(timestep)))


def to_eps_x0(model_output, sample, alpha_bar, prediction_type: str):
    """Convert a model output to ``(eps, x0)`` predictions at noise level ``alpha_bar`` (a float).

    ``v_prediction`` follows Salimans & Ho (2022): ``v = sqrt(a) eps - sqrt(1-a) x0``.
    """
    a, s = math.sqrt(alpha_bar), math.sqrt(1.0 - alpha_bar)
    if prediction_type == "epsilon":
        eps = model_output
        x0 = (sample - s * eps) / a
    elif prediction_type == "v_prediction":
        eps = a * model_output + s * sample
        x0 = a * sample - s * model_output
    elif prediction_type == "sample":
        x0 = model_output
        if s == 0.0:
            raise ValueError("prediction_type='sample' cannot give an epsilon at alpha_bar=1 (no noise)")
        eps = (sample - a * x0) / s
    else:
        raise ValueError(f"prediction_type={prediction_type!r} is not supported; use one of {PREDICTION_TYPES}")
    return eps, x0


def check_prediction_type(prediction_type: str, supported: Sequence[str], cls_name: str) -> None:
    if prediction_type not in supported:
        raise ValueError(
            f"{cls_name} does not support prediction_type={prediction_type!r}; use one of {tuple(supported)} "
            "(set it with from_config(..., prediction_type=...))"
        )


def check_off(cls_name: str, **flags) -> None:
    """Refuse config options we do not implement instead of silently ignoring them."""
    on = [k for k, v in flags.items() if v]
    if on:
        raise ValueError(
            f"{cls_name} does not implement {', '.join(on)}; load the config with "
            + ", ".join(f"{k}=False" for k in on)
            + " or use the diffusers scheduler"
        )


def check_grid_options(use_karras_sigmas: bool, use_exponential_sigmas: bool, use_beta_sigmas: bool,
                       use_lu_lambdas: bool = False) -> None:
    """At most one way of spacing the grid (diffusers refuses two sigma grids too)."""
    on = [k for k, v in (("use_karras_sigmas", use_karras_sigmas), ("use_exponential_sigmas", use_exponential_sigmas),
                         ("use_beta_sigmas", use_beta_sigmas), ("use_lu_lambdas", use_lu_lambdas)) if v]
    if len(on) > 1:
        raise ValueError(f"{' and '.join(on)} each set the grid: keep one of them True")


def check_thresholding(thresholding: bool, ratio: float, max_value: float) -> None:
    if thresholding and not (0 <= ratio <= 1 and max_value > 0):
        raise ValueError(f"thresholding needs 0 <= dynamic_thresholding_ratio <= 1 and sample_max_value > 0, "
                         f"got {ratio} and {max_value}")


def dynamic_threshold(x0: torch.Tensor, ratio: float, max_value: float) -> torch.Tensor:
    """Dynamic thresholding of a data prediction (Saharia et al. 2022, "Photorealistic text-to-image
    diffusion models with deep language understanding", sec. 2.3): per sample, ``s`` is the ``ratio``
    quantile of ``|x0|`` over all its entries, clamped to ``[1, max_value]``; ``x0`` is clipped to
    ``[-s, s]`` and divided by ``s`` (``s = 1`` is plain clipping to ``[-1, 1]``). ``x0``: ``[B, ...]``."""
    flat = x0.reshape(x0.shape[0], -1)
    s = torch.quantile(flat.abs(), ratio, dim=1).clamp(min=1.0, max=max_value).unsqueeze(1)
    return (torch.maximum(torch.minimum(flat, s), -s) / s).reshape(x0.shape)


def add_noise_vp(alphas_cumprod: torch.Tensor, original_samples, noise, timesteps) -> torch.Tensor:
    """Forward process ``sqrt(a_t) x0 + sqrt(1-a_t) eps`` for per-sample integer ``timesteps`` ``[B]``."""
    ac = alphas_cumprod.to(device=original_samples.device, dtype=original_samples.dtype)
    t = torch.as_tensor(timesteps, device=original_samples.device).long().reshape(-1)
    shape = (-1,) + (1,) * (original_samples.ndim - 1)
    a = ac[t].reshape(shape)
    return a.sqrt() * original_samples + (1 - a).sqrt() * noise


def velocity_vp(alphas_cumprod: torch.Tensor, sample, noise, timesteps) -> torch.Tensor:
    """The v target ``sqrt(a) eps - sqrt(1-a) x0`` for training v-prediction models."""
    ac = alphas_cumprod.to(device=sample.device, dtype=sample.dtype)
    t = torch.as_tensor(timesteps, device=sample.device).long().reshape(-1)
    a = ac[t].reshape((-1,) + (1,) * (sample.ndim - 1))
    return a.sqrt() * noise - (1 - a).sqrt() * sample


def randn_like_gen(shape, generator, device, dtype) -> torch.Tensor:
    """Gaussian noise drawn the way diffusers' pipelines draw it, so a shared generator gives the same
    numbers as a diffusers scheduler (needed for the exactness tests of stochastic steps)."""
    from diffusers.utils.torch_utils import randn_tensor

    return randn_tensor(shape, generator=generator, device=device, dtype=dtype)


class VPNoiseMixin:
    """The forward-process half of the diffusers scheduler contract, shared by the VP solvers.

    Needs `self.alphas_cumprod` and `self.config.num_train_timesteps`.
    """

    def add_noise(self, original_samples, noise, timesteps):
        return add_noise_vp(self.alphas_cumprod, original_samples, noise, timesteps)

    def get_velocity(self, sample, noise, timesteps):
        return velocity_vp(self.alphas_cumprod, sample, noise, timesteps)

    def __len__(self):
        return self.config.num_train_timesteps


def _lam(a: float) -> float:
    """log-SNR ``lambda = log(alpha / sigma)`` of the level ``alpha_bar = a``."""
    return 0.5 * (math.log(a) - math.log1p(-a))


def _third_order_differences(x0, history, a_s: float, h: float):
    """``(D1, D2)`` of the third-order multistep update (ODE and SDE alike): divided differences of the
    data predictions ``x0`` (at ``a_s``) and ``history = [(x0_1, a_1), (x0_2, a_2)]`` in log-SNR,
    scaled by the step ``h``."""
    (m1, a1), (m2, a2) = history
    r0, r1 = (_lam(a_s) - _lam(a1)) / h, (_lam(a1) - _lam(a2)) / h
    e0, e1 = (x0 - m1) / r0, (m1 - m2) / r1
    return e0 + (r0 / (r0 + r1)) * (e0 - e1), (e0 - e1) / (r0 + r1)
