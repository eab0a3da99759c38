"""`--model_args` of the harness model `dlm`: one frozen, validated config.

lm-evaluation-harness parses `--model_args key=value,...` itself ("true"/"false" become bools, numbers
become int or float) and adds `batch_size`, `max_batch_size` and `device`; `EvalArgs.from_model_args`
takes that dict. A key we do not know, a value of the wrong type or an unknown sampler raises one
ValueError that names the argument and what it accepts: nothing the user gave is dropped or changed.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

# Keys the harness itself adds to every model's constructor (lm_eval.api.model.LM.create_from_arg_*).
HARNESS_KEYS = ("batch_size", "max_batch_size", "device")
DTYPES = ("auto", "float32", "bfloat16", "float16")
KV_CACHE_MODES = ("none", "prefix", "dual", "prompt", "auto")  # as dlm.generate; repeated to stay import-light


@dataclass(frozen=True)
class EvalArgs:
    """Everything `dlm` takes as a harness model (docs/eval.md lists each with its default).

    Model: `pretrained` (a built-in name, a checkpoint folder or a hub id, as `dlm.load`), `device`,
    `dtype`, `trust_remote_code`. Generation (`generate_until`): `sampler` (a registry name, with its
    config as `name:key=value:...`), `steps` (the forward-pass budget), `gen_length` (None: each request's
    `max_gen_toks`), `block_length` (None: one block), `kv_cache`, `cache_refresh_every`,
    `cache_across_blocks`, `cfg` (LLaDA's classifier-free guidance weight), `temperature`, `seed`,
    `eos_early_stop`, `add_special_tokens` (None: the tokenizer's default unless the harness applied a
    chat template). Likelihood (`loglikelihood`): `mc_num` Monte Carlo samples per request, `check_greedy`
    (also decode the continuation one token per step and report whether it comes out). `batch_size`:
    prompts per `dlm.generate` call, and masked rows per forward of the likelihood estimator.
    """

    pretrained: Any = "tiny-dlm"
    sampler: str | None = None
    steps: int | None = None
    gen_length: int | None = None
    block_length: int | None = None
    kv_cache: str = "auto"
    cache_refresh_every: int = 0
    cache_across_blocks: bool = False
    cfg: float = 0.0
    temperature: float = 0.0
    seed: int = 1234
    eos_early_stop: bool | None = None
    add_special_tokens: bool | None = None
    mc_num: int = 128
    check_greedy: bool = False
    batch_size: int = 1
    max_batch_size: int | None = None
    device: str | None = None
    dtype: str = "auto"
    trust_remote_code: bool = True

    def __post_init__(self) -> None:
        self.validate()

    @classmethod
    def from_model_args(cls, args: dict) -> "EvalArgs":
        """From the harness's parsed `model_args` (plus its `batch_size` / `max_batch_size` / `device`)."""
        known = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(args) - set(known))
        if unknown:
            raise ValueError(f"model_args: unknown key {', '.join(map(repr, unknown))}; valid keys: {', '.join(known)}")
        values = dict(args)
        if "batch_size" in values:
            values["batch_size"] = _batch_size(values["batch_size"])
        return cls(**values)

    def validate(self) -> None:
        """ValueError naming the argument and what it accepts."""
        if not isinstance(self.pretrained, str):
            if getattr(self.pretrained, "model", None) is None:
                raise ValueError("model_args: pretrained must be a model name or path (or, from Python, a "
                                 f"dlm.LoadedModel), got {type(self.pretrained).__name__}")
        elif not self.pretrained.strip():
            raise ValueError("model_args: pretrained is empty; give a built-in name (tiny-dlm) or a checkpoint path")
        for name in ("steps", "gen_length", "block_length"):
            _whole(name, getattr(self, name), minimum=1, optional=True)
        for name, minimum in (("cache_refresh_every", 0), ("mc_num", 1), ("batch_size", 1), ("seed", 0)):
            _whole(name, getattr(self, name), minimum=minimum)
        _whole("max_batch_size", self.max_batch_size, minimum=1, optional=True)
        for name in ("cfg", "temperature"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"model_args: {name} must be a finite number >= 0, got {value!r}")
        for name in ("cache_across_blocks", "check_greedy", "trust_remote_code"):
            _flag(name, getattr(self, name))
        for name in ("eos_early_stop", "add_special_tokens"):
            if getattr(self, name) is not None:
                _flag(name, getattr(self, name))
        if self.kv_cache not in KV_CACHE_MODES:
            raise ValueError(f"model_args: kv_cache must be one of {', '.join(KV_CACHE_MODES)}, got {self.kv_cache!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"model_args: dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.device is not None and not isinstance(self.device, str):
            raise ValueError(f"model_args: device must be a device name such as cpu or cuda:0, got {self.device!r}")
        if self.gen_length and self.block_length and self.gen_length % self.block_length:
            raise ValueError(f"model_args: gen_length ({self.gen_length}) must be a multiple of block_length "
                             f"({self.block_length})")
        self._validate_sampler()

    def _validate_sampler(self) -> None:
        if self.sampler is None:
            return
        if not isinstance(self.sampler, str):
            raise ValueError(f"model_args: sampler must be a sampler name such as threshold or "
                             f"threshold:tau=0.8, got {self.sampler!r}")
        from samplers import get_sampler

        try:
            get_sampler(self.sampler)  # unknown names, unknown options and wrong types, before any work
        except ValueError as err:
            raise ValueError(f"model_args: sampler: {err}") from None

    def generate_kwargs(self) -> dict:
        """The `dlm.generate` keywords these arguments fix (lengths and the generator come per call)."""
        kw = dict(steps=self.steps, sampler=self.sampler, temperature=float(self.temperature), kv_cache=self.kv_cache)
        # masked-only options go in only when asked for, so that a uniform-noise model (which refuses
        # them) runs with the defaults
        if self.cache_refresh_every:
            kw["cache_refresh_every"] = self.cache_refresh_every
        if self.cache_across_blocks:
            kw["cache_across_blocks"] = True
        if self.cfg:
            kw["cfg_scale"] = float(self.cfg)
        if self.eos_early_stop is not None:
            kw["eos_early_stop"] = self.eos_early_stop
        return kw


def _whole(name: str, value, *, minimum: int, optional: bool = False) -> None:
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"model_args: {name} must be a whole number >= {minimum}, got {value!r}")


def _flag(name: str, value) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"model_args: {name} must be true or false, got {value!r}")


def _batch_size(value):
    """The harness hands `--batch_size` over as text ("8", "auto", "auto:4") or an int."""
    if isinstance(value, str):
        if value.startswith("auto"):
            raise ValueError(f"batch_size {value!r}: automatic batch sizes are not supported by the dlm model; "
                             "give a number (prompts per dlm.generate call), e.g. --batch_size 8")
        try:
            return int(value)
        except ValueError:
            raise ValueError(f"batch_size must be a whole number >= 1, got {value!r}") from None
    return value
