"""`compile=True`: the decoding step's scoring run through `torch.compile`.

What is compiled is the part of a step that runs between two model forwards and that this project
owns: a sampler's `step` (statistics, scoring, selection, commit) in the masked loop and for our
samplers on a canvas, and the per-chunk statistics of DiffusionGemma's rule (the exponential race,
entropy, argmax of `samplers.unmasking.entropy_bound`). Shapes are static (`dynamic=False`): a block's
shape changes only when rows leave, which compiles one more graph; the step's inputs are handed over
with row-major strides (`compiled_sampler_step`), so one call compiles one graph. On CUDA the mode is
"reduce-overhead" (CUDA graphs: the step's dozens of small kernels replay as one launch) for
greedy steps; a step that draws from a `torch.Generator` keeps the default mode, since a graph would
replay the generator's state. The model's forward is left to the caller (`torch.compile(model)`),
where its own cache and shapes are known.

The compiled step chooses the same tokens as the eager one (tests/dlm/test_compiled_step.py, inductor
on CPU): every decision is an argmax, a comparison against a threshold or a sort of values that the
compiled kernels compute in the same float32/float64 precision.
"""
from __future__ import annotations

import dataclasses
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


def standard_strides(t: torch.Tensor) -> torch.Tensor:
    """`t` itself when its strides are the row-major ones of its shape, else a row-major copy.

    `dynamic=False` guards on exact strides, also those of size-1 dimensions, which `.contiguous()`
    leaves alone (it returns a `[1, 32, V]` slice of a `[1, L, V]` forward with its stride `L * V`):
    `clone(memory_format=torch.contiguous_format)` writes fresh strides. Reading `t.stride()` is host
    metadata, no device sync."""
    expected, size = [], 1
    for n in reversed(t.shape):
        expected.append(size)
        size *= n
    if t.stride() == tuple(reversed(expected)):
        return t
    return t.clone(memory_format=torch.contiguous_format)


_CONTEXT_TENSORS = ("x", "candidates", "num_transfer", "rows", "hidden")


def compiled_sampler_step(policy, device: torch.device, temperature: float) -> Callable:
    """The `policy.step(logits, ctx)` to call when compiling: its function, compiled, bound to it.

    The compiled function is handed `logits` and the context's tensors with row-major strides
    (`standard_strides`), so that its guards see only shapes. The masked loop passes a block's logits
    as a slice of a forward whose length grows block by block (with the prefix cache the block's first
    step runs prompt + blocks so far): with the slice's own strides every block compiled a graph of its
    own, and at 256 tokens in blocks of 32 torch's limit of 8 recompilations sent the ninth block back
    to eager (tests/dlm/test_compiled_step.py counts one graph per call). The copy is made only when a
    stride differs: one [B, Lb, V] table where the loop passes a slice (a few microseconds on a GPU,
    beside a forward of milliseconds)."""
    draws = temperature > 0
    step = compiled(type(policy).step, device, draws=draws)
    graphs = torch.device(device).type == "cuda" and not draws

    def call(logits: torch.Tensor, ctx):
        fields = {name: standard_strides(getattr(ctx, name)) for name in _CONTEXT_TENSORS
                  if isinstance(getattr(ctx, name, None), torch.Tensor)}
        changed = {name: t for name, t in fields.items() if t is not getattr(ctx, name)}
        if changed:
            ctx = dataclasses.replace(ctx, **changed)
        if graphs:
            # each step is a new generation of CUDA-graph outputs: the loop is done with the previous
            # step's result (it copies the new tokens into its canvas) before it calls the next one
            torch.compiler.cudagraph_mark_step_begin()
        return step(policy, standard_strides(logits), ctx)
    return call
