"""One validated object for every decoding option of `dlm.generate`.

`generate(**kwargs)` builds a `DecodingConfig`; every field is checked when it is built, and a bad
value raises a `ValueError` naming the field and the fix. What a model family cannot honour (a
mask id on a model without masks, a KV-cache mode the family does not have) is refused by that
family's strategy (`dlm.engine.families`), never silently ignored. Frozen: the loops and the ensemble
derive variants with `replace`, and the object the caller built is never changed.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import torch

KV_CACHE_MODES = ("none", "prefix", "dual", "prompt", "elastic", "auto")

# The defaults a call resolves when an option is None, in one place (every entry point reads these).
# Masked models: `threshold`, the fastest setting within 1 point of one token per step on the built-in
# model's held-out suites (docs/dlm.md, "Defaults"), with kv_cache="auto".
DEFAULT_MASKED_SAMPLER = "threshold"
# The elastic cache's drift test (`dlm.engine.masked.elastic`): refresh when a layer's key or value cosine
# similarity on the probes falls below 0.999 (the paper's 0.9 is a similarity of attention weights; on K/V
# 0.9 never fires: docs/benchmarks.md, "Elastic cache"), 4 probe positions per step.
DEFAULT_DRIFT_THRESHOLD = 0.999
DEFAULT_DRIFT_PROBE = 4

# The lengths a masked model gets when the caller leaves them out, the same in `dlm.generate`,
# `DLMPipeline`, `dlm sample`, `dlm bench` and the accuracy figures of docs/dlm.md ("Defaults", which
# says why 32-token blocks: on the built-in model's validation prompts they score higher than one
# block of 64, and EOS stop can end a row after its first block).
DEFAULT_GEN_LENGTH = 64
DEFAULT_BLOCK_LENGTH = 32


def default_block_length(gen_length: int) -> int:
    """The block length used when none is given: `DEFAULT_BLOCK_LENGTH` where it divides `gen_length`,
    else one block of `gen_length` (a length such as 48 or 16 is never refused for a default it did
    not choose)."""
    return DEFAULT_BLOCK_LENGTH if gen_length % DEFAULT_BLOCK_LENGTH == 0 else gen_length


def _positive_int_or_none(name: str, value: Any) -> None:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value <= 0):
        raise ValueError(f"{name} must be a positive integer (or None for the default), got {value!r}")


@dataclass(frozen=True)
class DecodingConfig:
    """Options of one `dlm.generate` call (see its docstring for each field's meaning).

    None means "the model family's default": gen_length `DEFAULT_GEN_LENGTH` (64) tokens on a masked
    model and the generation config's `max_new_tokens` on a uniform-noise one; block_length
    `default_block_length(gen_length)` (32 where it divides gen_length, else one block; masked) or
    the canvas (uniform); steps one token per forward (masked) or the generation
    config's `max_denoising_steps` per canvas (uniform); sampler `threshold` (masked; with kv_cache "auto", the default) or
    transformers' own DiffusionGemma rule from the generation config (uniform).
    """

    gen_length: int | None = None
    block_length: int | None = None
    steps: int | None = None
    sampler: Any = None
    sampler_config: dict | None = None
    temperature: float = 0.0
    mask_token_id: int | None = None
    eos_token_id: int | None = None
    generator: torch.Generator | None = None
    kv_cache: str = "auto"
    cache_refresh_every: int = 0
    cfg_scale: float = 0.0
    cache_across_blocks: bool = False
    cut_trailing_masks: bool = False
    cache_drift_threshold: float = DEFAULT_DRIFT_THRESHOLD
    cache_drift_probe: int = DEFAULT_DRIFT_PROBE
    eos_early_stop: bool | None = None
    shift_logits: bool | None = None
    generation_config: Any = None
    progress: bool = False
    window_blocks: int = 1
    window_open_at: float = 0.1
    compile: bool = False

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Family-independent checks; raises ValueError naming the field and the fix."""
        _positive_int_or_none("gen_length", self.gen_length)
        _positive_int_or_none("block_length", self.block_length)
        _positive_int_or_none("steps", self.steps)
        t = self.temperature
        if not isinstance(t, (int, float)) or isinstance(t, bool) or not math.isfinite(t) or t < 0:
            raise ValueError(f"temperature must be a finite number >= 0 (0 is greedy), got {t!r}")
        if self.kv_cache not in KV_CACHE_MODES:
            raise ValueError(f"kv_cache must be one of {KV_CACHE_MODES}, got {self.kv_cache!r}")
        if not isinstance(self.cfg_scale, (int, float)) or self.cfg_scale < 0:
            raise ValueError(f"cfg_scale must be >= 0 (0 turns guidance off), got {self.cfg_scale!r}")
        if self.cfg_scale > 0 and self.kv_cache not in ("none", "auto"):
            raise ValueError("classifier-free guidance (cfg_scale > 0) is not supported with a KV cache; use kv_cache='none'")
        if not isinstance(self.cache_refresh_every, int) or self.cache_refresh_every < 0:
            raise ValueError(f"cache_refresh_every must be an integer >= 0 (0 refreshes only at block starts), "
                             f"got {self.cache_refresh_every!r}")
        if self.cache_across_blocks and self.kv_cache in ("none", "auto"):
            raise ValueError("cache_across_blocks=True needs a KV cache: pass kv_cache='prefix' or 'dual'")
        if self.cache_across_blocks and self.kv_cache in ("prompt", "elastic"):
            raise ValueError(f"kv_cache={self.kv_cache!r} already keeps its cache across blocks; drop cache_across_blocks")
        self._validate_drift()
        if self.sampler_config is not None and not isinstance(self.sampler_config, dict):
            raise ValueError(f"sampler_config must be a dict of sampler options, got {type(self.sampler_config).__name__}")
        if self.generator is not None and not isinstance(self.generator, torch.Generator):
            raise ValueError(f"generator must be a torch.Generator, got {type(self.generator).__name__}")
        if not isinstance(self.compile, bool):
            raise ValueError(f"compile must be True or False, got {self.compile!r}")
        self._validate_window()
        for name in ("mask_token_id", "eos_token_id"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
                raise ValueError(f"{name} must be a token id (an integer >= 0), got {value!r}")

    def _validate_drift(self) -> None:
        """The elastic cache's drift test (`dlm.engine.masked.elastic`): a threshold >= 0 and a probe count >= 0,
        only with kv_cache='elastic'."""
        t, p = self.cache_drift_threshold, self.cache_drift_probe
        if not isinstance(t, (int, float)) or isinstance(t, bool) or not math.isfinite(t) or t < 0:
            raise ValueError(f"cache_drift_threshold must be a number >= 0 (the cosine similarity below which the "
                             f"elastic cache refreshes; above 1 refreshes every step), got {t!r}")
        if not isinstance(p, int) or isinstance(p, bool) or p < 0:
            raise ValueError(f"cache_drift_probe must be an integer >= 0 (cached positions tested per step), got {p!r}")
        if self.kv_cache != "elastic" and (t != DEFAULT_DRIFT_THRESHOLD or p != DEFAULT_DRIFT_PROBE):
            raise ValueError("cache_drift_threshold / cache_drift_probe apply to kv_cache='elastic' only; pass "
                             "kv_cache='elastic' or drop them")

    def _validate_window(self) -> None:
        """The D2F-style block window (`dlm.engine.masked.window`): W >= 1 blocks, an opening fraction in [0, 1],
        no prefix/dual cache (their K/V belong to one block's prefix/suffix)."""
        w, at = self.window_blocks, self.window_open_at
        if not isinstance(w, int) or isinstance(w, bool) or w < 1:
            raise ValueError(f"window_blocks must be an integer >= 1 (1 decodes one block at a time; D2F-style "
                             f"windows use 2 or more), got {w!r}")
        if not isinstance(at, (int, float)) or isinstance(at, bool) or not 0 <= at <= 1:
            raise ValueError(f"window_open_at must be a fraction in [0, 1] (D2F opens the next block at 0.1 of "
                             f"the last one decoded), got {at!r}")
        if w == 1 and at != 0.1:
            raise ValueError("window_open_at has no effect with window_blocks=1; pass window_blocks >= 2 or drop it")
        if w > 1 and self.kv_cache in ("prefix", "dual", "elastic"):
            raise ValueError(f"window_blocks > 1 decodes several blocks at once, which kv_cache={self.kv_cache!r} "
                             "(K/V around one block) cannot serve; use kv_cache='none', 'prompt' or 'auto'")

    def replace(self, **changes: Any) -> "DecodingConfig":
        """A validated copy with `changes` applied."""
        return dataclasses.replace(self, **changes)

    def given(self) -> dict[str, Any]:
        """The fields that differ from their defaults: what the caller asked for explicitly."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if getattr(self, f.name) != f.default and f.name != "progress"}
