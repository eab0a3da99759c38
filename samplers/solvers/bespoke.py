"""Bespoke few-step solver: step positions *and* update coefficients learned for one model.

A fitted grid (``samplers/solvers/schedules.py``) moves the steps of a hand-derived solver; the
update rule stays the one derived for a generic ODE. "Bespoke Non-Stationary Solvers" (Shaul et al.
2024, BNS) and S4S (Frankel et al. 2025, "Solving for a diffusion model solver") go one step further
and learn the solver itself, i.e. the coefficients of a linear multistep method that may differ at
every step, by making a few-step solve agree with a teacher solve on the model's own samples.

The form used here (data prediction, variance preserving). The model is called ``N`` times, at
descending (possibly fractional) training timesteps ``t_0 > ... > t_{N-1}``. Every point where the
model is called, and the result, is a fixed linear combination of the starting noise ``x_T`` and the
data predictions made so far::

    y_i = C[i, 0] x_T + sum_{j < i} C[i, 1 + j] D_j        i = 0 .. N   (y_N is the result)
    D_j = x0-prediction of the model at (y_j, t_j)

so ``C`` is an ``[N + 1, N + 1]`` lower-triangular table (row ``i`` uses ``x_T`` and ``D_0..D_{i-1}``).
Every deterministic multistep solver of this library (DDIM, DPM-Solver++ 2M/3M, UniPC with its
corrector, PLMS) has this form, because each of its steps is linear in the sample and the model
output: :func:`trace_linear_solver` reads its table off by running the scheduler on symbolic
vectors, so a fit starts exactly at that solver on that grid. :func:`fit_bespoke` then minimises the
mean squared distance to a many-step reference with Adam (full batch, cosine learning rate), over
the table and the timesteps; timesteps are parametrised as ``t_i + 1 = (t_{i-1} + 1) sigmoid(u_i)``
(clamped at 0) so they stay descending and non-negative (``t_0`` is kept: it sets the starting
distribution).
:func:`fit_bespoke_family` fits one table to several models at once (tried as a model-agnostic
default in ``scripts/fit_universal_solver.py``; it did not transfer from mixtures to a network).

``alpha_bar`` at a fractional timestep interpolates ``alphas_cumprod`` linearly, the convention our
Gaussian-mixture oracle uses; a network receives the fractional timestep as is (sinusoidal timestep
embeddings take any real value). A learned table is tied to the model, the noise schedule and ``N``;
``BespokeSolver`` refuses other step counts and other schedules instead of silently degrading.
"""

from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
from diffusers.configuration_utils import ConfigMixin, register_to_config
from diffusers.schedulers.scheduling_utils import SchedulerMixin

from samplers.solvers._finite import check_model_output
from samplers.solvers._vp import (
    VP_COMPATIBLES,
    VPNoiseMixin,
    SolverOutput,
    check_prediction_type,
    make_alphas_cumprod,
    to_eps_x0,
)
from samplers.solvers.schedules import load_schedule, shipped_schedules

SCHEDULE_KEYS = ("num_train_timesteps", "beta_start", "beta_end", "beta_schedule")


