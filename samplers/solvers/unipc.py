"""UniPC (Zhao et al. 2023, "UniPC: A Unified Predictor-Corrector Framework for Fast Sampling of
Diffusion Models"), data-prediction form, as a diffusers scheduler.

Notation as in ``dpmpp_2m``: ``alpha``, ``sigma`` of a level (below), ``lambda = log(alpha / sigma)``,
``h = lambda_t - lambda_s`` for a step from ``s`` to ``t``, data predictions ``m`` (x0) of earlier
steps. With ``hh = -h``, ``phi_1 = exp(hh) - 1`` and ``B(h) = exp(hh) - 1`` ("bh2") or ``hh`` ("bh1"):

- **Predictor (UniP, order p)** from the current prediction ``m0`` and earlier ``m_i`` at
  ``r_i = (lambda_i - lambda_s) / h``: divided differences ``D_i = (m_i - m0) / r_i`` and
  ``x_t = (sigma_t / sigma_s) x_s - alpha_t phi_1 m0 - alpha_t B(h) sum_i rho_i D_i``.
- **Corrector (UniC)**: once the model has been evaluated at ``x_t`` (the next step's call, so no
  extra evaluation), the same update is redone from ``x_s`` with the new prediction ``m_t`` as one
  more difference, ``rho_c`` over ``(D_1.., m_t - m0)``, and the result replaces ``x_t``. The
  corrected sample is what the next predictor starts from; the stored prediction ``m_t`` stays the
  one computed from the uncorrected ``x_t``.
- The weights ``rho`` solve ``R rho = b`` with ``R[k, i] = r_i ** k`` and
  ``b[k] = (k + 1)! phi_{k+2}(hh) / B(h)``, ``phi`` built by the recurrence
  ``phi_{k+1} = phi_k / hh - 1 / (k + 1)!`` from ``phi_2 = phi_1 / hh - 1``; order 2 uses
  ``rho = 1/2`` (predictor) and order 1 ``rho = 1/2`` (corrector), as the reference code does.

Order schedule as in diffusers: the first step is first order and the order grows by one per step up
to ``solver_order``; with ``lower_order_final`` the order is capped by the steps left. A step that
lands on zero noise returns the data prediction (the ``h -> inf`` limit of first order).

A level is a pair ``(alpha, sigma)`` with ``x = alpha x0 + sigma eps``: on a VP grid
``alpha = 1 / sqrt(1 + s^2)``, ``sigma = s alpha`` for the VP sigma ``s``; with ``use_flow_sigmas``
(rectified-flow models such as Wan: ``x = (1 - s) x0 + s eps``) ``alpha = 1 - s``, ``sigma = s``. The
update above only uses ratios of these and ``lambda = log(alpha / sigma)``, so the same code integrates
both.

The VP grid (``timestep_spacing``, ``final_sigmas_type``, custom ``timesteps=`` / ``sigmas=``, fitted
schedules keyed ``unipc``) is DPM-Solver++'s (``samplers.solvers.dpmpp_2m``), which is diffusers'
UniPC grid too. The flow grid is diffusers' UniPC flow grid (:func:`flow_grid`). Reproduces
``UniPCMultistepScheduler(predict_x0=True)`` step for step.
"""

from __future__ import annotations

import math
from typing import List, Optional, Sequence

import numpy as np
import torch
from diffusers.configuration_utils import register_to_config

from samplers.solvers._vp import (
    check_grid_options,
    check_one_grid_source,
    check_prediction_type,
    check_schedule_covers,
    check_thresholding,
    dynamic_threshold,
)
from samplers.solvers.dpmpp_2m import DPMSolverPP2M, _vp_sigmas, sigma_grid
from samplers.solvers.flow import shift_sigmas, stretch_to_terminal, time_shift
from samplers.solvers.schedules import load_schedule


def _lam(level) -> float:
    """log-SNR ``lambda = log(alpha / sigma)`` of a level ``(alpha, sigma)``."""
    alpha, sigma = level
    return math.log(alpha) - math.log(sigma)


