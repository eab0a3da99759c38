"""A watchdog for the one GPU run: a traceback in the log when a section hangs, and the partial report on
disk before the run is killed.

A hang on a GPU (a kernel that never finishes, a deadlocked collective, a compile that does not end)
leaves the main thread inside C code, where no Python signal handler runs. So a daemon thread watches the
clock instead:
- when the running section has taken longer than its `hang_s`, it writes every thread's Python stack
  (`faulthandler.dump_traceback`) to the log once: the report then says where it stuck;
- past the run's hard limit it calls `on_hard_limit` (the report writer: the sections measured so far,
  the running one marked as cut) and ends the process with exit code 124, before an outer `timeout`
  or the machine's own limit kills it without a word.
"""
from __future__ import annotations

import contextlib
import faulthandler
import os
import threading
import time
from typing import Callable, TextIO


class Watchdog:
    """See the module docstring. `files`: where stacks are dumped (real files: faulthandler writes to
    their descriptors); `hard_limit_s`: seconds from now to the forced stop (None: never);
    `exit`: how the process ends (tests pass a recorder instead of `os._exit`)."""

    def __init__(self, files: list[TextIO], hard_limit_s: float | None, on_hard_limit: Callable[[str], None],
                 log: Callable[[str], None], poll_s: float = 0.5, exit: Callable[[int], None] = os._exit):
        self.files, self.on_hard_limit, self.log, self.poll_s, self.exit = files, on_hard_limit, log, poll_s, exit
        self.hard_deadline = None if hard_limit_s is None else time.monotonic() + hard_limit_s
        self.current: tuple[str, float, float] | None = None  # (section, started, hang_s)
        self.dumped = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="gpu-report-watchdog", daemon=True)
        self._thread.start()

    @contextlib.contextmanager
    def section(self, name: str, hang_s: float):
        """Watch `name` while the block runs: a stack dump if it runs past `hang_s` seconds."""
        self.current, self.dumped = (name, time.monotonic(), hang_s), False
        try:
            yield
        finally:
            self.current = None

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _dump(self, header: str) -> None:
        for f in self.files:
            try:
                f.write(header + "\n")
                f.flush()
                faulthandler.dump_traceback(file=f, all_threads=True)
                f.flush()
            except (OSError, ValueError):  # a closed or pseudo file: the other one still gets it
                pass

    def _watch(self) -> None:
        while not self._stop.wait(self.poll_s):
            now = time.monotonic()
            current = self.current
            if current is not None and not self.dumped and now - current[1] > current[2]:
                self.dumped = True
                self._dump(f"watchdog: section {current[0]} has run {now - current[1]:.0f} s (more than its "
                           f"{current[2]:.0f} s): every thread's stack follows")
            if self.hard_deadline is not None and now > self.hard_deadline:
                name = current[0] if current else "between sections"
                self._dump(f"watchdog: the run's hard limit passed during {name}: writing the partial report "
                           "and stopping (stacks follow)")
                try:
                    self.on_hard_limit(name)
                finally:
                    self.log("watchdog: stopped at the hard limit (exit 124)")
                    self.exit(124)
                return
