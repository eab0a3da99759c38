"""Loading masked diffusion LMs: built-in names and real checkpoints through transformers.

    model, tokenizer = dlm.load("tiny-dlm")                      # shipped with the package
    model, tokenizer = dlm.load("GSAI-ML/LLaDA-8B-Instruct")     # remote code, aligned logits
    model, tokenizer = dlm.load("Dream-org/Dream-v0-Instruct-7B")  # remote code, shifted logits

Mask, EOS and pad ids are read from the model config, then the tokenizer. A model with no mask
token (a causal LM such as GPT-2) is refused: it cannot fill masked positions in parallel.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from dlm.adapters import infer_shift_logits, resolve_token_id


def builtin_models() -> dict[str, str]:
    """Built-in model name -> checkpoint directory inside the package."""
    from dlm.tiny import BUILTIN_MODELS
    return dict(BUILTIN_MODELS)


@dataclass
class LoadedModel:
    """A model ready for `dlm.generate`, with the facts the driver needs.

    Iterable as `(model, tokenizer)` for convenience.
    """

    model: Any
    tokenizer: Any
    name: str
    mask_token_id: int
    eos_token_id: int | None
    pad_token_id: int | None
    shift_logits: bool

    def __iter__(self):
        return iter((self.model, self.tokenizer))


def _refuse_if_not_masked_diffusion(name: str, config: Any, tokenizer: Any) -> int:
    mask_id = resolve_token_id("mask_token_id", None, config and _Holder(config), tokenizer)
    if mask_id is None:
        kind = "a causal LM" if getattr(config, "is_decoder", False) or _is_causal(config) else "this model"
        raise ValueError(
            f"{name!r} is not a masked diffusion LM: {kind} defines no mask token in its config or "
            "tokenizer, so it cannot fill masked positions in parallel. Use a diffusion LM "
            "(LLaDA, Dream, LLaDA2, or a built-in: " + ", ".join(builtin_models()) + ")")
    return mask_id


class _Holder:
    """Lets `resolve_token_id` read ids from a bare config."""

    def __init__(self, config):
        self.config = config


def _is_causal(config: Any) -> bool:
    return any(a.endswith("ForCausalLM") or a.endswith("LMHeadModel") for a in (getattr(config, "architectures", None) or []))


def _model_class(config: Any):
    from transformers import AutoModel, AutoModelForCausalLM, AutoModelForMaskedLM
    auto_map = getattr(config, "auto_map", None) or {}
    if auto_map:  # remote code: LLaDA and Dream register AutoModel, LLaDA2 AutoModelForCausalLM
        return AutoModel if "AutoModel" in auto_map else AutoModelForCausalLM
    from transformers.models.auto.modeling_auto import MODEL_FOR_MASKED_LM_MAPPING_NAMES
    if config.model_type in MODEL_FOR_MASKED_LM_MAPPING_NAMES:
        return AutoModelForMaskedLM
    return AutoModel


def load(name_or_path: str, *, device: str | torch.device = "cpu", dtype: torch.dtype | None = None,
         trust_remote_code: bool = True, shift_logits: bool | None = None) -> LoadedModel:
    """Load a built-in model by name, or a checkpoint directory / hub id through transformers."""
    if not isinstance(name_or_path, str) or not name_or_path.strip():
        raise ValueError("model name is empty; pass a built-in name (" + ", ".join(builtin_models()) + ") or a path")
    builtins = builtin_models()
    if name_or_path in builtins:
        from dlm.tiny import load_tiny_dlm
        model, tokenizer = load_tiny_dlm(device=device, dtype=dtype or torch.float32)
        return _loaded(name_or_path, model, tokenizer, shift_logits)
    from transformers import AutoConfig, AutoTokenizer
    from dlm.tiny import register_auto_classes

    register_auto_classes()  # so AutoConfig knows a saved "tiny-dlm" checkpoint
    if not Path(name_or_path).exists() and ("/" not in name_or_path or name_or_path.startswith((".", "/"))):
        raise ValueError(f"unknown model {name_or_path!r}: not a built-in ({', '.join(builtins)}), "
                         "not an existing directory, and not a hub id of the form owner/name")
    try:
        config = AutoConfig.from_pretrained(name_or_path, trust_remote_code=trust_remote_code)
    except OSError as err:
        raise ValueError(f"cannot load model {name_or_path!r}: {str(err).splitlines()[0]}") from err
    if config.model_type == "tiny-dlm":
        from dlm.tiny import load_tiny_dlm
        model, tokenizer = load_tiny_dlm(name_or_path, device=device, dtype=dtype or torch.float32)
        return _loaded(name_or_path, model, tokenizer, shift_logits)
    tokenizer = AutoTokenizer.from_pretrained(name_or_path, trust_remote_code=trust_remote_code)
    _refuse_if_not_masked_diffusion(name_or_path, config, tokenizer)
    from dlm._progress import loading_bars

    with loading_bars():  # weight-loading bars only on a terminal
        model = _model_class(config).from_pretrained(
            name_or_path, trust_remote_code=trust_remote_code, dtype=dtype or "auto")
    model.to(device).eval()
    return _loaded(name_or_path, model, tokenizer, shift_logits)


def _loaded(name: str, model, tokenizer, shift_logits: bool | None) -> LoadedModel:
    mask_id = _refuse_if_not_masked_diffusion(name, getattr(model, "config", None), tokenizer)
    pad_id = resolve_token_id("pad_token_id", None, model, tokenizer)
    eos_id = resolve_token_id("eos_token_id", None, model, tokenizer)
    if pad_id is None or pad_id == mask_id:
        # Left padding must never look like a mask to be filled; EOS is the usual stand-in.
        pad_id = eos_id if eos_id is not None and eos_id != mask_id else None
    return LoadedModel(
        model=model, tokenizer=tokenizer, name=name, mask_token_id=mask_id, eos_token_id=eos_id,
        pad_token_id=pad_id, shift_logits=infer_shift_logits(model) if shift_logits is None else shift_logits)
