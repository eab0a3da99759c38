"""What one forward pass of a replica must read from device memory: the weight-streaming floor.

A decoding forward at small batch is bound by memory bandwidth: every weight it uses is read once from
HBM, whatever the batch (Williams et al., 2009, the roofline model). Its floor is therefore
`bytes read / copy bandwidth`. The bytes are counted from the built model's own parameter tensors (meta
or real), per part of the forward:

- every weight of every decoder layer, the final norm and the LM head is read once;
- the input embedding is gathered (only the rows of the tokens fed), except where a forward multiplies by
  the whole table: DiffusionGemma's self-conditioning (`softmax(previous logits) @ embed_tokens`) reads it in
  full, and its LM head is the same tied matrix, read a second time;
- an MoE layer reads only the experts its tokens route to: for N routed tokens (all rows together) each
  picking k of E experts, uniform routing gives E * (1 - (1 - k/E)^N) distinct experts in expectation
  (`expected_distinct_experts`); a trained router is rarely uniform, so `weight_bytes_all_experts` (every
  expert read) is the upper bound beside it. A 256-token DiffusionGemma canvas routes to 128 * (1 - (120/128)^256)
  = 127.99 of 128 experts: effectively all;
- a forward against a KV cache also reads the cached keys and values (`kv_bytes`, reported apart): what
  attention reads of positions the forward does not recompute.
Activations (a few MB at these shapes) are not counted.

Many tokens per forward (a batch of full 288-token forwards) make it compute-bound instead, so the cost also
counts matmul FLOPs (`flops`): 2 per weight a token multiplies (every 2-D weight of the layers, k of the E
experts, the LM head, DiffusionGemma's self-conditioning product with the table), plus attention's
4 * Lq * Lk * (heads * head_dim) per row and layer. The floor of a forward is then the larger of
`bytes / bandwidth` and `flops / matmul rate` (the roofline).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn as nn

from dlm.replicas.build import distinct_parameters


@dataclass(frozen=True)
class ForwardCost:
    """Bytes one forward pass reads.

    rows / query_tokens: the forward's batch rows and query positions per row (N = rows * query_tokens
    tokens route to experts). weight_bytes: weights read, experts at their expected count under uniform
    routing. weight_bytes_all_experts: every expert read (upper bound; equal for dense models).
    kv_bytes: cached K/V read (0 without a cache). experts_per_layer: expected distinct experts per MoE
    layer (None for dense models). flops: matmul floating-point operations of the forward.
    """

    rows: int
    query_tokens: int
    weight_bytes: int
    weight_bytes_all_experts: int
    kv_bytes: int
    experts_per_layer: Optional[float]
    flops: int = 0

    @property
    def bytes(self) -> int:
        """Weights (expected) plus cached K/V: the floor's numerator."""
        return self.weight_bytes + self.kv_bytes

    def floor_ms(self, copy_gbps: float) -> float:
        """Time to stream `bytes` at the device's measured copy bandwidth (GB/s, 1e9 bytes)."""
        return self.bytes / (copy_gbps * 1e9) * 1e3

    def compute_floor_ms(self, matmul_tflops: float) -> float:
        """Time to run `flops` at the device's measured matmul rate (TFLOP/s)."""
        return self.flops / (matmul_tflops * 1e12) * 1e3

    def as_dict(self) -> dict:
        return {"rows": self.rows, "query_tokens": self.query_tokens, "weight_bytes": self.weight_bytes,
                "weight_bytes_all_experts": self.weight_bytes_all_experts, "kv_bytes": self.kv_bytes,
                "bytes": self.bytes, "experts_per_layer": self.experts_per_layer, "flops": self.flops}


def expected_distinct_experts(tokens: int, num_experts: int, top_k: int) -> float:
    """Expected number of distinct experts `tokens` tokens route to when each picks `top_k` of `num_experts`
    uniformly without replacement: one token misses a given expert with probability 1 - k/E, all of them
    with (1 - k/E)^N. Group-limited routing (LLaDA2) keeps every expert's marginal at k/E: the same count."""
    if tokens <= 0:
        return 0.0
    return num_experts * (1.0 - math.pow(1.0 - top_k / num_experts, tokens))


