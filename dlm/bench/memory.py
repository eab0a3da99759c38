"""Peak memory of a benchmark pair: CUDA's allocator peak, or the CPU process's sampled resident set size."""
from __future__ import annotations

import os
import threading

import torch


class PeakMemory:
    """Peak memory above the starting level during a `with` block, in MiB (see module docstring)."""

    def __init__(self, device: torch.device):
        self.device = torch.device(device)
        self.peak_mb: float | None = None
        self.method = "cuda_max_memory_allocated" if self.device.type == "cuda" else "rss_peak_sampled_5ms"

    @staticmethod
    def _rss() -> int | None:
        try:
            with open("/proc/self/statm") as f:
                return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):
            return None

    def __enter__(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self._base = torch.cuda.memory_allocated(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            return self
        self._base = self._rss()
        self._max = self._base
        self._stop = threading.Event()
        if self._base is not None:
            def poll():
                while not self._stop.wait(0.005):
                    rss = self._rss()
                    if rss is not None and rss > self._max:
                        self._max = rss
            self._thread = threading.Thread(target=poll, daemon=True)
            self._thread.start()
        else:
            self.method = "unavailable"
        return self

    def __exit__(self, *exc):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.peak_mb = (torch.cuda.max_memory_allocated(self.device) - self._base) / 2**20
            return False
        if self._base is None:
            return False
        self._stop.set()
        self._thread.join()
        rss = self._rss()
        self._max = max(self._max, rss or 0)
        self.peak_mb = (self._max - self._base) / 2**20
        return False
