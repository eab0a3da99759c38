"""`compile=True`: the decoding step's scoring run through `torch.compile`.

What is compiled is the part of a step that runs between two model forwards and that this project
owns: a sampler's `step` (statistics, scoring, selection, commit) in the masked loop and for our
samplers on a canvas, and the per-chunk statistics of DiffusionGemma's rule (the exponential race,
entropy, argmax of `samplers.unmasking.entropy_bound`). Shapes are static (`dynamic=False`): a block's
shape changes only when rows leave, which compiles one more graph. On CUDA the mode is
"reduce-overhead" (CUDA graphs: the step's dozens of small kernels replay as one launch) for
greedy steps; a step that draws from a `torch.Generator` keeps the default mode, since a graph would
replay the generator's state. The model's forward is left to the caller (`torch.compile(model)`),
where its own cache and shapes are known.

The compiled step chooses the same tokens as the eager one (tests/dlm/test_compiled_step.py, inductor
on CPU): every decision is an argmax, a comparison against a threshold or a sort of values that the
compiled kernels compute in the same float32/float64 precision.
"""
from __future__ import annotations

import functools
import shutil
from typing import Callable

import torch


def check_compile_backend(device: torch.device) -> None:
    """Raise ValueError naming `compile` when torch.compile cannot run here."""
    device = torch.device(device)
    dynamo = getattr(torch, "_dynamo", None)
    if dynamo is None or not dynamo.is_dynamo_supported():
        raise ValueError("compile=True needs torch.compile, which this Python/torch build does not support; "
                         "pass compile=False")
    if device.type == "cpu" and not any(shutil.which(cc) for cc in ("c++", "g++", "clang++")):
        raise ValueError("compile=True on CPU needs a C++ compiler for torch's inductor backend (none found on "
                         "PATH: install g++ or clang++), or pass compile=False")
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"compile=True is supported on CPU and CUDA devices, not {device.type!r}; pass compile=False")


@functools.lru_cache(maxsize=64)
def _compiled(fn: Callable, mode: str | None) -> Callable:
    return torch.compile(fn, dynamic=False, mode=mode)


def compiled(fn: Callable, device: torch.device, *, draws: bool) -> Callable:
    """`fn` compiled for `device` (see the module docstring); `draws`: whether it samples with a
    generator (no CUDA graphs then). Compiled once per function and mode in the process."""
    device = torch.device(device)
    check_compile_backend(device)
    mode = "reduce-overhead" if device.type == "cuda" and not draws else None
    return _compiled(fn, mode)


def compiled_sampler_step(policy, device: torch.device, temperature: float) -> Callable:
    """The `policy.step(logits, ctx)` to call when compiling: its function, compiled, bound to it."""
    step = compiled(type(policy).step, device, draws=temperature > 0)
    return functools.partial(step, policy)
