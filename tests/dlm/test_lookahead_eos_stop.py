"""Per-row EOS stop for lookahead samplers (LoPA): a finished row (an EOS with no mask before it)
leaves the model's batch and the lookahead calls, with the tokens of the plain loop, a per-row
forward count that never exceeds the budget, and fewer forwards when rows finish.

"The plain loop" is our own loop with the stop off (`eos_early_stop=False`): a regression reference
(the stop changes no token), not evidence that LoPA decodes right. Where the answer is known exactly
(`Sequential`: row r is n[r] WORDs, then EOS) the tokens are also checked against it; LoPA's own
decisions are pinned in tests/samplers/unmasking/test_lopa.py."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import dlm
from dlm.engine.masked.eos import stop_at_eos
from dlm.engine.masked.eos import candidates_needing_model
from dlm.tiny import TinyDLMConfig, TinyDLMModel
from samplers import get_sampler
from toy_models import ToyDLM

MASK, EOS, WORD = 9, 8, 5


class Sequential(torch.nn.Module):
    """Row r answers WORD at generation positions < n[r] and EOS after. Only the leftmost masked
    position is confident (logit 8); every other mask has the right argmax at low confidence
    (falling with the position, so no ties), so a threshold fill commits one token per step and
    LoPA's winning branch adds at most one more."""

    def __init__(self, prompt_length: int, n: list[int]):
        super().__init__()
        self.config = SimpleNamespace(mask_token_id=MASK, eos_token_id=EOS, vocab_size=10)
        self.prompt_length, self.n = prompt_length, torch.tensor(n)
        self.rows_per_call: list[int] = []

    def forward(self, ids, attention_mask=None, **kw):
        self.rows_per_call.append(ids.shape[0])
        which = ids[:, 0]  # prompts are 0, 1, 2, ...: the row's id
        pos = torch.arange(ids.shape[1]) - self.prompt_length
        answer = torch.where(pos[None, :] < self.n[which][:, None], WORD, EOS)
        masked = ids == MASK
        before = masked.long().cumsum(dim=1) - masked.long()
        frontier = masked & (before == 0)
        logits = torch.zeros(*ids.shape, 10)
        logits.scatter_(2, answer.unsqueeze(-1), torch.where(frontier, 8.0, 1.0 - 0.01 * pos.float()).unsqueeze(-1))
        logits[..., MASK] = float("-inf")
        return logits


def _exact(n: list[int], gen_length: int) -> torch.Tensor:
    """`Sequential`'s only answer: row r is n[r] WORDs, then EOS to the end. `[R, gen_length]`."""
    return torch.tensor([[WORD] * k + [EOS] * (gen_length - k) for k in n])


def _reference(model, ids, **kw):
    """The loop without any EOS stop, then the EOS fill the stop promises (a regression reference)."""
    out = dlm.generate(model, ids, eos_early_stop=False, **kw)
    x = out.sequences.clone()
    stop_at_eos(x, torch.arange(x.shape[0]), ids.shape[1], x.shape[1], model.config.eos_token_id)
    return x, out


