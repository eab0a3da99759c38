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
                        help="semi-autoregressive block size (default: 32 where it divides gen-length, else one block, on "
                             "a masked model; the "
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


# ------------------------------------------------------------------ threads
THREADS_ENV = "DLM_THREADS"
# Threads for a built-in language model on the CPU when neither --threads nor DLM_THREADS says
# otherwise. Each forward of these 1-2M-parameter models is a few small matrix products: torch's one
# thread per core spends more time meeting at barriers than computing, and collapses when another
# process holds a core (docs/dlm.md, "Threads": `scripts/bench_threads.py`, one thread 5-62x faster
# than two on a shared 2-core machine). A command whose work differs sets `builtin_threads`: a count
# (`dlm image`: its digits transformer is faster on two), or 0 for torch's default (`dlm train-joint`:
# its training batches are faster on every core).
SMALL_MODEL_THREADS = 1


def add_threads_argument(parser: argparse.ArgumentParser) -> None:
    """`--threads N` (every command that computes; `dlm.cli` adds it to each one)."""
    own = parser.get_default("builtin_threads")
    default = ("torch's, one per core (measured fastest here)" if own == 0 else
               f"{own} for the shipped model (measured fastest)" if own else
               f"{SMALL_MODEL_THREADS} for the built-in models on the CPU, where more threads are slower, and torch's "
               "one per core for other models")
    parser.add_argument("--threads", type=positive_int, default=None,
                        help=f"torch CPU threads (default: ${THREADS_ENV} if set, else {default})")


def requested_threads(args: argparse.Namespace) -> tuple[int | None, str]:
    """(threads, why): --threads, else $DLM_THREADS, else the small-model default where it applies
    (a built-in model or oracle on the CPU), else (None, "torch's default"). ValueError for a bad
    $DLM_THREADS (one line, as for a bad flag)."""
    if getattr(args, "threads", None):
        return args.threads, "--threads"
    env = os.environ.get(THREADS_ENV, "").strip()
    if env:
        try:
            value = int(env)
        except ValueError:
            value = 0
        if value <= 0:
            raise ValueError(f"{THREADS_ENV}={env!r}: expected a positive integer; unset it or use --threads N")
        return value, THREADS_ENV
    own = getattr(args, "builtin_threads", None)
    if own != 0 and _runs_a_builtin_on_cpu(args):
        return own or SMALL_MODEL_THREADS, "built-in model"
    return None, "torch's default"


def _runs_a_builtin_on_cpu(args: argparse.Namespace) -> bool:
    if str(getattr(args, "device", "cpu") or "cpu") != "cpu":
        return False
    if getattr(args, "builtin_threads", None):  # `dlm image`: always the shipped digits model
        return True
    model = getattr(args, "model", None)
    if not isinstance(model, str):
        return False
    from dlm.tiny import BUILTIN_MODELS  # a dict of paths: no torch import

    return model in BUILTIN_MODELS or model.startswith("oracle-")


def apply_threads(args: argparse.Namespace) -> None:
    """Set torch's thread count as `requested_threads` says (nothing, and no torch import, when torch
    keeps its default)."""
    threads, _ = requested_threads(args)
    if threads is not None:
        import torch

        torch.set_num_threads(threads)


def threads_label() -> str:
    """"1 thread" / "2 threads": what torch runs with now, for summary lines."""
    import torch

    n = torch.get_num_threads()
    return f"{n} thread{'s' if n != 1 else ''}"
