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
from dlm.checkpoint_check import check_checkpoint_dir, check_tokenizer_fits, check_weights_fit

# What a damaged checkpoint makes the loaders raise (safetensors' own error is a plain Exception
# subclass, matched by name so that importing it is not needed); each becomes one ValueError.
_LOAD_ERRORS = (OSError, RuntimeError, KeyError, TypeError, UnicodeDecodeError)


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
    mask_token_id: int | None  # None for a uniform-noise model (DiffusionGemma has no mask token)
    eos_token_id: int | None
    pad_token_id: int | None
    shift_logits: bool | None  # None for a uniform-noise model (its logits are aligned by design)
    family: str = "masked"     # "masked" or "uniform-noise" (`dlm.engine.families`)

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
         trust_remote_code: bool = True, shift_logits: bool | None = None, progress: bool | None = None) -> LoadedModel:
    """Load a built-in model by name, or a checkpoint directory / hub id through transformers.

    progress: transformers' weight-loading bar for a checkpoint (None: only when stderr is a
    terminal; False: never). A built-in model loads in milliseconds and never shows one.
    A hub id is fetched only when the hub answers: with no network, or with HF_HUB_OFFLINE set, it is
    read from the local Hugging Face cache, and a model not there fails at once with one ValueError
    (transformers would otherwise retry for about half a minute first).
    """
    if not isinstance(name_or_path, str) or not name_or_path.strip():
        raise ValueError("model name is empty; pass a built-in name (" + ", ".join(builtin_models()) + ") or a path")
    builtins = builtin_models()
    if name_or_path in builtins and _is_uniform_noise_dir(builtins[name_or_path]):
        return _load_uniform_noise(name_or_path, builtins[name_or_path], device, dtype, trust_remote_code, False)
    if name_or_path in builtins:
        from dlm.tiny import load_tiny_dlm
        check_checkpoint_dir(builtins[name_or_path])
        with _one_line_errors(name_or_path, "checkpoint"):
            model, tokenizer = load_tiny_dlm(builtins[name_or_path], device=device, dtype=dtype or torch.float32)
        return _loaded(name_or_path, model, tokenizer, shift_logits)
    from transformers import AutoConfig, AutoTokenizer
    from dlm.tiny import register_auto_classes

    register_auto_classes()  # so AutoConfig knows a saved "tiny-dlm" checkpoint
    if not Path(name_or_path).exists() and ("/" not in name_or_path or name_or_path.startswith((".", "/"))):
        raise ValueError(f"unknown model {name_or_path!r}: not a built-in ({', '.join(builtins)}), "
                         "not an existing directory, and not a hub id of the form owner/name")
    check_checkpoint_dir(name_or_path)  # a local folder: missing files, corrupt weights, foreign config
    hub = {} if Path(name_or_path).exists() else hub_access(name_or_path)
    try:
        config = AutoConfig.from_pretrained(name_or_path, trust_remote_code=trust_remote_code, **hub)
    except OSError as err:
        if hub:
            raise ValueError(_not_cached_message(name_or_path)) from err
        raise ValueError(f"cannot load model {name_or_path!r}: {str(err).splitlines()[0]}") from err
    except (ValueError, KeyError) as err:  # e.g. an unknown model_type
        raise ValueError(f"{Path(name_or_path) / 'config.json'}: {_first_line(err)}") from err
    if config.model_type in _UNIFORM_NOISE_TYPES:
        return _load_uniform_noise(name_or_path, name_or_path, device, dtype, trust_remote_code, progress, hub)
    if config.model_type == "tiny-dlm":
        from dlm.tiny import load_tiny_dlm
        with _one_line_errors(name_or_path, "checkpoint"):
            model, tokenizer = load_tiny_dlm(name_or_path, device=device, dtype=dtype or torch.float32)
        return _loaded(name_or_path, model, tokenizer, shift_logits)
    with _one_line_errors(name_or_path, "tokenizer"):
        tokenizer = AutoTokenizer.from_pretrained(name_or_path, trust_remote_code=trust_remote_code, **hub)
    _refuse_if_not_masked_diffusion(name_or_path, config, tokenizer)
    from dlm._progress import loading_bars

    with loading_bars(progress), _one_line_errors(name_or_path):  # weight-loading bars only on a terminal
        model, info = _model_class(config).from_pretrained(
            name_or_path, trust_remote_code=trust_remote_code, dtype=dtype or "auto", output_loading_info=True, **hub)
    check_weights_fit(info, name_or_path, config)
    model.to(device).eval()
    return _loaded(name_or_path, model, tokenizer, shift_logits)


_UNIFORM_NOISE_TYPES = ("diffusion_gemma",)
# How long the hub gets to accept a connection before the machine is taken as offline.
HUB_PROBE_SECONDS = 3.0


def hub_access(repo_id: str) -> dict:
    """Keyword arguments for transformers' `from_pretrained` of hub id `repo_id`: {} when the hub can
    be reached, else `{"local_files_only": True}`, so that an offline machine (no route, no DNS, or
    HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE set) reads the local cache at once instead of retrying
    each file for about half a minute. One TCP connection to the hub's host decides."""
    import socket
    from urllib.parse import urlparse

    from huggingface_hub import constants

    if _offline_mode():
        return {"local_files_only": True}
    endpoint = urlparse(constants.ENDPOINT)
    port = endpoint.port or (443 if endpoint.scheme == "https" else 80)
    try:
        socket.create_connection((endpoint.hostname, port), timeout=HUB_PROBE_SECONDS).close()
    except OSError:
        return {"local_files_only": True}
    return {}


