"""Small deterministic stand-in models for driver and sampler tests.

`ToyDLM` is a one-layer bidirectional attention model with random (seeded) weights: its outputs
depend on the whole context, it honours key padding masks and position ids, so a left-padded row
gives the same logits as the same row alone.
"""
from __future__ import annotations

from types import SimpleNamespace

import torch


class ToyDLM(torch.nn.Module):
    def __init__(self, vocab_size: int = 16, dim: int = 32, seed: int = 0, max_len: int = 128):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.config = SimpleNamespace(
            mask_token_id=vocab_size - 1, eos_token_id=vocab_size - 2, pad_token_id=0,
            vocab_size=vocab_size, max_position_embeddings=max_len)
        self.tok = torch.nn.Parameter(torch.randn(vocab_size, dim, generator=g))
        self.pos = torch.nn.Parameter(torch.randn(max_len, dim, generator=g) * 0.5)
        self.qkv = torch.nn.Parameter(torch.randn(dim, 3 * dim, generator=g) / dim ** 0.5)
        self.out = torch.nn.Parameter(torch.randn(dim, vocab_size, generator=g) * 2 / dim ** 0.5)
        self.calls: list[torch.Tensor] = []

    def forward(self, input_ids, attention_mask=None, position_ids=None, **kw):
        self.calls.append(input_ids.detach().clone())
        if position_ids is None:
            position_ids = torch.arange(input_ids.shape[1]).expand_as(input_ids)
        h = self.tok[input_ids] + self.pos[position_ids]
        q, k, v = (h @ self.qkv).chunk(3, dim=-1)
        scores = q @ k.transpose(1, 2) / q.shape[-1] ** 0.5
        if attention_mask is not None:
            scores = scores.masked_fill(~attention_mask.bool()[:, None, :], float("-inf"))
        h = h + torch.softmax(scores, dim=-1) @ v
        logits = h @ self.out
        # Never predict the mask token itself.
        logits[..., self.config.mask_token_id] = float("-inf")
        return SimpleNamespace(logits=logits)


class ShiftedToy(torch.nn.Module):
    """Wraps a model so that its logits come out shifted by one (Dream-style)."""

    def __init__(self, inner: torch.nn.Module):
        super().__init__()
        self.inner = inner
        self.config = inner.config

    def forward(self, input_ids, attention_mask=None, **kw):
        logits = self.inner(input_ids, attention_mask=attention_mask, **kw).logits
        # shifted[:, i-1] predicts token i; the last row predicts nothing (filled with copies).
        return torch.cat([logits[:, 1:], logits[:, -1:]], dim=1)


def peaked_logits(top_probs, tokens=None, vocab: int = 10, mask_id: int = 9) -> torch.Tensor:
    """`[1, L, vocab]` logits whose argmax at position i is tokens[i] (default i) with probability
    top_probs[i]; the rest is spread over the other non-mask tokens, the mask token gets 0."""
    rows = []
    for i, p in enumerate(top_probs):
        tok = i if tokens is None else tokens[i]
        row = [(1 - p) / (vocab - 2)] * vocab
        row[tok], row[mask_id] = p, 0.0
        rows.append(row)
    return torch.tensor(rows, dtype=torch.float64).clamp_min(1e-12).log().float().unsqueeze(0)


class StaticLogits(torch.nn.Module):
    """Logits that do not depend on the input (a seeded [length, vocab] table, the same for every row):
    a drafted step is always the step the base sampler then takes, so lossless draft-and-verify
    verifies every draft and a round commits min(depth, steps left) base steps."""

    def __init__(self, vocab: int = 12, length: int = 64, seed: int = 1):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.table = torch.randn(length, vocab, generator=g) * 3
        self.config = SimpleNamespace(mask_token_id=vocab - 1, eos_token_id=None, pad_token_id=None, vocab_size=vocab)

    def forward(self, input_ids, attention_mask=None, **kw):
        return SimpleNamespace(logits=self.table[: input_ids.shape[1]].expand(input_ids.shape[0], -1, -1).clone())
