"""LLaDA's Monte Carlo likelihood estimator (`dlm.evaluation.likelihood`) against exact oracles.

The hidden-Markov oracle's conditionals given any partial mask are exact, so the estimator's target is
known: log p(continuation | prefix) by the forward algorithm over an enumeration of the whole language
(`HMMOracle.enumerate_joint`), which never goes through the conditionals the estimator reads.
"""
import math

import pytest
import torch

from dlm.evaluation.likelihood import draw_masks, estimate_loglikelihoods, mask_counts, request_generator
from dlm.oracles import HMMOracle


@pytest.fixture(scope="module")
def hmm():
    return HMMOracle.random(3, 3, 5, seed=0)


def _exact_conditional(oracle, sentence, k):
    """log p(x_{k+1..n} | x_1..x_k), from the exact joint (a logsumexp over the completions)."""
    seqs, logp = oracle.enumerate_joint()
    full = logp[(seqs == torch.tensor(sentence)).all(dim=1)].item()
    prefix = torch.logsumexp(logp[(seqs[:, :k] == torch.tensor(sentence[:k])).all(dim=1)], dim=0).item()
    return full - prefix


def _request(oracle, sentence, k):
    return [oracle.config.bos_token_id] + sentence[:k], sentence[k:]


SENTENCE = [0, 1, 2, 1, 0]


def test_stratified_counts_cover_every_count_equally():
    g = torch.Generator().manual_seed(3)
    counts = mask_counts(5, 20, g)
    assert sorted(counts.tolist()) == sorted(list(range(1, 6)) * 4)
    masks = draw_masks(7, 50, torch.Generator().manual_seed(1))
    assert masks.shape == (50, 7)
    assert torch.equal(masks.sum(dim=1), mask_counts(7, 50, torch.Generator().manual_seed(1)))


def test_each_sample_count_is_uniform_over_seeds():
    # sample j's count over many requests: uniform on 1..L (LLaDA's round-half-to-even is not, at jL/N = x.5)
    L, N = 4, 8
    hist = torch.zeros(N, L)
    for seed in range(400):
        c = mask_counts(L, N, torch.Generator().manual_seed(seed))
        hist[torch.arange(N), c - 1] += 1
    assert hist.min() > 60 and hist.max() < 140  # 100 expected per cell


def test_one_token_continuation_is_the_exact_conditional(hmm):
    prefix, target = _request(hmm, SENTENCE, 4)
    exact = _exact_conditional(hmm, SENTENCE, 4)
    for mc_num in (1, 5):
        est = estimate_loglikelihoods(hmm, [(prefix, target)], mask_token_id=hmm.config.mask_token_id, mc_num=mc_num)[0]
        assert est.loglikelihood == pytest.approx(exact, abs=1e-5)


def test_estimate_converges_to_the_exact_log_probability(hmm):
    prefix, target = _request(hmm, SENTENCE, 2)
    exact = _exact_conditional(hmm, SENTENCE, 2)
    errors = {}
    for mc_num in (8, 2048):
        errs = []
        for seed in range(6):
            est = estimate_loglikelihoods(hmm, [(prefix, target)], mask_token_id=hmm.config.mask_token_id,
                                          mc_num=mc_num, rows_per_forward=1024, seed=seed)[0]
            errs.append(abs(est.loglikelihood - exact))
            if mc_num == 2048:
                assert abs(est.loglikelihood - exact) < 5 * est.stderr + 1e-3
        errors[mc_num] = sum(errs) / len(errs)
    assert errors[2048] < 0.05 < errors[8]
    assert errors[2048] < errors[8] / 4


def test_estimate_is_its_exact_expectation_by_enumeration(hmm):
    # E over l ~ U{1..L} and uniform subsets of (L / l) * sum of masked log-conditionals, enumerated with
    # the oracle's own conditionals: the identity the estimator rests on (equals the exact value).
    import itertools

    prefix, target = _request(hmm, SENTENCE, 2)
    L = len(target)
    total = 0.0
    for l in range(1, L + 1):
        subsets = list(itertools.combinations(range(L), l))
        for subset in subsets:
            x = torch.tensor([prefix + target])
            for i in subset:
                x[0, len(prefix) + i] = hmm.config.mask_token_id
            logp = torch.log_softmax(hmm(x).double(), dim=-1)[0]
            s = sum(logp[len(prefix) + i, target[i]].item() for i in subset)
            total += (1 / L) * (L / l) * s / len(subsets)
    assert total == pytest.approx(_exact_conditional(hmm, SENTENCE, 2), abs=1e-5)


