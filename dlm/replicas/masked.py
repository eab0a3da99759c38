"""A transformers decoder stack run as a masked diffusion LM: bidirectional or block-causal, with the
project's windowed KV cache.

LLaDA and Dream are bidirectional transformers whose released modeling code is remote code; LLaDA2 is a
block-diffusion MoE (inclusionAI's `LLaDA2MoeModelLM`, remote code too). Their per-forward cost is that of
a transformers class with the same weight shapes: Llama (LLaDA), Qwen2 (Dream), GLM-4-MoE (LLaDA2). This
module runs such a class's own layers (`model.model.layers`, its rotary embedding, norm and LM head) under
the masked-model contract of `dlm.adapters` and `dlm.tiny.modeling`:

- no causal mask: every position attends to every key (LLaDA, Dream), or, with `block_length`, to the keys
  of its own block and the blocks before it, blocks aligned to absolute position 0 (LLaDA2's `generate`
  builds exactly this block-diagonal causal mask, `block_mask = tril(ones(num_blocks, num_blocks))`);
- the windowed cache of Fast-dLLM (Wu et al., 2025): a full call with `use_cache=True` returns the K/V
  of all `L` positions; a call with `past_key_values` and `cache_window=(s, e)` feeds only `x[:, s:e]`,
  whose new K/V replace slots `s:e` of (a copy of) the cache, and its queries attend over all `L` keys.
  Prefix cache is the window `(s, L)`, dual cache the window of one block.

The cache is plain tensors (a tuple over layers of `(K, V)`, each `[B, Hkv, L, Dh]`, K after rotary), so the
driver can slice, index and repeat its rows as it does the tiny model's. transformers' layers see it through
`_WindowKV`, an object with the one method their attention calls (`update`), which returns the K/V the
window's queries must attend to. Attention runs through SDPA (`attn_implementation="sdpa"`) with a boolean
mask, or no mask at all when nothing is padded and nothing is block-causal (then SDPA may use its
flash kernel).
"""
from __future__ import annotations

import inspect
from typing import Optional

import torch
import torch.nn as nn

from dlm.tiny.modeling import TinyDLMOutput

KVCache = tuple[tuple[torch.Tensor, torch.Tensor], ...]


class _WindowKV:
    """What transformers' attention layers call as their cache during one forward.

    `update(k, v, layer_idx)` gets the window's new K/V `[B, Hkv, Lq, Dh]` and returns the K/V the window's
    queries attend to: with a past, the past's slots before `s` and from `e` on around the new ones (new
    tensors: the caller's cache is never mutated); without one, the new K/V themselves. It keeps what it
    returned per layer: the full-length cache of this call."""

    def __init__(self, past: Optional[KVCache], window: Optional[tuple[int, int]], num_layers: int):
        self.past, self.window = past, window
        self.layers: list[Optional[tuple[torch.Tensor, torch.Tensor]]] = [None] * num_layers

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        if self.past is not None:
            s, e = self.window
            pk, pv = self.past[layer_idx]
            key_states = torch.cat([pk[:, :, :s].to(key_states.dtype), key_states, pk[:, :, e:].to(key_states.dtype)], 2)
            value_states = torch.cat([pv[:, :, :s].to(value_states.dtype), value_states,
                                      pv[:, :, e:].to(value_states.dtype)], 2)
        self.layers[layer_idx] = (key_states, value_states)
        return key_states, value_states


