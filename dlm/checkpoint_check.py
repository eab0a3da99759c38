"""Checks of a checkpoint folder before and after loading it: each fault is one ValueError that names
the file and what is wrong, so that the CLI prints one line instead of a library's traceback.

Caught here: a missing or malformed ``config.json``; no tokenizer files; a config of another family (a diffusers
pipeline or model config); missing weights; a truncated or corrupt ``*.safetensors`` file (its
header is read and its length compared with what the header promises, without reading the
tensors); a sharded checkpoint whose index names a missing shard; weights that do not fit the
config's architecture; a tokenizer whose ids do not fit the model's vocabulary.
"""
from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json", "tokenizer.model", "spiece.model")
_MAX_HEADER = 100 * 2**20  # safetensors refuses headers above 100 MB as well


def check_checkpoint_dir(path: str | Path) -> None:
    """ValueError naming the file when the folder `path` cannot be a loadable checkpoint."""
    path = Path(path)
    if not path.is_dir():
        return  # a hub id: transformers resolves and reports it
    read_config(path)
    weights = [path / name for name in WEIGHT_FILES if (path / name).is_file()]
    if not weights:
        raise ValueError(f"{path}: no weights: expected one of {', '.join(WEIGHT_FILES)}; the checkpoint is "
                         "incomplete (copy or save it again)")
    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        raise ValueError(f"{path / 'tokenizer.json'}: missing; the checkpoint has no tokenizer files "
                         f"({', '.join(TOKENIZER_FILES)}); copy them from the model's source")
    for file in weights:
        if file.name == "model.safetensors":
            check_safetensors(file)
        elif file.name.endswith(".index.json"):
            for shard in _index_shards(file):
                if not (path / shard).is_file():
                    raise ValueError(f"{path / shard}: missing; {file.name} lists it as a shard of the weights")
                if shard.endswith(".safetensors"):
                    check_safetensors(path / shard)


def read_config(path: Path) -> dict:
    """The parsed ``config.json`` of the folder `path`; ValueError for a missing, corrupt or foreign one."""
    file = path / "config.json"
    if not file.is_file():
        raise ValueError(f"{file}: missing; a checkpoint folder needs its config.json beside the weights")
    try:
        config = json.loads(file.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{file}: not valid JSON ({err}); the file is corrupt or truncated") from None
    if not isinstance(config, dict):
        raise ValueError(f"{file}: holds a {type(config).__name__}, not a JSON object of model settings")
    if "_class_name" in config:  # diffusers writes this key, transformers never does
        raise ValueError(f"{file}: a diffusers {config['_class_name']} config, not a language model; "
                         "`dlm sample` and `dlm bench` take a diffusion LM (image pipelines run under `dlm image`)")
    if "model_type" not in config:
        raise ValueError(f"{file}: no model_type key, so no model family can be chosen; the file is not a "
                         "transformers config (or lost that key)")
    return config


def check_safetensors(file: str | Path) -> None:
    """ValueError when `file` is not a whole safetensors file.

    Layout: an 8-byte little-endian header length n, n bytes of JSON mapping each tensor to its
    ``data_offsets`` [begin, end) in the data that follows; the file's size must be 8 + n + the
    largest end. Only the header is read.
    """
    file = Path(file)
    size = file.stat().st_size
    hint = "the file is truncated or corrupt (an interrupted download or copy); fetch or save it again"
    if size < 8:
        raise ValueError(f"{file}: {size} bytes, too short for a safetensors file; {hint}")
    with file.open("rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        if n > _MAX_HEADER or 8 + n > size:
            raise ValueError(f"{file}: header length {n} does not fit in the file's {size} bytes; {hint}")
        raw = f.read(n)
    try:
        header = json.loads(raw.decode("utf-8"))
        ends = [int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"]
    except (UnicodeDecodeError, json.JSONDecodeError, AttributeError, KeyError, IndexError, TypeError, ValueError):
        raise ValueError(f"{file}: its header is not valid safetensors JSON; {hint}") from None
    expected = 8 + n + max(ends, default=0)
    if size < expected:
        raise ValueError(f"{file}: truncated: the header describes {expected} bytes, the file has {size}; {hint}")
    if size > expected:
        raise ValueError(f"{file}: {size - expected} bytes more than its header describes ({expected}); {hint}")


def _index_shards(file: Path) -> list[str]:
    try:
        weight_map = json.loads(file.read_text())["weight_map"]
        return sorted(set(weight_map.values()))
    except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, AttributeError):
        raise ValueError(f"{file}: not a valid weights index (no weight_map); the file is corrupt") from None


def check_weights_fit(info: dict, path: str, config: Any) -> None:
    """ValueError when `from_pretrained(..., output_loading_info=True)` left parameters without weights
    (transformers would silently start them at random) or found weights of another architecture."""
    missing, unexpected = list(info.get("missing_keys") or []), list(info.get("unexpected_keys") or [])
    mismatched = list(info.get("mismatched_keys") or [])
    if not (missing or mismatched):
        return
    family = getattr(config, "model_type", "?")
    detail = (f"{len(missing)} parameters have no weights (e.g. {', '.join(sorted(missing)[:3])})" if missing
              else f"{len(mismatched)} weights have other shapes (e.g. {mismatched[0]})")
    extra = f" and {len(unexpected)} weights belong to no parameter" if unexpected else ""
    raise ValueError(f"{path}: the weights do not fit the {family!r} architecture of its config.json: {detail}{extra}; "
                     "the config is of another model family or size than the weights")


def check_tokenizer_fits(tokenizer: Any, config: Any, path: str) -> None:
    """ValueError when the tokenizer can emit ids at or beyond the model's vocabulary (embedding rows).

    A tokenizer smaller than the embedding is normal (rows padded for speed); a larger one means the
    tokenizer belongs to another model, and its high ids would index past the embedding.
    """
    vocab = getattr(config, "vocab_size", None)
    if not isinstance(vocab, int) or vocab <= 0:
        return
    try:
        n = len(tokenizer)
    except TypeError:
        n = getattr(tokenizer, "vocab_size", None)
    if not isinstance(n, int):
        return
    if n > vocab:
        where = Path(path) / "tokenizer.json" if (Path(path) / "tokenizer.json").is_file() else path
        raise ValueError(f"{where}: the tokenizer has {n} tokens but the model's vocabulary (config.json vocab_size) "
                         f"has {vocab}; its ids >= {vocab} would index past the embedding: the tokenizer "
                         "belongs to another model")
