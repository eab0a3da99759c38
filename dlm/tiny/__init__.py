"""The built-in tiny masked-diffusion LM (character level), its tokenizer and checkpoint.

`load_tiny_dlm()` returns `(model, tokenizer)` from the checkpoint shipped inside the package.
The model input for a task prompt is `prompt + "\\n"` (see `dlm.tasks.base.PROMPT_SUFFIX`); the
decoding driver then appends the mask tokens of the response.
"""
from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoConfig, AutoModel

from .configuration import TinyDLMConfig
from .modeling import TinyDLMModel, TinyDLMOutput
from .tokenizer import TinyCharTokenizer

CHECKPOINT_DIR = Path(__file__).resolve().parent / "checkpoints" / "tiny-dlm"
BUILTIN_MODELS = {"tiny-dlm": str(CHECKPOINT_DIR)}

try:
    AutoConfig.register("tiny-dlm", TinyDLMConfig)
except ValueError:  # already registered (module reloaded)
    pass
try:
    AutoModel.register(TinyDLMConfig, TinyDLMModel)
except ValueError:
    pass


def load_tiny_dlm(path=None, device="cpu", dtype=torch.float32):
    """Load the tiny DLM and its tokenizer; `path` defaults to the shipped checkpoint.

    Returns `(model, tokenizer)`, the model in eval mode on `device` in `dtype`.
    """
    d = Path(path) if path is not None else CHECKPOINT_DIR
    if not (d / "config.json").is_file():
        raise FileNotFoundError(
            f"no tiny-dlm checkpoint at {d} (expected config.json, model.safetensors, "
            f"tokenizer.json); train one with scripts/train_tiny_dlm.py")
    from dlm._progress import loading_bars

    with loading_bars():  # no "Loading weights" bar when stderr is redirected
        model = TinyDLMModel.from_pretrained(str(d), dtype=dtype)
    model.to(device=device, dtype=dtype).eval()
    tokenizer = TinyCharTokenizer.from_pretrained(d)
    return model, tokenizer


__all__ = ["TinyDLMConfig", "TinyDLMModel", "TinyDLMOutput", "TinyCharTokenizer",
           "load_tiny_dlm", "BUILTIN_MODELS", "CHECKPOINT_DIR"]
