"""Argument helpers shared by the `dlm` subcommands."""
from __future__ import annotations

import argparse
import math
import os
from pathlib import Path

# `dlm.decoding_config.KV_CACHE_MODES`, repeated here so that building the parser does not import torch.
KV_CACHE_CHOICES = ("none", "prefix", "dual", "prompt", "elastic", "auto")


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def temperature_value(text: str) -> float:
    """--temperature: a finite number >= 0 (nan and inf would silently emit empty text or masks)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0 (0 is greedy), got {text!r}")
    return value


def device_value(text: str) -> str:
    """--device: a torch device this torch build can use (checked before any model loads)."""
    import torch

    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        raise argparse.ArgumentTypeError(f"unknown device {text!r}; use cpu, cuda or cuda:N") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise argparse.ArgumentTypeError(
            f"device {text!r}: this torch ({torch.__version__}) sees no CUDA device; use --device cpu, "
            "or install a CUDA build of torch on a machine with a GPU")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise argparse.ArgumentTypeError(f"device {text!r}: only {torch.cuda.device_count()} CUDA device(s) present")
    return text


def check_output_dir(path: str | os.PathLike, flag: str = "--out") -> Path:
    """Fail before any work if `path` cannot become a writable directory (not under a file)."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ValueError(f"{flag} {path}: exists and is not a directory; choose a folder path")
    ancestor = path
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise ValueError(f"{flag} {path}: {ancestor} is a file, so no folder can be made under it; choose another path")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise ValueError(f"{flag} {path}: no permission to write in {ancestor}; choose another path")
    return path


def quiet_transformers() -> None:
    """Keep stderr for our own progress and errors: no weight-loading bars from transformers."""
    from transformers.utils import logging

    logging.disable_progress_bar()
    logging.set_verbosity_error()


def quiet_diffusers() -> None:
    """No loader advice (e.g. "install accelerate") from diffusers on the user's stderr."""
    from diffusers.utils import logging

    logging.set_verbosity_error()


def seeded_generator(seed: int):
    import torch

    return torch.Generator().manual_seed(seed)


def add_decoding_arguments(parser: argparse.ArgumentParser) -> None:
    """The decoding options of `dlm sample`, with the API's defaults, stated per model family (masked:
    tiny-dlm, LLaDA, Dream, LLaDA2; uniform noise: DiffusionGemma, tiny-dgemma)."""
    parser.add_argument("--model", default="tiny-dlm",
                        help="built-in name (see `dlm models`), checkpoint folder or hub id (default: tiny-dlm)")
    parser.add_argument("--gen-length", type=positive_int, default=None,
                        help="tokens to generate (default: 64 on a masked model; on DiffusionGemma the generation "
                             "config's max_new_tokens, 48 for tiny-dgemma; DiffusionGemma rounds up to whole canvases "
                             "and both stop early at EOS)")
    parser.add_argument("--block-length", type=positive_int, default=None,
                        help="semi-autoregressive block size (default: gen-length, one block, on a masked model; the "
                             "canvas length on DiffusionGemma, where a --sampler may take a divisor of it)")
    parser.add_argument("--temperature", type=temperature_value, default=0.0,
                        help="0 is greedy (default: 0); DiffusionGemma's own rule takes its temperatures from the "
                             "generation config (t_max, t_min) and needs --sampler for this one")
    parser.add_argument("--kv-cache", choices=KV_CACHE_CHOICES, default="auto",
                        help="masked models: Fast-dLLM's prefix or dual, prompt (the prompt's K/V only; exact for a "
                             "model whose prompt ignores the response), none, or auto (prompt where exact, else none); "
                             "DiffusionGemma keeps its own exact encoder cache: auto or none (default: auto)")
    parser.add_argument("--seed", type=int, default=0,
                        help="random seed: the sampler's generator, or torch's global RNG for DiffusionGemma's own "
                             "rule, as transformers' generate draws from it (default: 0)")
    parser.add_argument("--device", type=device_value, default="cpu", help="torch device (default: cpu)")
