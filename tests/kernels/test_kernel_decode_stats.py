import json
import math
from types import SimpleNamespace

import pytest
import torch

from kernels.decode_stats import decode_stats, decode_stats_ref
from kernel_interp import run_interpreted


def _logits(shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g) * 4
    return x


@pytest.mark.parametrize("chunk", [2, 7, 64])
def test_chunked_reference_matches_float64(chunk):
    x = _logits((3, 5, 101))
    x[0, 0, 3] = x[0, 0, 90] = 40.0  # tie across chunks: smallest id wins
    x[1, 2, 0:20] = float("-inf")  # masked vocabulary entries, whole leading chunks
    exact = decode_stats_ref(x.double())
    got = decode_stats_ref(x, chunk=chunk)
    assert torch.equal(got.token, exact.token)
    assert got.token[0, 0] == 3
    for f in ("prob", "margin", "entropy"):
        torch.testing.assert_close(getattr(got, f).double(), getattr(exact, f).double(), atol=1e-5, rtol=1e-4)  # float32 accumulation


def test_float64_reference_against_definition():
    x = _logits((4, 33), seed=1).double()
    p = x.softmax(-1)
    r = decode_stats_ref(x)
    top = p.topk(2, -1).values
    torch.testing.assert_close(r.prob.double(), top[:, 0], atol=1e-7, rtol=0)
    torch.testing.assert_close(r.margin.double(), top[:, 0] - top[:, 1], atol=1e-7, rtol=0)
    torch.testing.assert_close(r.entropy.double(), -(p * p.log()).sum(-1), atol=1e-6, rtol=0)


