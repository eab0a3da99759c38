"""The built-in tiny masked-diffusion LM (character level), its tokenizer and checkpoint.

`load_tiny_dlm()` returns `(model, tokenizer)` from the checkpoint shipped inside the package.
The model input for a task prompt is `prompt + "\\n"` (see `dlm.tasks.base.PROMPT_SUFFIX`); the
decoding driver then appends the mask tokens of the response.
"""
from __future__ import annotations

import importlib
from pathlib import Path

CHECKPOINT_DIR = Path(__file__).resolve().parent / "checkpoints" / "tiny-dlm"
BUILTIN_MODELS = {"tiny-dlm": str(CHECKPOINT_DIR),
                  # transformers' DiffusionGemma architecture, trained by scripts/train_tiny_dgemma.py
                  "tiny-dgemma": str(CHECKPOINT_DIR.parent / "tiny-dgemma"),
                  # tiny-dlm fine-tuned on the long sequential `chains` suite as well (issue 33)
                  "tiny-dlm-chains": str(CHECKPOINT_DIR.parent / "tiny-dlm-chains"),
                  # tiny-dlm fine-tuned on the running sum (`chains-hard` suite's `sum`), a chain that
                  # the position cannot shortcut (issue 33)
                  "tiny-dlm-chains-hard": str(CHECKPOINT_DIR.parent / "tiny-dlm-chains-hard")}

# Classes load on first use (PEP 562): listing the built-in models needs neither torch nor
# transformers. Touching any of them registers the config with transformers' Auto classes.
_LAZY = {"TinyDLMConfig": ".configuration", "TinyDLMModel": ".modeling", "TinyDLMOutput": ".modeling",
         "TinyCharTokenizer": ".tokenizer"}


def register_auto_classes() -> None:
    """Make `AutoConfig` / `AutoModel` know "tiny-dlm" (idempotent)."""
    from transformers import AutoConfig, AutoModel

    from .configuration import TinyDLMConfig
    from .modeling import TinyDLMModel

    try:
        AutoConfig.register("tiny-dlm", TinyDLMConfig)
    except ValueError:  # already registered
        pass
    try:
        AutoModel.register(TinyDLMConfig, TinyDLMModel)
    except ValueError:
        pass


def __getattr__(name: str):
    if name in _LAZY:
        module = importlib.import_module(_LAZY[name], __name__)
        if name != "TinyCharTokenizer":
            register_auto_classes()
        return getattr(module, name)
    raise AttributeError(f"module 'dlm.tiny' has no attribute {name!r}")


def load_tiny_dlm(path=None, device="cpu", dtype=None):
    """Load the tiny DLM and its tokenizer; `path` defaults to the shipped checkpoint.

    Returns `(model, tokenizer)`, the model in eval mode on `device` in `dtype`.
    """
    import torch

    from .modeling import TinyDLMModel
    from .tokenizer import TinyCharTokenizer

    register_auto_classes()
    dtype = torch.float32 if dtype is None else dtype
    d = Path(path) if path is not None else CHECKPOINT_DIR
    if not (d / "config.json").is_file():
        raise FileNotFoundError(
            f"no tiny-dlm checkpoint at {d} (expected config.json, model.safetensors, "
            f"tokenizer.json); train one with scripts/train_tiny_dlm.py")
    from dlm._progress import loading_bars

    with loading_bars(False):  # never a "Loading weights" bar: this model loads in milliseconds
        model = TinyDLMModel.from_pretrained(str(d), dtype=dtype)
    model.to(device=device, dtype=dtype).eval()
    tokenizer = TinyCharTokenizer.from_pretrained(d)
    return model, tokenizer


__all__ = ["TinyDLMConfig", "TinyDLMModel", "TinyDLMOutput", "TinyCharTokenizer",
           "load_tiny_dlm", "BUILTIN_MODELS", "CHECKPOINT_DIR"]
