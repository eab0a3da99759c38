"""Fitted few-step schedules: the step positions themselves optimised for one model.

Hand-made spacings (linspace, leading, trailing, uniform log-SNR) place the few steps of a fast
sampler the same way for every model. "Align Your Steps" (Sabour, Fidler & Kreis 2024) and LD3
(Tong et al. 2025, "Learning to Discretize Denoising Diffusion ODEs") instead choose the timesteps per
model, by making a few-step solve agree with a many-step one on the model's own samples. This module
does the cheap, gradient-free version of that (no training, CPU minutes):

- loss: mean squared distance between the few-step result and a many-step reference solve started
  from the same noises, over a *fit* seed set (evaluate on a different seed set to check that the
  schedule generalises);
- search: coordinate descent over the integer timesteps, each one moved by +-``delta`` within its
  neighbours for ``delta`` shrinking from coarse to 1, kept when the loss drops.

Saved schedules are JSON files, one per model (shipped ones live in ``samplers/solvers/schedules/``)::

    {"model": "...", "schedules": {"dpmpp-2m": {"8": [999, ...]}, "plms": {"7": [...]}}, "fits": [...]}

keyed by solver name and number of inference steps. Use one with any of our VP schedulers either per
call, ``sched.set_timesteps(timesteps=saved_timesteps("digits", "dpmpp-2m", 8))``, or through the
config, ``DPMSolverPP2M.from_config(cfg, fitted_schedule="digits")``, after which a pipeline's
``set_timesteps(8)`` uses the fitted grid (step counts without a fitted grid keep the default one).

A file may also hold learned solvers (step positions and coefficients, ``samplers/solvers/bespoke.py``,
written by ``scripts/fit_bespoke.py``) under ``"bespoke": {"8": {"timesteps": ..., "coefficients": ...}}``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

SCHEDULE_DIR = Path(__file__).resolve().parent / "schedules"


def shipped_schedules() -> List[str]:
    """Names of the schedules shipped with the package (``load_schedule`` accepts these)."""
    return sorted(p.stem for p in SCHEDULE_DIR.glob("*.json"))


def _path_of(name_or_path: str) -> Path:
    p = Path(name_or_path)
    if p.suffix == ".json" or os.sep in str(name_or_path):
        return p
    return SCHEDULE_DIR / f"{name_or_path}.json"


def load_schedule(name_or_path: str) -> dict:
    """The saved-schedule file for a shipped name (see :func:`shipped_schedules`) or a JSON path."""
    p = _path_of(name_or_path)
    if not p.is_file():
        raise ValueError(
            f"no saved schedule {name_or_path!r} (looked for {p.name}); shipped: {', '.join(shipped_schedules())} "
            "or pass a path to a JSON file written by scripts/fit_schedule.py"
        )
    return json.loads(p.read_text())


def saved_timesteps(name_or_path: str, solver: str, num_inference_steps: int) -> Optional[List[int]]:
    """The fitted grid ``[N]`` for ``solver`` at ``num_inference_steps`` steps, or ``None`` if not fitted."""
    table = load_schedule(name_or_path).get("schedules", {}).get(solver, {})
    ts = table.get(str(int(num_inference_steps)))
    return None if ts is None else [int(t) for t in ts]


def _save_fit(path: str, model: str, solver: str, steps: int, store: Callable[[dict], None], fit_info: dict) -> None:
    """Read (or start) the file at ``path``, let ``store(data)`` put the entry in, and replace the
    ``fits`` record of ``(solver, steps)`` with ``fit_info``."""
    p = Path(path)
    data = json.loads(p.read_text()) if p.is_file() else {"model": model, "schedules": {}, "fits": []}
    store(data)
    data["fits"] = [f for f in data["fits"] if not (f.get("solver") == solver and str(f.get("steps")) == str(steps))]
    data["fits"].append({"solver": solver, "steps": int(steps), **fit_info})
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(data, indent=1) + "\n")


def save_schedule(path: str, model: str, solver: str, timesteps: Sequence[int], fit_info: dict) -> None:
    """Add (or replace) the grid of ``solver`` at ``len(timesteps)`` steps in the file at ``path``."""
    grid = [int(t) for t in timesteps]

    def store(data):
        data["schedules"].setdefault(solver, {})[str(len(grid))] = grid
    _save_fit(path, model, solver, len(grid), store, fit_info)


def saved_bespoke(name_or_path: str, num_inference_steps: int) -> Optional[dict]:
    """The learned solver for ``num_inference_steps`` model calls in a schedule file (see
    ``samplers/solvers/bespoke.py``): ``{"timesteps": [N], "coefficients": [N + 1][N + 1], ...}``, or ``None``."""
    return load_schedule(name_or_path).get("bespoke", {}).get(str(int(num_inference_steps)))


def save_bespoke(path: str, model: str, entry: dict, fit_info: dict) -> None:
    """Add (or replace) the learned solver with ``len(entry["timesteps"])`` calls in the file at ``path``;
    ``fit_info`` joins the file's ``fits`` list under ``solver="bespoke"``."""
    n = len(entry["timesteps"])

    def store(data):
        data.setdefault("bespoke", {})[str(n)] = entry
    _save_fit(path, model, "bespoke", n, store, fit_info)


def fit_timesteps(
    loss_fn: Callable[[List[int]], float],
    init: Sequence[int],
    num_train_timesteps: int = 1000,
    deltas: Sequence[int] = (64, 32, 16, 8, 4, 2, 1),
    sweeps: int = 2,
    keep_first: bool = True,
) -> Tuple[List[int], List[float]]:
    """Coordinate descent over a strictly descending integer grid.

    Args:
        loss_fn: ``loss_fn(timesteps [N]) -> float`` (lower is better), e.g. the distance of a few-step
            solve on that grid to a many-step reference.
        init: the starting grid ``[N]``, descending.
        deltas: move sizes, coarse to fine; each is swept ``sweeps`` times over all positions.
        keep_first: keep ``init[0]`` (the noisiest step, normally ``T - 1``: the sampler starts from pure
            noise there, so moving it changes the starting distribution rather than the discretisation).
    Returns:
        ``(best grid, loss after each accepted move; the first entry is the loss of init)``.
    """
    ts = [int(t) for t in init]
    T = num_train_timesteps
    best = loss_fn(ts)
    trace = [best]
    for delta in deltas:
        for _ in range(sweeps):
            improved = False
            for i in range(1 if keep_first else 0, len(ts)):
                hi = ts[i - 1] - 1 if i > 0 else T - 1
                lo = ts[i + 1] + 1 if i + 1 < len(ts) else 0
                for cand in (ts[i] - delta, ts[i] + delta):
                    if not lo <= cand <= hi:
                        continue
                    trial = ts[:i] + [cand] + ts[i + 1 :]
                    val = loss_fn(trial)
                    if val < best:
                        best, ts, improved = val, trial, True
                        trace.append(best)
                        break
            if not improved:
                break
    return ts, trace


def fitted_or_default(config, solver: str, num_inference_steps: int) -> Optional[List[int]]:
    """For a scheduler's ``set_timesteps``: the fitted grid named by ``config.fitted_schedule`` for this
    solver and step count, or ``None`` (use the default spacing)."""
    name = config.get("fitted_schedule") if hasattr(config, "get") else None
    if not name:
        return None
    return saved_timesteps(name, solver, num_inference_steps)
