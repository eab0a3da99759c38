"""DPM-Solver in noise-prediction form (Lu, Zhou, Bao, Chen, Li & Zhu, NeurIPS 2022, "DPM-Solver: A fast
ODE solver for diffusion probabilistic model sampling in around 10 steps"), multistep orders 1-3, and
its stochastic counterpart (the noise-prediction SDE solver of "DPM-Solver++", Lu et al. 2022, sec. 5).

The probability-flow ODE written in log-SNR ``lambda = log(alpha / sigma)`` has the exact solution

    x_t = (alpha_t / alpha_s) x_s - alpha_t * integral_{lambda_s}^{lambda_t} e^-lambda eps(lambda) d lambda

DPM-Solver expands the noise prediction ``eps`` in ``lambda`` around the step's start and integrates the
exponential weights exactly. With ``h = lambda_t - lambda_s`` and ``phi = e^h - 1``::

    order 1 (DDIM):          x_t = (alpha_t / alpha_s) x_s - sigma_t phi D0
    order 2, "midpoint":      ... - sigma_t phi D1 / 2
    order 2, "heun":          ... - sigma_t (phi / h - 1) D1
    order 3:                  ... - sigma_t (phi / h - 1) D1 - sigma_t ((phi - h) / h^2 - 1/2) D2

where ``D0 = eps_s`` and ``D1``, ``D2`` are the multistep divided differences of the earlier noise
predictions in ``lambda`` (the same ones the data-prediction solver uses, see
``samplers.solvers.dpmpp_2m._third_order_differences``). The reverse SDE in the same variables doubles
the drift term and adds ``sigma_t sqrt(e^{2h} - 1) z``::

    order 1:                 x_t = (alpha_t / alpha_s) x_s - 2 sigma_t phi D0 + sigma_t sqrt(e^{2h} - 1) z
    order 2, "midpoint":      ... - sigma_t phi D1
    order 2, "heun":          ... - 2 sigma_t (phi / h - 1) D1

There is no third-order SDE update here (diffusers' ``DPMSolverMultistepScheduler`` has none either).
Both are selected with ``DPMSolverPP2M(algorithm_type="dpmsolver" | "sde-dpmsolver")``. Noise-prediction
solvers cannot end at zero noise (``sigma_t phi`` is ``0 * inf`` there); ``final_sigmas_type="sigma_min"``
is required, as in diffusers.
"""

from __future__ import annotations

import math
from typing import List, Tuple

import torch

from samplers.solvers._vp import _lam, _third_order_differences


def _levels(a_s: float, a_t: float):
    """``(alpha_s, alpha_t, sigma_t, h)`` of a step from ``alpha_bar = a_s`` to ``a_t`` (both in (0, 1))."""
    return math.sqrt(a_s), math.sqrt(a_t), math.sqrt(1.0 - a_t), _lam(a_t) - _lam(a_s)


def dpm_solver_update(x: torch.Tensor, eps: torch.Tensor, history: List[Tuple[torch.Tensor, float]], a_s: float,
                      a_t: float, solver_type: str = "midpoint") -> torch.Tensor:
    """One multistep DPM-Solver (noise prediction) step from ``a_s`` to ``a_t`` (``alpha_bar``, ``a_t < 1``).

    Args:
        x: ``[B, ...]`` sample at ``a_s``; ``eps``: ``[B, ...]`` its noise prediction.
        history: earlier ``[(eps_1, a_1), (eps_2, a_2)]``, newest first; its length (0, 1, 2) is the order
            minus one.
        solver_type: ``"midpoint"`` or ``"heun"`` (the second-order rule; order 3 has one form).
    Returns:
        ``[B, ...]`` the sample at ``a_t``.
    """
    alpha_s, alpha_t, sigma_t, h = _levels(a_s, a_t)
    phi = math.expm1(h)
    out = (alpha_t / alpha_s) * x - sigma_t * phi * eps
    if not history:
        return out
    if len(history) == 1:
        m1, a1 = history[0]
        d1 = (eps - m1) * h / (_lam(a_s) - _lam(a1))
        if solver_type == "midpoint":
            return out - 0.5 * sigma_t * phi * d1
        return out - sigma_t * (phi / h - 1.0) * d1
    d1, d2 = _third_order_differences(eps, history, a_s, h)
    return out - sigma_t * (phi / h - 1.0) * d1 - sigma_t * ((phi - h) / h**2 - 0.5) * d2


def sde_dpm_solver_update(x: torch.Tensor, eps: torch.Tensor, history: List[Tuple[torch.Tensor, float]],
                          a_s: float, a_t: float, noise: torch.Tensor, solver_type: str = "midpoint") -> torch.Tensor:
    """One multistep SDE-DPM-Solver (noise prediction) step, orders 1-2 (``len(history)`` 0 or 1).

    Args:
        noise: ``[B, ...]`` standard normal, the step's fresh noise. Others as :func:`dpm_solver_update`.
    """
    if len(history) > 1:
        raise ValueError("the noise-prediction SDE solver has orders 1 and 2; use solver_order <= 2 with "
                         "algorithm_type='sde-dpmsolver' (or 'sde-dpmsolver++' for order 3)")
    alpha_s, alpha_t, sigma_t, h = _levels(a_s, a_t)
    phi = math.expm1(h)
    out = (alpha_t / alpha_s) * x - 2.0 * sigma_t * phi * eps + sigma_t * math.sqrt(math.expm1(2.0 * h)) * noise
    if not history:
        return out
    m1, a1 = history[0]
    d1 = (eps - m1) * h / (_lam(a_s) - _lam(a1))
    if solver_type == "midpoint":
        return out - sigma_t * phi * d1
    return out - 2.0 * sigma_t * (phi / h - 1.0) * d1
