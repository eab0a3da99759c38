"""Argument helpers shared by the `dlm` subcommands."""
from __future__ import annotations

import argparse

import torch


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def quiet_transformers() -> None:
    """Keep stderr for our own progress and errors: no weight-loading bars from transformers."""
    from transformers.utils import logging

    logging.disable_progress_bar()
    logging.set_verbosity_error()


def seeded_generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def add_decoding_arguments(parser: argparse.ArgumentParser) -> None:
    """The decoding options every dLLM subcommand shares, with the same defaults as the API."""
    parser.add_argument("--model", default="tiny-dlm", help="built-in name (see `dlm models`) or checkpoint path (default: tiny-dlm)")
    parser.add_argument("--gen-length", type=positive_int, default=64, help="tokens to generate (default: 64)")
    parser.add_argument("--block-length", type=positive_int, default=None, help="semi-autoregressive block size (default: gen-length)")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 is greedy (default: 0)")
    parser.add_argument("--kv-cache", choices=("none", "prefix", "dual"), default="none", help="Fast-dLLM KV cache (default: none)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
