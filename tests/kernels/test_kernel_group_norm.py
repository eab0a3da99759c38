import pytest
import torch
import torch.nn.functional as F

from kernels.group_norm import combine_stats, group_norm_sliced, group_stats_ref
from kernel_interp import run_interpreted


def test_sliced_reference_equals_group_norm():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 12, 5, 7, generator=g) * 3 + 1.5
    w, b = torch.randn(12, generator=g), torch.randn(12, generator=g)
    for dim, slices in ((2, 5), (3, 3), (3, 1)):
        y = group_norm_sliced(x, 4, w, b, 1e-6, dim, slices)
        torch.testing.assert_close(y, F.group_norm(x, 4, w, b, 1e-6), atol=1e-5, rtol=1e-5)


def test_combine_equals_whole():
    x = torch.randn(3, 6, 11, dtype=torch.float64)
    parts = [group_stats_ref(c.contiguous(), 3) for c in x.chunk(4, 2)]
    mean, rstd = combine_stats(parts, 2 * 11, 0.0)
    xg = x.reshape(3, 3, -1)
    torch.testing.assert_close(mean, xg.mean(-1))
    torch.testing.assert_close(rstd, xg.var(-1, unbiased=False).rsqrt())


def test_two_dimensional_input_is_a_group_norm_of_channels():
    """[N, C] is a valid GroupNorm input (torch accepts it); the launchers take it, and refuse one dimension."""
    from kernels.group_norm import group_norm_apply, group_stats
    x = torch.randn(3, 6, generator=torch.Generator().manual_seed(2))
    s, q = group_stats(x, 3)
    torch.testing.assert_close((s, q), group_stats_ref(x, 3))
    mean, rstd = combine_stats([(s, q)], 2, 1e-5)
    torch.testing.assert_close(group_norm_apply(x, mean, rstd), F.group_norm(x, 3, eps=1e-5), atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match=r"\[N, C, \.\.\.\]"):
        group_stats(torch.randn(6), 3)


def test_bad_input():
    x = torch.randn(2, 6, 4, 4)
    with pytest.raises(ValueError, match="slices"):
        group_norm_sliced(x, 3, None, None, 1e-5, 3, 5)
    with pytest.raises(ValueError, match="groups"):
        group_norm_sliced(x, 4, None, None, 1e-5, 3, 2)
    from kernels.group_norm import group_stats
    with pytest.raises(ValueError, match="contiguous"):
        group_stats(x.transpose(2, 3), 3)
    with pytest.raises(ValueError, match="dtype"):
        group_stats(x.long(), 3)


def test_triton_interpreter_matches_float64():
    pytest.importorskip("triton", reason="Triton not installed (pip install 'dlm-fast[kernels]'): the torch reference is used")
    # The same call on this process's path first (the plain-torch fallback Triton replaces). It also tells
    # mutation testing (docs/testing.md), which only sees calls made in this process, that this test
    # exercises the launchers: their Triton branch then runs, mutated, in the interpreter below.
    x = torch.randn(2, 6, 5, 7, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(group_norm_sliced(x, 3, None, None, 1e-5, 3, 3), F.group_norm(x, 3, eps=1e-5),
                               atol=1e-5, rtol=1e-5)
    out = run_interpreted("""
        import torch, torch.nn.functional as F
        from kernels.group_norm import group_norm_sliced, group_stats, group_stats_ref
        g = torch.Generator().manual_seed(0)
        for shape, G, dim, sl, dt, tol in [((2, 6, 5, 7), 3, 3, 3, torch.float32, 1e-5),
                                          ((1, 4, 3, 3, 5), 2, 2, 2, torch.float16, 5e-3),
                                          # 1,280 elements per group: more than one default block of 1,024
                                          ((1, 2, 40, 32), 2, 2, 1, torch.float32, 1e-5)]:
            x = (torch.randn(*shape, generator=g) * 2 + 1).to(dt)
            w = torch.randn(shape[1], generator=g).to(dt)
            b = torch.randn(shape[1], generator=g).to(dt)
            y = group_norm_sliced(x, G, w, b, 1e-5, dim, sl)
            r = F.group_norm(x.double(), G, w.double(), b.double(), 1e-5)
            d = (y.double() - r).abs().max().item()
            assert y.dtype == dt and d < tol * 4, (dt, d)
            s, q = group_stats(x, G)
            s64, q64 = group_stats_ref(x.double(), G)
            assert torch.allclose(s.double(), s64, atol=tol * 20) and torch.allclose(q.double(), q64, rtol=tol)
        # no affine
        x = torch.randn(2, 4, 9, generator=g)
        y = group_norm_sliced(x, 2, None, None, 1e-5, 2, 4)
        assert torch.allclose(y, F.group_norm(x, 2, eps=1e-5), atol=1e-5)
        print("ok")
    """)
    assert out.strip().endswith("ok")
