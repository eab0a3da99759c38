"""Progress bars only where someone watches: on a terminal, unless asked for."""
from __future__ import annotations

import contextlib
import sys


def show_progress(requested: bool | None = None) -> bool:
    """`requested` True/False wins; None means "if stderr is a terminal" (not when redirected to a file)."""
    return sys.stderr.isatty() if requested is None else bool(requested)


@contextlib.contextmanager
def loading_bars(requested: bool | None = None):
    """Within the block, transformers' weight-loading bars follow `show_progress(requested)`."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    if show_progress(requested):
        hf_logging.enable_progress_bar()
    else:
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        (hf_logging.enable_progress_bar if was_enabled else hf_logging.disable_progress_bar)()
