"""Name -> sampler class registry for the dLLM step policies."""
from __future__ import annotations

import dataclasses
import types
import typing
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


def parse_option_value(text: str) -> Any:
    """Command-line option text -> None, bool, int, float or the string itself."""
    low = text.lower()
    if low in ("none", "null"):
        return None
    if low in ("true", "false"):
        return low == "true"
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def parse_sampler_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """`"threshold:tau=0.7:factor=0"` -> `("threshold", {"tau": 0.7, "factor": 0})`."""
    name, *opts = spec.split(":")
    options = {}
    for opt in opts:
        if "=" not in opt:
            raise ValueError(f"sampler option {opt!r} in {spec!r} must be key=value (e.g. threshold:tau=0.7)")
        key, value = opt.split("=", 1)
        options[key.strip()] = parse_option_value(value.strip())
    return name.strip(), options


def get_sampler(sampler: "str | Sampler", **config: Any) -> Sampler:
    """A sampler object from a registry name, a `name:key=value...` spec, or an existing object.

    Unknown option names and values of the wrong type raise ValueError listing the valid options.
    """
    if isinstance(sampler, Sampler):
        if config:
            raise ValueError("pass config overrides only with a sampler name, not with a sampler object")
        return sampler
    if isinstance(sampler, str) and ":" in sampler:
        sampler, spec_options = parse_sampler_spec(sampler)
        config = {**spec_options, **config}
    if not isinstance(sampler, str) or sampler not in SAMPLERS:
        raise ValueError(f"unknown sampler {sampler!r}; valid samplers: {', '.join(available_samplers())}")
    cls = SAMPLERS[sampler]
    valid = sorted(f.name for f in dataclasses.fields(cls.Config))
    unknown = sorted(set(config) - set(valid))
    if unknown:
        raise ValueError(f"sampler {sampler!r} has no option {', '.join(unknown)}; "
                         f"valid options: {', '.join(valid) or '(none)'}")
    for key, value in config.items():
        _check_option_type(sampler, cls.Config, key, value)
    try:
        return cls(**config)
    except TypeError as err:  # a value no annotation could check (a tuple field's items, say)
        raise ValueError(f"bad value in sampler {sampler!r} options {config}: {err}; "
                         f"valid options: {', '.join(valid)}") from None


# What a config field annotated with each type accepts, and how the error names it.
_OPTION_TYPES = {
    bool: ((bool,), "true or false"),
    int: ((int,), "an integer"),
    float: ((int, float), "a number"),
    str: ((str,), "text"),
}


def _check_option_type(sampler: str, config_cls: type, key: str, value: Any) -> None:
    """ValueError naming the option, what it takes and an example, when `value` is not of the type the
    config field is annotated with (a string for a number would otherwise surface as Python's own
    "'<' not supported" from `validate`). Fields typed `X | None` also take None; fields of other
    types (tuples) are left to the config's `validate`."""
    hint = typing.get_type_hints(config_cls).get(key)
    allowed = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    if value is None and type(None) in allowed:
        return
    kinds = [_OPTION_TYPES[t] for t in allowed if t in _OPTION_TYPES]
    if not kinds:
        return
    ok = any(isinstance(value, accepted) for accepted, _ in kinds)
    if isinstance(value, bool) and bool not in allowed:  # True is an int to Python, not a number to a user
        ok = False
    if not ok:
        default = getattr(config_cls, key, None)
        wanted = " or ".join(name for _, name in kinds) + (" or none" if type(None) in allowed else "")
        raise ValueError(f"sampler {sampler!r} option {key} takes {wanted}, got {value!r}; e.g. "
                         f"{sampler}:{key}={str(default).lower() if isinstance(default, bool) else default} "
                         f"(the default)")
