"""PNDM: pseudo numerical methods for diffusion models (Liu, Ren, Lin & Zhao, ICLR 2022).

Sampling is treated as an ODE on the data manifold. The *transfer* step (paper eq. 9) moves ``x`` from
level ``a = alpha_bar_t`` to ``a'`` along a given noise estimate ``e``::

    x' = sqrt(a'/a) x - (a' - a) e / (a sqrt(1 - a') + sqrt(a (1 - a) a'))

(with ``e`` the exact noise this is exactly DDIM's eta=0 step). The pseudo numerical methods only change
which ``e`` is fed to it:

- PLMS (pseudo linear multistep): ``e' = (55 e1 - 59 e2 + 37 e3 - 9 e4) / 24`` (Adams-Bashforth 4) over
  the noise estimates at the last four grid points; AB2 ``(3 e1 - e2)/2`` and AB3
  ``(23 e1 - 16 e2 + 5 e3)/12`` while fewer are known.
- Warm start, ``skip_prk_steps=False`` (the paper's, default): the first three steps use pseudo
  Runge-Kutta: 4 model calls per step at ``t``, the midpoint (twice) and ``t'``, combined with
  weights 1/6, 1/3, 1/3, 1/6. NFE = ``4 * min(N, 3) + max(N - 3, 0)`` = ``N + 9`` for ``N >= 3`` steps.
- Warm start, ``skip_prk_steps=True`` (diffusers' shortcut, PLMS): the first step is taken twice, a
  transfer with ``e0`` then with the average of ``e0`` and the noise estimate at the predicted point
  (a Heun step); the second grid point is therefore evaluated twice. NFE = ``N + 1`` (``N >= 2``).

An NFE budget instead of a step count: ``PNDMSolver.steps_for_nfe(nfe, skip_prk_steps)`` gives the
largest ``N`` that fits, and ``set_timesteps(nfe=...)`` uses it.

Grid: the timesteps of ``timestep_spacing`` (see ``samplers/_vp.py``); each step goes to the next grid
point (the last to ``final_alpha_cumprod``) and the PRK midpoint of a step ``t -> t'`` is
``t - (t - t') // 2``. This equals diffusers' ``PNDMScheduler`` whenever ``T // N`` is even with
``leading`` spacing (and for ``trailing`` spacing when ``N`` divides ``T``).
"""

from __future__ import annotations

import math
from typing import Callable, List, Optional, Sequence

import numpy as np
import torch
from diffusers.configuration_utils import ConfigMixin, register_to_config
from diffusers.schedulers.scheduling_utils import SchedulerMixin

from samplers.solvers._vp import (
    VPNoiseMixin,
    VP_COMPATIBLES,
    SampleResult,
    SolverOutput,
    check_prediction_type,
    make_alphas_cumprod,
    to_eps_x0,
    vp_timesteps,
)


def transfer(x, e, a: float, a_prev: float):
    """PNDM transfer step (eq. 9) from ``alpha_bar = a`` to ``a_prev``; ``x`` and ``e`` are ``[B, ...]``."""
    denom = a * math.sqrt(1 - a_prev) + math.sqrt(a * (1 - a) * a_prev)
    return math.sqrt(a_prev / a) * x - (a_prev - a) / denom * e


def plms_combine(history: List[torch.Tensor]):
    """Adams-Bashforth combination of the newest (last) noise estimates: AB1..AB4 by history length."""
    e = history
    if len(e) == 1:
        return e[-1]
    if len(e) == 2:
        return (3 * e[-1] - e[-2]) / 2
    if len(e) == 3:
        return (23 * e[-1] - 16 * e[-2] + 5 * e[-3]) / 12
    return (55 * e[-1] - 59 * e[-2] + 37 * e[-3] - 9 * e[-4]) / 24


def pndm_nfe(num_inference_steps: int, skip_prk_steps: bool = False) -> int:
    """Model calls made by ``N`` PNDM steps (PRK warm start) or PLMS steps (``skip_prk_steps``)."""
    N = int(num_inference_steps)
    if N < 1:
        raise ValueError(f"num_inference_steps must be >= 1, got {N}")
    if skip_prk_steps:
        return N + 1 if N >= 2 else 1
    return 4 * min(N, 3) + max(N - 3, 0)


def pndm_steps_for_nfe(nfe: int, skip_prk_steps: bool = False) -> int:
    """Largest step count whose NFE fits in ``nfe`` (the inverse of :func:`pndm_nfe`)."""
    nfe = int(nfe)
    lowest = 1 if skip_prk_steps else 4
    if nfe < lowest:
        raise ValueError(
            f"an NFE budget of {nfe} is below the cheapest {'PLMS' if skip_prk_steps else 'PNDM (PRK)'} run "
            f"({lowest}); raise the budget{'' if skip_prk_steps else ' or use skip_prk_steps=True'}"
        )
    if skip_prk_steps:
        return 1 if nfe < 3 else nfe - 1
    if nfe >= 12:
        return nfe - 9
    return nfe // 4


