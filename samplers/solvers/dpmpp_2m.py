"""DPM-Solver++ 2M and 3M (Lu et al. 2022, "DPM-Solver++: Fast solver for guided sampling of diffusion
probabilistic models", Alg. 2, multistep second order, midpoint variant; ``solver_order=3``: the
third-order multistep variant, below).

In data prediction form with ``alpha_t = sqrt(a_t)``, ``sigma_t = sqrt(1 - a_t)``,
``lambda_t = log(alpha_t / sigma_t)`` and ``h = lambda_t - lambda_s``, one step from ``s`` to ``t`` is::

    x_t = (sigma_t / sigma_s) x_s - alpha_t (exp(-h) - 1) (D0 + D1 / 2)
    D0 = x0(s),  D1 = (x0(s) - x0(s_prev)) * h / (lambda_s - lambda_{s_prev})

(first order, i.e. DDIM, when ``D1 = 0``). The first step is first order (no history). The last step is
first order when it lands on zero noise (``final_sigmas_type="zero"``), when ``euler_at_final`` is set,
or when ``lower_order_final`` is set and there are fewer than 15 steps, as in the reference code.

Third order (``solver_order=3``, "3M") uses the last three data predictions ``m0, m1, m2`` at
``lambda_0 > lambda_1 > lambda_2`` (newest first): with ``r0 = (lambda_0 - lambda_1) / h`` and
``r1 = (lambda_1 - lambda_2) / h``, the divided differences ``E0 = (m0 - m1) / r0``,
``E1 = (m1 - m2) / r1`` give ``D1 = E0 + r0 / (r0 + r1) (E0 - E1)`` and ``D2 = (E0 - E1) / (r0 + r1)``,
and the step integrates the quadratic in ``lambda`` exactly::

    x_t = (sigma_t / sigma_s) x_s - alpha_t (exp(-h) - 1) D0 + alpha_t ((exp(-h) - 1) / h + 1) D1
          - alpha_t ((exp(-h) - 1 + h) / h^2 - 1/2) D2

It needs two earlier steps, so the second step is second order; with ``lower_order_final`` and fewer
than 15 steps the second-to-last step drops to second order too (diffusers' rule).

Grid (``timestep_spacing``): ``linspace``/``leading`` take ``N + 1`` points and drop the cleanest, the
last step then goes to ``final_sigmas_type`` (``zero``: ``alpha_bar = 1``; ``sigma_min``:
``alpha_bar_0``); ``trailing`` is DDIM's. ``use_lu_lambdas`` spaces the grid uniformly in ``lambda``
(Lu et al. 2022's recommendation for few steps); as in diffusers the model is called at the rounded
timesteps while the step coefficients use the unrounded levels. ``set_timesteps(timesteps=...)`` or
``set_timesteps(sigmas=...)`` take a custom grid (training timesteps, or VP sigmas
``sqrt((1 - a) / a)``, descending; e.g. a fitted schedule, ``samplers/solvers/schedules.py``). These
choices reproduce diffusers' ``DPMSolverMultistepScheduler(algorithm_type="dpmsolver++",
solver_order=2)``; configs of its compatibles load as diffusers loads them (DEIS's
``algorithm_type="deis"`` and UniPC's ``solver_type="bh2"`` become DPM-Solver++ midpoint, DDPM's
``variance_type="fixed_small"`` is ignored, a learned variance is split off the model output).
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
from samplers.solvers.dpm_solver import dpm_solver_update, sde_dpm_solver_update
from samplers.solvers._vp import (  # _lam and _third_order_differences are shared with dpm_solver
    _lam, _third_order_differences,
    VPNoiseMixin,
    VP_COMPATIBLES,
    SampleResult,
    SolverOutput,
    TIMESTEP_SPACINGS,
    as_index,
    check_off,
    check_grid_options,
    check_one_grid_source,
    check_schedule_covers,
    check_prediction_type,
    check_thresholding,
    dynamic_threshold,
    custom_timesteps,
    make_schedule,
    to_eps_x0,
)


ALGORITHM_TYPES = ("dpmsolver++", "sde-dpmsolver++", "dpmsolver", "sde-dpmsolver")


def _vp_sigmas(alphas_cumprod: torch.Tensor) -> np.ndarray:
    """VP sigmas ``sqrt((1 - a) / a)`` ``[T]`` (increasing in t), computed as diffusers computes them."""
    ac = alphas_cumprod.float()
    return (((1 - ac) / ac) ** 0.5).numpy().astype(np.float64)


def sigma_to_t(sigma: np.ndarray, log_sigmas: np.ndarray) -> np.ndarray:
    """Fractional training timestep of each VP ``sigma``, interpolating ``log sigma`` linearly between
    training steps (clamped to ``[0, T - 1]``)."""
    return np.interp(np.log(np.maximum(sigma, 1e-10)), log_sigmas, np.arange(len(log_sigmas)))


SIGMA_GRIDS = ("karras", "exponential", "beta")


def sigma_grid(kind: str, sigma_min: float, sigma_max: float, n: int) -> np.ndarray:
    """``n`` descending VP sigmas from ``sigma_max`` to ``sigma_min`` spaced by a named rule:

    - ``karras``: uniform in ``sigma^(1/7)`` (Karras et al. 2022, "Elucidating the design space of
      diffusion-based generative models", eq. 5, rho = 7);
    - ``exponential``: uniform in ``log sigma``;
    - ``beta``: at the quantiles ``1 - i/(n-1)`` of a Beta(0.6, 0.6) distribution, which crowds the steps
      at both ends (Lee et al. 2024, "Beta sampling is all you need"); needs scipy.
    """
    ramp = np.linspace(0, 1, n)
    if kind == "karras":
        rho = 7.0
        lo, hi = sigma_min ** (1 / rho), sigma_max ** (1 / rho)
        return (hi + ramp * (lo - hi)) ** rho
    if kind == "exponential":
        return np.exp(np.linspace(math.log(sigma_max), math.log(sigma_min), n))
    if kind == "beta":
        try:
            from scipy.stats import beta as beta_dist
        except ImportError:  # pragma: no cover - scipy ships with the test environment
            raise ValueError("use_beta_sigmas needs scipy (pip install scipy)") from None
        return sigma_min + beta_dist.ppf(1 - ramp, 0.6, 0.6) * (sigma_max - sigma_min)
    raise ValueError(f"sigma grid must be one of {SIGMA_GRIDS}, got {kind!r}")


def dpm_timesteps(
    num_inference_steps: int,
    alphas_cumprod: torch.Tensor,
    timestep_spacing: str = "linspace",
    steps_offset: int = 0,
    lambda_min_clipped: float = -float("inf"),
    use_lu_lambdas: bool = False,
    beta_schedule: str = "linear",
    grid: Optional[str] = None,
    round_karras_always: bool = False,
    sigma_range: Optional[tuple] = None,
):
    """Descending timesteps ``[N]`` (int64) and the VP sigmas ``[N]`` the steps use; see the module docstring.

    ``grid`` (one of :data:`SIGMA_GRIDS`) spaces the sigmas by :func:`sigma_grid` over the whole training
    range instead; as in diffusers the model is called at the timesteps of those sigmas (rounded for
    ``karras`` except on the cosine schedule unless ``round_karras_always``, UniPC's rule; truncated
    otherwise) while the step coefficients keep the exact sigmas. ``sigma_range = (sigma_min, sigma_max)``
    replaces either end of that grid where not None (UniPC's ``sigma_min`` / ``sigma_max`` config keys)."""
    T = len(alphas_cumprod)
    N = int(num_inference_steps)
    if N < 1 or N > T:
        raise ValueError(f"num_inference_steps must be in [1, {T}], got {num_inference_steps}")
    sig = _vp_sigmas(alphas_cumprod)
    if grid is not None:
        lo, hi = sigma_range or (None, None)
        sigmas = sigma_grid(grid, float(sig[0] if lo is None else lo), float(sig[-1] if hi is None else hi), N)
        # log sigma in float32, as diffusers takes it: the largest grid sigma then maps to the timestep
        # diffusers calls the model at (T - 2 rather than T - 1 on the cosine schedule, where it truncates).
        t = sigma_to_t(sigmas, np.log(sig.astype(np.float32)))
        if grid == "karras" and (round_karras_always or beta_schedule != "squaredcos_cap_v2"):
            t = np.round(t)
        return t.astype(np.int64), sigmas
    if use_lu_lambdas:
        # Uniform in log sigma (= -lambda) over the whole training range; the model is called at the
        # rounded (cosine schedule: truncated) timesteps, the coefficients keep the exact sigmas.
        log_sig = np.log(sig)
        sigmas = np.exp(np.linspace(log_sig[-1], log_sig[0], N))
        t = sigma_to_t(sigmas, log_sig)
        ts = (t if beta_schedule == "squaredcos_cap_v2" else np.round(t)).astype(np.int64)
        return ts, sigmas
    ac = alphas_cumprod.double()
    lam = 0.5 * (torch.log(ac) - torch.log1p(-ac))
    # Timesteps whose lambda is below the clip are never used (the cosine schedule's last steps).
    last = T - int((lam < lambda_min_clipped).sum())
    if timestep_spacing == "linspace":
        ts = np.linspace(0, last - 1, N + 1).round()[::-1][:-1]
    elif timestep_spacing == "leading":
        ts = (np.arange(N + 1) * (last // (N + 1))).round()[::-1][:-1] + steps_offset
    elif timestep_spacing == "trailing":
        ts = np.round(np.arange(last, 0, -T / N)) - 1
    else:
        raise ValueError(f"timestep_spacing={timestep_spacing!r} is not supported; use one of {TIMESTEP_SPACINGS}")
    ts = np.ascontiguousarray(ts).astype(np.int64)
    return ts, sig[ts]


def dpmpp_3m_update(x, x0, history, a_s: float, a_t: float):
    """One third-order DPM-Solver++ step from ``a_s`` to ``a_t`` (``alpha_bar`` values, ``a_t < 1``).

    history: ``[(x0_1, a_1), (x0_2, a_2)]``, the data predictions and levels of the two previous steps,
    newest first. Formula in the module docstring.
    """
    alpha_t, sigma_t, sigma_s = math.sqrt(a_t), math.sqrt(1 - a_t), math.sqrt(1 - a_s)
    h = _lam(a_t) - _lam(a_s)
    d1, d2 = _third_order_differences(x0, history, a_s, h)
    phi1 = math.expm1(-h)  # exp(-h) - 1
    return ((sigma_t / sigma_s) * x - alpha_t * phi1 * x0 + alpha_t * (phi1 / h + 1.0) * d1
            - alpha_t * ((phi1 + h) / h**2 - 0.5) * d2)


def dpmpp_2m_update(x, x0, x0_prev, a_s: float, a_t: float, a_prev: Optional[float], solver_type: str = "midpoint"):
    """One DPM-Solver++ step from level ``a_s`` to ``a_t`` (``alpha_bar`` values).

    ``x0_prev``/``a_prev`` are the previous step's data prediction and level; ``None`` gives the first
    order (DDIM) update. ``solver_type="heun"`` integrates the linear term in ``lambda`` exactly
    (``x_t = ... + alpha_t ((e^-h - 1) / h + 1) D1``) instead of the midpoint's ``D1 / 2`` weight.
    """
    alpha_s, sigma_s = math.sqrt(a_s), math.sqrt(1 - a_s)
    alpha_t, sigma_t = math.sqrt(a_t), math.sqrt(1 - a_t)
    # exp(-h) = (sigma_t / alpha_t) / (sigma_s / alpha_s); written this way it stays finite at sigma_t = 0.
    emh = (sigma_t / alpha_t) / (sigma_s / alpha_s)
    D = x0
    if x0_prev is not None and sigma_t > 0:
        h = _lam(a_t) - _lam(a_s)
        h0 = _lam(a_s) - _lam(a_prev)
        if solver_type == "heun":
            d1 = (h / h0) * (x0 - x0_prev)
            return (sigma_t / sigma_s) * x + alpha_t * (1.0 - emh) * x0 + alpha_t * (math.expm1(-h) / h + 1.0) * d1
        D = x0 + 0.5 * (h / h0) * (x0 - x0_prev)
    return (sigma_t / sigma_s) * x + alpha_t * (1.0 - emh) * D


def dpmpp_sde_update(x, x0, history, a_s: float, a_t: float, noise, solver_type: str = "midpoint"):
    """One SDE-DPM-Solver++ step (Lu et al. 2022, "DPM-Solver++", section on the SDE solver) from level
    ``a_s`` to ``a_t``: the data-prediction multistep update of the reverse SDE, which adds fresh
    ``noise`` (``[B, ...]``, standard normal) of variance ``sigma_t^2 (1 - exp(-2h))`` each step.

    history: earlier ``[(x0_1, a_1), (x0_2, a_2)]``, newest first; its length sets the order
    (0: first order, 1: second order midpoint, 2: third order)::

        x_t = (sigma_t / sigma_s) e^-h x + alpha_t (1 - e^-2h) D0 + c1 D1 + c2 D2 + sigma_t sqrt(1 - e^-2h) z

    with ``c1 = alpha_t (1 - e^-2h) / 2`` at second order (``solver_type="heun"``:
    ``c1 = alpha_t ((1 - e^-2h) / (-2h) + 1)``) and, at third order,
    ``c1 = alpha_t ((1 - e^-2h) / (-2h) + 1)``, ``c2 = alpha_t ((1 - e^-2h - 2h) / (2h)^2 - 1/2)``;
    ``D1``, ``D2`` are the same divided differences of the data predictions as the ODE solver's.
    """
    alpha_t, sigma_t, sigma_s = math.sqrt(a_t), math.sqrt(1 - a_t), math.sqrt(1 - a_s)
    alpha_s = math.sqrt(a_s)
    emh = (sigma_t / alpha_t) / (sigma_s / alpha_s)  # exp(-h), finite at sigma_t = 0
    one_m_e2 = 1.0 - emh * emh
    out = (sigma_t / sigma_s * emh) * x + alpha_t * one_m_e2 * x0 + sigma_t * math.sqrt(one_m_e2) * noise
    if not history or sigma_t == 0:
        return out
    h = _lam(a_t) - _lam(a_s)
    (m1, a1) = history[0]
    r0 = (_lam(a_s) - _lam(a1)) / h
    if len(history) == 1:
        if solver_type == "heun":
            return out + alpha_t * (one_m_e2 / (-2.0 * h) + 1.0) * (x0 - m1) / r0
        return out + 0.5 * alpha_t * one_m_e2 * (x0 - m1) / r0
    d1, d2 = _third_order_differences(x0, history, a_s, h)
    return (out + alpha_t * (one_m_e2 / (-2.0 * h) + 1.0) * d1
            + alpha_t * ((one_m_e2 - 2.0 * h) / (2.0 * h) ** 2 - 0.5) * d2)


class DPMSolverPP2M(VPNoiseMixin, SchedulerMixin, ConfigMixin):
    """DPM-Solver++ 2M / 3M as a diffusers scheduler; config keys follow ``DPMSolverMultistepScheduler``.

    The multistep method at ``solver_order`` 1 (DDIM), 2 (``solver_type`` ``"midpoint"`` or ``"heun"``)
    or 3, in data-prediction form (DPM-Solver++, ``algorithm_type="dpmsolver++"``, or stochastic
    ``"sde-dpmsolver++"``, :func:`dpmpp_sde_update`) or noise-prediction form (DPM-Solver,
    ``"dpmsolver"``, or ``"sde-dpmsolver"`` at orders 1-2, :mod:`samplers.solvers.dpm_solver`); SDE
    ``step`` takes a ``generator`` or ``variance_noise`` as diffusers' does. Loading a config that asks for
    something not implemented (``use_flow_sigmas``) raises ``ValueError`` instead of silently changing
    the method. ``use_karras_sigmas`` / ``use_exponential_sigmas`` / ``use_beta_sigmas`` space the grid
    by :func:`sigma_grid`; ``thresholding`` applies :func:`~samplers.solvers._vp.dynamic_threshold` to each
    data prediction (diffusers' options of the same names). NFE = ``num_inference_steps``.
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
        fitted_schedule: Optional[str] = None,
    ):
        name = type(self).__name__
        check_prediction_type(prediction_type, ("epsilon", "v_prediction", "sample"), name)
        check_off(name, use_flow_sigmas=use_flow_sigmas)
        check_grid_options(use_karras_sigmas, use_exponential_sigmas, use_beta_sigmas, use_lu_lambdas)
        check_thresholding(thresholding, dynamic_thresholding_ratio, sample_max_value)
        # diffusers loads its compatibles' configs this way: DEIS's algorithm and UniPC's / DEIS's solver
        # types name the same multistep data-prediction method at order 2.
        if algorithm_type == "deis":
            algorithm_type = "dpmsolver++"
            self.register_to_config(algorithm_type=algorithm_type)
        if solver_type in ("logrho", "bh1", "bh2"):
            solver_type = "midpoint"
            self.register_to_config(solver_type=solver_type)
        if algorithm_type not in ALGORITHM_TYPES:
            raise ValueError(f"algorithm_type must be one of {ALGORITHM_TYPES}, got {algorithm_type!r}")
        if solver_order not in (1, 2, 3):
            raise ValueError(f"solver_order must be 1, 2 or 3, got {solver_order!r}")
        if solver_type not in ("midpoint", "heun"):
            raise ValueError(f"solver_type must be 'midpoint' or 'heun', got {solver_type!r}")
        if algorithm_type == "sde-dpmsolver" and solver_order == 3:
            # diffusers has no third-order update for it either (its step fails at the third step).
            raise ValueError("algorithm_type='sde-dpmsolver' has orders 1 and 2: use solver_order<=2, or "
                             "algorithm_type='sde-dpmsolver++' for order 3")
        if final_sigmas_type not in ("zero", "sigma_min"):
            raise ValueError(f"final_sigmas_type must be 'zero' or 'sigma_min', got {final_sigmas_type!r}")
        if algorithm_type in ("dpmsolver", "sde-dpmsolver") and final_sigmas_type == "zero":
            # The noise-prediction update is 0 * inf at zero noise; diffusers refuses the same config.
            raise ValueError(f"algorithm_type={algorithm_type!r} cannot end at zero noise: pass "
                             "final_sigmas_type='sigma_min' (or use algorithm_type='dpmsolver++')")
        if fitted_schedule is not None:
            load_schedule(fitted_schedule)  # fail now, naming the shipped schedules, not at set_timesteps
        self._init_state(num_train_timesteps, beta_start, beta_end, beta_schedule, trained_betas, rescale_betas_zero_snr)

    def _init_state(self, num_train_timesteps, beta_start, beta_end, beta_schedule, trained_betas,
                    rescale_betas_zero_snr) -> None:
        """Noise schedule and empty step state (shared with ``UniPCSolver``)."""
        self.betas, self.alphas_cumprod = make_schedule(
            num_train_timesteps, beta_start, beta_end, beta_schedule, trained_betas, rescale_betas_zero_snr
        )
        self.alphas = 1.0 - self.betas
        if rescale_betas_zero_snr:
            # lambda must stay finite at the last training step (same guard as the reference code).
            self.alphas_cumprod[-1] = 2.0**-24
        self.init_noise_sigma = 1.0
        self.num_inference_steps = None
        self.timesteps = torch.from_numpy(np.arange(num_train_timesteps)[::-1].copy())
        self.sigmas = None
        self._step_index = None
        self._begin_index = None
        self._reset()

    def _reset(self) -> None:
        self._history = []  # (x0 prediction, alpha_bar) of the previous steps, newest first

    def set_timesteps(self, num_inference_steps: Optional[int] = None, device=None, timesteps=None, sigmas=None):
        """Grid from ``num_inference_steps`` (diffusers' spacing) or a custom ``timesteps`` / VP ``sigmas``
        grid (descending, ``[N]``; the final level follows ``final_sigmas_type``). Resets the history."""
        check_one_grid_source(num_inference_steps, timesteps, "sigmas", sigmas)
        check_schedule_covers(self.alphas_cumprod, self.config.num_train_timesteps)
        cfg = self.config
        T = cfg.num_train_timesteps
        grid = self._sigma_grid()
        if (timesteps is not None or sigmas is not None) and (cfg.use_lu_lambdas or grid):
            flag = "use_lu_lambdas" if cfg.use_lu_lambdas else f"use_{grid}_sigmas"
            raise ValueError(f"custom timesteps/sigmas replace {flag}: load the config with {flag}=False")
        vp_sig = _vp_sigmas(self.alphas_cumprod)
        if timesteps is None and sigmas is None and not cfg.use_lu_lambdas and not grid:
            timesteps = fitted_or_default(cfg, self._schedule_key(), num_inference_steps)
        if timesteps is not None:
            ts = custom_timesteps(timesteps, T)
            sig = vp_sig[ts]
        elif sigmas is not None:
            sig = np.asarray(sigmas.tolist() if isinstance(sigmas, torch.Tensor) else sigmas, dtype=np.float64)
            if sig.ndim != 1 or sig.size < 1 or np.any(sig <= 0) or np.any(np.diff(sig) >= 0):
                raise ValueError(f"sigmas must be a non-empty, strictly descending list of positive VP sigmas, got {sig.tolist()}")
            ts = np.round(sigma_to_t(sig, np.log(vp_sig))).astype(np.int64)
        else:
            ts, sig = dpm_timesteps(
                num_inference_steps, self.alphas_cumprod, cfg.timestep_spacing, cfg.steps_offset,
                cfg.lambda_min_clipped, cfg.use_lu_lambdas, cfg.beta_schedule, grid, self._round_karras_always,
                self._sigma_range(),
            )
        final = 0.0 if cfg.final_sigmas_type == "zero" else float(vp_sig[0])
        if grid and cfg.final_sigmas_type != "zero" and self._final_sigma_from_grid:
            final = float(sig[-1])  # UniPC ends a sigma grid at the grid's own last sigma
        self.sigmas = torch.from_numpy(np.append(sig, final))
        self.num_inference_steps = len(ts)
        self.timesteps = torch.from_numpy(ts).to(device)
        self._step_index = None
        self._begin_index = None
        self._reset()

    # diffusers' DPM-Solver rounds Karras timesteps except on the cosine schedule and ends a sigma grid
    # at the training schedule's smallest sigma; its UniPC always rounds and ends at the grid's last sigma.
    _round_karras_always = False
    _final_sigma_from_grid = False

    def _sigma_range(self) -> Optional[tuple]:
        """``(sigma_min, sigma_max)`` overriding the ends of a sigma grid (None: the training range)."""
        return None

    def _sigma_grid(self) -> Optional[str]:
        """The configured sigma grid (``use_karras_sigmas`` ...), or None."""
        cfg = self.config
        for kind in SIGMA_GRIDS:
            if cfg.get(f"use_{kind}_sigmas", False):
                return kind
        return None

    def _schedule_key(self) -> str:
        """Key of this solver's grids in a fitted-schedule file (``dpmpp-2m``, ``dpm-1m-sde``, ...; the
        ``-heun`` suffix marks the Heun second-order rule)."""
        cfg = self.config
        fam = "dpmpp" if cfg.algorithm_type.endswith("++") else "dpm"
        sde = "-sde" if cfg.algorithm_type.startswith("sde-") else ""
        heun = "-heun" if cfg.solver_type == "heun" and cfg.solver_order > 1 else ""
        return f"{fam}-{cfg.solver_order}m{sde}{heun}"

    @property
    def step_index(self):
        return self._step_index

    @property
    def begin_index(self):
        return self._begin_index

    def set_begin_index(self, begin_index: int = 0):
        """img2img pipelines start at ``timesteps[begin_index]``."""
        self._begin_index = begin_index

    def scale_model_input(self, sample: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        return sample

    def _init_step_index(self, t: int) -> int:
        if self._begin_index is not None:
            return self._begin_index
        return self._index_for_timestep(t)

    def _index_for_timestep(self, t: int) -> int:
        """Grid position of timestep ``t``, by diffusers' rule (DPM-Solver and UniPC share it)."""
        hits = [i for i, u in enumerate(self.timesteps.tolist()) if u == t]
        if not hits:
            # diffusers' rule (DPM-Solver, UniPC): a first step at a timestep off the grid is the last step,
            # from the last grid level to the final one. Kept so a loop written for diffusers (its own test
            # suite steps at t = 0) runs the same here.
            return len(self.timesteps) - 1
        # A repeated timestep (rounded Lu lambdas) is entered at its second occurrence, as in diffusers.
        return hits[1] if len(hits) > 1 else hits[0]

    @staticmethod
    def _alpha_of_sigma(sigma: float) -> float:
        return 1.0 / (1.0 + sigma * sigma)

    def _enter_step(self, model_output, timestep, sample):
        """Shared checks at the start of ``step`` (also ``UniPCSolver``): ``(i, N, model_output)`` with the
        step index ``i`` of ``N`` and the model output without any learned-variance channels."""
        if self.num_inference_steps is None:
            raise ValueError("call set_timesteps(num_inference_steps) before step()")
        if self._step_index is None:
            self._step_index = self._init_step_index(as_index(timestep))
        i, N = self._step_index, len(self.timesteps)
        if i >= N:
            raise ValueError("step() called more times than there are timesteps; call set_timesteps() again")
        check_model_output(model_output, self, timestep, i)
        if self.config.variance_type in ("learned", "learned_range"):
            model_output = model_output[:, : sample.shape[1]]  # drop the predicted variance channels
        return i, N, model_output

    def _begin_step(self, model_output, timestep, sample):
        """Shared start of ``step``: ``(i, N, a_s, x, x0)`` with the step index ``i`` of ``N``, the
        current level ``a_s``, the sample and its data prediction in float64."""
        i, N, model_output = self._enter_step(model_output, timestep, sample)
        a_s = self._alpha_of_sigma(float(self.sigmas[i]))
        x = sample.double()
        self._eps, x0 = to_eps_x0(model_output.double(), x, a_s, self.config.prediction_type)
        cfg = self.config
        if cfg.thresholding:
            x0 = dynamic_threshold(x0, cfg.dynamic_thresholding_ratio, cfg.sample_max_value)
            self._eps = (x - math.sqrt(a_s) * x0) / math.sqrt(1.0 - a_s)  # the noise-prediction forms use it
        return i, N, a_s, x, x0

    def _end_step(self, prev, x0, sample, return_dict: bool):
        """Shared end of ``step``: advance the index, cast back to the sample's dtype."""
        self._step_index += 1
        prev, x0 = prev.to(sample.dtype), x0.to(sample.dtype)
        if not return_dict:
            return (prev,)
        return SolverOutput(prev_sample=prev, pred_original_sample=x0)

    def step(self, model_output, timestep, sample, generator=None, eta: float = 0.0, return_dict: bool = True,
             variance_noise: Optional[torch.Tensor] = None, **kw):
        """One step. With an SDE ``algorithm_type`` the noise is ``variance_noise`` or drawn from
        ``generator`` (float32, as diffusers draws it, so the same generator gives the same path). The
        data-prediction algorithms keep ``x0`` predictions in their history, the noise-prediction ones
        (``dpmsolver``, ``sde-dpmsolver``; :mod:`samplers.solvers.dpm_solver`) keep ``eps`` predictions."""
        if eta:
            raise ValueError("DPM-Solver++ takes no eta (use DDIMSolver for eta > 0, or algorithm_type="
                             "'sde-dpmsolver++' for the stochastic solver)")
        i, N, a_s, x, x0 = self._begin_step(model_output, timestep, sample)
        a_t = self._alpha_of_sigma(float(self.sigmas[i + 1]))
        cfg = self.config
        last_low = i == N - 1 and (cfg.euler_at_final or (cfg.lower_order_final and N < 15) or cfg.final_sigmas_type == "zero")
        second_last_low = i == N - 2 and cfg.lower_order_final and N < 15
        hist, algo, kind = self._history, cfg.algorithm_type, cfg.solver_type
        order = 1 if (cfg.solver_order == 1 or not hist or last_low) else (
            2 if (cfg.solver_order == 2 or len(hist) < 2 or second_last_low) else 3)
        m = x0 if algo.endswith("++") else self._eps  # what the history holds: x0 (data) or eps (noise)
        noise = self._noise(model_output, generator, variance_noise).double() if algo.startswith("sde-") else None
        if a_t == a_s:
            # A step to its own level (a sigma grid that ends at sigma_min, then sigma_min again): every
            # update leaves the sample where it is (h = 0; the higher-order weights would be 0/0 here).
            prev = x
        elif algo == "sde-dpmsolver++":
            prev = dpmpp_sde_update(x, x0, hist[:order - 1], a_s, a_t, noise, kind)
        elif algo == "sde-dpmsolver":
            prev = sde_dpm_solver_update(x, m, hist[:order - 1], a_s, a_t, noise, kind)
        elif algo == "dpmsolver":
            prev = dpm_solver_update(x, m, hist[:order - 1], a_s, a_t, kind)
        elif order == 1:
            prev = dpmpp_2m_update(x, x0, None, a_s, a_t, None)
        elif order == 2:
            prev = dpmpp_2m_update(x, x0, hist[0][0], a_s, a_t, hist[0][1], kind)
        else:
            prev = dpmpp_3m_update(x, x0, hist, a_s, a_t)
        self._history = ([(m, a_s)] + hist)[: cfg.solver_order - 1]
        return self._end_step(prev, x0, sample, return_dict)

    @staticmethod
    def _noise(model_output, generator, variance_noise):
        if variance_noise is not None:
            return variance_noise.to(device=model_output.device, dtype=torch.float32)
        from diffusers.utils.torch_utils import randn_tensor

        return randn_tensor(model_output.shape, generator=generator, device=model_output.device, dtype=torch.float32)


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