def test_reference_returns_float32_statistics_for_every_input_dtype():
    """The documented output: int64 tokens and float32 probability, margin and entropy, also for float64
    logits (the float64 reference's accumulator)."""
    x = torch.randn(3, 50, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    r = decode_stats_ref(x)
    assert r.token.dtype == torch.int64
    assert r.prob.dtype == r.margin.dtype == r.entropy.dtype == torch.float32


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("chunk", [None, 16])
def test_reference_accumulates_half_precision_logits_in_float32(dtype, chunk):
    """The torch reference (the CPU path) upcasts half-precision logits before its sums, as the kernel
    does: within the float32-accumulation tolerance of the float64 statistics of the same logits."""
    V = 1000
    x = (torch.randn(4, V, generator=torch.Generator().manual_seed(6)) * 4).to(dtype)
    errors = _max_errors(decode_stats_ref(x, chunk=chunk), decode_stats_ref(x.double()))
    assert all(errors[f] <= _tolerance(f, V) for f in errors), errors


def test_bad_input():
    with pytest.raises(ValueError, match="dtype"):
        decode_stats(torch.zeros(2, 8, dtype=torch.int64))
    with pytest.raises(ValueError, match="V >= 2"):
        decode_stats(torch.zeros(2, 1))
    with pytest.raises(ValueError, match="block"):
        decode_stats(torch.zeros(2, 8), block=10)


# Tolerance of the kernel against the float64 reference of the same (already rounded) inputs: the only
# error left is the accumulation, which the kernel does in float32 whatever the input dtype. Its sums run
# over V <= 1000 terms in chunks; 64 float32 ulps (of 1 for prob and margin, of log V, the largest
# possible entropy, for entropy) bound it with room: the measured error is <= 4e-6 (entropy at V = 1000),
# <= 1.6e-6 at V <= 130. A half-precision accumulator is off by ~1e-3 (its ulp at 1 is 8192 float32 ulps)
# and fails it (test_half_precision_accumulation_fails_the_tolerance).
EPS32 = torch.finfo(torch.float32).eps


def _tolerance(field: str, V: int) -> float:
    return 64 * EPS32 * (math.log(V) if field == "entropy" else 1.0)


def _max_errors(stats, ref) -> dict:
    return {f: (getattr(stats, f).double().reshape(-1) - getattr(ref, f).double().reshape(-1)).abs().max().item()
            for f in ("prob", "margin", "entropy")}


def _half_accumulated_stats(x: torch.Tensor, chunk: int = 16):
    """The kernel's online recurrence with every running quantity (and each chunk's partial sums) kept in
    float16, as a kernel without the float32 upcast would: x [N, V] -> DecodeStats-like namespace."""
    h = torch.float16
    xs = x.to(h)
    N, V = xs.shape
    m = torch.full((N,), float("-inf"), dtype=h)
    s, t = torch.zeros(N, dtype=h), torch.zeros(N, dtype=h)
    for a in range(0, V, chunk):
        xb = xs[:, a:a + chunk]
        nm = torch.maximum(m, xb.max(-1).values)
        e = (xb - nm[:, None]).exp()
        scale = (m - nm).exp()
        s = (s * scale + e.sum(-1, dtype=h)).to(h)
        t = (t * scale + (e * xb).sum(-1, dtype=h)).to(h)
        m = nm
    top = xs.topk(2, dim=-1).values
    lz = (m + s.log()).to(h)
    p1, p2 = (top[:, 0] - lz).exp(), (top[:, 1] - lz).exp()
    return SimpleNamespace(prob=p1, margin=p1 - p2, entropy=lz - t / s)


@pytest.mark.parametrize("V", [77, 130, 1000])
def test_half_precision_accumulation_fails_the_tolerance(V):
    x = _logits((8, V), seed=V)
    ref = decode_stats_ref(x.double())
    # the float32 online recurrence (the kernel's arithmetic, decode_stats_ref(chunk=...)) passes ...
    ok = _max_errors(decode_stats_ref(x, chunk=16), ref)
    assert all(d < _tolerance(f, V) for f, d in ok.items()), ok
    # ... the same recurrence accumulated in float16 fails on every field, by orders of magnitude
    half = _max_errors(_half_accumulated_stats(x), ref)
    assert all(d > 10 * _tolerance(f, V) for f, d in half.items()), half


CASES = [((2, 3, 77), 16, "float32"), ((5, 130), 32, "float16"), ((1, 2, 19), 16, "bfloat16"),
         ((4, 1000), 64, "float32"), ((4, 1000), 64, "bfloat16")]


def test_triton_interpreter_matches_float64():
    pytest.importorskip("triton", reason="Triton not installed (pip install 'dlm-fast[kernels]'): the torch reference is used")
    # The same call on this process's path first (the plain-torch fallback): it tells mutation testing,
    # which only sees calls made in this process, that this test exercises decode_stats's launch, which
    # then runs, mutated, in the interpreter below.
    x = torch.randn(3, 40, generator=torch.Generator().manual_seed(3))
    assert torch.equal(decode_stats(x, block=16).token, x.argmax(-1))
    out = run_interpreted(f"""
        import json
        import torch
        from kernels._backend import triton_available
        from kernels.decode_stats import decode_stats, decode_stats_ref
        assert triton_available()
        g = torch.Generator().manual_seed(0)
        errors = []
        for shape, block, dt in {CASES!r}:
            dt = getattr(torch, dt)
            x = (torch.randn(*shape, generator=g) * 4).to(dt)
            x.view(-1, shape[-1])[0, 1] = x.view(-1, shape[-1])[0, shape[-1] - 1] = 60
            x.view(-1, shape[-1])[-1, 0:17] = float("-inf")
            k = decode_stats(x, block=block)
            r = decode_stats_ref(x.double())
            assert torch.equal(k.token, r.token), (k.token, r.token)
            assert k.token.view(-1)[0] == 1
            errors.append({{f: (getattr(k, f).double() - getattr(r, f).double()).abs().max().item()
                           for f in ("prob", "margin", "entropy")}})
        # strided rows (a slice of positions) work; a non-unit vocab stride is refused
        x = torch.randn(4, 6, 50, generator=g)[:, 1:4]
        assert torch.equal(decode_stats(x, block=16).token, x.argmax(-1))
        try:
            decode_stats(torch.randn(50, 4).t())
        except ValueError as e:
            assert "contiguous" in str(e)
        else:
            raise AssertionError("no error for a non-contiguous vocabulary")
        print(json.dumps(errors))
    """)
    errors = json.loads(out.strip().splitlines()[-1])
    for (shape, _, dt), err in zip(CASES, errors):
        for field, d in err.items():
            assert d < _tolerance(field, shape[-1]), (shape, dt, field, d)
