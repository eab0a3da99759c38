"""The driver computes nothing that cannot change the answer: per-step EOS stop and block-causal
windows must give exactly the tokens of the plain loop.

Most references here are our own loop with the feature off (`eos_early_stop=False`, the whole sequence
fed): regression checks that a skip changes no token, not evidence that the loop itself is right. The
loop's tokens are pinned independently by the exact answers of `RowEos` and by
`test_eos_stop_equals_a_confidence_loop_written_here` (greedy LLaDA-style decoding in plain torch)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import dlm
from dlm.engine.masked.eos import stop_at_eos
from dlm.tiny import TinyCharTokenizer, TinyDLMConfig, TinyDLMModel
from toy_models import ToyDLM


class RowEos(torch.nn.Module):
    """Row r predicts token 5 at generation positions < n[r] and EOS after, confidently."""

    def __init__(self, prompt_length: int, n: list[int]):
        super().__init__()
        self.config = SimpleNamespace(mask_token_id=9, eos_token_id=8, vocab_size=10)
        self.prompt_length, self.n = prompt_length, torch.tensor(n)
        self.rows_seen: list[list[int]] = []

    def forward(self, ids, attention_mask=None, **kw):
        # Identify rows by their first prompt token (prompts are 0, 1, 2, ...).
        which = ids[:, 0]
        self.rows_seen.append(which.tolist())
        logits = torch.full((*ids.shape, 10), -10.0)
        pos = torch.arange(ids.shape[1]) - self.prompt_length
        before = pos[None, :] < self.n[which][:, None]
        logits[..., 5] = torch.where(before, 10.0, -10.0)
        logits[..., 8] = torch.where(before, -10.0, 10.0)
        return logits


def _reference(model, ids, **kw):
    """The plain loop without any EOS stop, then the EOS fill the early stop promises (our own loop with
    the feature off: a regression reference)."""
    out = dlm.generate(model, ids, eos_early_stop=False, **kw)
    x = out.sequences.clone()
    stop_at_eos(x, torch.arange(x.shape[0]), ids.shape[1], x.shape[1], model.config.eos_token_id)
    return x


def test_finished_rows_leave_the_batch_inside_a_block():
    ids = torch.arange(3).unsqueeze(1).repeat(1, 4)
    model = RowEos(prompt_length=4, n=[1, 3, 6])
    out = dlm.generate(model, ids, gen_length=8, block_length=8, steps=8, eos_early_stop=True, sampler="confidence")
    # Row r is fixed after n[r] + 1 one-token steps (ties commit left to right).
    assert [len(r) for r in model.rows_seen] == [3, 3, 2, 2, 1, 1, 1]
    assert out.nfe == 7
    assert torch.equal(out.sequences, _reference(RowEos(4, [1, 3, 6]), ids, gen_length=8, block_length=8, steps=8, sampler="confidence"))
    # and the exact answer: row r is n[r] fives, then EOS
    answer = torch.tensor([[5] * n + [8] * (8 - n) for n in (1, 3, 6)])
    assert torch.equal(out.sequences[:, 4:], answer)


def _decode_by_hand(model, ids, gen_length, block_length, steps, score):
    """Greedy masked-diffusion decoding written out (LLaDA's low-confidence remasking, Nie et al. 2025):
    blocks left to right, each with `steps / blocks` forwards; a step commits, among the block's masked
    positions, the `ceil(masks left / steps left)` with the highest `score(probs)` (their argmax token);
    finally everything after a row's first EOS becomes EOS (what an EOS stop promises)."""
    mask, eos = model.config.mask_token_id, model.config.eos_token_id
    P = ids.shape[1]
    x = torch.cat([ids, torch.full((ids.shape[0], gen_length), mask)], dim=1)
    per_block = steps // (gen_length // block_length)
    with torch.no_grad():
        for start in range(P, P + gen_length, block_length):
            for step in range(per_block):
                logits = model(x).logits.double()
                logits[..., mask] = float("-inf")
                probs = logits.softmax(-1)
                for row in range(x.shape[0]):
                    masked = (x[row, start:start + block_length] == mask).nonzero().flatten() + start
                    if len(masked) == 0:
                        continue
                    k = -(-len(masked) // (per_block - step))
                    ranked = sorted(masked.tolist(), key=lambda j: (-score(probs[row, j]), j))
                    for j in ranked[:k]:
                        x[row, j] = probs[row, j].argmax()
    gen = x[:, P:]
    for row in range(gen.shape[0]):
        hits = (gen[row] == eos).nonzero()
        if len(hits):
            gen[row, int(hits[0]) + 1:] = eos
    return x


SCORES = {"confidence": lambda p: p.max().item(),
          "margin": lambda p: (lambda t: (t[0] - t[1]).item())(p.topk(2).values),
          "entropy": lambda p: (p * p.clamp_min(1e-300).log()).sum().item()}  # higher = lower entropy


@pytest.mark.parametrize("sampler", list(SCORES))
@pytest.mark.parametrize("gen_length,block_length,steps", [(16, 16, 16), (24, 8, 12)])
def test_eos_stop_equals_a_confidence_loop_written_here(sampler, gen_length, block_length, steps):
    ids = torch.randint(0, 13, (6, 5), generator=torch.Generator().manual_seed(3))
    model = _eos_heavy_toy(1)
    out = dlm.generate(model, ids, gen_length=gen_length, block_length=block_length, steps=steps, sampler=sampler,
                       eos_early_stop=True)
    ref = _decode_by_hand(model, ids, gen_length, block_length, steps, SCORES[sampler])
    assert torch.equal(out.sequences, ref)
    assert (ref[:, 5:] == model.config.eos_token_id).any(dim=1).sum() >= 3  # rows do finish early here


def _eos_heavy_toy(seed: int, factor: float = 3.0) -> ToyDLM:
    """A random toy whose EOS logit is large at many positions, so rows finish at different steps."""
    model = ToyDLM(seed=seed)
    with torch.no_grad():
        model.out[:, model.config.eos_token_id] *= factor
    return model


@pytest.mark.parametrize("sampler", ["confidence", "margin", "entropy", "threshold", "random"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_per_step_eos_stop_is_token_identical_in_one_block(sampler, temperature):
    """One block: the plain loop's draws and the skipping loop's draws are the same stream."""
    ids = torch.randint(0, 13, (6, 5), generator=torch.Generator().manual_seed(3))
    kw = dict(gen_length=16, block_length=16, steps=16, sampler=sampler, temperature=temperature)
    model = _eos_heavy_toy(1)
    ref = _reference(model, ids, generator=torch.Generator().manual_seed(0), **kw)
    out = dlm.generate(model, ids, eos_early_stop=True, generator=torch.Generator().manual_seed(0), **kw)
    assert torch.equal(out.sequences, ref)


@pytest.mark.parametrize("sampler", ["confidence", "threshold"])
def test_per_step_eos_stop_is_token_identical_over_blocks(sampler):
    ids = torch.randint(0, 13, (6, 5), generator=torch.Generator().manual_seed(4))
    kw = dict(gen_length=24, block_length=8, steps=12, sampler=sampler)
    model = _eos_heavy_toy(3, 2.0)
    traced = dlm.generate(model, ids, eos_early_stop=True, return_trace=True, **kw)
    assert torch.equal(traced.sequences, _reference(model, ids, **kw))
    # The skip really happened: some step forwarded fewer rows than the block started with.
    first = {}
    for t in traced.trace:
        first.setdefault(t.block, t.rows.numel())
    assert any(t.rows.numel() < first[t.block] for t in traced.trace)
    assert len(first) > 1  # and some rows went on to the next block


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    tok = TinyCharTokenizer()
    config = TinyDLMConfig(vocab_size=tok.vocab_size, hidden_size=64, num_hidden_layers=2,
                           num_attention_heads=4, intermediate_size=128)
    model = TinyDLMModel(config).eval()
    with torch.no_grad():  # a larger EOS embedding makes EOS win at some positions
        model.embed_tokens.weight[config.eos_token_id] *= 1.6
    return model


@pytest.mark.parametrize("mode", ["prefix", "dual"])
def test_cached_rows_are_selected_when_rows_finish(tiny, mode):
    """With the cache refreshed every step the cached loop is exact; rows leaving the batch inside a
    block must pick their own cache rows."""
    ids = torch.randint(3, 40, (5, 7), generator=torch.Generator().manual_seed(5))
    kw = dict(gen_length=16, block_length=8, steps=16, eos_early_stop=True)
    plain = dlm.generate(tiny, ids, return_trace=True, **kw)
    first = {}
    for t in plain.trace:
        first.setdefault(t.block, t.rows.numel())
    assert any(t.rows.numel() < first[t.block] for t in plain.trace)  # rows left inside a block
    for refresh in (1, 0):
        cached = dlm.generate(tiny, ids, kv_cache=mode, cache_refresh_every=refresh, **kw)
        assert not (cached.sequences == tiny.config.mask_token_id).any()
        if refresh == 1:
            assert torch.equal(cached.sequences, plain.sequences)


class CausalToy(ToyDLM):
    """A toy whose attention is causal, hence block-causal for any block alignment."""

    dlm_block_causal = True

    def forward(self, input_ids, attention_mask=None, position_ids=None, **kw):
        self.calls.append(input_ids.detach().clone())
        if position_ids is None:
            position_ids = torch.arange(input_ids.shape[1]).expand_as(input_ids)
        h = self.tok[input_ids] + self.pos[position_ids]
        q, k, v = (h @ self.qkv).chunk(3, dim=-1)
        scores = q @ k.transpose(1, 2) / q.shape[-1] ** 0.5
        L = input_ids.shape[1]
        scores = scores.masked_fill(torch.ones(L, L, dtype=torch.bool).triu(1), float("-inf"))
        logits = (h + torch.softmax(scores, dim=-1) @ v) @ self.out
        return SimpleNamespace(logits=logits)


class Undeclared(torch.nn.Module):
    """The same model without the capability flag: the driver feeds the whole sequence."""

    def __init__(self, inner):
        super().__init__()
        self.inner, self.config = inner, inner.config

    def forward(self, *a, **kw):
        return self.inner(*a, **kw)


@pytest.mark.parametrize("sampler", ["confidence", "threshold"])
def test_block_causal_model_gets_only_the_prefix_up_to_the_block_end(sampler):
    ids = torch.randint(0, 13, (2, 4), generator=torch.Generator().manual_seed(6))
    kw = dict(gen_length=24, block_length=8, steps=12, sampler=sampler)
    model = CausalToy(seed=3)
    cut = dlm.generate(model, ids, **kw)
    whole = dlm.generate(Undeclared(CausalToy(seed=3)), ids, **kw)
    assert torch.equal(cut.sequences, whole.sequences)
    assert {c.shape[1] for c in model.calls} == {12, 20, 28}  # prompt 4 + 8, 16, 24
    assert cut.forward_tokens < whole.forward_tokens


def test_bidirectional_models_are_not_cut():
    model = ToyDLM()
    dlm.generate(model, torch.tensor([[1, 2, 3, 4]]), gen_length=16, block_length=8, steps=4)
    assert {c.shape[1] for c in model.calls} == {20}


def test_extending_a_cache_of_the_same_sequence_equals_the_full_forward(tiny):
    """The model-level property behind `cache_across_blocks`: when the cached K/V are those of
    the current sequence, recomputing only `x[:, lo:]` gives the full forward's logits there."""
    from dlm.adapters import DLMAdapter
    adapter = DLMAdapter.wrap(tiny)
    x = torch.randint(3, 40, (2, 20), generator=torch.Generator().manual_seed(7))
    full, cache = adapter.full(x, None, None, use_cache=True)
    part, new_cache = adapter.extend(x, cache, 12, None, None)
    torch.testing.assert_close(part, full[:, 12:], rtol=1e-5, atol=1e-5)
    for (k0, v0), (k1, v1) in zip(cache, new_cache):
        torch.testing.assert_close(k1, k0, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(v1, v0, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", ["prefix", "dual"])
def test_cache_across_blocks_skips_the_prefix_and_is_deterministic(tiny, mode):
    ids = torch.randint(3, 40, (3, 9), generator=torch.Generator().manual_seed(8))
    kw = dict(gen_length=24, block_length=8, steps=12, kv_cache=mode, return_trace=True, eos_early_stop=False)
    base = dlm.generate(tiny, ids, **kw)
    runs = [dlm.generate(tiny, ids, cache_across_blocks=True, **kw) for _ in range(2)]
    assert torch.equal(runs[0].sequences, runs[1].sequences)
    assert not (runs[0].sequences == tiny.config.mask_token_id).any()
    assert runs[0].nfe == base.nfe and runs[0].forward_tokens < base.forward_tokens
    # Block 0 starts with the same full forward, so its tokens agree exactly.
    assert torch.equal(runs[0].sequences[:, :17], base.sequences[:, :17])


def test_cache_across_blocks_needs_a_cache(tiny):
    with pytest.raises(ValueError, match="kv_cache='prefix'"):
        dlm.generate(tiny, torch.tensor([[5, 6, 7]]), gen_length=8, cache_across_blocks=True)


@pytest.mark.parametrize("sampler", ["confidence", "threshold"])
def test_cut_trailing_masks_feeds_a_bidirectional_model_up_to_the_block_end(sampler):
    """Opt-in: a model that does not declare itself block-causal is cut like one. On a causal model
    (where the cut is exact) the tokens equal the uncut run's; the forward tokens drop."""
    ids = torch.randint(0, 13, (2, 4), generator=torch.Generator().manual_seed(6))
    kw = dict(gen_length=24, block_length=8, steps=12, sampler=sampler)
    undeclared = Undeclared(CausalToy(seed=3))
    cut = dlm.generate(undeclared, ids, cut_trailing_masks=True, **kw)
    assert {c.shape[1] for c in undeclared.inner.calls} == {12, 20, 28}  # prompt 4 + 8, 16, 24
    whole = dlm.generate(Undeclared(CausalToy(seed=3)), ids, **kw)
    assert torch.equal(cut.sequences, whole.sequences)
    assert cut.forward_tokens < whole.forward_tokens
    bidirectional = ToyDLM()
    dlm.generate(bidirectional, torch.tensor([[1, 2, 3, 4]]), gen_length=16, block_length=8, steps=4,
                 cut_trailing_masks=True)
    assert {c.shape[1] for c in bidirectional.calls} == {12, 20}


def test_cut_trailing_masks_bad_uses():
    with pytest.raises(ValueError, match="ensemble"):
        dlm.generate(ToyDLM(), torch.tensor([[1, 2, 3, 4]]), gen_length=16, steps=16, sampler="hex",
                     cut_trailing_masks=True)
    from dlm.bench.harness import parse_sampler_specs
    assert parse_sampler_specs("threshold:kv=dual:cut=1")[0].cut_trailing_masks
    for bad, msg in (("threshold:cut=2", "must be 0 or 1"), ("diffusers-llada2:cut=1", "option of our engine"),
                     ("hex:cut=1", "ensemble")):
        with pytest.raises(ValueError, match=msg):
            parse_sampler_specs(bad)