def _plan(ts: Sequence[int], skip_prk_steps: bool):
    """One entry per model call: ``(t_eval, kind, i)`` where ``i`` is the grid step being taken.

    kinds: ``prk0..prk3`` (Runge-Kutta stages), ``heun0``/``heun1`` (diffusers' warm start), ``plms``.
    Also returns the midpoint timestep of each step.
    """
    N = len(ts)
    nxt = [int(ts[i + 1]) if i + 1 < N else -1 for i in range(N)]
    # The final step targets final_alpha_cumprod; its midpoint is taken towards timestep 0.
    mid = [int(ts[i]) - (int(ts[i]) - max(nxt[i], 0)) // 2 for i in range(N)]
    plan = []
    if skip_prk_steps:
        if N == 1:
            return [(int(ts[0]), "plms", 0)], nxt, mid
        plan += [(int(ts[0]), "heun0", 0), (int(ts[1]), "heun1", 0)]
        plan += [(int(ts[i]), "plms", i) for i in range(1, N)]
    else:
        n_prk = min(N, 3)
        for i in range(n_prk):
            t_next = nxt[i] if nxt[i] >= 0 else 0
            plan += [(int(ts[i]), "prk0", i), (mid[i], "prk1", i), (mid[i], "prk2", i), (t_next, "prk3", i)]
        plan += [(int(ts[i]), "plms", i) for i in range(n_prk, N)]
    return plan, nxt, mid


class PNDMSolver(VPNoiseMixin, SchedulerMixin, ConfigMixin):
    """PNDM / PLMS as a diffusers scheduler; config keys are those of diffusers' ``PNDMScheduler``.

    ``timesteps`` lists one entry per model call (so it is longer than ``num_inference_steps``: ``N + 9``
    with the PRK warm start, ``N + 1`` with ``skip_prk_steps=True``); a pipeline's loop over
    ``scheduler.timesteps`` makes exactly those calls. ``step`` must be called once per entry, in order.
    Prediction types: ``epsilon``, ``v_prediction``, ``sample`` (all converted to a noise estimate).
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
        skip_prk_steps: bool = False,
        set_alpha_to_one: bool = False,
        prediction_type: str = "epsilon",
        timestep_spacing: str = "leading",
        steps_offset: int = 0,
        rescale_betas_zero_snr: bool = False,
    ):
        check_prediction_type(prediction_type, ("epsilon", "v_prediction", "sample"), type(self).__name__)
        self.alphas_cumprod = make_alphas_cumprod(
            num_train_timesteps, beta_start, beta_end, beta_schedule, trained_betas, rescale_betas_zero_snr
        )
        self.final_alpha_cumprod = 1.0 if set_alpha_to_one else float(self.alphas_cumprod[0])
        self.init_noise_sigma = 1.0
        self.num_inference_steps = None
        self.timesteps = torch.from_numpy(np.arange(num_train_timesteps)[::-1].copy())
        self._reset()

    # ------------------------------------------------------------------ NFE accounting
    def nfe_for_steps(self, num_inference_steps: int) -> int:
        return pndm_nfe(num_inference_steps, self.config.skip_prk_steps)

    def steps_for_nfe(self, nfe: int) -> int:
        return pndm_steps_for_nfe(nfe, self.config.skip_prk_steps)

    @property
    def nfe(self) -> int:
        """Model calls one full pass over ``timesteps`` makes."""
        return len(self._plan)

    def _reset(self):
        self._plan, self._next, self._mid, self._grid = [], [], [], []
        self._call = 0
        self._history: List[torch.Tensor] = []  # noise estimate at the start of each past step
        self._x_start = None  # sample at the start of the current multi-call step
        self._e_acc = None  # weighted sum of Runge-Kutta / Heun stages

    def set_timesteps(self, num_inference_steps: Optional[int] = None, device=None, nfe: Optional[int] = None):
        """Plan the model calls for ``num_inference_steps`` steps, or for the most steps that fit in an
        NFE budget ``nfe``; resets the multistep history."""
        if (num_inference_steps is None) == (nfe is None):
            raise ValueError("pass exactly one of num_inference_steps or nfe to set_timesteps")
        if nfe is not None:
            num_inference_steps = self.steps_for_nfe(nfe)
        ts = vp_timesteps(
            num_inference_steps, self.config.num_train_timesteps, self.config.timestep_spacing, self.config.steps_offset
        )
        self._set_grid(ts, device)

    def scale_model_input(self, sample: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        return sample

    def _alpha(self, t: int) -> float:
        return float(self.alphas_cumprod[t]) if t >= 0 else self.final_alpha_cumprod

    def step(
        self,
        model_output: torch.Tensor,
        timestep,
        sample: torch.Tensor,
        generator=None,
        eta: float = 0.0,
        return_dict: bool = True,
        **kwargs,
    ):
        """Consume the model output for the current planned call and return the next sample.

        ``timestep`` must be the current entry of ``timesteps`` (checked); ``generator`` is accepted for
        pipeline compatibility and unused (PNDM is deterministic); ``eta`` must be 0.
        """
        if self.num_inference_steps is None:
            raise ValueError("call set_timesteps(num_inference_steps) before step()")
        if eta:
            raise ValueError("PNDM is a deterministic ODE solver; use eta=0 (or DDIMSolver for eta > 0)")
        if self._call >= len(self._plan):
            raise ValueError("step() called more times than there are timesteps; call set_timesteps() again")
        t_eval, kind, i = self._plan[self._call]
        if isinstance(timestep, torch.Tensor):
            timestep = timestep.item()
        if int(round(float(timestep))) != t_eval:
            raise ValueError(
                f"step() expected timestep {t_eval} (call {self._call} of {len(self._plan)}) but got {timestep}; "
                "step through scheduler.timesteps in order, once each"
            )
        x = sample.double()
        e, _ = to_eps_x0(model_output.double(), x, self._alpha(t_eval), self.config.prediction_type)
        t, t_next, t_mid = self._plan_t(i)
        a, a_next, a_mid = self._alpha(t), self._alpha(t_next), self._alpha(t_mid)
        x0 = None
        if kind == "plms":
            self._history = (self._history + [e])[-4:]
            e_comb = plms_combine(self._history)
            prev = transfer(x, e_comb, a, a_next)
            x0 = (x - math.sqrt(1 - a) * e_comb) / math.sqrt(a)
        elif kind == "heun0":
            self._history = [e]
            self._x_start = x
            prev = transfer(x, e, a, a_next)
        elif kind == "heun1":
            e_comb = (e + self._history[-1]) / 2
            prev = transfer(self._x_start, e_comb, a, a_next)
            x0 = (self._x_start - math.sqrt(1 - a) * e_comb) / math.sqrt(a)
            self._x_start = None
        elif kind == "prk0":
            self._history = (self._history + [e])[-4:]
            self._x_start, self._e_acc = x, e / 6
            prev = transfer(x, e, a, a_mid)
        elif kind == "prk1":
            self._e_acc = self._e_acc + e / 3
            prev = transfer(self._x_start, e, a, a_mid)
        elif kind == "prk2":
            self._e_acc = self._e_acc + e / 3
            prev = transfer(self._x_start, e, a, a_next)
        else:  # prk3
            e_comb = self._e_acc + e / 6
            prev = transfer(self._x_start, e_comb, a, a_next)
            x0 = (self._x_start - math.sqrt(1 - a) * e_comb) / math.sqrt(a)
            self._x_start, self._e_acc = None, None
        self._call += 1
        prev = prev.to(sample.dtype)
        x0 = None if x0 is None else x0.to(sample.dtype)
        if not return_dict:
            return (prev,)
        return SolverOutput(prev_sample=prev, pred_original_sample=x0)

    def _plan_t(self, i: int):
        return self._grid[i], self._next[i], self._mid[i]

    def _set_grid(self, ts: Sequence[int], device=None):
        self._reset()
        self.num_inference_steps = len(ts)
        self._grid = [int(t) for t in ts]
        self._plan, self._next, self._mid = _plan(self._grid, self.config.skip_prk_steps)
        self.timesteps = torch.tensor([p[0] for p in self._plan], dtype=torch.int64, device=device)


def sample_pndm(
    eps_fn: Callable[[torch.Tensor, int], torch.Tensor],
    x_T: torch.Tensor,
    alphas_cumprod: torch.Tensor,
    timesteps: Sequence[int],
    *,
    skip_prk_steps: bool = False,
    final_alpha_cumprod: float = 1.0,
) -> SampleResult:
    """PNDM (PRK warm start) or PLMS (``skip_prk_steps=True``) over a descending integer grid.

    Args:
        eps_fn: ``eps_fn(x [B, ...], t: int) -> eps [B, ...]`` (``t`` may be a PRK midpoint).
        x_T: ``[B, ...]`` initial noise.
        alphas_cumprod: ``[T]`` training ``alpha_bar``.
        timesteps: ``N`` descending grid points; the last step goes to ``final_alpha_cumprod``.
    Returns:
        :class:`SampleResult`; NFE as in :func:`pndm_nfe`.
    """
    ts = [int(t) for t in timesteps]
    if len(ts) < 1:
        raise ValueError("sample_pndm needs at least one timestep")
    sched = PNDMSolver(num_train_timesteps=len(alphas_cumprod), skip_prk_steps=skip_prk_steps)
    sched.alphas_cumprod = torch.as_tensor(alphas_cumprod).detach().cpu()
    sched.final_alpha_cumprod = float(final_alpha_cumprod)
    sched._set_grid(ts)
    x = x_T
    for t, _, _ in sched._plan:
        x = sched.step(eps_fn(x, t), t, x).prev_sample
    return SampleResult(sample=x, nfe=len(sched._plan))
