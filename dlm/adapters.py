"""Model adapters: one calling convention for every masked diffusion LM.

The driver asks an adapter for the logits of one block, `[B, Lb, V]`, aligned so that entry j
predicts the token at absolute position `block_start + j`. The adapter hides:
- aligned (LLaDA family) vs shifted (Dream family: `logits[:, i-1]` predicts token i) outputs;
- models returning a tensor, an object with `.logits`, a dict with "logits" or a tuple whose
  first item is the logits;
- left-padding attention masks and position ids;
- the windowed KV-cache call of models that support it (`supports_dlm_kv_cache = True`, see
  `dlm.tiny.modeling` for the exact signature);
- the block-causal capability (`dlm_block_causal = True`): the driver then feeds `x[:, :block_end]`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

# Model types whose logits are shifted by one (AR-initialised diffusion LMs).
SHIFTED_MODEL_TYPES = ("dream", "diffucoder", "d2f")


def _config_of(model: Any):
    return getattr(model, "config", None)


def infer_shift_logits(model: Any) -> bool:
    """True for the Dream family, read from the config's `model_type` or an explicit attribute."""
    config = _config_of(model)
    if config is None:
        return False
    explicit = getattr(config, "shift_logits", None)
    if explicit is not None:
        return bool(explicit)
    model_type = str(getattr(config, "model_type", "")).lower()
    return any(name in model_type for name in SHIFTED_MODEL_TYPES)


def resolve_token_id(name: str, given: int | None, model: Any, tokenizer: Any = None) -> int | None:
    """An id given explicitly, else from the model config, else from the tokenizer."""
    if given is not None:
        return int(given)
    for source in (_config_of(model), tokenizer):
        value = getattr(source, name, None) if source is not None else None
        if isinstance(value, (list, tuple)):
            value = value[0] if value else None
        if value is not None:
            return int(value)
    return None


def model_output_logits(out) -> tuple[torch.Tensor, Any]:
    """(logits, past_key_values or None) from whatever a model returned.

    Accepts a tensor, an object with `.logits` (transformers' ModelOutput), a dict with "logits"
    and a tuple/list whose first item is the logits (`return_dict=False`).
    """
    if isinstance(out, torch.Tensor):
        return out, None
    if isinstance(out, dict) and isinstance(out.get("logits"), torch.Tensor):
        return out["logits"], out.get("past_key_values")
    if isinstance(getattr(out, "logits", None), torch.Tensor):
        return out.logits, getattr(out, "past_key_values", None)
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        return out[0], None
    raise ValueError(
        f"the model returned {type(out).__name__}, not logits: a model must return a [batch, length, vocab] "
        "tensor, an object with .logits, a dict with 'logits' or a tuple whose first item is the logits")


