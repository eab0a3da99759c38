"""The solvers' guard against a model output holding NaN or inf.

A half-precision denoiser that overflows returns NaN or inf; every solver step mixes that output
into the whole sample, so without a check the pipeline decodes a black (or noise) image and says
nothing. Each solver's ``step`` calls :func:`check_model_output` once on the output it consumes.

Cost: one reduction over ``model_output`` and one read of its boolean result. On a GPU that read
waits for the model's forward; the steps of DDIM, PNDM, DPM++ and UniPC already read their
timestep on the host (``as_index``), so in a diffusers pipeline, whose timesteps live on the
device, the wait is already paid and the check adds only its own reduction.
"""
from __future__ import annotations

import torch


def check_model_output(model_output: torch.Tensor, solver, timestep, step: int | None = None) -> None:
    """Raise ValueError naming the step and the likely fix when ``model_output`` is not all finite.

    Args:
        model_output: ``[B, C, ...]`` the denoiser's prediction handed to ``solver.step``.
        solver: the scheduler (its class name and ``timesteps`` go into the message).
        timestep: the timestep ``step`` was called with.
        step: 0-based index of the step in ``solver.timesteps`` (looked up from ``timestep`` if None).
    """
    finite = torch.isfinite(model_output)
    if bool(finite.all()):
        return
    bad = int(finite.numel() - finite.sum())  # error path only: the extra reads cost nothing here
    t = float(timestep.reshape(-1)[0]) if isinstance(timestep, torch.Tensor) else float(timestep)
    if step is None:
        grid = [float(u) for u in getattr(solver, "timesteps", [])]
        step = min(range(len(grid)), key=lambda i: abs(grid[i] - t)) if grid else None
    where = f"step {step} (timestep {t:g})" if step is not None else f"timestep {t:g}"
    raise ValueError(
        f"{type(solver).__name__}.step: model_output at {where} has {bad} of {finite.numel()} non-finite "
        f"values (NaN/inf), dtype {model_output.dtype}; the denoiser overflowed or was fed bad inputs. "
        "Run it in float32 or bfloat16 (e.g. pipe.to(torch.float32)), or check its weights and inputs")
