"""Name -> sampler class registry for the dLLM step policies."""
from __future__ import annotations

from typing import Any

from samplers.base import Sampler

SAMPLERS: dict[str, type[Sampler]] = {}


def register(cls: type[Sampler]) -> type[Sampler]:
    """Class decorator: make a sampler available by `cls.name`."""
    if not cls.name:
        raise ValueError(f"{cls.__name__} needs a non-empty `name` to be registered")
    if cls.name in SAMPLERS and SAMPLERS[cls.name] is not cls:
        raise ValueError(f"two samplers are named '{cls.name}': {SAMPLERS[cls.name].__name__} and {cls.__name__}")
    SAMPLERS[cls.name] = cls
    return cls


def available_samplers() -> list[str]:
    return sorted(SAMPLERS)


def get_sampler(sampler: "str | Sampler", **config: Any) -> Sampler:
    """A sampler object from a registry name (with config overrides) or an existing object."""
    if isinstance(sampler, Sampler):
        if config:
            raise ValueError("pass config overrides only with a sampler name, not with a sampler object")
        return sampler
    if not isinstance(sampler, str) or sampler not in SAMPLERS:
        raise ValueError(f"unknown sampler {sampler!r}; valid samplers: {', '.join(available_samplers())}")
    return SAMPLERS[sampler](**config)