def _is_expert_bank(module: nn.Module) -> bool:
    """transformers' stacked expert weights (`*Experts` with `gate_up_proj [E, 2I, H]`, `down_proj [E, H, I]`)."""
    return type(module).__name__.endswith("Experts") and hasattr(module, "num_experts")


def _bytes(params, itemsize: int) -> int:
    return sum(p.numel() for p in params) * itemsize


def _layer_bytes(layers: nn.Module, itemsize: int, tokens: int, top_k: int) -> tuple[float, int, Optional[float]]:
    """(bytes read with the expected experts, bytes with all experts, expected experts per MoE layer)."""
    per_layer = None
    banks = [m for m in layers.modules() if _is_expert_bank(m)]
    bank_params = {id(p) for m in banks for p in m.parameters()}
    dense = [p for _, p in distinct_parameters(layers) if id(p) not in bank_params]
    expected = everything = float(_bytes(dense, itemsize))
    for bank in banks:
        bank_bytes = _bytes(bank.parameters(), itemsize)
        per_layer = expected_distinct_experts(tokens, bank.num_experts, top_k)
        expected += bank_bytes * per_layer / bank.num_experts
        everything += bank_bytes
    return expected, int(everything), per_layer


def _per_token_weights(layers: nn.Module, top_k: int) -> float:
    """Weights one token multiplies in `layers`: every 2-D weight outside the expert banks (projections, dense
    and shared MLPs, routers) and k/E of each bank."""
    banks = [m for m in layers.modules() if _is_expert_bank(m)]
    bank_params = {id(p) for m in banks for p in m.parameters()}
    dense = sum(p.numel() for _, p in distinct_parameters(layers) if p.dim() == 2 and id(p) not in bank_params)
    return dense + sum(sum(p.numel() for p in m.parameters()) * top_k / m.num_experts for m in banks)


def _attention_flops(layers: nn.Module, rows: int, query: int, keys_of) -> int:
    """4 * Lq * Lk * (heads * head_dim) per row and layer: the QK^T and PV products (`keys_of(attn)` = Lk)."""
    return sum(4 * rows * query * keys_of(layer.self_attn) * layer.self_attn.q_proj.out_features for layer in layers)


def _top_k(text_config) -> int:
    return int(getattr(text_config, "top_k_experts", None) or getattr(text_config, "num_experts_per_tok", 0) or 0)


def _kv_bytes_per_position(layers: nn.Module, itemsize: int, context_of=None) -> int:
    """Bytes of one position's cached K and V over all layers (`[Hkv, Dh]` each; both stored even where
    a layer shares K and V)."""
    total = 0
    for layer in layers:
        attn = layer.self_attn
        kv_heads = attn.k_proj.out_features // attn.head_dim
        total += 2 * kv_heads * attn.head_dim * itemsize * (1 if context_of is None else context_of(attn))
    return total


