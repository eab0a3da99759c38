"""Pieces shared by the sliced full-attention video DiT blocks (``video.dit``).

A full-attention DiT block holds, at its peak, the attention inputs and the feed-forward's widened
hidden state for every token of the clip at once. Every operator of such a block except the
attention's softmax is per token (projections, LayerNorm/RMSNorm, adaLN modulation, RoPE, the
FFN), so it can run on a slice of tokens; attention is exact per *query* slice as long as each
query sees every key (the softmax is over keys). The sliced block therefore runs in two passes
over token spans:

1. keys and values of every span are written into two full ``[B, L, heads, head_dim]`` buffers;
2. each span's queries attend to all of them (exact softmax) and the result is written into the
   attention-output buffer ``[B, L, heads * head_dim]``;
3. each span then goes straight on through the output projection, the gated residual, the
   cross-attention and the FFN (operator grouping, Zhan et al., "Streamlined Inference", ECCV 2024),
   written back over its own rows of that buffer, which becomes the block's output.

Passes 1-2 can run on ``head_slices`` groups of heads one after another (attention is independent
per head): then K and V exist for one group at a time. Memory per block: input + attention output
+ K + V of one head group at full size (``2 + 2 / head_slices`` times the hidden states), everything
else span-sized. The price is recomputing the (per-token) norm and q/k/v projections once per head
group.
"""

import torch


def token_spans(n: int, chunks: int, what: str = "slices") -> list[tuple[int, int]]:
    """Exactly ``chunks`` contiguous ``(start, end)`` spans covering ``range(n)``, sizes differing by at
    most 1 (the first ``n % chunks`` one longer, as ``tensor_split``). A chunk count above ``n`` is a
    ValueError naming the limit (never clamped). Plain integers: no tensor is made, so nothing can land
    on an accelerator (under a ``torch.device`` context) and cost a host sync per span."""
    if chunks > n:
        raise ValueError(f"{what}={chunks} is larger than the dimension it slices ({n}); use at most {n}")
    size, extra = divmod(n, chunks)
    bounds = [i * size + min(i, extra) for i in range(chunks + 1)]
    return list(zip(bounds[:-1], bounds[1:]))


def rows(t: torch.Tensor, a: int, b: int, n: int) -> torch.Tensor:
    """Rows ``a:b`` (dim 1) of a per-token tensor ``[B, n, ...]``; a broadcast one (dim 1 of size 1,
    e.g. a per-sample modulation ``[B, 1, D]``) is returned whole."""
    return t[:, a:b] if t.dim() > 1 and t.shape[1] == n and n != 1 else t


class KVBuffer:
    """Full-length key/value buffers filled span by span: ``put(a, b, k, v)`` with ``k, v`` of shape
    ``[B, b - a, heads, head_dim]``; ``k`` / ``v`` are the full ``[B, L, heads, head_dim]`` tensors.

    Stored head-major (``[B, heads, L, head_dim]`` contiguous, ``k`` / ``v`` are transposed views): the
    layout attention kernels read, so no call copies the keys again (torch's CPU flash kernel copies
    a non-contiguous K/V on every call, which made many query spans slow)."""

    def __init__(self, length: int):
        self.length = length
        self._k = self._v = None

    def put(self, a: int, b: int, k: torch.Tensor, v: torch.Tensor) -> None:
        if self._k is None:
            shape = (k.shape[0], k.shape[2], self.length, k.shape[3])
            self._k, self._v = k.new_empty(shape), v.new_empty(shape)
        self._k[:, :, a:b] = k.transpose(1, 2)
        self._v[:, :, a:b] = v.transpose(1, 2)

    @property
    def k(self) -> torch.Tensor:
        return self._k.transpose(1, 2)

    @property
    def v(self) -> torch.Tensor:
        return self._v.transpose(1, 2)


def attend(query, key, value, mask=None, backend=None):
    """diffusers' attention dispatch on ``[B, S, heads, head_dim]`` tensors (the backend the model's
    processor is set to, e.g. after ``model.set_attention_backend``); each query row's softmax runs
    over all of ``key``, so calling it on a slice of queries gives those rows exactly."""
    from diffusers.models.attention_dispatch import dispatch_attention_fn

    return dispatch_attention_fn(query, key, value, attn_mask=mask, dropout_p=0.0, is_causal=False,
                                 backend=backend, parallel_config=None)


def head_spans(heads: int, head_slices: int) -> list[tuple[int, int]]:
    """``head_slices`` groups of heads; more groups than heads is a ValueError naming the limit."""
    return token_spans(heads, head_slices, "head_slices")


QUERY_SPAN = 256


def query_chunks(n: int, chunks: int) -> int:
    """Query spans of pass 2: ``chunks``, but none shorter than ``QUERY_SPAN`` tokens. Attention
    kernels tile the queries (torch's CPU flash kernel uses 32-query tiles below 192 queries, 64 up
    to 768, 256 above; GPU kernels 64-128), so very short query spans cost time (+17% attention time
    at 128-query spans measured on CPU, +3% at 512) while a query span's transient (its normed input,
    q and output, about 4 hidden widths per token) is small next to the full-size K/V it reads."""
    return max(1, min(chunks, n // QUERY_SPAN))


def attention_by_spans(segs, length, heads, head_slices, kv_of, q_of, attn_fn, qsegs=None):
    """Passes 1-2: exact attention of every query span against all keys, by head groups.

    segs: ``(tag, a, b, ga, gb)`` spans of the joint sequence (``ga:gb`` its global rows, ``tag, a, b``
        what the callbacks need to find the span's inputs); keys and values are made per span.
    qsegs: the query spans, in the same form (default: ``segs``).
    kv_of(seg, h0, h1) -> (k, v) and q_of(seg, h0, h1) -> q: projections of the span for heads
        ``h0:h1``, ``[B, n, h1 - h0, head_dim]``.
    attn_fn(q, k, v) -> ``[B, n, heads', head_dim]`` attention (exact per query row).
    Returns the attention output ``[B, length, heads * head_dim]`` in the dtype of the queries.
    """
    out = None
    for h0, h1 in head_spans(heads, head_slices):
        kv = KVBuffer(length)
        for seg in segs:
            k, v = kv_of(seg, h0, h1)
            kv.put(seg[3], seg[4], k, v)
        for seg in segs if qsegs is None else qsegs:
            q = q_of(seg, h0, h1)
            o = attn_fn(q, kv.k, kv.v)
            if out is None:
                d = q.shape[-1]
                out = q.new_empty(q.shape[0], length, heads * d)
            out[:, seg[3]:seg[4], h0 * d:h1 * d] = o.flatten(2, 3)
        del kv
    return out


def head_linear(lin, x, h0: int, h1: int, heads: int):
    """``lin(x)`` restricted to the output features of heads ``h0:h1``, as ``[B, n, h1 - h0, d]``.

    A plain ``nn.Linear`` computes only those rows of its weight (head groups then cost no extra
    projection FLOPs); any other module (e.g. a LoRA wrapper) runs whole and is sliced after."""
    if h0 == 0 and h1 == heads:
        return lin(x).unflatten(2, (heads, -1))
    if type(lin) is torch.nn.Linear:
        d = lin.out_features // heads
        bias = None if lin.bias is None else lin.bias[h0 * d:h1 * d]
        return torch.nn.functional.linear(x, lin.weight[h0 * d:h1 * d], bias).unflatten(2, (h1 - h0, d))
    return lin(x).unflatten(2, (heads, -1))[:, :, h0:h1]
