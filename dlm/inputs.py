"""What `dlm.generate` checks about its model and tensors before anything else, for both families.

Each mistake a new user makes with the arguments gets one ValueError naming the argument and the
fix, before any forward pass (a bad mask or a `None` model would otherwise fail deep inside the
model, or return a silent wrong answer). Integer ids of another width are cast to `torch.long`: every
integer dtype's values fit, so the cast changes no value. Called once at the top of `dlm.generate`.
"""
from __future__ import annotations

import torch

# Integer dtypes whose every value fits `torch.long` unchanged (uint64 does not exist in torch's
# indexing ops; bool is not a token id).
_SAFE_ID_DTYPES = (torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64)


def check_generate_inputs(model, input_ids, attention_mask) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`(input_ids, attention_mask)` ready for the loops: ids as `[B, P]` long, the mask `[B, P]`
    (0/1, same dtype rules) or None; ValueError for anything the loops would get wrong.

    Shapes: input_ids `[B, P]` integer; attention_mask `[B, P]` of 0 (left padding) and 1 (prompt).
    """
    _check_model(model)
    input_ids = _token_ids(input_ids)
    if attention_mask is not None:
        attention_mask = _attention_mask(attention_mask, input_ids)
    return input_ids, attention_mask


def _check_model(model) -> None:
    if model is None:
        raise ValueError("model is None: pass the model itself, e.g. `model, tokenizer = dlm.load(\"tiny-dlm\")` "
                         "then `dlm.generate(model, input_ids)`")
    from dlm.adapters import DLMAdapter

    if not callable(model) and not isinstance(model, DLMAdapter):
        raise ValueError(f"model must be a callable model (a torch module or `model(input_ids) -> logits`), got "
                         f"{type(model).__name__}; load one with dlm.load(name)")


def _token_ids(input_ids) -> torch.Tensor:
    if not isinstance(input_ids, torch.Tensor):
        raise ValueError(f"input_ids must be a [batch, prompt_length] tensor of token ids, got "
                         f"{type(input_ids).__name__}; wrap a list as torch.tensor([ids])")
    if input_ids.dtype not in _SAFE_ID_DTYPES:
        raise ValueError(f"input_ids must hold integer token ids, got dtype {input_ids.dtype}; encode the prompt "
                         "with the tokenizer (tokenizer.encode_prompt(text) for the built-in model)")
    if input_ids.dim() != 2:
        hint = "; add the batch dimension: input_ids.unsqueeze(0)" if input_ids.dim() == 1 else ""
        raise ValueError(f"input_ids must be [batch, prompt_length], got shape {tuple(input_ids.shape)}{hint}")
    if input_ids.shape[1] == 0:
        raise ValueError("input_ids is empty: give a prompt of at least one token")
    return input_ids.long()  # value-preserving for every dtype above; a no-op (same tensor) for long


def _attention_mask(mask, input_ids: torch.Tensor) -> torch.Tensor:
    if not isinstance(mask, torch.Tensor) or mask.shape != input_ids.shape:
        shape = tuple(mask.shape) if isinstance(mask, torch.Tensor) else type(mask).__name__
        raise ValueError(f"attention_mask shape {shape} must equal input_ids shape {tuple(input_ids.shape)}")
    if mask.dtype != torch.bool:
        if mask.is_complex():
            raise ValueError(f"attention_mask must hold 0 and 1, got dtype {mask.dtype}")
        values = torch.unique(mask)  # one host read, before decoding starts
        bad = [v for v in values.tolist() if v not in (0, 1)]
        if bad:
            raise ValueError(f"attention_mask must hold only 0 (left padding) and 1 (prompt tokens), got "
                             f"{bad[0]!r}; build it as (input_ids != pad_id).long()")
    empty = ~mask.bool().any(dim=1)
    if bool(empty.any()):
        row = int(empty.nonzero()[0])
        raise ValueError(f"attention_mask row {row} is all zeros, so that row has no prompt to answer; give every "
                         "row at least one prompt token (1), or leave the row out")
    return mask.long()
