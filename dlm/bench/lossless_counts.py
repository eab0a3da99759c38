"""What a lossless draft-and-verify call's tally says about its rounds (`sampler="lossless"`, issue 50).

A verification pass is one forward over `depth` candidate rows per row: the driver counts it as 1 forward
(`nfe`) and `depth` branch forwards; every other pass is plain (1 and 1). A round (one driver step, one
`(block, step)` of the step trace) either verifies, or commits exactly one base step without a pass (the
block's last step, or no pass left in the budget). So, from a call's `nfe`, `branch_forwards`, its base steps
(`sum(schedule_steps_per_block)`) and its rounds:

    passes V     = (branch_forwards - nfe) / (depth - 1)
    plain P      = nfe - V
    acceptance   = (steps - (rounds - V)) / V      base steps per verification pass, at most depth

Used by scripts/bench_lossless.py and the GPU report's `engine_lossless` section; tested against models on
which every draft, or none, is right (tests/dlm/test_bench_lossless_script.py).
"""
from __future__ import annotations


def verification_passes(nfe: int, branch_forwards: int, depth: int) -> int:
    """V of the module docstring; ValueError when the counts cannot come from `depth`-row passes."""
    extra = branch_forwards - nfe
    if extra < 0 or extra % (depth - 1):
        raise ValueError(f"branch forwards - nfe = {extra} is not a non-negative multiple of depth - 1 = {depth - 1}")
    return extra // (depth - 1)


def acceptance(steps: int, rounds: int, passes: int) -> float | None:
    """Base steps committed per verification pass (None without a pass)."""
    return (steps - (rounds - passes)) / passes if passes else None


class RoundCounter:
    """A `dlm.generate(callback=...)` that counts the call's rounds: distinct `(block, step)` of its trace."""

    def __init__(self):
        self.seen: set = set()

    def __call__(self, trace) -> None:
        self.seen.add((trace.block, trace.step))

    @property
    def rounds(self) -> int:
        return len(self.seen)
