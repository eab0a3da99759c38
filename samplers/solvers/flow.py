"""Few-step solvers for rectified-flow / flow-matching velocity models.

Model convention (SD3, Flux, Wan, Open-Sora): ``x_s = (1 - s) x0 + s eps`` for ``s`` in ``[0, 1]``
(``s = 1`` is pure noise) and the model predicts the velocity ``v = eps - x0 = dx_s/ds``. Sampling
integrates the ODE from ``s = 1`` down to ``s = 0``:

- Euler: ``x' = x + (s' - s) v(x, s)``. NFE = N.
- Heun (2nd order): Euler predictor, then ``x' = x + (s' - s) (v(x, s) + v(x_pred, s')) / 2``; the last
  step (to ``s = 0``) is plain Euler. NFE = ``2N - 1``.
- Linear Proportional Leap (LPL, Kim et al. 2025, "On-device Sora"): Euler steps until the velocity
  settles, then one straight leap to ``s = 0`` along the current velocity, ``x0 = x - s v``. Our reading
  of "settles": the relative change ``||v_k - v_{k-1}|| / ||v_{k-1}||`` (L2 per sample, maximum over the
  batch) falls below ``leap_tolerance``, checked only after the first ``leap_min_fraction`` of the steps
  (near pure noise the velocity points at the data mean and hardly changes, which would trigger a leap
  at once). Where the paper's
  exact test differs, this one is the documented choice. NFE = the steps taken before the leap + 1.

The grid follows ``FlowMatchEulerDiscreteScheduler``: ``timesteps = sigmas * num_train_timesteps``, sigmas
linearly spaced from 1 to the (shifted) smallest training sigma, then shifted by
``shift * s / (1 + (shift - 1) s)`` (or the dynamic ``mu`` shift), with a final 0 appended; custom
``sigmas``/``timesteps``/``mu`` are accepted by ``set_timesteps`` like the diffusers scheduler, so
``FlowMatchSolverScheduler.from_config(pipe.scheduler.config)`` replaces it in SD3/Flux-style pipelines.

In a pipeline the saving of LPL needs the loop to stop calling the model after the leap: the scheduler
sets ``scheduler.leaped`` and later steps return the leaped sample unchanged; pass
``callback_on_step_end=lpl_stop_callback`` to pipelines that honour ``pipe._interrupt`` (Flux, SD3) to
skip the remaining model calls. :func:`sample_flow` skips them itself.
"""

from __future__ import annotations

import math
from typing import Callable, List, Optional, Sequence

import numpy as np
import torch
from diffusers.configuration_utils import ConfigMixin, register_to_config
from diffusers.schedulers.scheduling_utils import SchedulerMixin

from samplers.solvers._finite import check_model_output
from samplers.solvers._vp import SampleResult, SolverOutput, check_off

FLOW_SOLVERS = ("euler", "heun")


def shift_sigmas(sigmas: np.ndarray, shift: float) -> np.ndarray:
    """SD3's resolution shift ``shift * s / (1 + (shift - 1) s)``; ``shift = 1`` is the identity."""
    return shift * sigmas / (1 + (shift - 1) * sigmas)


def time_shift(mu: float, sigmas: np.ndarray, kind: str = "exponential") -> np.ndarray:
    """Flux's dynamic shift for image size parameter ``mu`` (exponential or linear in ``mu``)."""
    if kind == "exponential":
        return math.exp(mu) / (math.exp(mu) + (1 / sigmas - 1))
    if kind == "linear":
        return mu / (mu + (1 / sigmas - 1))
    raise ValueError(f"time_shift_type must be 'exponential' or 'linear', got {kind!r}")


def stretch_to_terminal(sigmas: np.ndarray, terminal: float) -> np.ndarray:
    """LTX-Video's terminal stretch: scale ``1 - s`` so the last sigma becomes ``terminal``."""
    one_minus = 1 - sigmas
    return 1 - one_minus / (one_minus[-1] / (1 - terminal))


def flow_sigmas(num_inference_steps: int, num_train_timesteps: int = 1000, shift: float = 1.0) -> np.ndarray:
    """Descending sigmas ``[N + 1]`` (last = 0) of the default FlowMatchEuler grid for a static shift."""
    T = num_train_timesteps
    s_min = float(shift_sigmas(np.array(1.0 / T), shift))
    s = np.linspace(1.0, s_min, num_inference_steps)
    return np.append(shift_sigmas(s, shift), 0.0)


