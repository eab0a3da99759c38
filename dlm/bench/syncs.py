"""Count the operations that make the host wait for the device, outside the model's own forward.

On a GPU, every device->host read (`.item()`, `bool(t)`, `.tolist()`, `.cpu()`, `nonzero`, a boolean
mask index, ...) stalls the host until the device queue drains: a decoding step that reads the device
four times cannot overlap the next launch with the current forward. On CUDA,
`torch.cuda.set_sync_debug_mode` reports them; on CPU nothing syncs, so `HostSyncCounter` counts the
calls that WOULD sync on a device by wrapping those tensor methods for the duration of a `with`
block. Calls made inside any `nn.Module` forward (the model's own code, e.g. a MoE router's
`nonzero`) are not counted: the engine's budget is about the engine.

    with HostSyncCounter() as syncs:
        dlm.generate(model, ids, ...)
    syncs.count, syncs.by_name  # total, and per operation name
"""
from __future__ import annotations

import collections
import threading

import torch
from torch.nn.modules import module as _module

_METHODS = ("item", "tolist", "cpu", "numpy", "nonzero", "__bool__", "__int__", "__float__", "__index__")
_FUNCTIONS = ("nonzero", "masked_select", "unique", "argwhere")


def _bool_index(index) -> bool:
    """Whether an index holds a boolean tensor (its selection size needs the host)."""
    if isinstance(index, torch.Tensor):
        return index.dtype == torch.bool
    if isinstance(index, tuple):
        return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in index)
    return False


class HostSyncCounter:
    """Context manager counting would-be device->host synchronisations (see module docstring).

    Attributes: count (int), by_name (Counter of operation names). Not re-entrant; one at a time.
    """

    _active = threading.Lock()

    def __init__(self):
        self.count = 0
        self.by_name: collections.Counter = collections.Counter()
        self._depth = 0
        self._saved: list = []

    def _hit(self, name: str) -> None:
        if self._depth == 0:
            self.count += 1
            self.by_name[name] += 1

    def _wrap(self, owner, name: str, label: str, check=None):
        original = getattr(owner, name)
        counter = self

        def wrapper(*args, **kwargs):
            if check is None or check(args):
                counter._hit(label)
            return original(*args, **kwargs)

        self._saved.append((owner, name, original))
        setattr(owner, name, wrapper)

    def __enter__(self):
        if not self._active.acquire(blocking=False):
            raise RuntimeError("HostSyncCounter is already active")
        for name in _METHODS:
            self._wrap(torch.Tensor, name, f"Tensor.{name}")
        for name in _FUNCTIONS:
            self._wrap(torch, name, f"torch.{name}")
        self._wrap(torch.Tensor, "__getitem__", "bool-mask index", check=lambda a: _bool_index(a[1]))
        self._wrap(torch.Tensor, "__setitem__", "bool-mask assign", check=lambda a: _bool_index(a[1]))
        self._wrap(torch.Tensor, "repeat_interleave", "repeat_interleave(tensor)",
                   check=lambda a: len(a) > 1 and isinstance(a[1], torch.Tensor) and a[1].numel() > 1)

        def enter(module, args):
            self._depth += 1

        def leave(module, args, output):
            self._depth -= 1

        self._hooks = (_module.register_module_forward_pre_hook(enter), _module.register_module_forward_hook(leave))
        return self

    def __exit__(self, *exc):
        for hook in self._hooks:
            hook.remove()
        for owner, name, original in reversed(self._saved):
            setattr(owner, name, original)
        self._saved.clear()
        self._active.release()
        return False
