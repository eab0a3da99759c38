"""DPM-Solver++ 2M (Lu et al. 2022, "DPM-Solver++: Fast solver for guided sampling of diffusion
probabilistic models", Alg. 2, multistep second order, midpoint variant).

In data prediction form with ``alpha_t = sqrt(a_t)``, ``sigma_t = sqrt(1 - a_t)``,
``lambda_t = log(alpha_t / sigma_t)`` and ``h = lambda_t - lambda_s``, one step from ``s`` to ``t`` is::

    x_t = (sigma_t / sigma_s) x_s - alpha_t (exp(-h) - 1) (D0 + D1 / 2)
    D0 = x0(s),  D1 = (x0(s) - x0(s_prev)) * h / (lambda_s - lambda_{s_prev})

(first order, i.e. DDIM, when ``D1 = 0``). The first step is first order (no history). The last step is
first order when it lands on zero noise (``final_sigmas_type="zero"``), when ``euler_at_final`` is set,
or when ``lower_order_final`` is set and there are fewer than 15 steps, as in the reference code.

Grid (``timestep_spacing``): ``linspace``/``leading`` take ``N + 1`` points and drop the cleanest, the
last step then goes to ``final_sigmas_type`` (``zero``: ``alpha_bar = 1``; ``sigma_min``:
``alpha_bar_0``); ``trailing`` is DDIM's. ``use_lu_lambdas`` spaces the grid uniformly in ``lambda``
(Lu et al. 2022's recommendation for few steps). These choices reproduce diffusers'
``DPMSolverMultistepScheduler(algorithm_type="dpmsolver++", solver_order=2)``.
"""

from __future__ import annotations

import math
from typing import Callable, Optional, Sequence

import numpy as np
import torch
from diffusers.configuration_utils import ConfigMixin, register_to_config
from diffusers.schedulers.scheduling_utils import SchedulerMixin

from samplers.solvers._vp import (
    VPNoiseMixin,
    VP_COMPATIBLES,
    SampleResult,
    SolverOutput,
    TIMESTEP_SPACINGS,
    as_index,
    check_off,
    check_prediction_type,
    make_alphas_cumprod,
    to_eps_x0,
)


