"""Monte Carlo log-likelihood of a continuation under a masked diffusion LM.

LLaDA (Nie et al., 2025, "Large Language Diffusion Models", arXiv 2502.09992, Eq. 14 and its
`get_log_likelihood.py`) scores a continuation `a` (length L) after a prefix `p` by the masked-token
cross-entropy of its training objective, estimated by Monte Carlo:

    log p(a | p)  ~  -(1 / N) sum_j (L / l_j) sum_{i in M_j} CE(model(p, a with M_j masked)_i, a_i)

with N = `mc_num` samples, l_j ~ U{1..L} masked positions and M_j a uniform subset of l_j positions of
the continuation; the prefix is never masked. With exact conditionals this is unbiased: the weighted
masked loss averaged over l and M equals the expectation over random orders of the chain rule, which
every order sums to log p(a | p) (Ou et al., 2024, "Your Absorbing Discrete Diffusion Secretly Models
the Conditional Distributions of Clean Data"). A trained model gives a bound-type estimate.

Where we differ from LLaDA's code, on purpose:
- the draws of one request depend on the seed and on that request only (`request_generator`), never
  on the batch size, the other requests of a batch or their order; LLaDA stratifies the counts per
  minibatch of `batch_size` rows, so its estimate changes with the batch size;
- the counts are stratified over all N samples with whole-number offsets, l_j = (k - 1 + floor(jL/N))
  mod L + 1 with one k ~ U{1..L}: every l_j is exactly uniform (LLaDA rounds `k + jL/b` half to
  even, which makes some counts of a row more likely than others when jL/b ends in .5);
- rows of several requests may share a forward (left-padded, with an attention mask), so that
  `mc_num=1` (LLaDA's MMLU setting) still fills a batch.
CFG (LLaDA's): a second copy of each row with the prefix masked, logits `u + (w + 1)(c - u)`.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
import torch.nn.functional as F


@dataclass
class LikelihoodEstimate:
    """One request's estimate.

    Attributes:
        loglikelihood: the estimate of log p(target | prefix), nats.
        stderr: standard error of the N per-sample values (treating them as independent, which the
            stratification makes conservative).
        samples: N, the Monte Carlo samples. forwards: batched model calls that held its rows.
        rows: model rows it took (N, twice that with CFG).
    """

    loglikelihood: float
    stderr: float
    samples: int
    forwards: int
    rows: int


def request_generator(seed: int, prefix: Sequence[int], target: Sequence[int], occurrence: int = 0) -> torch.Generator:
    """A CPU generator seeded by `seed` and the request's own tokens (and `occurrence`, to tell
    repeated identical requests apart): the same request gets the same draws in any batch or order."""
    text = f"{seed}|{occurrence}|{','.join(map(str, prefix))}|{','.join(map(str, target))}"
    value = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") & ((1 << 63) - 1)
    return torch.Generator().manual_seed(value)


def mask_counts(length: int, num: int, generator: torch.Generator) -> torch.Tensor:
    """`[num]` long masked counts in 1..length, stratified: one k ~ U{1..length}, then whole-number
    offsets `floor(j * length / num)`, wrapped; each count is marginally uniform."""
    k = torch.randint(1, length + 1, (1,), generator=generator)
    offsets = torch.arange(num) * length // num
    return (k - 1 + offsets) % length + 1


def draw_masks(length: int, num: int, generator: torch.Generator) -> torch.Tensor:
    """`[num, length]` bool: row j masks a uniform subset of `mask_counts(...)[j]` positions."""
    counts = mask_counts(length, num, generator)
    keys = torch.rand(num, length, generator=generator)
    ranks = keys.argsort(dim=1).argsort(dim=1)  # a uniform random permutation per row
    return ranks < counts[:, None]


def _positions(attention_mask: torch.Tensor | None) -> torch.Tensor | None:
    """Position ids that skip left padding (as the decoding loop gives them); None when unpadded."""
    if attention_mask is None:
        return None
    return (attention_mask.cumsum(dim=1) - 1).clamp_min(0)


@torch.no_grad()
def estimate_loglikelihoods(
    model: Callable,
    requests: Sequence[tuple[Sequence[int], Sequence[int]]],
    *,
    mask_token_id: int,
    mc_num: int = 128,
    rows_per_forward: int = 32,
    seed: int = 1234,
    cfg_scale: float = 0.0,
    shift_logits: bool = False,
    pad_token_id: int | None = None,
    device: torch.device | str = "cpu",
    generators: Sequence[torch.Generator] | None = None,
    progress: Callable[[int], None] | None = None,
) -> list[LikelihoodEstimate]:
    """Estimate log p(target | prefix) for each `(prefix ids, target ids)` request.

    Args:
        model: `model(input_ids [R, T], attention_mask=None, **kw)` returning logits `[R, T, V]` (or an
            object with `.logits`), aligned unless `shift_logits` (Dream: logits[i-1] predicts token i);
            a model with `dlm_position_ids(x, mask)` gets its own positions, others `position_ids`
            only under padding.
        requests: token id lists; the target non-empty, the prefix non-empty when `shift_logits`.
        mc_num: N samples per request. rows_per_forward: rows per batched call (CFG doubles the rows).
        seed / generators: draws come from `request_generator(seed, ...)` unless `generators` gives one
            per request. pad_token_id: the id left padding is filled with (any id, it is masked out).
        progress: called with the number of rows finished after each call.
    Returns: one `LikelihoodEstimate` per request, in order.
    """
    from dlm.adapters import model_output_logits

    if mc_num < 1 or rows_per_forward < 1:
        raise ValueError(f"mc_num ({mc_num}) and rows_per_forward ({rows_per_forward}) must be >= 1")
    rows = []  # (request index, sequence [T] long, masked [T] bool, weight L/l)
    for r, (prefix, target) in enumerate(requests):
        prefix, target = list(prefix), list(target)
        if not target:
            raise ValueError(f"request {r}: the continuation is empty; there is nothing to score")
        if shift_logits and not prefix:
            raise ValueError(f"request {r}: a shifted-logits model needs a prefix token before the continuation")
        g = generators[r] if generators is not None else request_generator(seed, prefix, target)
        masks = draw_masks(len(target), mc_num, g)
        clean = torch.tensor(prefix + target, dtype=torch.long)
        for m in masks:
            full = torch.cat([torch.zeros(len(prefix), dtype=torch.bool), m])
            rows.append((r, clean, full, len(target) / int(m.sum()), len(prefix)))
    losses = [[] for _ in requests]
    calls = [0] * len(requests)
    positions_of = getattr(model, "dlm_position_ids", None)
    for start in range(0, len(rows), rows_per_forward):
        chunk = rows[start:start + rows_per_forward]
        x, clean, masked, attention = _left_padded(chunk, mask_token_id, pad_token_id)
        x, clean, masked = x.to(device), clean.to(device), masked.to(device)
        attention = None if attention is None else attention.to(device)
        logits = _guided_logits(model, x, attention, chunk, mask_token_id, cfg_scale, positions_of, model_output_logits)
        if shift_logits:  # logits[:, i-1] predicts token i; position 0 is never a target (prefix >= 1)
            logits, clean, masked = logits[:, :-1], clean[:, 1:], masked[:, 1:]
        # only the masked positions: a [R, T, V] log-softmax of a 126k vocabulary would not fit
        row_of = masked.nonzero()[:, 0]
        logp = F.log_softmax(logits[masked].float(), dim=-1).gather(-1, clean[masked].unsqueeze(-1)).squeeze(-1)
        per_row = torch.zeros(len(chunk), dtype=torch.float64, device=logp.device).index_add_(0, row_of, -logp.double())
        per_row = per_row.cpu()
        for (r, _, _, weight, _), loss in zip(chunk, per_row.tolist()):
            losses[r].append(loss * weight)
        for r in {row[0] for row in chunk}:
            calls[r] += 1
        if progress is not None:
            progress(len(chunk))
    out = []
    factor = 2 if cfg_scale else 1
    for r, values in enumerate(losses):
        v = torch.tensor(values, dtype=torch.float64)
        stderr = float(v.std(unbiased=True) / len(v) ** 0.5) if len(v) > 1 else float("nan")
        out.append(LikelihoodEstimate(loglikelihood=-float(v.mean()), stderr=stderr, samples=len(v),
                                      forwards=calls[r], rows=factor * len(v)))
    return out


def _left_padded(chunk, mask_id: int, pad_id: int | None):
    """Noised inputs `[R, T]`, clean tokens, the masked positions and an attention mask (None when every
    row has the same length: LLaDA was trained without one, so none is passed where none is needed)."""
    width = max(len(row[1]) for row in chunk)
    pad = mask_id + 1 if pad_id is None or pad_id == mask_id else pad_id  # any id but the mask: it is masked out
    x = torch.full((len(chunk), width), pad, dtype=torch.long)
    clean = torch.full_like(x, pad)
    masked = torch.zeros_like(x, dtype=torch.bool)
    attention = torch.zeros_like(x)
    for i, (_, seq, m, _, _) in enumerate(chunk):
        n = len(seq)
        clean[i, width - n:] = seq
        x[i, width - n:] = torch.where(m, torch.full_like(seq, mask_id), seq)
        masked[i, width - n:] = m
        attention[i, width - n:] = 1
    return x, clean, masked, (None if bool(attention.all()) else attention)


def _guided_logits(model, x, attention, chunk, mask_id, cfg_scale, positions_of, output_logits):
    """The model's logits `[R, T, V]` for `x`; with `cfg_scale` > 0, LLaDA's guidance against a copy
    whose prefix (the real prompt tokens) is masked, in the same call."""
    if cfg_scale:
        uncond = x.clone()
        width = x.shape[1]
        for i, (_, seq, _, _, prefix_len) in enumerate(chunk):
            lo = width - len(seq)
            uncond[i, lo:lo + prefix_len] = mask_id
        inputs = torch.cat([x, uncond])
        mask = None if attention is None else attention.repeat(2, 1)
    else:
        inputs, mask = x, attention
    # positions of the conditional rows, repeated for the guidance copies (as the decoding loop does)
    positions = positions_of(x, attention) if positions_of is not None else _positions(attention)
    kw = {}
    if positions is not None:
        kw["position_ids"] = positions.repeat(2, 1) if cfg_scale else positions
    if mask is not None:
        kw["attention_mask"] = mask
    logits, _ = output_logits(model(inputs, **kw))
    if not cfg_scale:
        return logits
    cond, un = logits.float().chunk(2)
    ruled_out = torch.isneginf(cond) | torch.isneginf(un)  # keep -inf where either pass rules a token out
    return torch.where(ruled_out, cond, un + (cfg_scale + 1) * (cond - un))
