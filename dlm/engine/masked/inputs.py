"""Checks of a masked model's prompt and ids before the loop, and the attention mask over the
generation (left padding)."""
from __future__ import annotations

import torch

from dlm.adapters import DLMAdapter


def full_attention_mask(attention_mask, gen_length):
    """Extend a prompt attention mask over the generation; None when nothing is padded.

    LLaDA was trained without an attention mask, so an all-ones mask is dropped rather than passed
    (passing it could change results on some remote-code models)."""
    if attention_mask is None or bool(attention_mask.all()):
        return None, None
    mask = torch.cat([attention_mask.long(), attention_mask.new_ones(attention_mask.shape[0], gen_length).long()], dim=1)
    positions = (mask.cumsum(dim=1) - 1).clamp_min(0)
    return mask, positions


def check_special_ids(adapter: DLMAdapter) -> None:
    """The mask and EOS ids must be tokens of the model: a mask id past the vocabulary would fail
    deep in the embedding lookup of the first forward."""
    vocab = adapter.vocab_size
    if vocab is None:
        return
    for name, value in (("mask_token_id", adapter.mask_token_id), ("eos_token_id", adapter.eos_token_id)):
        if value is not None and not 0 <= value < vocab:
            raise ValueError(f"{name}={value} is outside the model's vocabulary (0..{vocab - 1}); pass the model's "
                             f"own {name} or leave it to the config")


def check_prompt_ids(adapter: DLMAdapter, input_ids: torch.Tensor, attention_mask: torch.Tensor | None):
    """Refuse prompts the model would silently get wrong; returns the attention mask to use.

    - ids outside the vocabulary (the embedding lookup would fail deep inside the model);
    - the mask id inside a real prompt token (the model would treat it as a blank to fill);
    - a model whose config names a prompt separator (`position_restart_token_id`, the tiny model's
      newline) needs every prompt to end with it;
    - left padding without `attention_mask`: rows starting with the pad id get a mask that hides
      that leading run (the documented convention); when the pad id is also the EOS or mask id the
      padding cannot be told apart, so we refuse and ask for `attention_mask`.
    Shapes: input_ids `[B, P]`, attention_mask `[B, P]` or None.
    """
    vocab = adapter.vocab_size
    low, high = int(input_ids.min()), int(input_ids.max())
    if low < 0 or (vocab is not None and high >= vocab):
        bad = low if low < 0 else high
        raise ValueError(f"input_ids contains token id {bad}, outside the model's vocabulary (0..{(vocab or 0) - 1}); "
                         "encode the prompt with the model's tokenizer")
    pad = adapter.pad_token_id
    if attention_mask is None and pad is not None and bool((input_ids[:, 0] == pad).any()):
        if pad in (adapter.eos_token_id, adapter.mask_token_id):
            raise ValueError(f"input_ids rows start with token {pad}, which is the pad id and also the EOS or mask id, "
                             "so left padding cannot be detected; pass attention_mask (0 on padding, 1 on prompt tokens)")
        attention_mask = ((input_ids != pad).long().cummax(dim=1).values)
        if not bool(attention_mask[:, -1].all()):
            raise ValueError(f"a row of input_ids is all padding (pad id {pad}); give every row a prompt")
    real = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
    hit = (input_ids == adapter.mask_token_id) & real
    if bool(hit.any()):
        row, col = (int(v) for v in hit.nonzero()[0])
        raise ValueError(f"the prompt contains the mask token id {adapter.mask_token_id} (row {row}, position {col}); "
                         "a prompt must not contain masks: remove it, or pass the right mask_token_id")
    separator = adapter.prompt_separator_id
    if separator is not None and not bool((input_ids[:, -1] == separator).all()):
        row = int((input_ids[:, -1] != separator).nonzero()[0])
        raise ValueError(f"prompt row {row} does not end with the model's prompt separator (token {separator}); "
                         "encode prompts with tokenizer.encode_prompt(text) or use DLMPipeline")
    return attention_mask
