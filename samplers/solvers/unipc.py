"""UniPC (Zhao et al. 2023, "UniPC: A Unified Predictor-Corrector Framework for Fast Sampling of
Diffusion Models"), data-prediction form, as a diffusers scheduler.

Notation as in ``dpmpp_2m``: ``alpha``, ``sigma`` of a VP level, ``lambda = log(alpha / sigma)``,
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

The grid (``timestep_spacing``, ``final_sigmas_type``, custom ``timesteps=`` / ``sigmas=``, fitted
schedules keyed ``unipc``) is DPM-Solver++'s (``samplers.solvers.dpmpp_2m``), which is diffusers'
UniPC grid too. Reproduces ``UniPCMultistepScheduler(predict_x0=True)`` step for step.
"""

from __future__ import annotations

import math
from typing import List, Optional, Sequence

import numpy as np
from diffusers.configuration_utils import register_to_config

from samplers.solvers._vp import check_grid_options, check_off, check_prediction_type, check_thresholding
from samplers.solvers.dpmpp_2m import DPMSolverPP2M, _lam
from samplers.solvers.schedules import load_schedule


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
    """``(r_i, D_i)`` for earlier predictions ``history = [(m_i, a_i), ...]`` (newest first)."""
    rks, ds = [], []
    for m, a in history:
        r = (_lam(a) - lam_s) / h
        rks.append(r)
        ds.append((m - m0) / r)
    return rks, ds


def unipc_update(x, m0, a_s: float, a_t: float, history, order: int, bh: str = "bh2", m_t=None):
    """One UniPC predictor step (``m_t=None``) or corrector step (``m_t``: the prediction at ``a_t``)
    from level ``a_s`` to ``a_t``; ``history`` holds the ``order - 1`` earlier ``(x0, alpha_bar)``
    pairs, newest first. ``x``, ``m0``, ``m_t``: tensors of one shape."""
    alpha_t, sigma_t = math.sqrt(a_t), math.sqrt(1.0 - a_t)
    if sigma_t == 0.0:
        return m0  # zero noise: the h -> inf limit
    sigma_s = math.sqrt(1.0 - a_s)
    lam_s = _lam(a_s)
    h = _lam(a_t) - lam_s
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


class UniPCSolver(DPMSolverPP2M):
    """UniPC as a diffusers scheduler; config keys follow ``UniPCMultistepScheduler``.

    Data prediction (``predict_x0=True``), ``solver_type`` "bh1" or "bh2", any ``solver_order`` >= 1,
    ``disable_corrector`` (step indices whose correction is skipped), Karras / exponential / beta sigma
    grids and dynamic thresholding (shared with ``DPMSolverPP2M``). Anything else diffusers' UniPC offers
    (``solver_p``, noise prediction, flow sigmas) raises ``ValueError``. NFE = ``num_inference_steps``
    (the corrector reuses the next step's evaluation).
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
        use_lu_lambdas: bool = False,
        lambda_min_clipped: float = -float("inf"),
        euler_at_final: bool = False,
        variance_type: Optional[str] = None,
        fitted_schedule: Optional[str] = None,
    ):
        name = type(self).__name__
        check_prediction_type(prediction_type, ("epsilon", "v_prediction", "sample"), name)
        check_off(name, use_flow_sigmas=use_flow_sigmas)
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
        if fitted_schedule is not None:
            load_schedule(fitted_schedule)
        self._init_state(num_train_timesteps, beta_start, beta_end, beta_schedule, trained_betas, rescale_betas_zero_snr)

    _round_karras_always = True  # diffusers' UniPC rounds Karras timesteps on every schedule
    _final_sigma_from_grid = True  # ... and ends a sigma grid at the grid's last sigma

    def _schedule_key(self) -> str:
        return "unipc"

    def _reset(self) -> None:
        self._history = []  # (x0, alpha_bar) of earlier steps, newest first (at most solver_order)
        self._last = None  # (sample the last predictor started from, its alpha_bar)
        self._order = 0  # order of the last predictor step

    def step(self, model_output, timestep, sample, generator=None, return_dict: bool = True, **kw):
        i, N, a_s, x, x0 = self._begin_step(model_output, timestep, sample)
        cfg = self.config
        if self._last is not None and (i - 1) not in set(cfg.disable_corrector or ()):
            last_x, a_prev = self._last  # correct x (reached by the last predictor) with x0 seen at x
            x = unipc_update(last_x, self._history[0][0], a_prev, a_s, self._history[1:], self._order,
                             cfg.solver_type, m_t=x0)
        order = min(cfg.solver_order, N - i) if cfg.lower_order_final else cfg.solver_order
        order = min(order, len(self._history) + 1)  # warm-up: one more earlier prediction per step
        a_t = self._alpha_of_sigma(float(self.sigmas[i + 1]))
        prev = unipc_update(x, x0, a_s, a_t, self._history, order, cfg.solver_type)
        self._history = [(x0, a_s)] + self._history[: cfg.solver_order - 1]
        self._last, self._order = (x, a_s), order
        return self._end_step(prev, x0, sample, return_dict)