def _min_leap_step(num_steps: int, fraction: float) -> int:
    # Near pure noise a flow model's velocity points at the data mean and barely changes, so an
    # unguarded test would leap at once; no leap before this step index.
    return max(1, math.ceil(fraction * num_steps))


def _rel_change(v: torch.Tensor, v_prev: torch.Tensor) -> float:
    B = v.shape[0]
    num = (v - v_prev).reshape(B, -1).norm(dim=1)
    den = v_prev.reshape(B, -1).norm(dim=1).clamp_min(1e-12)
    return float((num / den).max())


class FlowMatchSolverScheduler(SchedulerMixin, ConfigMixin):
    """Flow-matching Euler / Heun / LPL as a diffusers scheduler; config keys follow
    ``FlowMatchEulerDiscreteScheduler`` plus ``solver``, ``leap_tolerance`` and ``leap_min_fraction``.

    ``leap_tolerance=None`` turns LPL off; LPL needs ``solver="euler"``.
    """

    _compatibles = ["FlowMatchEulerDiscreteScheduler", "FlowMatchHeunDiscreteScheduler"]
    order = 1

    @register_to_config
    def __init__(
        self,
        num_train_timesteps: int = 1000,
        shift: float = 1.0,
        use_dynamic_shifting: bool = False,
        base_shift: Optional[float] = 0.5,
        max_shift: Optional[float] = 1.15,
        base_image_seq_len: int = 256,
        max_image_seq_len: int = 4096,
        invert_sigmas: bool = False,
        shift_terminal: Optional[float] = None,
        use_karras_sigmas: bool = False,
        use_exponential_sigmas: bool = False,
        use_beta_sigmas: bool = False,
        time_shift_type: str = "exponential",
        stochastic_sampling: bool = False,
        solver: str = "euler",
        leap_tolerance: Optional[float] = None,
        leap_min_fraction: float = 0.5,
    ):
        name = type(self).__name__
        check_off(
            name,
            invert_sigmas=invert_sigmas,
            use_karras_sigmas=use_karras_sigmas,
            use_exponential_sigmas=use_exponential_sigmas,
            use_beta_sigmas=use_beta_sigmas,
            stochastic_sampling=stochastic_sampling,
        )
        if solver not in FLOW_SOLVERS:
            raise ValueError(f"solver={solver!r} is not supported; use one of {FLOW_SOLVERS}")
        if leap_tolerance is not None and (solver != "euler" or leap_tolerance <= 0):
            raise ValueError("Linear Proportional Leap needs solver='euler' and leap_tolerance > 0 (None = off)")
        if not 0.0 <= leap_min_fraction < 1.0:
            raise ValueError(f"leap_min_fraction must be in [0, 1), got {leap_min_fraction}")
        if time_shift_type not in ("exponential", "linear"):
            raise ValueError(f"time_shift_type must be 'exponential' or 'linear', got {time_shift_type!r}")
        T = num_train_timesteps
        s = np.linspace(1, T, T)[::-1] / T
        if not use_dynamic_shifting:
            s = shift_sigmas(s, shift)
        self.sigmas = torch.from_numpy(s.astype(np.float32))
        self.timesteps = self.sigmas * T
        self.sigma_min, self.sigma_max = float(self.sigmas[-1]), float(self.sigmas[0])
        self._shift = shift
        self.init_noise_sigma = 1.0
        # Heun makes two calls per step; img2img pipelines slice timesteps at t_start * order.
        self.order = 2 if solver == "heun" else 1
        self.num_inference_steps = None
        self._begin_index = None
        self._reset()

    @property
    def shift(self) -> float:
        return self._shift

    def set_shift(self, shift: float):
        self._shift = shift

    @property
    def begin_index(self):
        return self._begin_index

    def set_begin_index(self, begin_index: int = 0):
        """img2img pipelines start part-way down the call list, at ``timesteps[begin_index]`` (they pass
        ``t_start * scheduler.order``; ``order`` is 2 for Heun, as in diffusers' Heun scheduler)."""
        if begin_index and not 0 <= begin_index < len(self._plan):
            raise ValueError(f"begin_index must be in [0, {len(self._plan) - 1}] (len(timesteps) - 1), got {begin_index}")
        if self._plan and self._plan[begin_index][1] == "heun1":
            raise ValueError(
                f"begin_index {begin_index} is a Heun corrector call; pass t_start * scheduler.order (an even index)"
            )
        self._begin_index = begin_index
        self._call = begin_index

    @property
    def step_index(self):
        return None if not self._plan or self._call >= len(self._plan) else self._plan[self._call][1]

    def _reset(self):
        self._plan: List[tuple] = []  # (sigma index, kind) per model call
        self._first_call_of = {}
        self._call = 0
        self._x_start = None
        self._v_start = None
        self._v_prev = None
        self.leaped = False
        self.leap_step = None

    def _stretch_to_terminal(self, s: np.ndarray) -> np.ndarray:
        return stretch_to_terminal(s, self.config.shift_terminal)

    def set_timesteps(
        self,
        num_inference_steps: Optional[int] = None,
        device=None,
        sigmas: Optional[Sequence[float]] = None,
        mu: Optional[float] = None,
        timesteps: Optional[Sequence[float]] = None,
    ):
        """Sigma grid as in FlowMatchEulerDiscreteScheduler; resets solver history and the leap flag."""
        cfg = self.config
        T = cfg.num_train_timesteps
        if cfg.use_dynamic_shifting and mu is None:
            raise ValueError("this config uses dynamic shifting: pass mu= to set_timesteps (pipelines do)")
        if num_inference_steps is None:
            if sigmas is None and timesteps is None:
                raise ValueError("pass num_inference_steps, sigmas or timesteps to set_timesteps")
            num_inference_steps = len(sigmas) if sigmas is not None else len(timesteps)
        if num_inference_steps < 1:
            raise ValueError(f"num_inference_steps must be >= 1, got {num_inference_steps}")
        if sigmas is not None:
            s = np.asarray(sigmas, dtype=np.float64)
        elif timesteps is not None:
            s = np.asarray(timesteps, dtype=np.float64) / T
        else:
            s = np.linspace(self.sigma_max, self.sigma_min, num_inference_steps)
        if len(s) != num_inference_steps:
            raise ValueError(f"got {len(s)} sigmas/timesteps for num_inference_steps={num_inference_steps}")
        s = time_shift(mu, s, cfg.time_shift_type) if cfg.use_dynamic_shifting else shift_sigmas(s, self.shift)
        if cfg.shift_terminal:
            s = self._stretch_to_terminal(s)
        sig = torch.from_numpy(np.asarray(s, dtype=np.float32))
        ts = torch.from_numpy(np.asarray(timesteps, dtype=np.float32)) if timesteps is not None else sig * T
        self.sigmas = torch.cat([sig, torch.zeros(1)])
        self._reset()
        self.num_inference_steps = int(num_inference_steps)
        N = self.num_inference_steps
        plan = []
        for i in range(N):
            self._first_call_of[i] = len(plan)
            if cfg.solver == "heun" and i < N - 1:
                plan += [(i, "heun0"), (i, "heun1")]
            else:
                plan.append((i, "euler"))
        self._plan = plan
        # Model calls: Heun evaluates the next grid point as its corrector stage.
        call_ts = [ts[i] if k != "heun1" else ts[i + 1] for i, k in plan]
        self.timesteps = torch.stack(call_ts).to(device)
        self._begin_index = None

    @property
    def nfe(self) -> int:
        """Model calls of one full pass without a leap."""
        return len(self._plan)

    def scale_model_input(self, sample: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        return sample

    def scale_noise(self, sample: torch.Tensor, timestep, noise: torch.Tensor) -> torch.Tensor:
        """Forward process ``(1 - s) x0 + s eps`` at the sigma of ``timestep`` (img2img)."""
        t = torch.as_tensor(timestep, dtype=torch.float32).reshape(-1)
        T = self.config.num_train_timesteps
        s = (t / T).to(device=sample.device, dtype=sample.dtype).reshape((-1,) + (1,) * (sample.ndim - 1))
        return s * noise + (1.0 - s) * sample

    def _enter_at(self, timestep):
        """A pipeline that sliced ``timesteps`` (img2img) without ``set_begin_index``: enter at the call
        with this timestep; a Heun grid point appears twice (corrector, then predictor) and the step
        starts at the second, as diffusers' ``index_for_timestep`` does."""
        t = float(timestep)
        hits = [j for j, u in enumerate(self.timesteps.tolist()) if abs(u - t) <= 1e-4 * max(1.0, abs(t))]
        if hits:
            self._call = hits[1] if len(hits) > 1 else hits[0]

    def step(self, model_output, timestep, sample, generator=None, return_dict: bool = True, **kwargs):
        if self.num_inference_steps is None:
            raise ValueError("call set_timesteps(num_inference_steps) before step()")
        if self._call >= len(self._plan):
            raise ValueError("step() called more times than there are timesteps; call set_timesteps() again")
        if self._call == 0 and self._begin_index is None:
            self._enter_at(timestep)
        i, kind = self._plan[self._call]
        self._call += 1
        if self.leaped:
            out = sample
            x0 = sample
        else:
            check_model_output(model_output, self, timestep, self._call - 1)
            s, s_next = float(self.sigmas[i]), float(self.sigmas[i + 1])
            x, v = sample.double(), model_output.double()
            x0 = x - s * v
            if kind == "euler":
                if (
                    self.config.leap_tolerance is not None
                    and self._v_prev is not None
                    and i >= _min_leap_step(self.num_inference_steps, self.config.leap_min_fraction)
                    and i < self.num_inference_steps - 1
                    and _rel_change(v, self._v_prev) < self.config.leap_tolerance
                ):
                    out = x0  # leap straight to s = 0
                    self.leaped, self.leap_step = True, i
                else:
                    out = x + (s_next - s) * v
                self._v_prev = v
            elif kind == "heun0":
                self._x_start, self._v_start = x, v
                out = x + (s_next - s) * v
            else:  # heun1: v was evaluated at the predicted point, sigma index i + 1
                x_start, v_start = self._x_start, self._v_start
                s_from = float(self.sigmas[i])
                out = x_start + (s_next - s_from) * 0.5 * (v_start + v)
                x0 = x_start - s_from * 0.5 * (v_start + v)
                self._x_start = self._v_start = None
            out, x0 = out.to(model_output.dtype), x0.to(model_output.dtype)
        if not return_dict:
            return (out,)
        return SolverOutput(prev_sample=out, pred_original_sample=x0)

    def __len__(self):
        return self.config.num_train_timesteps


def lpl_stop_callback(pipe, step_index, timestep, callback_kwargs):
    """``callback_on_step_end`` for pipelines with ``pipe._interrupt`` (Flux, SD3): once the scheduler
    has leaped, skip the remaining model calls."""
    if getattr(pipe.scheduler, "leaped", False):
        pipe._interrupt = True
    return callback_kwargs


def sample_flow(
    velocity_fn: Callable[[torch.Tensor, float], torch.Tensor],
    x_1: torch.Tensor,
    sigmas: Sequence[float],
    *,
    solver: str = "euler",
    leap_tolerance: Optional[float] = None,
    leap_min_fraction: float = 0.5,
) -> SampleResult:
    """Integrate a flow-matching model from ``sigmas[0]`` to ``sigmas[-1]`` (normally 1 -> 0).

    Args:
        velocity_fn: ``velocity_fn(x [B, ...], sigma: float) -> v [B, ...]`` (``v = eps - x0``).
        x_1: ``[B, ...]`` initial noise.
        sigmas: descending ``[N + 1]`` grid including the final 0, e.g. :func:`flow_sigmas`.
        solver: ``euler`` or ``heun``; ``leap_tolerance`` turns on LPL (euler only).
    Returns:
        :class:`SampleResult` with the number of velocity calls actually made.
    """
    sig = [float(s) for s in sigmas]
    N = len(sig) - 1
    if N < 1:
        raise ValueError("sample_flow needs at least two sigmas (start and end)")
    if solver not in FLOW_SOLVERS:
        raise ValueError(f"solver={solver!r} is not supported; use one of {FLOW_SOLVERS}")
    if leap_tolerance is not None and solver != "euler":
        raise ValueError("Linear Proportional Leap needs solver='euler'")
    x = x_1.double()
    nfe, v_prev = 0, None
    for i in range(N):
        s, s_next = sig[i], sig[i + 1]
        v = velocity_fn(x.to(x_1.dtype), s).double()
        nfe += 1
        if (
            leap_tolerance is not None
            and v_prev is not None
            and i >= _min_leap_step(N, leap_min_fraction)
            and i < N - 1
            and _rel_change(v, v_prev) < leap_tolerance
        ):
            x = x + (sig[-1] - s) * v
            break
        if solver == "heun" and s_next > 0:
            x_pred = x + (s_next - s) * v
            v2 = velocity_fn(x_pred.to(x_1.dtype), s_next).double()
            nfe += 1
            x = x + (s_next - s) * 0.5 * (v + v2)
        else:
            x = x + (s_next - s) * v
        v_prev = v
    return SampleResult(sample=x.to(x_1.dtype), nfe=nfe)