def dpm_timesteps(
    num_inference_steps: int,
    alphas_cumprod: torch.Tensor,
    timestep_spacing: str = "linspace",
    steps_offset: int = 0,
    lambda_min_clipped: float = -float("inf"),
    use_lu_lambdas: bool = False,
) -> np.ndarray:
    """Descending timesteps ``[N]`` for DPM-Solver; see the module docstring."""
    T = len(alphas_cumprod)
    N = int(num_inference_steps)
    if N < 1 or N > T:
        raise ValueError(f"num_inference_steps must be in [1, {T}], got {num_inference_steps}")
    ac = alphas_cumprod.double()
    lam = 0.5 * (torch.log(ac) - torch.log1p(-ac))
    # Timesteps whose lambda is below the clip are never used (the cosine schedule's last steps).
    last = T - int((lam < lambda_min_clipped).sum())
    if use_lu_lambdas:
        # Uniform in lambda between the noisiest usable step and the cleanest, mapped back to fractional
        # timesteps by interpolating log-sigma (sigma = exp(-lambda)), then rounded.
        lam_hi, lam_lo = lam[0].item(), lam[last - 1].item()
        lams = np.linspace(lam_lo, lam_hi, N)
        grid = -lam.numpy()  # log sigma, increasing in t
        ts = np.round(np.interp(-lams, grid, np.arange(T))).astype(np.int64)
        # Near t = 0 one training step spans a large lambda interval, so rounding can repeat a
        # timestep; keep the first occurrence (the grid may end up shorter than N).
        _, first = np.unique(ts, return_index=True)
        return ts[np.sort(first)]
    if timestep_spacing == "linspace":
        ts = np.linspace(0, last - 1, N + 1).round()[::-1][:-1]
    elif timestep_spacing == "leading":
        ts = (np.arange(N + 1) * (last // (N + 1))).round()[::-1][:-1] + steps_offset
    elif timestep_spacing == "trailing":
        ts = np.round(np.arange(last, 0, -T / N)) - 1
    else:
        raise ValueError(f"timestep_spacing={timestep_spacing!r} is not supported; use one of {TIMESTEP_SPACINGS}")
    return np.ascontiguousarray(ts).astype(np.int64)


def dpmpp_2m_update(x, x0, x0_prev, a_s: float, a_t: float, a_prev: Optional[float]):
    """One DPM-Solver++ step from level ``a_s`` to ``a_t`` (``alpha_bar`` values).

    ``x0_prev``/``a_prev`` are the previous step's data prediction and level; ``None`` gives the first
    order (DDIM) update.
    """
    alpha_s, sigma_s = math.sqrt(a_s), math.sqrt(1 - a_s)
    alpha_t, sigma_t = math.sqrt(a_t), math.sqrt(1 - a_t)
    # exp(-h) = (sigma_t / alpha_t) / (sigma_s / alpha_s); written this way it stays finite at sigma_t = 0.
    emh = (sigma_t / alpha_t) / (sigma_s / alpha_s)
    D = x0
    if x0_prev is not None and sigma_t > 0:
        lam = lambda a: 0.5 * (math.log(a) - math.log1p(-a))
        h = lam(a_t) - lam(a_s)
        h0 = lam(a_s) - lam(a_prev)
        D = x0 + 0.5 * (h / h0) * (x0 - x0_prev)
    return (sigma_t / sigma_s) * x + alpha_t * (1.0 - emh) * D


class DPMSolverPP2M(VPNoiseMixin, SchedulerMixin, ConfigMixin):
    """DPM-Solver++ 2M as a diffusers scheduler; config keys follow ``DPMSolverMultistepScheduler``.

    Only the deterministic data-prediction, order-2, midpoint configuration is implemented; loading a
    config that asks for something else (another ``algorithm_type``, ``solver_order=3``, Karras sigmas,
    thresholding, learned variance) raises ``ValueError`` instead of silently changing the method.
    NFE = ``num_inference_steps``.
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
        solver_order: int = 2,
        prediction_type: str = "epsilon",
        thresholding: bool = False,
        dynamic_thresholding_ratio: float = 0.995,
        sample_max_value: float = 1.0,
        algorithm_type: str = "dpmsolver++",
        solver_type: str = "midpoint",
        lower_order_final: bool = True,
        euler_at_final: bool = False,
        use_karras_sigmas: bool = False,
        use_exponential_sigmas: bool = False,
        use_beta_sigmas: bool = False,
        use_lu_lambdas: bool = False,
        use_flow_sigmas: bool = False,
        final_sigmas_type: str = "zero",
        lambda_min_clipped: float = -float("inf"),
        variance_type: Optional[str] = None,
        timestep_spacing: str = "linspace",
        steps_offset: int = 0,
        rescale_betas_zero_snr: bool = False,
    ):
        name = type(self).__name__
        check_prediction_type(prediction_type, ("epsilon", "v_prediction", "sample"), name)
        check_off(
            name,
            thresholding=thresholding,
            use_karras_sigmas=use_karras_sigmas,
            use_exponential_sigmas=use_exponential_sigmas,
            use_beta_sigmas=use_beta_sigmas,
            use_flow_sigmas=use_flow_sigmas,
        )
        if algorithm_type != "dpmsolver++" or solver_order != 2 or solver_type != "midpoint":
            raise ValueError(
                f"{name} implements algorithm_type='dpmsolver++', solver_order=2, solver_type='midpoint'; got "
                f"{algorithm_type!r}, {solver_order}, {solver_type!r}: pass those three values to from_config"
            )
        if variance_type is not None:
            raise ValueError(f"{name} does not handle learned variance (variance_type={variance_type!r}); pass None")
        if final_sigmas_type not in ("zero", "sigma_min"):
            raise ValueError(f"final_sigmas_type must be 'zero' or 'sigma_min', got {final_sigmas_type!r}")
        self.alphas_cumprod = make_alphas_cumprod(
            num_train_timesteps, beta_start, beta_end, beta_schedule, trained_betas, rescale_betas_zero_snr
        )
        if rescale_betas_zero_snr:
            # lambda must stay finite at the last training step (same guard as the reference code).
            self.alphas_cumprod[-1] = 2.0**-24
        self.init_noise_sigma = 1.0
        self.num_inference_steps = None
        self.timesteps = torch.from_numpy(np.arange(num_train_timesteps)[::-1].copy())
        self._index = {}
        self._last = None

    def set_timesteps(self, num_inference_steps: int, device=None):
        ts = dpm_timesteps(
            num_inference_steps,
            self.alphas_cumprod,
            self.config.timestep_spacing,
            self.config.steps_offset,
            self.config.lambda_min_clipped,
            self.config.use_lu_lambdas,
        )
        self.num_inference_steps = len(ts)
        self.timesteps = torch.from_numpy(ts).to(device)
        self._index = {int(t): i for i, t in enumerate(ts)}
        self._last = None  # (step index, x0 prediction, alpha_bar) of the previous step

    def scale_model_input(self, sample: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        return sample

    def _final_alpha(self) -> float:
        return 1.0 if self.config.final_sigmas_type == "zero" else float(self.alphas_cumprod[0])

    def step(self, model_output, timestep, sample, generator=None, eta: float = 0.0, return_dict: bool = True, **kw):
        if self.num_inference_steps is None:
            raise ValueError("call set_timesteps(num_inference_steps) before step()")
        if eta:
            raise ValueError("DPM-Solver++ 2M is deterministic; use eta=0 (or DDIMSolver for eta > 0)")
        t = as_index(timestep)
        if t not in self._index:
            raise ValueError(f"timestep {t} is not on the grid set by set_timesteps ({self.timesteps.tolist()})")
        i = self._index[t]
        N = len(self.timesteps)
        a_s = float(self.alphas_cumprod[t])
        a_t = float(self.alphas_cumprod[int(self.timesteps[i + 1])]) if i + 1 < N else self._final_alpha()
        x = sample.double()
        _, x0 = to_eps_x0(model_output.double(), x, a_s, self.config.prediction_type)
        first_order = (
            self._last is None
            or self._last[0] != i - 1
            or (
                i == N - 1
                and (
                    self.config.euler_at_final
                    or (self.config.lower_order_final and N < 15)
                    or self.config.final_sigmas_type == "zero"
                )
            )
        )
        if first_order:
            prev = dpmpp_2m_update(x, x0, None, a_s, a_t, None)
        else:
            prev = dpmpp_2m_update(x, x0, self._last[1], a_s, a_t, self._last[2])
        self._last = (i, x0, a_s)
        prev, x0 = prev.to(sample.dtype), x0.to(sample.dtype)
        if not return_dict:
            return (prev,)
        return SolverOutput(prev_sample=prev, pred_original_sample=x0)


def sample_dpmpp_2m(
    eps_fn: Callable[[torch.Tensor, int], torch.Tensor],
    x_T: torch.Tensor,
    alphas_cumprod: torch.Tensor,
    timesteps: Sequence[int],
    *,
    final_alpha_cumprod: float = 1.0,
    lower_order_final: bool = True,
) -> SampleResult:
    """DPM-Solver++ 2M over a descending integer grid, ending at ``final_alpha_cumprod``.

    Args:
        eps_fn: ``eps_fn(x [B, ...], t: int) -> eps [B, ...]``.
        x_T: ``[B, ...]`` initial noise.
        alphas_cumprod: ``[T]`` training ``alpha_bar``.
        lower_order_final: first-order last step when there are fewer than 15 steps (always when the
            last step lands on zero noise).
    Returns:
        :class:`SampleResult` with NFE = ``len(timesteps)``.
    """
    ts = [int(t) for t in timesteps]
    if len(ts) < 1:
        raise ValueError("sample_dpmpp_2m needs at least one timestep")
    ac = [float(v) for v in alphas_cumprod]
    N = len(ts)
    x = x_T.double()
    x0_prev, a_prev = None, None
    for i, t in enumerate(ts):
        a_s = ac[t]
        a_t = ac[ts[i + 1]] if i + 1 < N else final_alpha_cumprod
        eps = eps_fn(x.to(x_T.dtype), t).double()
        x0 = (x - math.sqrt(1 - a_s) * eps) / math.sqrt(a_s)
        last_low = i == N - 1 and ((lower_order_final and N < 15) or a_t >= 1.0)
        if x0_prev is None or last_low:
            x = dpmpp_2m_update(x, x0, None, a_s, a_t, None)
        else:
            x = dpmpp_2m_update(x, x0, x0_prev, a_s, a_t, a_prev)
        x0_prev, a_prev = x0, a_s
    return SampleResult(sample=x.to(x_T.dtype), nfe=N)