def _per_row(out, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward passes (and branch forwards) each row took part in, summed from the trace as
    `dlm bench` does."""
    nfe = torch.zeros(batch, dtype=torch.long)
    branches = torch.zeros(batch, dtype=torch.long)
    for record in out.trace:
        nfe[record.rows] += record.forwards
        branches[record.rows] += record.branch_forwards
    return nfe, branches


@pytest.mark.parametrize("branches", [2, 3])
def test_finished_rows_leave_lookahead_calls_with_the_same_tokens(branches):
    ids = torch.arange(4).unsqueeze(1).repeat(1, 3)
    n = [1, 4, 9, 15]
    kw = dict(gen_length=16, block_length=16, steps=16, sampler=get_sampler("lopa", branches=branches))
    ref, plain = _reference(Sequential(3, n), ids, **kw)
    model = Sequential(3, n)
    out = dlm.generate(model, ids, eos_early_stop=True, return_trace=True, **kw)
    assert torch.equal(out.sequences, ref)
    assert torch.equal(out.sequences[:, 3:], _exact(n, 16))
    per_row, per_row_branches = _per_row(out, 4)
    # Budget: no row takes part in more passes than the call made, nor than `steps`.
    assert int(per_row.max()) == out.nfe <= 16
    assert sum(r.forwards for r in out.trace) == out.nfe
    assert sum(r.branch_forwards for r in out.trace) == out.branch_forwards
    # Rows that finish early take fewer passes, in the order they finish.
    assert per_row.tolist() == sorted(per_row.tolist()) and per_row[0] < per_row[-1]
    assert (per_row_branches <= out.branch_forwards).all()
    # Lookahead calls really ran on fewer rows than the batch.
    assert any(r.branch_forwards >= branches and r.rows.numel() < 4 for r in out.trace)
    assert out.nfe <= plain.nfe


def test_a_single_row_stops_at_its_eos():
    """Batch of one: the row leaves as soon as it is finished, not when its block is full; the last
    lookahead call of a finished row is not run at all."""
    ids = torch.zeros(1, 3, dtype=torch.long)
    kw = dict(gen_length=16, block_length=16, steps=16, sampler="lopa")
    ref, plain = _reference(Sequential(3, [3]), ids, **kw)
    out = dlm.generate(Sequential(3, [3]), ids, eos_early_stop=True, **kw)
    assert torch.equal(out.sequences, ref) and torch.equal(out.sequences[:, 3:], _exact([3], 16))
    # Up to two tokens per LoPA round: the row is finished after about two rounds, against about
    # eight to fill the whole block; plain threshold takes one pass per token up to the EOS (4).
    assert out.nfe < plain.nfe
    threshold = dlm.generate(Sequential(3, [3]), ids, eos_early_stop=True, **{**kw, "sampler": "threshold"})
    assert threshold.nfe == 4 and out.nfe < threshold.nfe and torch.equal(threshold.sequences, ref)


def _eos_heavy_toy(seed: int, factor: float) -> ToyDLM:
    model = ToyDLM(seed=seed)
    with torch.no_grad():
        model.out[:, model.config.eos_token_id] *= factor
    return model


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("seed", [1, 2])
def test_random_model_one_block_token_identical(temperature, seed):
    """One block: the skipping loop's draws are the plain loop's stream, so every token matches."""
    ids = torch.randint(0, 13, (6, 5), generator=torch.Generator().manual_seed(seed))
    kw = dict(gen_length=16, block_length=16, steps=16, sampler="lopa", temperature=temperature)
    model = _eos_heavy_toy(seed, 3.0)
    ref, _ = _reference(model, ids, generator=torch.Generator().manual_seed(0), **kw)
    out = dlm.generate(model, ids, eos_early_stop=True, generator=torch.Generator().manual_seed(0),
                       return_trace=True, **kw)
    assert torch.equal(out.sequences, ref)
    per_row, _ = _per_row(out, 6)
    assert (per_row <= out.nfe).all() and out.nfe <= 16


def test_random_model_over_blocks_token_identical():
    ids = torch.randint(0, 13, (6, 5), generator=torch.Generator().manual_seed(4))
    kw = dict(gen_length=24, block_length=8, steps=12, sampler="lopa")
    model = _eos_heavy_toy(3, 2.0)
    ref, _ = _reference(model, ids, **kw)
    out = dlm.generate(model, ids, eos_early_stop=True, return_trace=True, **kw)
    assert torch.equal(out.sequences, ref)
    per_row, _ = _per_row(out, 6)
    assert (per_row <= 12).all() and sum(out.steps_per_block) == out.nfe <= 12
    assert per_row.min() < per_row.max()  # some rows finished early and stopped paying


def test_nothing_changes_when_no_row_finishes_early():
    """A model that never proposes EOS: the stop on and off give the same tokens, passes and trace."""
    inner = ToyDLM(seed=5)

    class NoEos(torch.nn.Module):
        config = inner.config

        def forward(self, ids, **kw):
            logits = inner(ids, **kw).logits
            logits[..., inner.config.eos_token_id] = float("-inf")
            return logits

    model = NoEos()
    ids = torch.randint(0, 13, (4, 5), generator=torch.Generator().manual_seed(0))
    kw = dict(gen_length=16, block_length=8, steps=16, sampler="lopa", return_trace=True)
    on = dlm.generate(model, ids, eos_early_stop=True, **kw)
    off = dlm.generate(model, ids, eos_early_stop=False, **kw)
    assert torch.equal(on.sequences, off.sequences)
    assert (on.nfe, on.branch_forwards, on.steps_per_block) == (off.nfe, off.branch_forwards, off.steps_per_block)
    assert [(r.rows.tolist(), r.forwards) for r in on.trace] == [(r.rows.tolist(), r.forwards) for r in off.trace]


@pytest.mark.parametrize("mode", ["prefix", "prompt"])
def test_cached_lookahead_picks_the_rows_left(mode):
    """With a cache refreshed every step the cached loop is exact; the lookahead call's repeated
    cache must hold the rows still running. ("dual" is left out: LoPA under a dual cache differs
    from the uncached loop even without the EOS stop, as it did before this stop existed.)"""
    torch.manual_seed(0)
    config = TinyDLMConfig(vocab_size=16, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                           intermediate_size=64, mask_token_id=15, eos_token_id=14, pad_token_id=0)
    model = TinyDLMModel(config).eval()
    with torch.no_grad():
        model.embed_tokens.weight[14] *= 6.0
    ids = torch.randint(1, 14, (5, 6), generator=torch.Generator().manual_seed(2))
    kw = dict(gen_length=16, block_length=8, steps=16, sampler="lopa", eos_early_stop=True, return_trace=True)
    plain = dlm.generate(model, ids, kv_cache="none", **kw)
    cached = dlm.generate(model, ids, kv_cache=mode, cache_refresh_every=1, **kw)
    assert torch.equal(cached.sequences, plain.sequences)
    assert cached.nfe == plain.nfe
    assert any(r.rows.numel() < 5 for r in plain.trace)  # rows did leave


def test_candidates_needing_model():
    c = torch.tensor([
        [[5, 8, MASK], [5, 8, 5]],       # finished anchor, branch fills after the EOS: fixed
        [[5, MASK, 8], [5, 5, 8]],       # anchor has a mask before its EOS: needed
        [[5, 8, MASK], [8, 8, MASK]],    # both finished but they differ before the EOS: needed
        [[5, 5, 5], [5, 5, 5]],          # no EOS at all: needed
    ])
    assert candidates_needing_model(c, EOS, MASK).tolist() == [False, True, True, True]
