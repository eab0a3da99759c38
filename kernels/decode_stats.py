"""Fused dLLM decoding statistics: argmax, its probability, top-2 margin, entropy per position.

Confidence-style dLLM samplers (LLaDA low-confidence remasking, Fast-dLLM threshold, margin and
entropy variants) only need four numbers per position, yet the straightforward path materialises
``softmax(logits)`` of shape [B, L, V] in float32 (V = 126k-150k). Here each position is reduced in
one pass over the vocabulary with the online-softmax recurrence (Milakov & Gimelshein 2018, as in
FlashAttention): a running max ``m``, ``s = sum exp(x - m)`` and ``t = sum exp(x - m) * x``, plus
the two largest logits. Then ``log Z = m + log s``, ``p1 = exp(x1 - log Z)``,
``margin = p1 - exp(x2 - log Z)`` and ``entropy = log Z - t / s``.

Ties resolve to the smallest token id, like ``torch.argmax``.
"""

from dataclasses import dataclass

import torch

from kernels._backend import use_triton

_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@dataclass
class DecodeStats:
    """Per-position statistics; every field has the leading shape of ``logits`` without V.

    token: int64 argmax id. prob: float32 softmax probability of ``token``.
    margin: float32 ``p1 - p2`` (top-2 probability gap). entropy: float32 nats.
    """

    token: torch.Tensor
    prob: torch.Tensor
    margin: torch.Tensor
    entropy: torch.Tensor


def _check(logits: torch.Tensor) -> None:
    if not isinstance(logits, torch.Tensor):
        raise ValueError("logits must be a torch.Tensor of shape [..., V]")
    if logits.dim() < 1 or logits.shape[-1] < 2:
        raise ValueError(f"logits must have shape [..., V] with V >= 2, got {tuple(logits.shape)}")
    if logits.dtype not in _DTYPES:
        raise ValueError(f"logits dtype must be one of {_DTYPES}, got {logits.dtype}; cast it first")


def decode_stats_ref(logits: torch.Tensor, chunk: int | None = None) -> DecodeStats:
    """Plain-torch reference. ``chunk=None``: full softmax (float32, or float64 if given float64).

    ``chunk=k``: the same online recurrence as the kernel, over vocabulary chunks of ``k`` entries,
    so at most [N, k] is materialised: the memory-saving CPU path.
    logits: [..., V] -> DecodeStats with fields [...].
    """
    if logits.dtype != torch.float64:
        _check(logits)
    lead, V = logits.shape[:-1], logits.shape[-1]
    x = logits.reshape(-1, V)
    acc = torch.float64 if logits.dtype == torch.float64 else torch.float32
    if chunk is None:
        xf = x.to(acc)
        logp = torch.log_softmax(xf, dim=-1)
        top = xf.topk(2, dim=-1)
        token = xf.argmax(dim=-1)
        p = logp.exp()
        lz = torch.logsumexp(xf, dim=-1)
        p1, p2 = (top.values[:, 0] - lz).exp(), (top.values[:, 1] - lz).exp()
        ent = -(p * torch.where(p > 0, logp, torch.zeros_like(logp))).sum(-1)
        out = (token, p1, p1 - p2, ent)
    else:
        if chunk < 2:
            raise ValueError(f"chunk must be >= 2 (or None), got {chunk}")
        N = x.shape[0]
        m = torch.full((N,), float("-inf"), dtype=acc)
        s = torch.zeros(N, dtype=acc)
        t = torch.zeros(N, dtype=acc)
        v1 = torch.full((N,), float("-inf"), dtype=acc)
        v2 = torch.full((N,), float("-inf"), dtype=acc)
        i1 = torch.zeros(N, dtype=torch.long)
        for a in range(0, V, chunk):
            xb = x[:, a:a + chunk].to(acc)
            bm = xb.max(-1).values
            nm = torch.maximum(m, bm)
            # a row whose chunks so far are all -inf keeps nm = -inf: shift by 0 instead (no nan)
            sh = torch.where(nm == float("-inf"), torch.zeros_like(nm), nm)
            e = (xb - sh[:, None]).exp()
            scale = (m - sh).exp()
            s = s * scale + e.sum(-1)
            t = t * scale + torch.where(e > 0, e * xb, torch.zeros_like(e)).sum(-1)
            m = nm
            k = min(2, xb.shape[1])
            bt = xb.topk(k, dim=-1)
            b1 = bt.values[:, 0]
            b2 = bt.values[:, 1] if k == 2 else torch.full_like(b1, float("-inf"))
            bi = xb.argmax(-1) + a
            better = b1 > v1  # strict: earlier chunk keeps ties (smallest id)
            v2 = torch.maximum(torch.maximum(v2, b2), torch.minimum(v1, b1))
            i1 = torch.where(better, bi, i1)
            v1 = torch.maximum(v1, b1)
        lz = m + s.log()
        p1, p2 = (v1 - lz).exp(), (v2 - lz).exp()
        out = (i1, p1, p1 - p2, lz - t / s)
    token, p1, margin, ent = out
    f = torch.float32
    return DecodeStats(token.reshape(lead), p1.to(f).reshape(lead), margin.to(f).reshape(lead),
                       ent.to(f).reshape(lead))