@dataclass
class DLMAdapter:
    """Wraps any callable `model(input_ids, attention_mask=None, **kw)` for the driver.

    Attributes:
        model: the callable.
        mask_token_id / eos_token_id / pad_token_id: ids (from arguments, config or tokenizer).
        shift_logits: True when `logits[:, i-1]` predicts token i.
    """

    model: Callable
    mask_token_id: int
    eos_token_id: int | None = None
    pad_token_id: int | None = None
    shift_logits: bool = False

    @classmethod
    def wrap(cls, model, *, mask_token_id=None, eos_token_id=None, pad_token_id=None,
             shift_logits=None, tokenizer=None) -> "DLMAdapter":
        if isinstance(model, DLMAdapter):
            return model
        mask_id = resolve_token_id("mask_token_id", mask_token_id, model, tokenizer)
        if mask_id is None:
            raise ValueError(
                "mask_token_id is unknown: pass mask_token_id=..., or use a model whose config or "
                "tokenizer defines it (a model without a mask token is not a masked diffusion LM)")
        return cls(
            model=model,
            mask_token_id=mask_id,
            eos_token_id=resolve_token_id("eos_token_id", eos_token_id, model, tokenizer),
            pad_token_id=resolve_token_id("pad_token_id", pad_token_id, model, tokenizer),
            shift_logits=infer_shift_logits(model) if shift_logits is None else bool(shift_logits),
        )

    @property
    def supports_kv_cache(self) -> bool:
        return bool(getattr(self.model, "supports_dlm_kv_cache", False))

    @property
    def block_causal(self) -> bool:
        """True when the model declares `dlm_block_causal = True` (on itself or its config): its
        logits at positions before a block's end never depend on later positions, so the driver
        forwards only `x[:, :block_end]` (LLaDA2-style block-diffusion models). Never inferred:
        a bidirectional model (LLaDA, Dream, the built-in tiny model) would silently change."""
        return bool(self._declared("dlm_block_causal"))

    @property
    def prompt_ignores_response(self) -> bool:
        """True when the model declares that its prompt positions never attend to the response, so
        their K/V are fixed for the whole generation and `kv_cache="prompt"` is exact: the tiny model's
        `config.prompt_attends_response = False`, or `dlm_prompt_ignores_response = True` on any model
        or its config. Never inferred (LLaDA and Dream prompts attend to everything)."""
        explicit = self._declared("dlm_prompt_ignores_response")
        if explicit is None:  # the tiny model's own config flag
            explicit = getattr(_config_of(self.model), "prompt_attends_response", None) is False
        return bool(explicit)

    def _declared(self, name: str):
        """A capability flag the model declares on itself or, failing that, on its config; None if neither."""
        explicit = getattr(self.model, name, None)
        if explicit is None:
            explicit = getattr(_config_of(self.model), name, None)
        return explicit

    @property
    def vocab_size(self) -> int | None:
        config = _config_of(self.model)
        value = getattr(config, "vocab_size", None) if config is not None else None
        return int(value) if value else None

    @property
    def prompt_separator_id(self) -> int | None:
        """Token every prompt must end with, for models trained that way (the tiny model's newline,
        `config.position_restart_token_id`); None when the model has no such convention."""
        config = _config_of(self.model)
        value = getattr(config, "position_restart_token_id", None) if config is not None else None
        return None if value is None else int(value)

    @property
    def max_length(self) -> int | None:
        config = _config_of(self.model)
        value = getattr(config, "max_position_embeddings", None) if config is not None else None
        return int(value) if value else None

    def _call(self, input_ids, attention_mask, **kw):
        kwargs = dict(kw)
        if attention_mask is not None:
            kwargs["attention_mask"] = attention_mask
        return model_output_logits(self.model(input_ids, **kwargs))

    def full(self, x, attention_mask, position_ids, *, use_cache: bool = False):
        """One full forward pass. Returns raw logits `[B, L, V]` and the cache (or None)."""
        kw = {}
        if position_ids is not None:
            kw["position_ids"] = position_ids
        if use_cache:
            kw["use_cache"] = True
        return self._call(x, attention_mask, **kw)

    def full_with_hidden(self, x, attention_mask, position_ids):
        """One full forward asking for hidden states (`output_hidden_states=True`).

        Returns raw logits `[B, L, V]` and the last hidden state `[B, L, H]`, or None when the model
        returns none (a plain tensor, or an output without `hidden_states`)."""
        kw = {"output_hidden_states": True}
        if position_ids is not None:
            kw["position_ids"] = position_ids
        if attention_mask is not None:
            kw["attention_mask"] = attention_mask
        out = self.model(x, **kw)
        if isinstance(out, torch.Tensor):
            return out, None
        states = getattr(out, "hidden_states", None)
        return out.logits, (states[-1] if states else None)

    def window(self, x, cache, start: int, end: int, attention_mask, position_ids, *, use_cache: bool = False):
        """Forward only `x[:, start:end]` against a full-length cache. Raw logits `[B, end-start, V]`;
        with `use_cache`, also the full-length cache whose slots `start:end` hold the window's K/V."""
        kw = {"past_key_values": cache, "cache_window": (start, end)}
        if use_cache:
            kw["use_cache"] = True
        if position_ids is not None:
            kw["position_ids"] = position_ids[:, start:end]
        logits, new_cache = self._call(x[:, start:end], attention_mask, **kw)
        return (logits, new_cache) if use_cache else logits

    def extend(self, x, cache, start: int, attention_mask, position_ids):
        """Forward `x[:, start:]` against `cache` and return its raw logits `[B, L-start, V]` with
        the cache whose slots `start:` now hold the window's K/V (slots before `start` are kept):
        the prefix cache extended by one decoded block instead of recomputed."""
        end = x.shape[1]
        kw = {"past_key_values": cache, "cache_window": (start, end), "use_cache": True}
        if position_ids is not None:
            kw["position_ids"] = position_ids[:, start:end]
        return self._call(x[:, start:end], attention_mask, **kw)

    def align(self, raw: torch.Tensor, raw_start: int, block_start: int, block_end: int) -> torch.Tensor:
        """Slice logits predicting tokens `block_start:block_end` out of raw logits that begin at
        absolute position `raw_start`. For shifted models the prediction of token i sits at i-1."""
        offset = 1 if self.shift_logits else 0
        lo = block_start - offset - raw_start
        return raw[:, lo: lo + (block_end - block_start)]