def _cache_keyword(layer: nn.Module) -> str:
    """The keyword a transformers decoder layer takes its cache under: transformers 5.24 renamed
    `past_key_values` to `cache` (the old name still works with a deprecation warning until 5.40)."""
    params = inspect.signature(layer.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def block_causal_allowed(query_positions: torch.Tensor, key_length: int, block_length: int) -> torch.Tensor:
    """`[Lq, L]` bool, True where a query at absolute position `query_positions[i]` may attend key `j`:
    the key's block (`j // block_length`) is not after the query's."""
    keys = torch.arange(key_length, device=query_positions.device)
    return (keys // block_length)[None, :] <= (query_positions // block_length)[:, None]


def count_real_positions(attention_mask: Optional[torch.Tensor], batch: int, length: int, device) -> torch.Tensor:
    """Rotary positions `[B, L]` counting real tokens from 0 (left padding skipped), as transformers and the
    tiny model compute them from a 2-D attention mask; `arange(L)` without a mask."""
    if attention_mask is None:
        return torch.arange(length, device=device).expand(batch, length)
    return (attention_mask.long().cumsum(dim=1) - 1).clamp_min(0)


class MaskedReplica(nn.Module):
    """A transformers causal-LM class (`lm`: `model.layers`, `model.rotary_emb`, `model.norm`, `lm_head`)
    run without a causal mask, under the masked-model contract.

    forward(input_ids, attention_mask=None, position_ids=None, past_key_values=None, cache_window=None,
            use_cache=False, output_hidden_states=False) -> TinyDLMOutput (the same call and output as
    `dlm.tiny.modeling.TinyDLMModel`, whose docstring gives the window rules):
    - input_ids `[B, Lq]`; attention_mask `[B, L]` (1 real, 0 left pad; masks keys only), always the full
      sequence's; position_ids `[B, Lq]` (default: real-token count over the full sequence, sliced to the window);
    - logits `[B, Lq, V]` in the model's dtype (LLaDA's and Dream's own code return them unconverted too;
      the engine takes float32 before any softmax);
    - past_key_values: a tuple over layers of `(K, V)`, `[B, Hkv, L, Dh]` for all `L` positions.

    Attributes: `config` (the transformers config, with `mask_token_id`, `eos_token_id`, `pad_token_id` and,
    for the shifted Dream family, `shift_logits=True`), `supports_dlm_kv_cache = True`, and
    `dlm_block_causal` (True with `block_length`: the driver then feeds `x[:, :block_end]`).
    """

    supports_dlm_kv_cache = True

    def __init__(self, lm: nn.Module, block_length: Optional[int] = None):
        super().__init__()
        self.lm = lm
        self.config = lm.config
        self.block_length = block_length
        self.dlm_block_causal = block_length is not None
        for layer in lm.model.layers:
            # SDPA takes `is_causal` from the module when no mask is passed; a diffusion LM has none.
            layer.self_attn.is_causal = False
        self._cache_kw = _cache_keyword(lm.model.layers[0]) if len(lm.model.layers) else "cache"

    @property
    def device(self) -> torch.device:
        return self.lm.lm_head.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.lm.lm_head.weight.dtype

    def _window_of(self, past, cache_window, length: int) -> tuple[int, Optional[tuple[int, int]], int]:
        """(L, window, start) of a call: the full length, the window `(s, e)` or None, its first position."""
        if (past is None) != (cache_window is None):
            raise ValueError("past_key_values and cache_window must be given together")
        if past is None:
            return length, None, 0
        if len(past) != len(self.lm.model.layers):
            raise ValueError(f"past_key_values has {len(past)} layers, the model has {len(self.lm.model.layers)}")
        full = past[0][0].shape[2]
        s, e = int(cache_window[0]), int(cache_window[1])
        if full == s and e - s == length:
            full = e  # a cache of the first s positions only (a prompt cache): the window is the rest
        if not (0 <= s < e <= full) or e - s != length:
            raise ValueError(f"cache_window {cache_window} does not fit cache length {full} and input length {length} "
                             f"(need 0 <= s < e <= L and e - s == input length, or a cache of exactly s positions)")
        return full, (s, e), s

    def _attention_mask(self, attention_mask, batch: int, full: int, start: int, length: int, device):
        """Boolean SDPA mask `[B or 1, 1, Lq, L]` (True = may attend), or None without an attention mask on
        a model that is not block-causal: SDPA then runs unmasked and non-causal."""
        allowed = None
        if attention_mask is not None:  # the driver passes none when nothing is padded (no host sync here)
            if tuple(attention_mask.shape) != (batch, full):
                raise ValueError(f"attention_mask must be the full [B, L] = {(batch, full)}, got "
                                 f"{tuple(attention_mask.shape)}")
            allowed = attention_mask.bool()[:, None, None, :]  # keys only
        if self.block_length is not None:
            queries = torch.arange(start, start + length, device=device)
            blocks = block_causal_allowed(queries, full, self.block_length)[None, None]
            allowed = blocks if allowed is None else allowed & blocks
        return allowed

    def forward(self, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor] = None,
                position_ids: Optional[torch.Tensor] = None, past_key_values: Optional[KVCache] = None,
                cache_window: Optional[tuple[int, int]] = None, use_cache: bool = False,
                output_hidden_states: bool = False, **kwargs) -> TinyDLMOutput:
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must be [B, L], got shape {tuple(input_ids.shape)}")
        batch, length = input_ids.shape
        full, window, start = self._window_of(past_key_values, cache_window, length)
        if position_ids is None:
            position_ids = count_real_positions(attention_mask, batch, full, input_ids.device)[:, start:start + length]
        elif tuple(position_ids.shape) != (batch, length):
            raise ValueError(f"position_ids must be {(batch, length)}, got {tuple(position_ids.shape)}")
        mask = self._attention_mask(attention_mask, batch, full, start, length, input_ids.device)
        base = self.lm.model
        cache = None
        if past_key_values is not None or use_cache:
            cache = _WindowKV(past_key_values, window, len(base.layers))
        h = base.embed_tokens(input_ids)
        rotary = base.rotary_emb(h, position_ids)
        hidden = [h] if output_hidden_states else None
        for i, layer in enumerate(base.layers):
            out = layer(h, attention_mask=mask, position_ids=position_ids, position_embeddings=rotary,
                        **{self._cache_kw: cache})
            h = out[0] if isinstance(out, tuple) else out  # transformers < 5 returned a tuple
            if hidden is not None and i < len(base.layers) - 1:
                hidden.append(h)
        h = base.norm(h)
        if hidden is not None:
            hidden.append(h)
        logits = self.lm.lm_head(h)
        return TinyDLMOutput(logits=logits, past_key_values=tuple(cache.layers) if use_cache else None,
                             hidden_states=tuple(hidden) if hidden is not None else None)
