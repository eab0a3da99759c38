"""The GPU report's building blocks: one context, timing and peak-memory helpers, one module per section.

`scripts/gpu_report.py` runs every section in one process and writes report.json / report.md. Each
section module exposes `run(ctx: ReportContext) -> dict` returning plain JSON data (numbers, strings,
lists, dicts); a section never prints except through `ctx.log`, and never raises for a shortfall (a
target not met is data: `{"target": ..., "met": False}`). `ctx.smoke` asks for the tiny CPU version of
the same code path (seconds), which the test suite runs so that the script cannot rot between GPU runs.
"""
from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

import torch


@dataclass
class ReportContext:
    """What every section gets.

    device: where models and tensors live ("cuda" on the GPU run, "cpu" in smoke mode).
    dtype: the model dtype of the run (bfloat16 on the GPU, float32 in smoke mode).
    smoke: run at tiny sizes (CPU, seconds) instead of the real shapes.
    deadline: `time.monotonic()` value after which sections should skip remaining work (and say so).
    log: a callable taking one line of progress text.
    facts: results other sections may read (e.g. "copy_gbps" from the machine section).
    """

    device: torch.device
    dtype: torch.dtype
    smoke: bool
    deadline: float
    log: Callable[[str], None] = print
    facts: dict = field(default_factory=dict)

    def time_left(self) -> float:
        return self.deadline - time.monotonic()

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def time_call(ctx: ReportContext, fn: Callable[[], object], *, reps: int = 10, warmup: int = 2) -> dict:
    """Wall time of `fn()` in milliseconds over `reps` runs after `warmup` runs.

    On CUDA every run is bracketed by device synchronisations, so the time is the device's, not
    the launch's. Returns {"ms": median, "min_ms", "max_ms", "reps"}: the median is the figure, the
    min/max range is the spread the report prints beside it.
    """
    for _ in range(warmup):
        fn()
    ctx.synchronize()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        ctx.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    return {"ms": statistics.median(times), "min_ms": min(times), "max_ms": max(times), "reps": reps}


def _status_kib(name: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(name):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def peak_extra_bytes(ctx: ReportContext, fn: Callable[[], object]) -> int | None:
    """Peak memory above the level at the call, while `fn()` runs, in bytes.

    CUDA: the caching allocator's peak of allocated bytes minus the allocated bytes before.
    CPU: the process's peak resident set (VmHWM, reset through /proc/self/clear_refs) minus the
    resident set before; exact for tensors only when large blocks are their own mappings
    (`MALLOC_MMAP_THRESHOLD_=65536` in the environment at process start), else glibc may keep
    freed memory in the heap. None where neither is available.
    """
    if ctx.device.type == "cuda":
        torch.cuda.synchronize(ctx.device)
        base = torch.cuda.memory_allocated(ctx.device)
        torch.cuda.reset_peak_memory_stats(ctx.device)
        fn()
        torch.cuda.synchronize(ctx.device)
        return int(torch.cuda.max_memory_allocated(ctx.device) - base)
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return None
    base = _status_kib("VmRSS")
    fn()
    peak = _status_kib("VmHWM")
    if base is None or peak is None:
        return None
    return max(0, peak - base) * 1024


def mallopt_live_env() -> dict:
    """The environment a child process needs for `peak_extra_bytes` to track live tensors on CPU."""
    return dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