def test_batch_size_and_request_order_change_nothing():
    import dlm

    lm = dlm.load("tiny-dlm")
    tok = lm.tokenizer
    requests = [(tok.encode_prompt("copy: ana bo"), tok.encode("ana bo")),
                (tok.encode_prompt("reverse: tom fay ivy gus"), tok.encode("gus ivy fay tom")),
                (tok.encode_prompt("sort: kai eli"), tok.encode("eli kai"))]
    kw = dict(mask_token_id=lm.mask_token_id, pad_token_id=lm.pad_token_id, mc_num=6, seed=7)
    ref = estimate_loglikelihoods(lm.model, requests, rows_per_forward=1, **kw)
    for rows in (4, 18):
        got = estimate_loglikelihoods(lm.model, requests, rows_per_forward=rows, **kw)
        for a, b in zip(ref, got):
            assert b.loglikelihood == pytest.approx(a.loglikelihood, abs=1e-4)
    flipped = estimate_loglikelihoods(lm.model, requests[::-1], rows_per_forward=5, **kw)[::-1]
    assert [round(e.loglikelihood, 4) for e in flipped] == [round(e.loglikelihood, 4) for e in ref]
    assert ref[0].forwards == 6 and ref[0].samples == 6
    assert len({round(e.loglikelihood, 6) for e in ref}) == 3
    # a different seed draws different masks (the estimate is seeded, not fixed)
    other = estimate_loglikelihoods(lm.model, requests[1:2], rows_per_forward=8, **{**kw, "seed": 8})[0]
    assert other.loglikelihood != pytest.approx(ref[1].loglikelihood, abs=1e-6)


def test_guidance_follows_llada_formula(hmm):
    prefix, target = _request(hmm, SENTENCE, 4)
    w = 0.5
    est = estimate_loglikelihoods(hmm, [(prefix, target)], mask_token_id=hmm.config.mask_token_id, mc_num=1,
                                  cfg_scale=w)[0]
    cond_x = torch.tensor([prefix + [hmm.config.mask_token_id]])
    uncond_x = torch.tensor([[hmm.config.mask_token_id] * len(prefix) + [hmm.config.mask_token_id]])
    c, u = hmm(cond_x)[0, -1].double(), hmm(uncond_x)[0, -1].double()
    expected = torch.log_softmax(u + (w + 1) * (c - u), dim=-1)[target[0]].item()
    assert est.loglikelihood == pytest.approx(expected, abs=1e-4)
    assert est.rows == 2  # the guidance copy doubles the rows
    assert abs(expected - _exact_conditional(hmm, SENTENCE, 4)) > 1e-3  # guidance changed the value


class _Shifted(torch.nn.Module):
    """The oracle as a Dream-style model: logits[:, i-1] predicts token i."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, input_ids, attention_mask=None, **kw):
        logits = self.inner(input_ids)
        return torch.cat([logits[:, 1:], torch.zeros_like(logits[:, :1])], dim=1)


def test_shifted_logits_are_aligned(hmm):
    prefix, target = _request(hmm, SENTENCE, 1)
    kw = dict(mask_token_id=hmm.config.mask_token_id, mc_num=16, seed=2)
    plain = estimate_loglikelihoods(hmm, [(prefix, target)], **kw)[0]
    shifted = estimate_loglikelihoods(_Shifted(hmm), [(prefix, target)], shift_logits=True, **kw)[0]
    assert shifted.loglikelihood == pytest.approx(plain.loglikelihood, abs=1e-5)


def test_request_generator_depends_on_the_request_only():
    a = request_generator(1, [1, 2], [3]).initial_seed()
    assert a == request_generator(1, [1, 2], [3]).initial_seed()
    assert len({a, request_generator(2, [1, 2], [3]).initial_seed(), request_generator(1, [1, 2], [4]).initial_seed(),
                request_generator(1, [1, 2], [3], occurrence=1).initial_seed()}) == 4


def test_bad_requests_are_refused(hmm):
    with pytest.raises(ValueError, match="continuation is empty"):
        estimate_loglikelihoods(hmm, [([5], [])], mask_token_id=hmm.config.mask_token_id)
    with pytest.raises(ValueError, match="needs a prefix token"):
        estimate_loglikelihoods(hmm, [([], [1])], mask_token_id=hmm.config.mask_token_id, shift_logits=True)
    prefix, target = _request(hmm, SENTENCE, 4)
    assert math.isnan(estimate_loglikelihoods(hmm, [(prefix, target)], mask_token_id=hmm.config.mask_token_id,
                                              mc_num=1)[0].stderr)  # one sample has no spread to report