def alpha_bar_at(alphas_cumprod: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """``alpha_bar`` at training timesteps ``t`` (any shape, fractional allowed, differentiable in ``t``):
    linear interpolation of ``alphas_cumprod`` ``[T]``, clamped to ``[0, T - 1]``."""
    ac = alphas_cumprod.to(dtype=t.dtype if t.is_floating_point() else torch.float64, device=t.device)
    T = ac.numel()
    t = t.clamp(0, T - 1)
    lo = t.detach().floor().long()
    hi = (lo + 1).clamp(max=T - 1)
    frac = t - lo.to(t.dtype)
    return ac[lo] * (1 - frac) + ac[hi] * frac


def data_prediction(model_output: torch.Tensor, sample: torch.Tensor, alpha_bar: torch.Tensor,
                    prediction_type: str = "epsilon") -> torch.Tensor:
    """The model's ``x0`` estimate ``[B, ...]`` from its output at level ``alpha_bar`` (0-d tensor)."""
    a, s = alpha_bar.sqrt(), (1 - alpha_bar).sqrt()
    if prediction_type == "epsilon":
        return (sample - s * model_output) / a
    if prediction_type == "v_prediction":
        return a * sample - s * model_output
    if prediction_type == "sample":
        return model_output
    raise ValueError(f"prediction_type={prediction_type!r} is not supported; use epsilon, v_prediction or sample")


def combine(row: torch.Tensor, x_T: torch.Tensor, preds: Sequence[torch.Tensor]) -> torch.Tensor:
    """``row[0] x_T + sum_j row[1 + j] preds[j]``: one point of the solve (``row`` ``[N + 1]``)."""
    out = row[0].to(x_T.dtype) * x_T
    for j, d in enumerate(preds):
        out = out + row[1 + j].to(x_T.dtype) * d
    return out


def trace_linear_solver(scheduler, alphas_cumprod: Optional[torch.Tensor] = None) -> Tuple[List[float], torch.Tensor]:
    """The ``[N + 1, N + 1]`` table of a deterministic multistep scheduler on its current grid.

    Runs ``scheduler`` (``set_timesteps`` already called) on float64 vectors of length ``N + 1``
    whose entries are the coefficients of ``x_T, D_0, ..., D_{N-1}``: at call ``i`` the model output
    given to ``step`` is the epsilon whose data prediction is exactly ``D_i``. Valid for any scheduler
    whose ``step`` is linear in the sample and the model output (not for stochastic ones).

    Returns:
        ``(timesteps [N] of the model calls, table [N + 1, N + 1] float64)``.
    """
    ac = (scheduler.alphas_cumprod if alphas_cumprod is None else alphas_cumprod).double()
    calls = [float(t) for t in scheduler.timesteps]
    n = len(calls)
    x = torch.zeros(n + 1, dtype=torch.float64)
    x[0] = 1.0
    rows = []
    for i, t in enumerate(scheduler.timesteps):
        rows.append(x.clone())
        a = alpha_bar_at(ac, torch.tensor(calls[i], dtype=torch.float64))
        unit = torch.zeros(n + 1, dtype=torch.float64)
        unit[1 + i] = 1.0
        eps = (x - a.sqrt() * unit) / (1 - a).sqrt()
        x = scheduler.step(eps, t, x).prev_sample.double()
    rows.append(x.clone())
    return calls, torch.stack(rows)


def bespoke_solve(model_fn: Callable, x_T: torch.Tensor, timesteps: torch.Tensor, table: torch.Tensor,
                  alphas_cumprod: torch.Tensor, prediction_type: str = "epsilon") -> torch.Tensor:
    """Run the solver: ``N`` calls ``model_fn(y [B, ...], t 0-d tensor)`` and the final combination.

    Differentiable in ``timesteps`` ``[N]`` and ``table`` ``[N + 1, N + 1]``; computes in ``x_T``'s dtype,
    exactly as :class:`BespokeSolver` does step by step.
    """
    preds: List[torch.Tensor] = []
    for i in range(timesteps.numel()):
        t = timesteps[i]
        y = combine(table[i], x_T, preds)
        a = alpha_bar_at(alphas_cumprod, t.double()).to(x_T.dtype)  # as BespokeSolver.step computes it
        preds.append(data_prediction(model_fn(y, t), y, a, prediction_type))
    return combine(table[-1], x_T, preds)


def _times_to_logits(times: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`_logits_to_times` (``times`` ``[N]`` strictly descending, ``>= 0``)."""
    shifted = times.double() + 1
    return torch.logit(shifted[1:] / shifted[:-1])


def _logits_to_times(first: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """``t_i + 1 = (t_{i-1} + 1) sigmoid(u_i)``, clamped at 0: descending for any ``logits`` ``[N - 1]``
    (the offset of 1 lets a grid that ends at ``t = 0`` start with finite logits)."""
    ratios = torch.sigmoid(logits)
    return torch.cat([first.reshape(1), (first + 1) * torch.cumprod(ratios, 0) - 1]).clamp(min=0)


def fit_bespoke(model_fn: Callable, x_T: torch.Tensor, reference: torch.Tensor, timesteps: Sequence[float],
                table: torch.Tensor, alphas_cumprod: torch.Tensor, iters: int = 300, lr: float = 5e-4,
                lr_times: float = 0.01, learn_times: bool = True, prediction_type: str = "epsilon",
                output_transform: Optional[Callable] = None,
                progress: Optional[Callable[[int, float], None]] = None) -> Dict:
    """Learn the table (and the timesteps) that bring the solve from ``x_T`` closest to ``reference``.

    Args:
        model_fn: ``model_fn(y [B, ...], t 0-d tensor) -> output [B, ...]``; must be differentiable in ``y``
            (and in ``t`` when ``learn_times``).
        x_T, reference: ``[B, ...]`` fit noises and the many-step solve from them.
        timesteps, table: the start, normally from :func:`trace_linear_solver` on a (fitted) grid.
        iters, lr, lr_times: Adam steps (full batch, cosine decay) and learning rates of the table
            entries and of the timestep logits.
        output_transform: applied to the solve's result before the loss, e.g. the clamp a pipeline applies
            to its output, so the fit spends nothing on pixels the clamp already fixes.
        progress: called as ``progress(iteration, loss)``.
    Returns:
        ``{"timesteps": [N] floats, "table": [N + 1, N + 1] float64, "loss_start", "loss_fit", "losses"}``;
        the result is the best iterate seen (the loss is evaluated on the full fit set every step).
    """

    def loss_of(times, tab):
        result = bespoke_solve(model_fn, x_T, times, tab, alphas_cumprod, prediction_type)
        if output_transform is not None:
            result = output_transform(result)
        return ((result - reference) ** 2).mean()

    return _fit_table(loss_of, x_T.dtype, timesteps, table, iters, lr, lr_times, learn_times, progress)


def fit_bespoke_family(problems: Sequence[Tuple[Callable, torch.Tensor, torch.Tensor]], timesteps: Sequence[float],
                       table: torch.Tensor, alphas_cumprod: torch.Tensor, iters: int = 300, lr: float = 5e-4,
                       lr_times: float = 0.01, prediction_type: str = "epsilon",
                       progress: Optional[Callable[[int, float], None]] = None) -> Dict:
    """One table for several models: :func:`fit_bespoke` with the loss averaged over ``problems``.

    ``problems`` is a list of ``(model_fn, x_T [B, ...], reference [B, ...])`` (shapes may differ between
    models). The loss is the mean over models of ``log`` of each model's mean squared error, so every
    model weighs the same whatever its scale or its error (a geometric mean: halving any one model's
    error lowers it by the same amount). Returns the same dict as :func:`fit_bespoke` (``loss_*`` in
    that log units).
    """
    if not problems:
        raise ValueError("problems is empty; pass at least one (model_fn, x_T, reference)")

    def loss_of(times, tab):
        logs = [((bespoke_solve(fn, x, times, tab, alphas_cumprod, prediction_type) - ref) ** 2).mean().log()
                for fn, x, ref in problems]
        return torch.stack(logs).mean()

    return _fit_table(loss_of, problems[0][1].dtype, timesteps, table, iters, lr, lr_times, True, progress)


def _fit_table(loss_of: Callable, dtype: torch.dtype, timesteps: Sequence[float], table: torch.Tensor, iters: int,
               lr: float, lr_times: float, learn_times: bool, progress: Optional[Callable[[int, float], None]]) -> Dict:
    """Adam over the causal entries of ``table`` and the timestep logits, minimising ``loss_of(times [N],
    table [N + 1, N + 1])``; keeps the best iterate (see :func:`fit_bespoke`)."""
    start = table.to(dtype)
    # only the entries a causal solve can use: row i mixes x_T and D_0..D_{i-1}
    free = torch.zeros_like(start)
    for i in range(1, start.shape[0]):
        free[i, : i + 1] = 1.0
    delta = torch.zeros_like(start, requires_grad=True)
    ts = torch.as_tensor(list(timesteps), dtype=torch.float64)
    first = ts[0].to(dtype)
    logits = _times_to_logits(ts).to(dtype).requires_grad_(learn_times)
    groups = [{"params": [delta], "lr": lr}] + ([{"params": [logits], "lr": lr_times}] if learn_times else [])
    opt = torch.optim.Adam(groups)
    decay = torch.optim.lr_scheduler.CosineAnnealingLR(opt, max(iters, 1))

    def current():
        return _logits_to_times(first, logits), start + delta * free

    losses = []
    best = None
    for it in range(iters + 1):
        times, tab = current()
        loss = loss_of(times, tab)
        value = float(loss.detach())
        losses.append(value)
        if best is None or value < best[0]:
            best = (value, times.detach().double().clone(), tab.detach().double().clone())
        if progress is not None:
            progress(it, value)
        if it == iters:
            break
        opt.zero_grad()
        loss.backward()
        opt.step()
        decay.step()
    return {"timesteps": best[1].tolist(), "table": best[2], "loss_start": losses[0], "loss_fit": best[0],
            "losses": losses}


class BespokeSolver(VPNoiseMixin, SchedulerMixin, ConfigMixin):
    """A learned few-step solver (:func:`fit_bespoke`) as a diffusers scheduler.

    ``bespoke`` names a shipped schedule file (``samplers/solvers/schedules/<name>.json``) or a JSON path
    written by ``scripts/fit_bespoke.py``; ``set_timesteps(N)`` loads the table learned for ``N`` model
    calls. The table is the model's: only step counts that were fitted are accepted, only on the noise
    schedule it was fitted on, and only from pure noise (no img2img: a table learned from ``x_T`` has no
    meaning for a partly denoised start). NFE = ``num_inference_steps``.
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
        prediction_type: str = "epsilon",
        bespoke: Optional[str] = None,
        steps_offset: int = 0,
        timestep_spacing: str = "linspace",
    ):
        name = type(self).__name__
        check_prediction_type(prediction_type, ("epsilon", "v_prediction", "sample"), name)
        if bespoke is None:
            raise ValueError(f"{name} needs bespoke=<a shipped name or a JSON path written by scripts/fit_bespoke.py>; "
                             f"shipped: {', '.join(shipped_schedules())}")
        self._tables = load_schedule(bespoke).get("bespoke", {})  # read once: every pipeline call sets timesteps
        if not self._tables:
            raise ValueError(f"{bespoke!r} holds no learned solver (no 'bespoke' entry); fit one with scripts/fit_bespoke.py")
        self.alphas_cumprod = make_alphas_cumprod(num_train_timesteps, beta_start, beta_end, beta_schedule, trained_betas)
        self.init_noise_sigma = 1.0
        self.num_inference_steps = None
        self.timesteps = torch.arange(num_train_timesteps - 1, -1, -1, dtype=torch.float32)
        self._table = None
        self._step_index = None
        self._begin_index = None
        self._reset()

    def _reset(self) -> None:
        self._x_T = None
        self._preds: List[torch.Tensor] = []

    def fitted_steps(self) -> List[int]:
        """Step counts with a learned table in this scheduler's ``bespoke`` file."""
        return sorted(int(k) for k in self._tables)

    def set_timesteps(self, num_inference_steps: Optional[int] = None, device=None, timesteps=None, sigmas=None):
        """Load the table learned for ``num_inference_steps`` model calls (``timesteps``/``sigmas`` are
        learned with the table and cannot be replaced)."""
        name = type(self).__name__
        if timesteps is not None or sigmas is not None:
            raise ValueError(f"{name} learns its own timesteps with its coefficients; pass num_inference_steps only")
        if num_inference_steps is None:
            raise ValueError(f"pass num_inference_steps to set_timesteps (fitted: {self.fitted_steps()})")
        entry = self._tables.get(str(int(num_inference_steps)))
        if entry is None:
            raise ValueError(f"no learned solver for num_inference_steps={num_inference_steps} in "
                             f"{self.config.bespoke!r}; fitted: {self.fitted_steps()} (fit more with scripts/fit_bespoke.py)")
        fitted_on = entry.get("noise_schedule", {})
        mismatched = {k: (fitted_on[k], self.config[k]) for k in SCHEDULE_KEYS if k in fitted_on and fitted_on[k] != self.config[k]}
        if mismatched or (fitted_on and self.config.trained_betas is not None):
            raise ValueError(f"this learned solver was fitted on another noise schedule ({fitted_on}); this scheduler has "
                             f"{ {k: self.config[k] for k in SCHEDULE_KEYS} }: use the model's own scheduler config")
        self._table = torch.tensor(entry["coefficients"], dtype=torch.float64)
        self.timesteps = torch.tensor(entry["timesteps"], dtype=torch.float32, device=device)
        self.num_inference_steps = len(entry["timesteps"])
        self._step_index = None
        self._begin_index = None
        self._reset()

    @property
    def step_index(self):
        return self._step_index

    @property
    def begin_index(self):
        return self._begin_index

    def set_begin_index(self, begin_index: int = 0):
        if begin_index != 0:
            raise ValueError(f"{type(self).__name__} is learned from pure noise and cannot start mid-way (img2img, "
                             f"begin_index={begin_index}); use a fitted-grid solver such as UniPCSolver for img2img")
        self._begin_index = 0

    def scale_model_input(self, sample: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        return sample

    def step(self, model_output, timestep, sample, return_dict: bool = True, **kwargs):
        """Take the model output at the current point, return the next point (the result after the last call)."""
        if self._table is None:
            raise ValueError("call set_timesteps(num_inference_steps) before step()")
        if self._step_index is None:
            self._step_index = 0
            if abs(float(timestep) - float(self.timesteps[0])) > 1e-3:
                raise ValueError(f"{type(self).__name__} starts at timestep {float(self.timesteps[0])} (pure noise), "
                                 f"got {float(timestep)}: img2img is not supported by a learned solver")
            self._x_T = sample
        i = self._step_index
        if i >= self.num_inference_steps:
            raise ValueError("step() called more times than there are timesteps; call set_timesteps() again")
        check_model_output(model_output, self, timestep, i, last=i == self.num_inference_steps - 1)
        t = self.timesteps[i].to(torch.float64)
        a = alpha_bar_at(self.alphas_cumprod, t).to(sample.dtype)
        x0 = data_prediction(model_output.to(sample.dtype), sample, a, self.config.prediction_type)
        self._preds.append(x0)
        prev = combine(self._table[i + 1], self._x_T, self._preds)
        self._step_index += 1
        if not return_dict:
            return (prev,)
        return SolverOutput(prev_sample=prev, pred_original_sample=x0)
