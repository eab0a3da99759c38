"""Choose, once per process, whether kernels run through Triton or the torch reference."""

import functools
import os

import torch


@functools.lru_cache(maxsize=None)
def triton_available() -> bool:
    """True when Triton can run: a CUDA device, or the CPU interpreter (TRITON_INTERPRET=1).

    The interpreter flag is read by Triton at import time, so it must be set before Triton is
    imported; we read it here once and never re-decide (the backend is chosen once).
    """
    if not (torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"):
        return False
    try:
        import triton  # noqa: F401
    except Exception:  # Triton missing or broken: the reference is always correct.
        return False
    return True


def use_triton(t: torch.Tensor) -> bool:
    """Triton path for this tensor: CUDA tensors on GPU, any tensor under the interpreter."""
    if not triton_available():
        return False
    if os.environ.get("TRITON_INTERPRET") == "1":
        return True
    return t.is_cuda