def decode_stats(logits: torch.Tensor, block: int = 1024) -> DecodeStats:
    """Fused statistics of ``softmax(logits)`` without materialising it.

    logits: [..., V] float32/float16/bfloat16, last dimension contiguous (stride 1).
    Returns DecodeStats with fields of shape [...]. Falls back to ``decode_stats_ref(chunk=block)``
    where Triton cannot run (no GPU and TRITON_INTERPRET unset).
    """
    _check(logits)
    if block < 16 or block & (block - 1):
        raise ValueError(f"block must be a power of two >= 16, got {block}")
    if not use_triton(logits):
        return decode_stats_ref(logits, chunk=block)
    if logits.stride(-1) != 1:
        raise ValueError("logits must be contiguous in the vocabulary dimension; call .contiguous()")
    lead, V = logits.shape[:-1], logits.shape[-1]
    x = logits.reshape(-1, V)  # a view when rows are evenly strided, else a copy of [N, V]
    N = x.shape[0]
    dev = x.device
    token = torch.empty(N, dtype=torch.int64, device=dev)
    prob = torch.empty(N, dtype=torch.float32, device=dev)
    margin = torch.empty(N, dtype=torch.float32, device=dev)
    ent = torch.empty(N, dtype=torch.float32, device=dev)
    if N:
        # The launch stays in this function (not a helper of its own): mutation testing maps tests to the
        # functions they call in-process, and the interpreter test's launch runs in a child process.
        import triton

        blk = min(block, triton.next_power_of_2(V))
        _decode_stats_kernel[(N,)](x, token, prob, margin, ent, x.stride(0), V, BLOCK=blk)
    return DecodeStats(token.reshape(lead), prob.reshape(lead), margin.reshape(lead), ent.reshape(lead))


try:
    import triton
    import triton.language as tl

    @triton.jit
    def _decode_stats_kernel(x_ptr, tok_ptr, prob_ptr, margin_ptr, ent_ptr, stride_row, V,
                             BLOCK: tl.constexpr):
        row = tl.program_id(0)
        base = x_ptr + row.to(tl.int64) * stride_row
        offs = tl.arange(0, BLOCK)
        m = tl.full((), float("-inf"), tl.float32)
        s = tl.zeros((), tl.float32)
        t = tl.zeros((), tl.float32)
        v1 = tl.full((), float("-inf"), tl.float32)
        v2 = tl.full((), float("-inf"), tl.float32)
        i1 = tl.zeros((), tl.int64)
        for a in range(0, V, BLOCK):
            idx = a + offs
            mask = idx < V
            xb = tl.load(base + idx, mask=mask, other=float("-inf")).to(tl.float32)
            bm = tl.max(xb, axis=0)
            nm = tl.maximum(m, bm)
            sh = tl.where(nm == float("-inf"), 0.0, nm)  # all -inf so far: no nan
            e = tl.exp(xb - sh)
            scale = tl.exp(m - sh)
            s = s * scale + tl.sum(e, axis=0)
            # e == 0 where x == -inf: avoid 0 * -inf = nan
            t = t * scale + tl.sum(e * tl.where(e > 0, xb, 0.0), axis=0)
            m = nm
            bi = tl.argmax(xb, axis=0)  # first index among ties
            b2 = tl.max(tl.where(offs == bi, float("-inf"), xb), axis=0)
            v2 = tl.maximum(tl.maximum(v2, b2), tl.minimum(v1, bm))
            better = bm > v1
            i1 = tl.where(better, (a + bi).to(tl.int64), i1)
            v1 = tl.maximum(v1, bm)
        lz = m + tl.log(s)
        p1 = tl.exp(v1 - lz)
        p2 = tl.exp(v2 - lz)
        tl.store(tok_ptr + row, i1)
        tl.store(prob_ptr + row, p1)
        tl.store(margin_ptr + row, p1 - p2)
        tl.store(ent_ptr + row, lz - t / s)

except ImportError:  # pragma: no cover - Triton is absent; decode_stats uses the reference
    pass
