"""Group normalisation over slices: exact statistics from partial sums, then normalise per slice.

Streamlined Inference (Zhan et al., ECCV 2024) slices temporal GroupNorm inputs over the spatial
dimension; normalising each slice with its own statistics is what makes the released code
approximate. Exact fix: pass 1 accumulates, per (batch, group), the sum and sum of squares of every
slice (:func:`group_stats`), :func:`combine_stats` turns them into mean and rstd in float64, and
pass 2 normalises each slice with those global statistics (:func:`group_norm_apply`).

A slice is ``[N, C, *rest]`` (contiguous): for a fixed (n, g) the group's ``C // G * prod(rest)``
elements are one contiguous run, so each Triton program streams one run.
"""

import math

import torch

from kernels._backend import use_triton

_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _check(x: torch.Tensor, groups: int, name: str = "x") -> None:
    if not isinstance(x, torch.Tensor) or x.dim() < 2:
        raise ValueError(f"{name} must be a tensor of shape [N, C, ...]")
    if x.dtype not in _DTYPES:
        raise ValueError(f"{name} dtype must be one of {_DTYPES}, got {x.dtype}")
    if groups < 1 or x.shape[1] % groups:
        raise ValueError(f"groups={groups} must divide the channel count {x.shape[1]}")
    if not x.is_contiguous():
        raise ValueError(f"{name} must be contiguous; call .contiguous() on the slice first")