def _weights(rks: List[float], h: float, order: int, bh: str) -> tuple:
    """``(R [order, order], b [order], phi_1, B(h))`` of a UniPC step (module docstring)."""
    hh = -h
    phi_1 = math.expm1(hh)
    phi_k = phi_1 / hh - 1.0
    b_h = math.expm1(hh) if bh == "bh2" else hh
    R, b, factorial = [], [], 1
    for k in range(1, order + 1):
        R.append([r ** (k - 1) for r in rks])
        b.append(phi_k * factorial / b_h)
        factorial *= k + 1
        phi_k = phi_k / hh - 1.0 / factorial
    return np.array(R, dtype=np.float64), np.array(b, dtype=np.float64), phi_1, b_h


def _differences(m0, history, lam_s: float, h: float):
    """``(r_i, D_i)`` for earlier predictions ``history = [(m_i, level_i), ...]`` (newest first)."""
    rks, ds = [], []
    for m, lv in history:
        r = (_lam(lv) - lam_s) / h
        rks.append(r)
        ds.append((m - m0) / r)
    return rks, ds


def unipc_update(x, m0, lv_s, lv_t, history, order: int, bh: str = "bh2", m_t=None):
    """One UniPC predictor step (``m_t=None``) or corrector step (``m_t``: the prediction at ``lv_t``)
    from level ``lv_s`` to ``lv_t`` (``(alpha, sigma)`` pairs); ``history`` holds the ``order - 1``
    earlier ``(x0, level)`` pairs, newest first. ``x``, ``m0``, ``m_t``: tensors of one shape."""
    alpha_t, sigma_t = lv_t
    if sigma_t == 0.0:
        return m0  # zero noise: the h -> inf limit
    sigma_s = lv_s[1]
    lam_s = _lam(lv_s)
    h = _lam(lv_t) - lam_s
    if h == 0.0:
        # A step to its own level (a sigma grid ending at sigma_min twice): every weight carries a factor
        # B(h) = 0 and the sample stays; the phi functions would be 0/0 here.
        return x
    rks, ds = _differences(m0, history[: order - 1], lam_s, h)
    R, b, phi_1, b_h = _weights(rks + [1.0], h, order, bh)
    x_t = (sigma_t / sigma_s) * x - alpha_t * phi_1 * m0
    if m_t is None:  # predictor: the last weight row is for the (not yet known) new prediction
        if not ds:
            return x_t
        rhos = [0.5] if order == 2 else np.linalg.solve(R[:-1, :-1], b[:-1]).tolist()
        return x_t - alpha_t * b_h * sum(r * d for r, d in zip(rhos, ds))
    rhos = [0.5] if order == 1 else np.linalg.solve(R, b).tolist()
    corr = sum(r * d for r, d in zip(rhos[:-1], ds)) if ds else 0.0
    return x_t - alpha_t * b_h * (corr + rhos[-1] * (m_t - m0))


def flow_grid(
    num_inference_steps: int,
    num_train_timesteps: int,
    sigmas: Optional[np.ndarray] = None,
    flow_shift: float = 1.0,
    mu: Optional[float] = None,
    time_shift_type: str = "exponential",
    shift_terminal: Optional[float] = None,
    karras_range: Optional[tuple] = None,
) -> np.ndarray:
    """Descending flow sigmas ``[N]`` (the final level is appended by the caller), as diffusers' UniPC
    builds them with ``use_flow_sigmas``:

    - default: ``sigmas`` (or ``N`` points from 1 to ``1 / T``, the last dropped) shifted by
      ``flow_shift`` (SD3's ``shift s / (1 + (shift - 1) s)``) or, with ``mu``, by the dynamic time shift,
      then stretched to ``shift_terminal``; a first sigma of 1 is moved to ``1 - 1e-6`` so ``alpha``
      stays positive (``lambda`` finite);
    - ``karras_range = (sigma_min, sigma_max)`` (VP sigmas): the Karras grid over that range mapped to
      flow sigmas by ``s / (1 + s)`` (no shift), which is diffusers' ``use_flow_sigmas`` +
      ``use_karras_sigmas``.
    """
    if karras_range is not None:
        s = sigma_grid("karras", karras_range[0], karras_range[1], num_inference_steps)
        return s / (s + 1)
    if sigmas is None:
        sigmas = np.linspace(1, 1 / num_train_timesteps, num_inference_steps + 1)[:-1]
    s = time_shift(mu, sigmas, time_shift_type) if mu is not None else shift_sigmas(sigmas, flow_shift)
    if shift_terminal:
        if not s[-1] < 1:
            raise ValueError("shift_terminal needs a last sigma below 1 to stretch (one step from sigma 1 has "
                             "none): use at least 2 steps or shift_terminal=None")
        s = stretch_to_terminal(s, shift_terminal)
    s = np.array(s, dtype=np.float64)
    if abs(s[0] - 1) < 1e-6:
        s[0] -= 1e-6
    return s


