"""The fused decoding-statistics path (kernels.decode_stats) chooses what the softmax path chooses."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import dlm
from samplers import get_sampler
from samplers.base import StepContext
from samplers.unmasking._common import fused_stats_wanted, step_stats
from toy_models import ToyDLM

GREEDY = SimpleNamespace(temperature=0.0, generator=None)
SCORING = ("confidence", "margin", "entropy", "threshold", "eb")


def peaked_logits(B, L, V, seed=0):
    """Random logits with a few strong candidates per position, so scores spread out."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, L, V, generator=g)
    hot = torch.randint(0, V, (B, L, 3), generator=g)
    return logits.scatter_add(-1, hot, 6 * torch.rand(B, L, 3, generator=g))


def test_auto_mode_keeps_the_softmax_path_on_cpu(monkeypatch):
    monkeypatch.delenv("DLM_FUSED_DECODE", raising=False)
    assert not fused_stats_wanted(torch.zeros(1, 2, 50_000), 0.0)


def test_fused_path_only_for_greedy_float_logits(monkeypatch):
    monkeypatch.setenv("DLM_FUSED_DECODE", "on")
    assert fused_stats_wanted(torch.zeros(1, 2, 500), 0.0)
    assert not fused_stats_wanted(torch.zeros(1, 2, 500), 0.7)  # sampling needs the full distribution
    assert not fused_stats_wanted(torch.zeros(1, 2, 500, dtype=torch.float64), 0.0)


def test_env_switch_and_bad_value(monkeypatch):
    monkeypatch.setenv("DLM_FUSED_DECODE", "on")
    assert fused_stats_wanted(torch.zeros(1, 2, 10), 0.0)
    monkeypatch.setenv("DLM_FUSED_DECODE", "off")
    assert not fused_stats_wanted(torch.zeros(1, 2, 10), 0.0)
    monkeypatch.setenv("DLM_FUSED_DECODE", "yes")
    with pytest.raises(ValueError, match="DLM_FUSED_DECODE"):
        fused_stats_wanted(torch.zeros(1, 2, 10), 0.0)


def test_stats_match_softmax_path_at_large_vocabulary(monkeypatch):
    logits = peaked_logits(2, 9, 40_000)
    monkeypatch.setenv("DLM_FUSED_DECODE", "off")
    ref = step_stats(logits, GREEDY, margin=True, entropy=True)
    monkeypatch.setenv("DLM_FUSED_DECODE", "on")
    fused = step_stats(logits, GREEDY)
    assert torch.equal(fused.proposal, ref.proposal)
    torch.testing.assert_close(fused.confidence, ref.confidence, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(fused.margin, ref.margin, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(fused.entropy, ref.entropy, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", SCORING)
def test_one_step_commits_the_same_positions_at_large_vocabulary(name, monkeypatch):
    B, L, V = 2, 12, 40_000
    logits = peaked_logits(B, L, V, seed=1)
    x = torch.full((B, L), 7, dtype=torch.long)
    candidates = torch.zeros(B, L, dtype=torch.bool)
    candidates[:, 4:] = True
    x[candidates] = 3  # the mask id
    ctx = dict(x=x, candidates=candidates, num_transfer=torch.tensor([2, 3]), step=0, steps_in_block=4,
               last_step=False, temperature=0.0, generator=None, mask_token_id=3)
    sampler = get_sampler(name)
    monkeypatch.setenv("DLM_FUSED_DECODE", "off")
    ref = sampler.step(logits, StepContext(**ctx))
    monkeypatch.setenv("DLM_FUSED_DECODE", "on")
    fused = sampler.step(logits, StepContext(**ctx))
    assert torch.equal(fused.x, ref.x)
    assert (ref.x != x).any()  # the step did commit something


@pytest.mark.parametrize("name", SCORING)
def test_generation_identical_with_and_without_fused_path(name, monkeypatch):
    prompt = torch.tensor([[1, 2, 3, 4, 5], [6, 7, 8, 9, 10]])

    def run():
        return dlm.generate(ToyDLM(), prompt, gen_length=16, block_length=8, steps=8, sampler=name).sequences

    monkeypatch.setenv("DLM_FUSED_DECODE", "off")
    ref = run()
    monkeypatch.setenv("DLM_FUSED_DECODE", "on")
    assert torch.equal(run(), ref)
