"""Shared plumbing of the caches: step tracking, per-branch state, hook registration, block I/O.

Every cache in this package is a set of diffusers ``ModelHook`` objects registered through
``HookRegistry.check_if_exists_or_initialize`` (the diffusers hooks contract) plus one root hook on
the denoiser (UNet or transformer) that owns a :class:`StepTracker`.

Why a tracker instead of diffusers' ``cache_context``: only some pipelines (Flux, CogVideoX) open a
cache context, so caches keyed on it do nothing or fail on UNets, SD3, PixArt, img2img pipelines and
custom pipelines. The tracker reads the ``timestep`` argument of every denoiser call instead:

- timesteps fall within one sampling run, so a timestep *higher* than the previous call's starts a
  new run (text-to-image or img2img alike) and every cached tensor is dropped;
- an *equal* timestep is another classifier-free-guidance pass of the same step (pipelines that run
  the conditional and unconditional branches as separate calls), which gets its own state;
- a *lower* timestep is the next step.

A scheduler that evaluates the model twice at one timestep (Heun-type) is seen as two branches,
which is still correct, only less effective. ``caching.reset(model)`` forces a reset.

Non-finite features (a half-precision model that overflowed) are never reused: at the start of
every denoiser call the tracker checks the tensors stored since the last check (one reduction each,
queued before the call's timestep read, which then waits for them too; the flag is read after it)
and, if any holds NaN or inf, drops every cached tensor so that this call recomputes them
(``counters["nonfinite_dropped"]`` counts it). We recompute rather than raise: the fault may be a one-off, and if the model really
emits NaN the solver's own check (``samplers.solvers._finite``) stops the run with a clear error.
"""
from __future__ import annotations

import inspect
import weakref
from collections import Counter
from typing import Any, Callable

import torch
from diffusers.hooks import HookRegistry, ModelHook

HOOK_PREFIX = "dlm_caching"


class StepTracker:
    """Step index, CFG branch and per-branch tensor state of one cached denoiser.

    ``step``: 0-based denoising step within the current pipeline call. ``branch``: 0 for the first
    call at a timestep, 1 for the second (separate CFG pass), ... ``counters``: how much work the
    hooks did and skipped (for tests and benchmarks; reset only by :meth:`clear_counters`).
    """

    def __init__(self) -> None:
        self.counters: Counter = Counter()
        self.reset()

    def reset(self) -> None:
        self.last_t: float | None = None
        self.step = 0
        self.branch = 0
        self.calls = 0
        self._states: dict[int, dict[str, Any]] = {}
        # id -> tensor already checked finite (weak: a replaced feature is freed at once)
        self._checked: weakref.WeakValueDictionary = weakref.WeakValueDictionary()

    def clear_counters(self) -> None:
        self.counters.clear()

    def begin(self, t: float, nonfinite: torch.Tensor | None = None) -> None:
        """Advance on a new denoiser call at timestep ``t`` (see the module docstring); ``nonfinite``
        is :meth:`check_stored`'s flag, taken before ``t`` was read."""
        if self.last_t is None or t > self.last_t:
            self.reset()
            self.counters["runs"] += 1
        elif nonfinite is not None and bool(nonfinite):
            self._states = {}  # no cached feature is reused: this call recomputes them all
            self.counters["nonfinite_dropped"] += 1
        elif t == self.last_t:
            self.branch += 1
        else:
            self.step += 1
            self.branch = 0
        self.last_t = t
        self.calls += 1

    def check_stored(self) -> torch.Tensor | None:
        """Start the check of the tensors stored since the last call: a 0-d bool tensor on their device
        (True: one holds NaN or inf), or None when nothing new was stored. Nothing is read here."""
        return stored_nonfinite(self._states, self._checked) if self._states else None

    @property
    def state(self) -> dict[str, Any]:
        """Tensors cached for the current CFG branch (a plain dict, dropped on reset)."""
        return self._states.setdefault(self.branch, {})


def _tensors(obj, depth: int = 0):
    """The floating-point tensors inside a cache state (dicts, lists, tuples, small objects)."""
    if isinstance(obj, torch.Tensor):
        if obj.is_floating_point() or obj.is_complex():
            yield obj
    elif depth > 4 or obj is None or isinstance(obj, (str, bytes, int, float, bool, torch.nn.Module)):
        return
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _tensors(v, depth + 1)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _tensors(v, depth + 1)
    elif hasattr(obj, "__dict__"):  # e.g. module_forecast.TaylorFactors
        yield from _tensors(vars(obj), depth + 1)


def stored_nonfinite(states: dict, checked: weakref.WeakValueDictionary) -> torch.Tensor | None:
    """A 0-d bool tensor: whether a tensor stored in ``states`` since the last call holds NaN or inf
    (None when none is new). Each tensor is checked once (``checked`` remembers it); the result is
    left on the device (on the first tensor's device when the cache spans several)."""
    flags = []
    for x in _tensors(states):
        if checked.get(id(x)) is not x:
            flags.append(torch.isfinite(x).all())
            checked[id(x)] = x
    if not flags:
        return None
    return ~torch.stack([f.to(flags[0].device) for f in flags]).all()


