"""Schedule oracle: a masked LM whose answers fail under some block lengths, different ones per prompt.

HEX's argument (Lee et al., 2025, arXiv:2510.05040): a masked diffusion LM has learnt many
generation orders, the block length of semi-autoregressive decoding picks one, and single
schedules fail in different ways on different prompts, so a vote over block lengths recovers
answers none of them gets everywhere. This oracle holds, per prompt, one right answer (a token
string then end-of-text) and the two failures the paper and its code describe, each at a
position drawn per prompt, so which block lengths fail depends on the prompt:

- padding collapse (the paper's case): a masked position at least `pad_distance` to the right of
  the first masked position looks like end-of-text padding: EOS with probability 0.95, above the
  0.9 of the next answer token. A block longer than `pad_distance` lets confidence decoding commit
  EOS inside the answer; smaller blocks never see such a position.
- a late anchor: the token at `anchor - 1` is right only once the token at `anchor` (probability
  0.97) is committed; before that the model proposes a wrong token there. A schedule that commits
  `anchor - 1` no later than `anchor` (an earlier block, or the same step) writes it wrong:
  small blocks whose boundary falls between them.

Every other masked position predicts its target with probability 0.9 at the first masked
position and 0.8 - 0.01 * distance further right. The answer is exact: quality is the share of
prompts whose generation up to its first EOS equals the answer (`score`), no proxy.

Prompts are two tokens encoding the prompt's index (`prompt`); scenarios are drawn from a seeded
RNG (`draw_scenarios`): answer length uniform in [answer_min, answer_max], pad_distance uniform
in [2, gen_length] (gen_length: no collapse), an anchor on half of the prompts, uniform inside the
answer. Token layout: answer symbols 1..12, EOS 13, MASK 14, prompt digits 0..12 (vocab 15).
"""
from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import torch
from torch import nn

VOCAB, EOS, MASK = 15, 13, 14
SYMBOLS = 12  # answer tokens 1..12
BASE = 13  # prompt digits 0..12


@dataclass(frozen=True)
class Scenario:
    """One prompt: its answer tokens, where padding starts to look likely, where the anchor is."""

    answer: tuple[int, ...]
    pad_distance: int | None = None
    anchor: int | None = None


def draw_scenarios(num_prompts: int, gen_length: int, *, seed: int = 0, answer_min: int = 6,
                   answer_max: int = 12) -> list[Scenario]:
    """`num_prompts` scenarios from a seeded numpy RNG (module docstring)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(num_prompts):
        length = int(rng.integers(answer_min, answer_max + 1))
        answer = tuple(int(t) for t in rng.integers(1, SYMBOLS + 1, size=length))
        pad = int(rng.integers(2, gen_length + 1))
        anchor = int(rng.integers(1, length)) if rng.random() < 0.5 else None
        out.append(Scenario(answer, None if pad >= gen_length else pad, anchor))
    return out


def _distribution(token: int, p: float) -> torch.Tensor:
    row = torch.full((VOCAB,), (1 - p) / (VOCAB - 2), dtype=torch.float64)
    row[token], row[MASK] = p, 0.0
    return row


class ScheduleOracle(nn.Module):
    """The schedule oracle over `scenarios` (module docstring); input `[B, 2 + gen_length]`, aligned
    logits `[B, 2 + gen_length, VOCAB]`, no KV cache."""

    supports_dlm_kv_cache = False

    def __init__(self, scenarios: list[Scenario], gen_length: int):
        super().__init__()
        if len(scenarios) > BASE * BASE:
            raise ValueError(f"at most {BASE * BASE} scenarios (two prompt digits), got {len(scenarios)}")
        if any(len(s.answer) >= gen_length for s in scenarios):
            raise ValueError(f"every answer must be shorter than gen_length {gen_length} (room for its EOS)")
        self.scenarios, self.gen_length = scenarios, gen_length
        self.config = SimpleNamespace(mask_token_id=MASK, eos_token_id=EOS, pad_token_id=EOS, vocab_size=VOCAB,
                                      max_position_embeddings=2 + gen_length)

    def prompt(self, indices=None) -> torch.Tensor:
        """`[N, 2]` prompts of scenarios `indices` (default: all)."""
        idx = range(len(self.scenarios)) if indices is None else indices
        return torch.tensor([[i // BASE, i % BASE] for i in idx], dtype=torch.long)

    def target(self, s: Scenario) -> list[int]:
        return list(s.answer) + [EOS] * (self.gen_length - len(s.answer))

    def forward(self, input_ids: torch.Tensor, attention_mask=None, **kw):
        if input_ids.shape[1] != 2 + self.gen_length:
            raise ValueError("the schedule oracle decodes the whole canvas: input must be [B, 2 + gen_length] "
                             "(kv_cache='none')")
        probs = torch.full((*input_ids.shape, VOCAB), 1.0 / (VOCAB - 1), dtype=torch.float64)
        probs[..., MASK] = 0.0
        for r, row in enumerate(input_ids.tolist()):
            s = self.scenarios[row[0] * BASE + row[1]]
            gen, target = row[2:], self.target(s)
            masked = [i for i, t in enumerate(gen) if t == MASK]
            for i in masked:
                d = i - masked[0]
                if s.pad_distance is not None and d >= s.pad_distance:
                    token, p = EOS, 0.95
                elif i == s.anchor:
                    token, p = target[i], 0.97
                else:
                    token, p = target[i], 0.9 if d == 0 else 0.8 - 0.01 * d
                    if s.anchor is not None and i == s.anchor - 1 and gen[s.anchor] == MASK:
                        token = 1 + target[i] % SYMBOLS  # a wrong answer token (never EOS or mask)
                probs[r, 2 + i] = _distribution(token, p)
        return SimpleNamespace(logits=probs.clamp_min(1e-12).log().float())

    def answer_of(self, generated: torch.Tensor) -> tuple[int, ...]:
        """The generated tokens `[gen_length]` up to the first EOS."""
        ids = generated.tolist()
        return tuple(ids[: ids.index(EOS)] if EOS in ids else ids)

    def score(self, sequences: torch.Tensor, indices=None) -> torch.Tensor:
        """`[N]` bool: row r's answer equals scenario `indices[r]`'s (sequences `[N, 2 + gen_length]`)."""
        idx = list(range(len(self.scenarios))) if indices is None else list(indices)
        return torch.tensor([self.answer_of(seq[2:]) == self.scenarios[i].answer for seq, i in zip(sequences, idx)])


__all__ = ["ScheduleOracle", "Scenario", "draw_scenarios", "VOCAB", "EOS", "MASK"]
