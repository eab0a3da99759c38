"""The solvers' guard against a model output holding NaN or inf.

A half-precision denoiser that overflows returns NaN or inf; every solver step mixes that output
into the whole sample, so without a check the pipeline decodes a black (or noise) image and says
nothing. Each solver's ``step`` calls :func:`check_model_output` once on the output it consumes.

Cost: one reduction over ``model_output`` per step, and no new host sync. On the CPU the result is
read at once and the error raised at the faulty step. On an accelerator reading it would make the
host wait for the device every step, so the step only folds it into a device-side "first faulty
step" scalar, and the last step of the run reads that scalar once (the pipeline reads its result
right after anyway) and raises there, naming the first faulty step.
"""
from __future__ import annotations

import torch


def _defer(model_output: torch.Tensor) -> bool:
    """Whether the check waits for the run's last step (on an accelerator) or reads now (CPU)."""
    return model_output.device.type != "cpu"


def check_model_output(model_output: torch.Tensor, solver, timestep, step: int | None = None,
                       last: bool | None = None) -> None:
    """Raise ValueError naming the step and the likely fix when ``model_output`` is not all finite.

    Args:
        model_output: ``[B, C, ...]`` the denoiser's prediction handed to ``solver.step``.
        solver: the scheduler (its class name and ``timesteps`` go into the message).
        timestep: the timestep ``step`` was called with.
        step: 0-based index of this call in ``solver.timesteps`` (None: not known on the host).
        last: whether this is the run's last call (default: ``step == len(solver.timesteps) - 1``).
    """
    finite = torch.isfinite(model_output).all()
    if last is None:
        last = step is not None and step == len(solver.timesteps) - 1
    if not _defer(model_output):
        if not bool(finite):
            _raise(model_output, solver, timestep, step)
        return
    # Device-side "first faulty step" (-1: none yet), kept per timestep grid: a new set_timesteps()
    # makes a new grid tensor, which drops a flag left by a run that was abandoned midway.
    grid, first = getattr(solver, "_nonfinite_first", (None, None))
    if grid is not solver.timesteps or first is None:
        first = torch.full((), -1, dtype=torch.long, device=model_output.device)
    here = torch.full_like(first, -2 if step is None else step)  # -2: a step whose index is unknown
    first = torch.where((first == -1) & ~finite, here, first)
    solver._nonfinite_first = (solver.timesteps, first)
    if last:
        solver._nonfinite_first = (None, None)
        bad = int(first)  # the run's one read of the flag
        if bad != -1:
            _raise(model_output, solver, None, None if bad == -2 else bad)


def _raise(model_output, solver, timestep, step) -> None:
    where = f"step {step}" if step is not None else "a step"
    if timestep is not None:
        t = float(timestep.reshape(-1)[0]) if isinstance(timestep, torch.Tensor) else float(timestep)
        where += f" (timestep {t:g})"
    finite = torch.isfinite(model_output)
    count = (f"{int(finite.numel() - finite.sum())} of {finite.numel()} values are" if timestep is not None
             else "some values were")
    raise ValueError(
        f"{type(solver).__name__}.step: the model output at {where} is not finite: {count} NaN or inf "
        f"(dtype {model_output.dtype}); the denoiser overflowed or was fed bad inputs. Run it in float32 or "
        "bfloat16 (e.g. pipe.to(torch.float32)), or check its weights and inputs")