def timestep_reader(module: torch.nn.Module) -> Callable[[tuple, dict], float]:
    """A function ``(args, kwargs) -> float`` returning the ``timestep`` argument of ``module.forward``.

    Raises ValueError if the forward has no ``timestep`` parameter (the tracker needs it).
    """
    sig = inspect.signature(module.forward)
    names = list(sig.parameters)
    if "timestep" not in names:
        raise ValueError(f"{type(module).__name__}.forward has no `timestep` argument; caching hooks need the "
                         "denoiser (a diffusers UNet or transformer), not one of its sub-modules")
    pos = names.index("timestep")

    def read(args: tuple, kwargs: dict) -> float:
        t = kwargs["timestep"] if "timestep" in kwargs else args[pos]
        # one host read per denoiser call: the run/step/branch decision is Python control flow
        return float(torch.as_tensor(t).reshape(-1)[0])

    return read


class RootHook(ModelHook):
    """Root hook on the denoiser: advances the tracker, then runs ``around(forward, args, kwargs)``.

    ``around`` defaults to calling the forward unchanged; T-GATE passes one that halves the batch.
    """

    _is_stateful = True

    def __init__(self, tracker: StepTracker, read_t, around=None) -> None:
        super().__init__()
        self.tracker, self.read_t, self.around = tracker, read_t, around

    def new_forward(self, module, *args, **kwargs):
        # The check of the stored features is queued before the timestep is read, so that one read
        # (the timestep's, on the device in a pipeline) waits for both.
        nonfinite = self.tracker.check_stored()
        self.tracker.begin(self.read_t(args, kwargs), nonfinite)
        if self.around is None:
            return self.fn_ref.original_forward(*args, **kwargs)
        return self.around(self.fn_ref.original_forward, args, kwargs)

    def reset_state(self, module):
        self.tracker.reset()
        return module


def register(module: torch.nn.Module, hook: ModelHook, name: str) -> None:
    HookRegistry.check_if_exists_or_initialize(module).register_hook(hook, f"{HOOK_PREFIX}.{name}")


def remove_hooks(model: torch.nn.Module) -> int:
    """Remove every hook of this package from ``model`` and its sub-modules; returns how many."""
    removed = 0
    for m in model.modules():
        reg = getattr(m, "_diffusers_hook", None)
        if reg is None:
            continue
        for name in [n for n in reg.hooks if n.startswith(HOOK_PREFIX)]:
            reg.remove_hook(name, recurse=False)
            removed += 1
        if not reg.hooks:  # leave the module exactly as it was: class forward, no registry
            del m._diffusers_hook
            m.__dict__.pop("forward", None)
    return removed


# -- transformer blocks: where the hidden states are in a block's inputs and outputs ---------------

def block_return_indices(block: torch.nn.Module) -> tuple[int | None, int | None]:
    """``(hidden index, encoder index)`` in a block's tuple output, from diffusers' block registry.

    ``(None, None)`` means the block returns the hidden-states tensor alone.
    """
    from diffusers.hooks._helpers import TransformerBlockRegistry

    try:
        meta = TransformerBlockRegistry.get(type(block))
    except ValueError:
        return None, None
    if meta.return_encoder_hidden_states_index is None:
        return None, None
    return meta.return_hidden_states_index, meta.return_encoder_hidden_states_index


def split_output(out, indices) -> tuple[torch.Tensor, torch.Tensor | None]:
    hi, ei = indices
    if hi is None:
        return (out[0] if isinstance(out, tuple) else out), None
    return out[hi], out[ei]


def join_output(hidden, encoder, indices):
    hi, ei = indices
    if hi is None:
        return hidden
    out = [None, None]
    out[hi], out[ei] = hidden, encoder
    return tuple(out)


def block_inputs(block: torch.nn.Module) -> Callable[[tuple, dict], tuple[torch.Tensor, torch.Tensor | None]]:
    """A function ``(args, kwargs) -> (hidden_states, encoder_hidden_states or None)`` for ``block``."""
    names = list(inspect.signature(block.forward).parameters)
    hpos = names.index("hidden_states")
    epos = names.index("encoder_hidden_states") if "encoder_hidden_states" in names else None

    def read(args, kwargs):
        h = kwargs["hidden_states"] if "hidden_states" in kwargs else args[hpos]
        if epos is None:
            return h, None
        e = kwargs["encoder_hidden_states"] if "encoder_hidden_states" in kwargs else (
            args[epos] if len(args) > epos else None)
        return h, e

    return read


def find_blocks(model: torch.nn.Module) -> torch.nn.ModuleList:
    """The transformer's main block list (``transformer_blocks``); ValueError for UNets and others."""
    blocks = getattr(model, "transformer_blocks", None)
    if isinstance(blocks, torch.nn.ModuleList) and len(blocks) > 0:
        return blocks
    hint = " (a UNet: use DeepCacheConfig or TGateConfig)" if hasattr(model, "up_blocks") else ""
    raise ValueError(f"{type(model).__name__} has no `transformer_blocks` list to cache{hint}")