def forward_cost(model: nn.Module, *, rows: int, query_tokens: int, cached_positions: int = 0,
                 dtype: Optional[torch.dtype] = None) -> ForwardCost:
    """Bytes read and matmul FLOPs of one forward of a replica (`dlm.replica(...)`, on any device including meta).

    Masked replicas (`MaskedReplica`): a forward of `query_tokens` positions per row; `cached_positions`
    per row are read from a KV cache instead of recomputed (a prefix-cache window of 32 tokens after a
    256-token prompt: query_tokens 32, cached_positions 256; a full 288-token forward: 288 and 0).
    DiffusionGemma: one decoder forward over a canvas of `query_tokens` against an encoder cache of
    `cached_positions` prompt tokens (sliding layers read at most their window), with self-conditioning
    (every step after the first): the embedding table is read for it and again as the tied LM head.
    dtype: the weights' dtype (default: the model's; give it for a model built on meta).
    """
    params = distinct_parameters(model)
    dtype = dtype or params[0][1].dtype
    itemsize = torch.empty((), dtype=dtype).element_size()
    tokens = rows * query_tokens
    if hasattr(model, "lm"):  # MaskedReplica around a transformers causal LM
        lm = model.lm
        text = lm.config
        expected, everything, per_layer = _layer_bytes(lm.model.layers, itemsize, tokens, _top_k(text))
        embed = lm.model.embed_tokens.weight
        rest = _bytes(lm.model.norm.parameters(), itemsize) + _bytes([lm.lm_head.weight], itemsize)
        gathered = tokens * embed.shape[1] * itemsize
        kv = rows * cached_positions * _kv_bytes_per_position(lm.model.layers, itemsize)
        flops = (2 * tokens * (_per_token_weights(lm.model.layers, _top_k(text)) + lm.lm_head.weight.numel())
                 + _attention_flops(lm.model.layers, rows, query_tokens, lambda attn: query_tokens + cached_positions))
    else:  # DiffusionGemmaForBlockDiffusion: one decoder forward
        decoder = model.model.decoder
        text = model.config.text_config
        expected, everything, per_layer = _layer_bytes(decoder.layers, itemsize, tokens, _top_k(text))
        table = _bytes([decoder.embed_tokens.weight], itemsize)
        rest = (_bytes(decoder.norm.parameters(), itemsize) + _bytes(decoder.self_conditioning.parameters(), itemsize)
                + 2 * table)  # the self-conditioning matmul and the tied LM head each read the whole table
        gathered = tokens * decoder.embed_tokens.weight.shape[1] * itemsize
        window = int(getattr(text, "sliding_window", 0) or 0)

        def context_of(attn):
            return min(cached_positions, window) if (attn.is_sliding and window) else cached_positions

        kv = rows * _kv_bytes_per_position(decoder.layers, itemsize, context_of)
        per_token = (_per_token_weights(decoder.layers, _top_k(text))
                     + sum(p.numel() for p in decoder.self_conditioning.parameters() if p.dim() == 2)
                     + 2 * decoder.embed_tokens.weight.numel())  # self-conditioning product and LM head
        flops = 2 * tokens * per_token + _attention_flops(decoder.layers, rows, query_tokens,
                                                          lambda attn: context_of(attn) + query_tokens)
    return ForwardCost(rows=rows, query_tokens=query_tokens, weight_bytes=int(expected + rest + gathered),
                       weight_bytes_all_experts=int(everything + rest + gathered), kv_bytes=int(kv),
                       experts_per_layer=per_layer, flops=int(flops))


def parameter_counts(model: nn.Module) -> dict:
    """{"total", "active"}: distinct text parameters (tied weights once; DiffusionGemma's vision tower left
    out), and those one token uses (every non-expert weight, k/E of each expert bank), as model cards count
    "activated" parameters (embeddings included)."""
    params = distinct_parameters(model)
    vision = set()
    inner = getattr(model, "model", None)
    tower = getattr(getattr(inner, "encoder", None), "vision_tower", None)
    if tower is not None:
        vision = {id(p) for p in tower.parameters()}
    total = sum(p.numel() for _, p in params if id(p) not in vision)
    text = model.config.get_text_config()
    top_k = _top_k(text)
    experts = sum(sum(p.numel() for p in m.parameters()) * (1 - top_k / m.num_experts)
                  for m in _unique_banks(model))
    return {"total": int(total), "active": int(total - experts)}


def _unique_banks(model: nn.Module) -> list[nn.Module]:
    """Expert banks once each (DiffusionGemma's encoder and decoder hold the same tied tensors)."""
    seen, banks = set(), []
    for m in model.modules():
        if _is_expert_bank(m):
            key = id(next(m.parameters()))
            if key not in seen:
                seen.add(key)
                banks.append(m)
    return banks
