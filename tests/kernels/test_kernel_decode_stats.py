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


def test_bad_input():
    with pytest.raises(ValueError, match="dtype"):
        decode_stats(torch.zeros(2, 8, dtype=torch.int64))
    with pytest.raises(ValueError, match="V >= 2"):
        decode_stats(torch.zeros(2, 1))
    with pytest.raises(ValueError, match="block"):
        decode_stats(torch.zeros(2, 8), block=10)


def test_triton_interpreter_matches_float64():
    pytest.importorskip("triton", reason="Triton not installed (pip install 'dlm-fast[kernels]'): the torch reference is used")
    out = run_interpreted("""
        import torch
        from kernels._backend import triton_available
        from kernels.decode_stats import decode_stats, decode_stats_ref
        assert triton_available()
        g = torch.Generator().manual_seed(0)
        for shape, block, dt, tol in [((2, 3, 77), 16, torch.float32, 2e-6),
                                      ((5, 130), 32, torch.float16, 2e-3),
                                      ((1, 2, 19), 16, torch.bfloat16, 1e-2)]:
            x = (torch.randn(*shape, generator=g) * 4).to(dt)
            x.view(-1, shape[-1])[0, 1] = x.view(-1, shape[-1])[0, shape[-1] - 1] = 60
            x.view(-1, shape[-1])[-1, 0:17] = float("-inf")
            k = decode_stats(x, block=block)
            r = decode_stats_ref(x.double())
            assert torch.equal(k.token, r.token), (k.token, r.token)
            assert k.token.view(-1)[0] == 1
            for f in ("prob", "margin", "entropy"):
                d = (getattr(k, f).double() - getattr(r, f).double()).abs().max().item()
                assert d < tol * 10, (f, dt, d)
        # strided rows (a slice of positions) work; a non-unit vocab stride is refused
        x = torch.randn(4, 6, 50, generator=g)[:, 1:4]
        assert torch.equal(decode_stats(x, block=16).token, x.argmax(-1))
        try:
            decode_stats(torch.randn(50, 4).t())
        except ValueError as e:
            assert "contiguous" in str(e)
        else:
            raise AssertionError("no error for a non-contiguous vocabulary")
        print("ok")
    """)
    assert out.strip().endswith("ok")
