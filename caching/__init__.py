"""caching package: reuse across denoising steps, as diffusers hooks, on any UNet or transformer.

    import caching
    tracker = caching.apply(pipe, caching.TGateConfig(gate_step=10))   # or a bare model
    images = pipe(...)                                                  # state resets every call
    caching.remove(pipe)                                                # original forward back

One entry point dispatching on the config type:

- :class:`TGateConfig` (``caching.tgate``): cross-attention caching after a gate step, CFG dropped;
- :class:`BlockCacheConfig` (``caching.block_cache``): adaptive middle-block residual caching;
- :class:`DeepCacheConfig` (``caching.deepcache``): fixed-interval deep-feature / block inheritance;
- :class:`ForecastConfig` (``caching.module_forecast``): TaylorSeer forecasts of every block's attention and
  feed-forward outputs, on a fixed or adaptive schedule;
- :class:`StepRehashConfig` (``caching.step_rehash``): adaptive reuse of a UNet's deep branch (Step Rehash).

No pipeline cooperation is needed (no ``cache_context``): see ``caching._core`` for how calls, steps
and CFG branches are told apart.
"""
from __future__ import annotations

from dataclasses import fields

import torch

from ._core import StepTracker, remove_hooks
from .block_cache import BlockCacheConfig, apply_block_cache
from .deepcache import DeepCacheConfig, apply_deepcache
from .module_forecast import ForecastConfig, apply_forecast
from .step_rehash import StepRehashConfig, apply_step_rehash
from .tgate import TGateConfig, apply_tgate

#: CLI names -> config classes (``dlm image --cache NAME[:key=value,...]``)
CACHES = {"tgate": TGateConfig, "block": BlockCacheConfig, "deepcache": DeepCacheConfig, "rehash": StepRehashConfig,
          "forecast": ForecastConfig}
_APPLY = {TGateConfig: apply_tgate, BlockCacheConfig: apply_block_cache, DeepCacheConfig: apply_deepcache,
          StepRehashConfig: apply_step_rehash, ForecastConfig: apply_forecast}

__all__ = ["CACHES", "BlockCacheConfig", "DeepCacheConfig", "ForecastConfig", "StepRehashConfig", "StepTracker", "TGateConfig", "apply", "denoiser",
           "parse_spec", "remove", "reset"]


def denoiser(pipe_or_model) -> torch.nn.Module:
    """The denoiser of a pipeline (``pipe.transformer`` or ``pipe.unet``), or the model itself."""
    if isinstance(pipe_or_model, torch.nn.Module):
        return pipe_or_model
    for name in ("transformer", "unet"):
        m = getattr(pipe_or_model, name, None)
        if isinstance(m, torch.nn.Module):
            return m
    raise ValueError(f"{type(pipe_or_model).__name__} is neither a model nor a pipeline with a `transformer` "
                     "or `unet`; pass the denoiser module itself")


def apply(pipe_or_model, config) -> StepTracker:
    """Attach the cache ``config`` describes; returns the :class:`StepTracker` (step, counters).

    Raises ValueError if a cache from this package is already attached (``caching.remove`` first).
    """
    model = denoiser(pipe_or_model)
    fn = _APPLY.get(type(config))
    if fn is None:
        raise ValueError(f"config must be one of {', '.join(c.__name__ for c in _APPLY)}, got {type(config).__name__}")
    if any(n.startswith("dlm_caching") for m in model.modules()
           for n in getattr(getattr(m, "_diffusers_hook", None), "hooks", {})):
        raise ValueError("a cache is already attached to this model; call caching.remove(model) first")
    try:
        return fn(model, config)
    except Exception:
        remove_hooks(model)  # no half-attached cache
        raise


def remove(pipe_or_model) -> int:
    """Detach every cache of this package; the model's forward is the original again."""
    return remove_hooks(denoiser(pipe_or_model))


def reset(pipe_or_model) -> None:
    """Drop every cached tensor now (the next call starts a fresh run)."""
    model = denoiser(pipe_or_model)
    for m in model.modules():
        reg = getattr(m, "_diffusers_hook", None)
        if reg is not None:
            for name, hook in reg.hooks.items():
                if name.startswith("dlm_caching") and hasattr(hook, "tracker"):
                    hook.tracker.reset()


def parse_spec(spec: str, **defaults):
    """``"NAME[:key=value,...]"`` -> config; ``defaults`` fill fields the spec leaves out.

    Values are parsed as the field's type (int, float, bool: true/false/1/0). ValueError names the
    problem and the valid choices.
    """
    name, _, rest = spec.partition(":")
    cls = CACHES.get(name.strip())
    if cls is None:
        raise ValueError(f"unknown cache {name!r}; choose from {', '.join(CACHES)}")
    types = {f.name: f.type for f in fields(cls)}
    kw = {k: v for k, v in defaults.items() if k in types}
    for item in filter(None, (s.strip() for s in rest.split(","))):
        key, eq, val = item.partition("=")
        key = key.strip()
        if not eq or key not in types:
            raise ValueError(f"bad cache option {item!r} for {name}; use key=value with key in {', '.join(types)}")
        kw[key] = _parse_value(key, val.strip(), types[key])
    return cls(**kw).validate()


def _parse_value(key: str, val: str, typ):
    typ = typ if isinstance(typ, str) else typ.__name__
    try:
        if typ == "bool":
            if val.lower() not in ("true", "false", "1", "0"):
                raise ValueError
            return val.lower() in ("true", "1")
        return int(val) if typ == "int" else float(val)
    except ValueError:
        raise ValueError(f"cache option {key} must be a {typ}, got {val!r}") from None
