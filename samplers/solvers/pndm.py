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

Grid: ``set_timesteps(N)`` reproduces diffusers' ``PNDMScheduler`` call for call, including its step
targets ``t - T // N`` and PRK midpoints (see :func:`_diffusers_plan`); ``set_timesteps(timesteps=[...])``
takes a custom descending grid (a fitted schedule, ``samplers/solvers/schedules.py``) on which each step
goes to the next grid point, the last to ``final_alpha_cumprod``, and the PRK midpoint of ``t -> t'`` is
``t - (t - t') // 2`` (see :func:`_grid_plan`).
"""

from __future__ import annotations

import math
from typing import Callable, List, NamedTuple, Optional, Sequence

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
    check_one_grid_source,
    check_schedule_covers,
    check_prediction_type,
    custom_timesteps,
    make_schedule,
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


IMG2IMG_RESUME = ("diffusers", "grid")


class Call(NamedTuple):
    """One planned model call: evaluate at ``t_eval``, then move ``x_from_start`` or ``x`` from level
    ``t_from`` to ``t_to`` (``-1`` = ``final_alpha_cumprod``). ``kind`` is one of ``prk0..prk3`` (Runge-Kutta
    stages), ``heun0``/``heun1`` (diffusers' warm start), ``plms`` (Adams-Bashforth) or ``same`` (the next
    call re-evaluates the same point, so this one leaves the sample where it is)."""

    t_eval: int
    kind: str
    t_from: int
    t_to: int


def _grid_plan(ts: Sequence[int], skip_prk_steps: bool) -> List[Call]:
    """Plan on a self-consistent grid: each step goes to the next grid point (the last to ``-1``), a PRK
    midpoint is ``t - (t - t') // 2``. Used for custom ``timesteps`` and short grids (N < 4 with PRK)."""
    N = len(ts)
    nxt = [int(ts[i + 1]) if i + 1 < N else -1 for i in range(N)]
    plan: List[Call] = []
    if skip_prk_steps:
        if N == 1:
            return [Call(int(ts[0]), "plms", int(ts[0]), -1)]
        plan += [Call(int(ts[0]), "heun0", int(ts[0]), nxt[0]), Call(int(ts[1]), "heun1", int(ts[0]), nxt[0])]
        return plan + [Call(int(ts[i]), "plms", int(ts[i]), nxt[i]) for i in range(1, N)]
    n_prk = min(N, 3)
    for i in range(n_prk):
        t = int(ts[i])
        t_next = max(nxt[i], 0)  # the final step's stages are evaluated towards timestep 0
        mid = t - (t - t_next) // 2
        plan += [Call(t, "prk0", t, mid), Call(mid, "prk1", t, mid), Call(mid, "prk2", t, nxt[i]), Call(t_next, "prk3", t, nxt[i])]
    return plan + [Call(int(ts[i]), "plms", int(ts[i]), nxt[i]) for i in range(n_prk, N)]


def _diffusers_plan(ts: Sequence[int], skip_prk_steps: bool, T: int) -> List[Call]:
    """The calls diffusers' ``PNDMScheduler`` makes for the descending grid ``ts`` of ``set_timesteps(N)``.

    diffusers steps to ``t - T // N`` (PLMS) and to ``t -/+ T // N // 2`` (PRK stages) whatever the
    spacing, and evaluates the PRK midpoint as ``t' + T // N // 2``. On a ``leading`` grid with an even
    ``T // N`` this is exactly :func:`_grid_plan`; elsewhere we reproduce it so that the same config
    gives the same images (drop-in)."""
    N = len(ts)
    r = T // N
    h = r // 2
    if skip_prk_steps:
        if N == 1:
            return [Call(int(ts[0]), "plms", int(ts[0]), int(ts[0]) - r)]
        g0, g1 = int(ts[0]), int(ts[1])
        plan = [Call(g0, "heun0", g0, g0 - r), Call(g1, "heun1", g1 + r, g1)]
        return plan + [Call(int(t), "plms", int(t), int(t) - r) for t in ts[1:]]
    plan = []
    for i in range(3):
        s, n = int(ts[i]), int(ts[i + 1])
        plan += [Call(s, "prk0", s, s - h), Call(n + h, "prk1", s, n + h), Call(n + h, "prk2", s, n), Call(n, "prk3", s, n)]
    return plan + [Call(int(t), "plms", int(t), int(t) - r) for t in ts[3:]]


def _diffusers_resumed_plan(calls: Sequence[int], grid: Sequence[int], skip_prk_steps: bool, T: int) -> List[Call]:
    """The calls diffusers' ``PNDMScheduler`` makes when a pipeline enters part-way (img2img: the pipeline
    loops over ``timesteps[begin_index:]``; diffusers' PNDM has no ``set_begin_index``).

    Its call counter starts again at 0 at the first remaining call, and each call is taken by the rule
    for that counter value, with the timestep the pipeline passes:

    - counter < 12 with the PRK warm start: Runge-Kutta stage ``counter % 4``, from the level of the
      *full* grid's ``counter // 4``-th point (``prk_timesteps[counter // 4 * 4]``) to ``t - T//N//2``
      (stages 0, 2) or ``t`` (stages 1, 3);
    - otherwise, diffusers' ``step_plms``: counter 0 a transfer ``t -> t - T//N`` (Heun start), counter 1
      the Heun average re-taken from ``t + T//N`` to ``t``, later calls Adams-Bashforth ``t -> t - T//N``.

    So the sample's level and the level the step assumes differ after the entry (the warm start restarts
    from the top of the grid); reproducing it keeps the drop-in promise, same config same images
    (``img2img_resume="grid"`` is the on-the-ODE alternative, :func:`_resumed_plan`).

    Args:
        calls: timesteps of the remaining calls, in order.
        grid: the full descending grid of ``set_timesteps(N)`` (``N = len(grid)``).
    """
    r = T // len(grid)
    h = r // 2
    plan: List[Call] = []
    for counter, t in enumerate(int(u) for u in calls):
        if not skip_prk_steps and counter < 12:
            stage = counter % 4
            plan.append(Call(t, f"prk{stage}", int(grid[counter // 4]), t if stage % 2 else t - h))
        elif counter == 0:
            plan.append(Call(t, "heun0", t, t - r))
        elif counter == 1:
            plan.append(Call(t, "heun1", t + r, t))
        else:
            plan.append(Call(t, "plms", t, t - r))
    return plan


def _resumed_plan(calls: Sequence[int]) -> List[Call]:
    """Plan for a pipeline that enters the call list part-way (img2img: ``timesteps[begin_index:]``)
    with ``img2img_resume="grid"``, and on grids diffusers has no counterpart for (custom ``timesteps``,
    PRK with fewer than 4 steps).

    Each distinct timestep of the remaining calls is a grid point and is stepped to the next one by PLMS
    (its history starts empty there); a call whose timestep the next call repeats (what is left of a
    warm start) leaves the sample unchanged, since the model is about to be evaluated at the same
    point again. This keeps every model call on the level its sample is at (diffusers' PNDM instead
    restarts its warm start from the top of the grid, :func:`_diffusers_resumed_plan`)."""
    plan = []
    for j, t in enumerate(calls):
        t = int(t)
        if j + 1 < len(calls) and int(calls[j + 1]) == t:
            plan.append(Call(t, "same", t, t))
            continue
        later = [int(u) for u in calls[j + 1 :] if int(u) != t]
        plan.append(Call(t, "plms", t, later[0] if later else -1))
    return plan


class PNDMSolver(VPNoiseMixin, SchedulerMixin, ConfigMixin):
    """PNDM / PLMS as a diffusers scheduler; config keys are those of diffusers' ``PNDMScheduler``.

    ``timesteps`` lists one entry per model call (so it is longer than ``num_inference_steps``: ``N + 9``
    with the PRK warm start, ``N + 1`` with ``skip_prk_steps=True``); a pipeline's loop over
    ``scheduler.timesteps`` makes exactly those calls. ``step`` must be called once per entry, in order;
    img2img pipelines enter part-way through ``set_begin_index``: by default the remaining calls are
    diffusers' own (:func:`_diffusers_resumed_plan`, same images as ``PNDMScheduler``);
    ``img2img_resume="grid"`` steps each remaining grid point by PLMS instead (:func:`_resumed_plan`:
    stays on the ODE, not diffusers' images).
    Prediction types: ``epsilon``, ``v_prediction``, ``sample``. As in diffusers, the model outputs
    themselves are combined (Runge-Kutta / Adams-Bashforth weights) and the combination is converted to
    a noise estimate at the step's start sample and level.
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
        fitted_schedule: Optional[str] = None,
        img2img_resume: str = "diffusers",
    ):
        check_prediction_type(prediction_type, ("epsilon", "v_prediction", "sample"), type(self).__name__)
        if img2img_resume not in IMG2IMG_RESUME:
            raise ValueError(
                f"img2img_resume must be one of {IMG2IMG_RESUME}, got {img2img_resume!r}: 'diffusers' gives "
                "diffusers' PNDMScheduler's img2img images, 'grid' steps the remaining grid by PLMS (on the ODE)"
            )
        if fitted_schedule is not None:
            load_schedule(fitted_schedule)  # fail now, naming the shipped schedules, not at set_timesteps
        self.betas, self.alphas_cumprod = make_schedule(
            num_train_timesteps, beta_start, beta_end, beta_schedule, trained_betas, rescale_betas_zero_snr
        )
        self.alphas = 1.0 - self.betas
        self.final_alpha_cumprod = 1.0 if set_alpha_to_one else float(self.alphas_cumprod[0])
        self.init_noise_sigma = 1.0
        self.num_inference_steps = None
        self.timesteps = torch.from_numpy(np.arange(num_train_timesteps)[::-1].copy())
        self._plan: List[Call] = []
        self._grid: List[int] = []
        self._diffusers_grid = False  # the plan is diffusers' (set_timesteps(N) on a grid it accepts)
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
        self._call = 0
        self._begin_index = None
        self._history: List[torch.Tensor] = []  # raw model output at the start of each past step
        self._x_start = None  # sample at the start of the current multi-call step
        self._acc = None  # weighted sum of Runge-Kutta stages (raw model outputs)
        self._guessed_entry = None  # entry taken from a first timestep that also precedes it (see _check_call)

    def set_timesteps(
        self,
        num_inference_steps: Optional[int] = None,
        device=None,
        nfe: Optional[int] = None,
        timesteps: Optional[Sequence[int]] = None,
    ):
        """Plan the model calls for ``num_inference_steps`` steps (diffusers' grid and step targets), for
        the most steps that fit in an NFE budget ``nfe``, or for a custom descending grid ``timesteps``
        (e.g. a fitted schedule; each step then goes to the next grid point). Resets the history."""
        check_one_grid_source(num_inference_steps, timesteps, "nfe", nfe)
        check_schedule_covers(self.alphas_cumprod, self.config.num_train_timesteps)
        T = self.config.num_train_timesteps
        skip = self.config.skip_prk_steps
        if nfe is not None:
            num_inference_steps, nfe = self.steps_for_nfe(nfe), None
        if timesteps is None:
            timesteps = fitted_or_default(self.config, "plms" if skip else "pndm", num_inference_steps)
        if timesteps is not None:
            ts = custom_timesteps(timesteps, T)
            plan, diffusers_grid = _grid_plan(ts, skip), False
        else:
            ts = vp_timesteps(num_inference_steps, T, self.config.timestep_spacing, self.config.steps_offset)
            # diffusers' PRK warm start needs 4 grid points; below that only our own grid plan exists.
            diffusers_grid = skip or len(ts) >= 4
            plan = _diffusers_plan(ts, skip, T) if diffusers_grid else _grid_plan(ts, skip)
        self._set_plan([int(t) for t in ts], plan, device, diffusers_grid)

    def _set_plan(self, grid: Sequence[int], plan: List[Call], device=None, diffusers_grid: bool = False):
        self._reset()
        self._diffusers_grid = diffusers_grid
        self.num_inference_steps = len(grid)
        self._grid = list(grid)
        self._plan = plan
        self.timesteps = torch.tensor([c.t_eval for c in plan], dtype=torch.int64, device=device)

    @property
    def begin_index(self):
        return self._begin_index

    def set_begin_index(self, begin_index: int = 0):
        """Enter the call list at ``timesteps[begin_index]`` (img2img pipelines call this after slicing
        ``timesteps``). The remaining calls are re-planned as diffusers' ``PNDMScheduler`` takes them
        (:func:`_diffusers_resumed_plan`), or with ``img2img_resume="grid"``, and on grids diffusers does
        not offer (custom ``timesteps``, PRK with fewer than 4 steps), by :func:`_resumed_plan`."""
        if self.num_inference_steps is None:
            raise ValueError("call set_timesteps() before set_begin_index()")
        full = self.timesteps.tolist()
        if not 0 <= begin_index < len(full):
            raise ValueError(f"begin_index must be in [0, {len(full) - 1}] (len(timesteps) - 1), got {begin_index}")
        if begin_index > 0:
            self._reset()
            self._plan = [Call(c.t_eval, "skipped", c.t_from, c.t_to) for c in self._plan[:begin_index]]
            if self._resumes_as_diffusers():
                T = self.config.num_train_timesteps
                self._plan += _diffusers_resumed_plan(full[begin_index:], self._grid, self.config.skip_prk_steps, T)
            else:
                self._plan += _resumed_plan(full[begin_index:])
            self._call = begin_index
        self._begin_index = begin_index

    def _resumes_as_diffusers(self) -> bool:
        return self._diffusers_grid and self.config.img2img_resume == "diffusers"

    def _maybe_enter_one_earlier(self, t: int):
        """The entry guessed from the first timestep alone is the later of two equal timesteps; a pipeline
        that sliced at the earlier one passes that timestep again now. With diffusers' resume the call
        already taken is the same in both plans (counter 0 at that timestep), so re-plan from the earlier
        entry and go on with the state it left."""
        entry, self._guessed_entry = self._guessed_entry, None
        if t != int(self.timesteps[entry]) or t == self._plan[self._call].t_eval:
            return
        state = (self._history, self._x_start, self._acc)
        self.set_begin_index(entry - 1)
        self._history, self._x_start, self._acc = state
        self._call = entry

    def scale_model_input(self, sample: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        return sample

    def _alpha(self, t: int) -> float:
        return float(self.alphas_cumprod[t]) if t >= 0 else self.final_alpha_cumprod

    def _check_call(self, timestep) -> Call:
        if self.num_inference_steps is None:
            raise ValueError("call set_timesteps(num_inference_steps) before step()")
        t = as_index(timestep)
        if self._call == 0 and self._begin_index is None and t != self._plan[0].t_eval and t in self.timesteps.tolist():
            # A pipeline that sliced timesteps for img2img without calling set_begin_index: enter at the
            # last call with this timestep (the step that starts there).
            entry = len(self.timesteps) - 1 - self.timesteps.tolist()[::-1].index(t)
            self.set_begin_index(entry)
            if self._resumes_as_diffusers() and int(self.timesteps[entry - 1]) == t:
                self._guessed_entry = entry
        elif self._guessed_entry is not None and self._call == self._guessed_entry + 1:
            self._maybe_enter_one_earlier(t)
        if self._call >= len(self._plan):
            raise ValueError("step() called more times than there are timesteps; call set_timesteps() again")
        call = self._plan[self._call]
        if t != call.t_eval:
            raise ValueError(
                f"step() expected timestep {call.t_eval} (call {self._call} of {len(self._plan)}) but got {timestep}; "
                "step through scheduler.timesteps in order, once each (img2img: call set_begin_index first)"
            )
        return call

    def _to_eps(self, output, x_base, a: float):
        eps, x0 = to_eps_x0(output, x_base, a, self.config.prediction_type)
        return eps, x0

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
        if eta:
            raise ValueError("PNDM is a deterministic ODE solver; use eta=0 (or DDIMSolver for eta > 0)")
        call = self._check_call(timestep)
        return self._apply(call, model_output, sample, return_dict)

    def _apply(self, call: Call, model_output, sample, return_dict: bool):
        """Take the planned (or, for a direct ``step_prk``/``step_plms`` call, derived) ``call``."""
        check_model_output(model_output, self, call.t_eval, self._call)
        self._call += 1
        if call.kind == "same":
            return (sample,) if not return_dict else SolverOutput(prev_sample=sample, pred_original_sample=None)
        x, m = sample.double(), model_output.double()
        a, a_to = self._alpha(call.t_from), self._alpha(call.t_to)
        kind, x0 = call.kind, None
        if kind == "plms":
            self._history = (self._history + [m])[-4:]
            eps, x0 = self._to_eps(plms_combine(self._history), x, a)
            prev = transfer(x, eps, a, a_to)
        elif kind in ("heun0", "prk0"):
            self._history = [m] if kind == "heun0" else (self._history + [m])[-4:]
            self._x_start, self._acc = x, m / 6
            eps, _ = self._to_eps(m, x, a)
            prev = transfer(x, eps, a, a_to)
        elif kind == "heun1":
            eps, x0 = self._to_eps((m + self._history[-1]) / 2, self._x_start, a)
            prev = transfer(self._x_start, eps, a, a_to)
            self._x_start = None
        elif kind in ("prk1", "prk2"):
            x_start = x if self._x_start is None else self._x_start
            self._acc = (0 if self._acc is None else self._acc) + m / 3
            eps, _ = self._to_eps(m, x_start, a)
            prev = transfer(x_start, eps, a, a_to)
        elif kind == "prk3":
            x_start = x if self._x_start is None else self._x_start
            eps, x0 = self._to_eps((0 if self._acc is None else self._acc) + m / 6, x_start, a)
            prev = transfer(x_start, eps, a, a_to)
            self._x_start, self._acc = None, None
        else:
            raise ValueError(f"call {self._call - 1} lies before begin_index; step from timesteps[begin_index:]")
        prev = prev.to(sample.dtype)
        x0 = None if x0 is None else x0.to(sample.dtype)
        if not return_dict:
            return (prev,)
        return SolverOutput(prev_sample=prev, pred_original_sample=x0)

    # ------------------------------------------------------------------ diffusers' direct-call API
    # diffusers' PNDMScheduler exposes its two stepping rules, driven by a call counter and the list of
    # past model outputs ``ets``; tests and some user code call them directly, at any timestep and with
    # ``ets`` set by hand. On the planned call (the timestep of ``timesteps[counter]``) both are exactly
    # ``step()``; anywhere else they follow diffusers' rules for which levels the call moves between.

    @property
    def counter(self) -> int:
        """Number of calls taken since ``set_timesteps`` (diffusers' ``counter``)."""
        return self._call

    @counter.setter
    def counter(self, value: int):
        self._call = int(value)

    @property
    def ets(self) -> List[torch.Tensor]:
        """Past model outputs, oldest first, that the linear multistep rule combines (diffusers' ``ets``)."""
        return self._history

    @ets.setter
    def ets(self, value):
        self._history = list(value)

    def _planned(self, timestep, prefixes) -> Optional[Call]:
        """The current planned call if ``timestep`` is its timestep and its kind starts with ``prefixes``."""
        if self._call >= len(self._plan):
            return None
        call = self._plan[self._call]
        return call if call.t_eval == as_index(timestep) and call.kind.startswith(prefixes) else None

    def _need_timesteps(self):
        if self.num_inference_steps is None:
            raise ValueError("call set_timesteps(num_inference_steps) before step(), step_prk() or step_plms()")

    def step_prk(self, model_output, timestep, sample, return_dict: bool = True):
        """diffusers' ``PNDMScheduler.step_prk``: one pseudo Runge-Kutta stage (stage ``counter % 4``).

        On a planned Runge-Kutta call this is ``step()``. Called elsewhere (any ``timestep``) it does what
        diffusers does: the stage starts from level ``prk_timesteps[counter // 4 * 4]`` and moves to
        ``timestep - T // N // 2`` (stages 0 and 2) or ``timestep`` (stages 1 and 3).
        With ``skip_prk_steps=True`` there is no Runge-Kutta warm start: ``ValueError`` (diffusers fails
        too, indexing its empty ``prk_timesteps``).
        """
        self._need_timesteps()
        call = self._planned(timestep, "prk")
        if call is None:
            if not len(self.prk_timesteps):
                raise ValueError(
                    "step_prk() needs the Runge-Kutta warm start, which skip_prk_steps=True (or a custom grid "
                    "without one) leaves out; use step() or step_plms()"
                )
            if self._call // 4 * 4 >= len(self.prk_timesteps):
                raise ValueError(
                    f"step_prk() called at call {self._call}, after the Runge-Kutta warm start's "
                    f"{len(self.prk_timesteps)} calls; use step() or step_plms()"
                )
            stage, t = self._call % 4, as_index(timestep)
            T, N = self.config.num_train_timesteps, self.num_inference_steps
            t_from = int(self.prk_timesteps[self._call // 4 * 4])
            t_to = t if stage % 2 else t - T // N // 2
            call = Call(t, f"prk{stage}", t_from, t_to)
        return self._apply(call, model_output, sample, return_dict)

    def step_plms(self, model_output, timestep, sample, return_dict: bool = True):
        """diffusers' ``PNDMScheduler.step_plms``: one linear multistep call (including the Heun-like warm
        start of ``skip_prk_steps=True``).

        On a planned call this is ``step()``. Called elsewhere (any ``timestep``) it does what diffusers
        does: move from ``timestep`` to ``timestep - T // N`` combining ``ets`` and the new output with
        Adams-Bashforth weights by history length; at ``counter == 1`` it instead re-takes the step from
        ``timestep + T // N`` with the average of the new and the previous output (the Heun warm start).
        Raises ``ValueError`` while the Runge-Kutta warm start is still due (fewer than 3 past outputs
        with ``skip_prk_steps=False``), as diffusers does.
        """
        self._need_timesteps()
        call = self._planned(timestep, ("plms", "heun", "same"))
        if call is not None:
            return self._apply(call, model_output, sample, return_dict)
        if not self.config.skip_prk_steps and len(self._history) < 3:
            raise ValueError(
                f"step_plms() called at call {self._call} before the Runge-Kutta warm start has produced 3 model "
                "outputs (its first 12 calls, skip_prk_steps=False); use step(), which picks the right method, or "
                "step_prk() for those calls"
            )
        t = as_index(timestep)
        r = self.config.num_train_timesteps // self.num_inference_steps
        if self._call == 1:
            # diffusers re-takes the first step here (from t + r to t) and stores nothing new.
            if len(self._history) == 1:
                if self._x_start is None:
                    self._x_start = sample.double()
                return self._apply(Call(t, "heun1", t + r, t), model_output, sample, return_dict)
            return self._plms_no_store(Call(t, "plms", t + r, t), sample, return_dict)
        self._history = self._history[-3:]
        kind = "heun0" if (not self._history and self._call == 0) else "plms"
        return self._apply(Call(t, kind, t, t - r), model_output, sample, return_dict)

    def _plms_no_store(self, call: Call, sample, return_dict: bool):
        """diffusers' ``step_plms`` at ``counter == 1`` with a history that is not one output long: the
        Adams-Bashforth combination of ``ets`` alone (the new output is neither used nor stored)."""
        if not self._history:
            raise ValueError("step_plms() at counter 1 combines the stored outputs (ets), and none is stored")
        self._call += 1
        x = sample.double()
        a, a_to = self._alpha(call.t_from), self._alpha(call.t_to)
        eps, x0 = self._to_eps(plms_combine(self._history[-4:]), x, a)
        prev, x0 = transfer(x, eps, a, a_to).to(sample.dtype), x0.to(sample.dtype)
        return (prev,) if not return_dict else SolverOutput(prev_sample=prev, pred_original_sample=x0)

    @property
    def prk_timesteps(self):
        """Timesteps of the Runge-Kutta warm start's calls (diffusers' ``prk_timesteps``; empty with
        ``skip_prk_steps=True``; ``None`` before ``set_timesteps``)."""
        if self.num_inference_steps is None:
            return None
        return np.array([c.t_eval for c in self._plan if c.kind.startswith("prk")], dtype=np.int64)

    @property
    def plms_timesteps(self):
        """Timesteps of the remaining calls (diffusers' ``plms_timesteps``)."""
        if self.num_inference_steps is None:
            return None
        return np.array([c.t_eval for c in self._plan if not c.kind.startswith("prk")], dtype=np.int64)


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
    sched._set_plan(ts, _grid_plan(ts, skip_prk_steps))
    x = x_T
    for t in sched.timesteps.tolist():
        x = sched.step(eps_fn(x, t), t, x).prev_sample
    return SampleResult(sample=x, nfe=len(sched._plan))