def _flow_sigmas_arg(sigmas) -> np.ndarray:
    s = np.asarray(sigmas.tolist() if isinstance(sigmas, torch.Tensor) else sigmas, dtype=np.float64)
    if s.ndim != 1 or s.size < 1 or np.any(s <= 0) or np.any(s > 1) or np.any(np.diff(s) >= 0):
        raise ValueError("with use_flow_sigmas, sigmas must be a non-empty, strictly descending list of flow "
                         f"sigmas in (0, 1], got {s.tolist()}")
    return s


class UniPCSolver(DPMSolverPP2M):
    """UniPC as a diffusers scheduler; config keys follow ``UniPCMultistepScheduler``.

    Data prediction (``predict_x0=True``), ``solver_type`` "bh1" or "bh2", any ``solver_order`` >= 1,
    ``disable_corrector`` (step indices whose correction is skipped), Karras / exponential / beta sigma
    grids (over ``sigma_min``..``sigma_max`` when set) and dynamic thresholding (shared with
    ``DPMSolverPP2M``), and flow-matching models: ``use_flow_sigmas`` with ``flow_shift``,
    ``use_dynamic_shifting`` (``set_timesteps(mu=...)``), ``shift_terminal``, the Karras flow grid and
    ``prediction_type="flow_prediction"`` (velocity ``eps - x0``). ``solver_p`` and noise prediction
    (``predict_x0=False``) raise ``ValueError``. NFE = ``num_inference_steps`` (the corrector reuses
    the next step's evaluation).
    """

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
        predict_x0: bool = True,
        solver_type: str = "bh2",
        lower_order_final: bool = True,
        disable_corrector: Optional[Sequence[int]] = None,
        solver_p=None,
        use_karras_sigmas: bool = False,
        use_exponential_sigmas: bool = False,
        use_beta_sigmas: bool = False,
        use_flow_sigmas: bool = False,
        flow_shift: float = 1.0,
        timestep_spacing: str = "linspace",
        steps_offset: int = 0,
        final_sigmas_type: str = "zero",
        rescale_betas_zero_snr: bool = False,
        use_dynamic_shifting: bool = False,
        time_shift_type: str = "exponential",
        sigma_min: Optional[float] = None,
        sigma_max: Optional[float] = None,
        shift_terminal: Optional[float] = None,
        use_lu_lambdas: bool = False,
        lambda_min_clipped: float = -float("inf"),
        euler_at_final: bool = False,
        variance_type: Optional[str] = None,
        fitted_schedule: Optional[str] = None,
    ):
        name = type(self).__name__
        check_prediction_type(prediction_type, ("epsilon", "v_prediction", "sample", "flow_prediction"), name)
        check_grid_options(use_karras_sigmas, use_exponential_sigmas, use_beta_sigmas, use_lu_lambdas)
        check_thresholding(thresholding, dynamic_thresholding_ratio, sample_max_value)
        if not predict_x0 or solver_p is not None:
            raise ValueError(f"{name} implements the data-prediction form without an external predictor: "
                             f"pass predict_x0=True and solver_p=None (got {predict_x0}, {solver_p!r})")
        if solver_type not in ("bh1", "bh2"):
            raise ValueError(f"solver_type must be 'bh1' or 'bh2', got {solver_type!r}")
        if solver_order < 1:
            raise ValueError(f"solver_order must be >= 1, got {solver_order}")
        if final_sigmas_type not in ("zero", "sigma_min"):
            raise ValueError(f"final_sigmas_type must be 'zero' or 'sigma_min', got {final_sigmas_type!r}")
        if time_shift_type not in ("exponential", "linear"):
            raise ValueError(f"time_shift_type must be 'exponential' or 'linear', got {time_shift_type!r}")
        if use_flow_sigmas:
            _check_flow_config(name, use_exponential_sigmas, use_beta_sigmas, use_lu_lambdas, fitted_schedule, flow_shift)
        else:
            # Flow-only options on a VP grid: diffusers refuses shift_terminal too; the others would be
            # silently meaningless there.
            flow_only = {"shift_terminal": shift_terminal is not None, "use_dynamic_shifting": use_dynamic_shifting,
                         "prediction_type='flow_prediction'": prediction_type == "flow_prediction"}
            on = [k for k, v in flow_only.items() if v]
            if on:
                raise ValueError(f"{name}: {', '.join(on)} need(s) use_flow_sigmas=True (a flow-matching model)")
        if fitted_schedule is not None:
            load_schedule(fitted_schedule)
        self._init_state(num_train_timesteps, beta_start, beta_end, beta_schedule, trained_betas, rescale_betas_zero_snr)

    _round_karras_always = True  # diffusers' UniPC rounds Karras timesteps on every schedule
    _final_sigma_from_grid = True  # ... and ends a sigma grid at the grid's last sigma

    def _schedule_key(self) -> str:
        return "unipc"

    def _sigma_range(self) -> Optional[tuple]:
        return (self.config.sigma_min, self.config.sigma_max)

    def _reset(self) -> None:
        self._history = []  # (x0, level) of earlier steps, newest first (at most solver_order)
        self._last = None  # (sample the last predictor started from, its level)
        self._order = 0  # order of the last predictor step

    # ------------------------------------------------------------------ grid
    def set_timesteps(self, num_inference_steps: Optional[int] = None, device=None, timesteps=None, sigmas=None,
                      mu: Optional[float] = None):
        """VP grid as ``DPMSolverPP2M.set_timesteps``; with ``use_flow_sigmas`` the flow grid of
        :func:`flow_grid` from ``num_inference_steps`` or custom flow ``sigmas`` (descending, in (0, 1],
        shifted like the default grid, as diffusers does). ``mu`` is the dynamic-shift parameter pipelines
        pass; it is required with ``use_dynamic_shifting`` and, as in diffusers, unused otherwise."""
        cfg = self.config
        if cfg.use_dynamic_shifting and mu is None:
            raise ValueError("this config uses dynamic shifting (use_dynamic_shifting=True): pass mu= to set_timesteps")
        if not cfg.use_flow_sigmas:
            return super().set_timesteps(num_inference_steps, device, timesteps=timesteps, sigmas=sigmas)
        check_one_grid_source(num_inference_steps, timesteps, "sigmas", sigmas)
        if timesteps is not None:
            raise ValueError("with use_flow_sigmas the grid is set by num_inference_steps or sigmas= (flow sigmas "
                             "in (0, 1]), not timesteps=")
        karras = None
        if cfg.use_karras_sigmas:
            if sigmas is not None:
                raise ValueError("custom sigmas replace use_karras_sigmas: load the config with use_karras_sigmas=False")
            check_schedule_covers(self.alphas_cumprod, cfg.num_train_timesteps)
            vp = _vp_sigmas(self.alphas_cumprod)
            karras = (float(vp[0]) if cfg.sigma_min is None else cfg.sigma_min,
                      float(vp[-1]) if cfg.sigma_max is None else cfg.sigma_max)
        if sigmas is not None:
            sigmas = _flow_sigmas_arg(sigmas)
            num_inference_steps = len(sigmas)
        elif int(num_inference_steps) < 1:
            raise ValueError(f"num_inference_steps must be >= 1, got {num_inference_steps}")
        T = cfg.num_train_timesteps
        s = flow_grid(int(num_inference_steps), T, sigmas, cfg.flow_shift, mu if cfg.use_dynamic_shifting else None,
                      cfg.time_shift_type, cfg.shift_terminal, karras)
        final = s[-1] if cfg.final_sigmas_type == "sigma_min" else 0.0
        # float32 levels and truncated integer timesteps, as diffusers stores them.
        self.sigmas = torch.from_numpy(np.append(s, final).astype(np.float32))
        self.timesteps = torch.from_numpy(s * T).to(device=device, dtype=torch.int64)
        self.num_inference_steps = len(s)
        self._step_index = None
        self._begin_index = None
        self._reset()

    def _level(self, i: int) -> tuple:
        """``(alpha, sigma)`` of grid level ``i`` (module docstring)."""
        s = float(self.sigmas[i])
        if self.config.use_flow_sigmas:
            return 1.0 - s, s
        alpha = 1.0 / math.sqrt(1.0 + s * s)
        return alpha, s * alpha

    def _data_prediction(self, model_output, x, i: int):
        """``x0`` from the model output at level ``i`` (diffusers' conversions), thresholded if asked."""
        cfg = self.config
        alpha, sigma = self._level(i)
        if cfg.prediction_type == "epsilon":
            x0 = (x - sigma * model_output) / alpha
        elif cfg.prediction_type == "v_prediction":
            x0 = alpha * x - sigma * model_output
        elif cfg.prediction_type == "flow_prediction":
            x0 = x - sigma * model_output  # velocity eps - x0 of x = (1 - s) x0 + s eps
        else:
            x0 = model_output
        if cfg.thresholding:
            x0 = dynamic_threshold(x0, cfg.dynamic_thresholding_ratio, cfg.sample_max_value)
        return x0

    # ------------------------------------------------------------------ step
    def step(self, model_output, timestep, sample, generator=None, return_dict: bool = True, **kw):
        i, N, model_output = self._enter_step(model_output, timestep, sample)
        cfg = self.config
        x = sample.double()
        lv_s = self._level(i)
        x0 = self._data_prediction(model_output.double(), x, i)
        if self._last is not None and (i - 1) not in set(cfg.disable_corrector or ()):
            last_x, lv_prev = self._last  # correct x (reached by the last predictor) with x0 seen at x
            x = unipc_update(last_x, self._history[0][0], lv_prev, lv_s, self._history[1:], self._order,
                             cfg.solver_type, m_t=x0)
        order = min(cfg.solver_order, N - i) if cfg.lower_order_final else cfg.solver_order
        order = min(order, len(self._history) + 1)  # warm-up: one more earlier prediction per step
        prev = unipc_update(x, x0, lv_s, self._level(i + 1), self._history, order, cfg.solver_type)
        self._history = [(x0, lv_s)] + self._history[: cfg.solver_order - 1]
        self._last, self._order = (x, lv_s), order
        return self._end_step(prev, x0, sample, return_dict)

    # ------------------------------------------------------------------ forward process
    def add_noise(self, original_samples, noise, timesteps):
        """VP: ``sqrt(a_t) x0 + sqrt(1 - a_t) eps``. Flow: ``(1 - s) x0 + s eps`` at the grid level of each
        timestep, found by diffusers' rule (``begin_index`` / the current step when set; else the
        timestep's grid position, an unknown one meaning the last)."""
        if not self.config.use_flow_sigmas:
            return super().add_noise(original_samples, noise, timesteps)
        if self.num_inference_steps is None:
            raise ValueError("with use_flow_sigmas the noise levels come from the grid: call set_timesteps() first")
        t = torch.as_tensor(timesteps).reshape(-1)
        if self._begin_index is None:
            idx = [self._index_for_timestep(int(u)) for u in t.tolist()]
        else:
            idx = [self._step_index if self._step_index is not None else self._begin_index] * len(t)
        s = self.sigmas.to(device=original_samples.device, dtype=original_samples.dtype)[idx]
        s = s.reshape((-1,) + (1,) * (original_samples.ndim - 1))
        return (1 - s) * original_samples + s * noise

    def get_velocity(self, sample, noise, timesteps):
        if self.config.use_flow_sigmas:
            raise ValueError("get_velocity is the VP v-target; a flow model's target is noise - sample "
                             "(prediction_type='flow_prediction')")
        return super().get_velocity(sample, noise, timesteps)


def _check_flow_config(name, use_exponential_sigmas, use_beta_sigmas, use_lu_lambdas, fitted_schedule, flow_shift):
    """Options that cannot shape a flow grid. diffusers accepts exponential / beta sigmas with flow
    sigmas but then steps on VP sigmas > 1 as flow sigmas (``alpha = 1 - s < 0``: non-finite samples)."""
    bad = {"use_exponential_sigmas": use_exponential_sigmas, "use_beta_sigmas": use_beta_sigmas,
           "use_lu_lambdas": use_lu_lambdas, "fitted_schedule": fitted_schedule is not None}
    on = [k for k, v in bad.items() if v]
    if on:
        raise ValueError(f"{name}: {', '.join(on)} cannot be combined with use_flow_sigmas=True (flow grids are "
                         "the default shifted grid, the Karras flow grid or custom sigmas=)")
    if not flow_shift > 0:
        raise ValueError(f"flow_shift must be > 0, got {flow_shift}")