def _offline_mode() -> bool:
    """HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE set (read now, not only when huggingface_hub was imported)."""
    import os

    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE) or any(
        os.environ.get(name, "").strip().upper() in ("1", "ON", "YES", "TRUE")
        for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def _not_cached_message(name: str) -> str:
    from huggingface_hub import constants

    why = "offline mode is set (HF_HUB_OFFLINE)" if _offline_mode() else f"{constants.ENDPOINT} cannot be reached"
    return (f"cannot load model {name!r}: {why} and it is not in the local Hugging Face cache; download it on a "
            f"connected machine (hf download {name}) or pass a local folder")


def _is_uniform_noise_dir(path: str) -> bool:
    """True when `path/config.json` declares a uniform-noise model (read as JSON: no transformers)."""
    import json

    try:
        return json.loads((Path(path) / "config.json").read_text()).get("model_type") in _UNIFORM_NOISE_TYPES
    except (OSError, ValueError):
        return False


def _load_uniform_noise(name: str, path: str, device, dtype, trust_remote_code: bool, progress: bool | None,
                        hub: dict | None = None) -> LoadedModel:
    """A DiffusionGemma checkpoint through transformers' Auto classes (`AutoModelForImageTextToText`
    maps it to `DiffusionGemmaForBlockDiffusion`); its tokenizer is the folder's (transformers', or
    our tiny character tokenizer for tiny-dgemma). The folder's generation_config.json becomes the
    model's `generation_config`, the defaults of `dlm.generate` on it."""
    import json

    from transformers import AutoModelForImageTextToText, AutoTokenizer

    hub = hub or {}
    check_checkpoint_dir(path)
    tokenizer_file = Path(path) / "tokenizer.json"
    with _one_line_errors(path, "tokenizer"):
        ours = tokenizer_file.is_file() and json.loads(tokenizer_file.read_text()).get("tokenizer_class") == "TinyCharTokenizer"
        if ours:
            from dlm.tiny.tokenizer import TinyCharTokenizer
            tokenizer = TinyCharTokenizer.from_pretrained(path)
        else:
            tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code, **hub)
    from dlm._progress import loading_bars

    with loading_bars(progress), _one_line_errors(path):
        model, info = AutoModelForImageTextToText.from_pretrained(
            path, trust_remote_code=trust_remote_code, dtype=dtype or torch.float32, output_loading_info=True, **hub)
    check_weights_fit(info, path, model.config)
    model.to(device).eval()
    gc, text = model.generation_config, model.config.text_config
    eos = gc.eos_token_id if gc.eos_token_id is not None else getattr(text, "eos_token_id", None)
    eos = eos[0] if isinstance(eos, (list, tuple)) and eos else eos
    pad = gc.pad_token_id if gc.pad_token_id is not None else getattr(text, "pad_token_id", None)
    return LoadedModel(model=model, tokenizer=tokenizer, name=name, mask_token_id=None, eos_token_id=eos,
                       pad_token_id=pad, shift_logits=None, family="uniform-noise")


def _first_line(err: BaseException) -> str:
    lines = str(err).strip().splitlines()
    return f"{type(err).__name__}: {lines[0] if lines else ''}".rstrip(": ")


class _one_line_errors:
    """Turn what a damaged checkpoint makes a loader raise into one ValueError naming the checkpoint."""

    def __init__(self, path: str, part: str = "weights"):
        self.path, self.part = path, part

    def __enter__(self):
        return self

    def __exit__(self, kind, err, tb):
        if err is None or isinstance(err, ValueError):
            return False
        if "ignore_mismatched_sizes" in str(err):  # transformers' shape check; its report went to the log
            raise ValueError(f"{self.path}: the weights' shapes do not match its config.json (a config of another "
                             "model size or family than the weights)") from err
        if isinstance(err, _LOAD_ERRORS) or type(err).__name__ == "SafetensorError":
            raise ValueError(f"cannot load the {self.part} of {self.path}: {_first_line(err)}") from err
        return False


def _loaded(name: str, model, tokenizer, shift_logits: bool | None) -> LoadedModel:
    check_tokenizer_fits(tokenizer, getattr(model, "config", None), name)
    mask_id = _refuse_if_not_masked_diffusion(name, getattr(model, "config", None), tokenizer)
    pad_id = resolve_token_id("pad_token_id", None, model, tokenizer)
    eos_id = resolve_token_id("eos_token_id", None, model, tokenizer)
    if pad_id is None or pad_id == mask_id:
        # Left padding must never look like a mask to be filled; EOS is the usual stand-in.
        pad_id = eos_id if eos_id is not None and eos_id != mask_id else None
    return LoadedModel(
        model=model, tokenizer=tokenizer, name=name, mask_token_id=mask_id, eos_token_id=eos_id,
        pad_token_id=pad_id, shift_logits=infer_shift_logits(model) if shift_logits is None else shift_logits)
