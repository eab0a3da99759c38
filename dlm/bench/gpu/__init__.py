"""The GPU report's building blocks: one context, timing and peak-memory helpers, one module per section.

`scripts/gpu_report.py` runs every section in one process and writes report.json / report.md / report.log.
Each section module exposes `run(ctx: ReportContext) -> dict` returning plain JSON data (numbers, strings,
lists, dicts), `MIN_START_S` (the seconds it needs: it is not started with less left before the deadline)
and a markdown renderer; a section never prints except through `ctx.log`, and never raises for a
shortfall (a target not met is data: `{"target": ..., "met": False}`). A section made of parts runs each
through `run_part` (its own start minimum and error guard) and hands its result so far to `ctx.save`
after each, so what was measured reaches the disk before the next part starts. `ctx.smoke` asks for the
tiny CPU version of the same code path (seconds), which the test suite runs so that the script cannot rot
between GPU runs.
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
    save: Callable[[dict], None] = lambda partial: None
    raise_errors: bool | None = None

    def __post_init__(self):
        if self.raise_errors is None:
            self.raise_errors = self.smoke  # on CPU a failure is a bug the tests must see

    def time_left(self) -> float:
        return self.deadline - time.monotonic()

    def may_start(self, minimum_s: float) -> bool:
        """Whether a part needing about `minimum_s` seconds may start (always in smoke mode)."""
        return self.smoke or self.time_left() >= minimum_s

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def time_call(ctx: ReportContext, fn: Callable[[], object], *, reps: int = 10, warmup: int = 2,
              keep_output: bool = False) -> dict:
    """Wall time of `fn()` in milliseconds over `reps` runs after `warmup` runs.

    On CUDA every run is bracketed by device synchronisations, so the time is the device's, not
    the launch's. Returns {"ms": median, "min_ms", "max_ms", "reps"}: the median is the figure, the
    min/max range is the spread the report prints beside it; with `keep_output` also "out", the last
    run's return value (no extra run to see what was made).
    """
    for _ in range(warmup):
        fn()
    ctx.synchronize()
    times, out = [], None
    for _ in range(reps):
        start = time.perf_counter()
        out = fn()
        ctx.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    result = {"ms": statistics.median(times), "min_ms": min(times), "max_ms": max(times), "reps": reps}
    if keep_output:
        result["out"] = out
    return result


def enqueue_ms(ctx: ReportContext, fn: Callable[[], object], reps: int) -> float:
    """Median host time for `fn()` to return after a synchronisation, before its kernels finish: when it is
    close to the synchronised time, the host's dispatch of operations, not the GPU, sets the pace (on the
    CPU both are the same work)."""
    times = []
    for _ in range(reps):
        ctx.synchronize()
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    ctx.synchronize()
    return statistics.median(times)


def graphed_ms(ctx: ReportContext, fn: Callable[[], object], reps: int) -> float:
    """Median time of `fn` replayed from a CUDA graph (no per-operation host dispatch): the GPU's own time.
    Raises where a capture cannot run (CPU; an operation that syncs with the host)."""
    if ctx.device.type != "cuda":
        raise RuntimeError("CUDA graphs need a CUDA device")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up on a side stream (per-stream library workspaces), as capture requires
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    try:
        return time_call(ctx, graph.replay, reps=reps)["ms"]
    finally:
        del graph
        torch.cuda.empty_cache()


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


def error_entry(error: BaseException) -> dict:
    """What a failed part records: its error in one line and the end of its traceback."""
    import traceback

    return {"error": f"{type(error).__name__}: {error}"[:500], "traceback": traceback.format_exc()[-2000:]}


def run_part(ctx: ReportContext, name: str, minimum_s: float, fn: Callable[[], dict], out: dict,
             root: dict | None = None) -> None:
    """`out[name] = fn()` when at least `minimum_s` seconds are left (else a "skipped" entry saying so),
    with a failure recorded as `out[name] = error_entry(...)` (raised instead with `ctx.raise_errors`);
    then `ctx.save(root or out)` (`root`: the section's whole result, when `out` is a piece of it): the
    part's result is on disk before the next part starts."""
    if not ctx.may_start(minimum_s):
        out[name] = {"skipped": f"not started: needs about {minimum_s:.0f} s, {max(ctx.time_left(), 0):.0f} s left"}
        ctx.log(f"{name}: {out[name]['skipped']}")
    else:
        try:
            out[name] = fn()
        except Exception as error:  # noqa: BLE001 - one GPU window: record, go on with the next part
            if ctx.raise_errors:
                raise
            out[name] = error_entry(error)
            ctx.log(f"{name}: failed: {out[name]['error']}")
    ctx.save(out if root is None else root)


def tokens_up_to_eos(generated: torch.Tensor, eos_token_id: int) -> int:
    """Generated tokens counted per row up to and including the row's first EOS (all of the row when it
    has none), summed over rows: what a user receives. `generated`: `[B, N]` ids after the prompt."""
    is_eos = generated == eos_token_id
    first = torch.where(is_eos.any(dim=1), is_eos.long().argmax(dim=1) + 1,
                        torch.full_like(is_eos[:, 0], generated.shape[1], dtype=torch.long))
    return int(first.sum())