def group_stats_ref(x: torch.Tensor, groups: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference: x [N, C, ...] -> (sum, sumsq), each float32 [N, groups] (float64 if x is)."""
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    xg = x.reshape(x.shape[0], groups, -1).to(acc)
    return xg.sum(-1), (xg * xg).sum(-1)


def group_stats(x: torch.Tensor, groups: int, block: int = 1024) -> tuple[torch.Tensor, torch.Tensor]:
    """Partial sums of one slice: x [N, C, ...] contiguous -> (sum, sumsq) float32 [N, groups]."""
    _check(x, groups)
    if not use_triton(x) or x.numel() == 0:
        return group_stats_ref(x, groups)
    import triton

    N = x.shape[0]
    M = x.numel() // (N * groups)
    s = torch.empty(N, groups, dtype=torch.float32, device=x.device)
    q = torch.empty_like(s)
    _stats_kernel[(N * groups,)](x, s, q, M, BLOCK=min(block, triton.next_power_of_2(M)))
    return s, q


def combine_stats(parts, count: int, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Combine per-slice (sum, sumsq) exactly-in-float64 into (mean, rstd) float64 [N, groups].

    parts: iterable of (sum, sumsq) pairs; count: elements per (n, group) over all slices.
    """
    tot = tot2 = None
    for s, q in parts:
        s, q = s.double(), q.double()
        tot = s if tot is None else tot + s
        tot2 = q if tot2 is None else tot2 + q
    if tot is None or count <= 0:
        raise ValueError("combine_stats needs at least one slice and count > 0")
    mean = tot / count
    var = (tot2 / count - mean * mean).clamp_min(0.0)
    return mean, (var + eps).rsqrt()


def group_norm_apply_ref(x, mean, rstd, weight=None, bias=None):
    """Reference: normalise x [N, C, ...] with mean/rstd [N, G], then affine weight/bias [C]."""
    N, C = x.shape[:2]
    G = mean.shape[1]
    xg = x.reshape(N, G, -1).to(torch.float64)
    y = ((xg - mean[..., None].double()) * rstd[..., None].double()).reshape(x.shape)
    shape = (1, C) + (1,) * (x.dim() - 2)
    if weight is not None:
        y = y * weight.double().reshape(shape)
    if bias is not None:
        y = y + bias.double().reshape(shape)
    return y.to(x.dtype)


def group_norm_apply(x, mean, rstd, weight=None, bias=None, block: int = 1024):
    """Normalise one slice x [N, C, ...] with given statistics mean/rstd [N, G] (+ affine [C])."""
    _check(x, mean.shape[1] if mean.dim() == 2 else 1)
    N, C = x.shape[:2]
    G = mean.shape[1]
    if mean.shape != (N, G) or rstd.shape != (N, G):
        raise ValueError(f"mean and rstd must have shape [N, G] = [{N}, {G}]")
    for name, p in (("weight", weight), ("bias", bias)):
        if p is not None and (p.shape != (C,) or not p.is_contiguous()):
            raise ValueError(f"{name} must be a contiguous tensor of shape [{C}]")
    if not use_triton(x) or x.numel() == 0:
        return group_norm_apply_ref(x, mean, rstd, weight, bias)
    import triton

    M = x.numel() // (N * G)
    S = M // (C // G)  # elements per channel
    y = torch.empty_like(x)
    w = weight if weight is not None else x.new_ones(1)
    b = bias if bias is not None else x.new_zeros(1)
    _apply_kernel[(N * G,)](x, y, mean.float().contiguous(), rstd.float().contiguous(), w, b,
                            G, C // G, S, M, weight is not None, bias is not None,
                            BLOCK=min(block, triton.next_power_of_2(M)))
    return y


def group_norm_sliced(x: torch.Tensor, groups: int, weight, bias, eps: float, dim: int, slices: int):
    """Exact GroupNorm of x [N, C, ...] computed slice by slice along ``dim`` (>= 2).

    Equals ``F.group_norm(x, groups, weight, bias, eps)``; only one slice-sized copy at a time.
    """
    if dim < 2 or dim >= x.dim():
        raise ValueError(f"dim must index a non-channel dimension (2..{x.dim() - 1}), got {dim}")
    if slices < 1 or slices > x.shape[dim]:
        raise ValueError(f"slices={slices} must be in 1..{x.shape[dim]} (size of dim {dim})")
    chunks = x.chunk(slices, dim)
    count = x[0].numel() // groups
    mean, rstd = combine_stats((group_stats(c.contiguous(), groups) for c in chunks), count, eps)
    return torch.cat([group_norm_apply(c.contiguous(), mean, rstd, weight, bias) for c in chunks], dim)


try:
    import triton
    import triton.language as tl

    @triton.jit
    def _stats_kernel(x_ptr, s_ptr, q_ptr, M, BLOCK: tl.constexpr):
        pid = tl.program_id(0)
        base = x_ptr + pid.to(tl.int64) * M
        offs = tl.arange(0, BLOCK)
        acc = tl.zeros((BLOCK,), tl.float32)
        acc2 = tl.zeros((BLOCK,), tl.float32)
        for a in range(0, M, BLOCK):
            v = tl.load(base + a + offs, mask=a + offs < M, other=0.0).to(tl.float32)
            acc += v
            acc2 += v * v
        tl.store(s_ptr + pid, tl.sum(acc, axis=0))
        tl.store(q_ptr + pid, tl.sum(acc2, axis=0))

    @triton.jit
    def _apply_kernel(x_ptr, y_ptr, mean_ptr, rstd_ptr, w_ptr, b_ptr, G, CG, S, M,
                      HAS_W: tl.constexpr, HAS_B: tl.constexpr, BLOCK: tl.constexpr):
        pid = tl.program_id(0)
        g = pid % G
        mu = tl.load(mean_ptr + pid)
        r = tl.load(rstd_ptr + pid)
        base = pid.to(tl.int64) * M
        offs = tl.arange(0, BLOCK)
        for a in range(0, M, BLOCK):
            idx = a + offs
            mask = idx < M
            v = tl.load(x_ptr + base + idx, mask=mask, other=0.0).to(tl.float32)
            y = (v - mu) * r
            c = g * CG + idx // S
            if HAS_W:
                y = y * tl.load(w_ptr + c, mask=mask, other=1.0).to(tl.float32)
            if HAS_B:
                y = y + tl.load(b_ptr + c, mask=mask, other=0.0).to(tl.float32)
            tl.store(y_ptr + base + idx, y.to(y_ptr.dtype.element_ty), mask=mask)

except ImportError:  # pragma: no cover
    pass
