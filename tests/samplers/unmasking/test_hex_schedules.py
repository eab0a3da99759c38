"""HEX on a test bed where block schedules fail in different ways (real decoding, no mocked outcome).

`ScheduleOracle` is an analytic masked LM whose per-row behaviour reproduces the two failure modes
behind HEX (Lee et al., 2025, arXiv:2510.05040):

- padding collapse (the paper's case): masked positions at least `pad_distance` to the right of the
  first masked position look like end-of-text padding, predicted EOS with probability 0.95, above
  the 0.9 of the next answer token. A block longer than `pad_distance` commits EOS inside the answer
  first (top-k confidence or margin) and the answer is cut short; small blocks never see such a
  position, so they decode the answer left to right.
- a late anchor: the token at `anchor - 1` is only right once the confident token at `anchor`
  (probability 0.97) is committed. A schedule that commits `anchor - 1` no later than `anchor`
  (`anchor - 1` in an earlier block, or both in one block with `anchor - 1` at its start, where
  the first pass commits both) writes a wrong token there.

Every other masked position predicts its target with probability 0.9 at the first masked position
and 0.8 - 0.01 * distance further right, so a schedule without those two traps decodes the target
exactly, two tokens per pass (the published gen/2 passes per expert).
"""
from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import torch

import dlm
from dlm.ensemble import hex_generate
from samplers.unmasking.hex import HexConfig

VOCAB, EOS, MASK = 16, 14, 15
PROMPT_LENGTH = 3


@dataclass(frozen=True)
class Scenario:
    answer: tuple[int, ...]
    pad_distance: int | None = None  # masked positions this far right of the first masked one look like padding
    anchor: int | None = None  # position whose token the one before it needs


def _probs(token: int, p: float) -> torch.Tensor:
    """A distribution with `p` on `token`, the rest spread over the other non-mask tokens."""
    row = torch.full((VOCAB,), (1 - p) / (VOCAB - 2), dtype=torch.float64)
    row[token], row[MASK] = p, 0.0
    return row


class ScheduleOracle(torch.nn.Module):
    """Row r of a batch follows `scenarios[input_ids[r, 0]]`; prompts are `PROMPT_LENGTH` long."""

    def __init__(self, scenarios: list[Scenario], gen_length: int):
        super().__init__()
        self.scenarios, self.gen_length = scenarios, gen_length
        self.config = SimpleNamespace(mask_token_id=MASK, eos_token_id=EOS, pad_token_id=0, vocab_size=VOCAB,
                                      max_position_embeddings=PROMPT_LENGTH + gen_length)

    def target(self, s: Scenario) -> list[int]:
        return list(s.answer) + [EOS] * (self.gen_length - len(s.answer))

    def forward(self, input_ids, attention_mask=None, **kw):
        assert input_ids.shape[1] == PROMPT_LENGTH + self.gen_length, "the test decodes without a KV cache"
        probs = torch.full((*input_ids.shape, VOCAB), 1.0 / (VOCAB - 1), dtype=torch.float64)
        probs[..., MASK] = 0.0
        for r, row in enumerate(input_ids.tolist()):
            s = self.scenarios[row[0]]
            gen, target = row[PROMPT_LENGTH:], self.target(s)
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
                        token = 1 + target[i] % 12  # a wrong answer token (never EOS or mask)
                probs[r, PROMPT_LENGTH + i] = _probs(token, p)
        return SimpleNamespace(logits=probs.clamp_min(1e-12).log().float())


def _prompts(n: int) -> torch.Tensor:
    return torch.tensor([[r, 1, 2] for r in range(n)])


def _answer(gen: torch.Tensor):
    """The generated tokens up to the first EOS, as the default extractor reads them."""
    ids = gen.tolist()
    return tuple(ids[: ids.index(EOS)] if EOS in ids else ids)


def _right(oracle: ScheduleOracle, sequences: torch.Tensor) -> list[bool]:
    return [_answer(seq[PROMPT_LENGTH:]) == s.answer for seq, s in zip(sequences, oracle.scenarios)]


def _single(oracle, gen_length, block, sampler="confidence"):
    return dlm.generate(oracle, _prompts(len(oracle.scenarios)), gen_length=gen_length, block_length=block,
                        steps=gen_length // 2, sampler=sampler, kv_cache="none")


ANSWER = (3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8)


def test_full_length_block_collapses_into_eos_and_the_published_ensemble_recovers():
    """gen 64, the published ladder [2, 4, 8, 16, 32] at gen/2 passes each, steps unset."""
    # row 0: padding 8 positions ahead (blocks > 8 collapse); row 1: anchor at 5 (blocks 2 and 4 fail)
    oracle = ScheduleOracle([Scenario(ANSWER, pad_distance=8), Scenario(ANSWER[:10], anchor=5)], gen_length=64)
    for sampler in ("confidence", "margin"):  # the paper's baseline: one full-length block
        full = _single(oracle, 64, 64, sampler)
        gen = full.sequences[0, PROMPT_LENGTH:]
        assert _answer(gen) == ANSWER[:8] and (gen[8:] == EOS).all()  # end-of-text inside the answer
        assert _right(oracle, full.sequences) == [False, True]

    out = hex_generate(oracle, _prompts(2), gen_length=64, kv_cache="none")
    ex = out.experts
    assert ex.block_lengths == [2, 4, 8, 16, 32] and ex.steps == [32] * 5
    right = {b: _right(oracle, ex.sequences[e]) for e, b in enumerate(ex.block_lengths)}
    assert right == {2: [True, False], 4: [True, False], 8: [True, True], 16: [False, True], 32: [False, True]}
    for e, b in enumerate(ex.block_lengths):  # each expert is a plain decoding with the published passes
        assert torch.equal(ex.sequences[e], _single(oracle, 64, b).sequences)
    assert _right(oracle, out.sequences) == [True, True]
    assert ex.winner == [0, 2]  # row 1: the first expert (smallest block) with the majority answer
    assert out.nfe == sum(ex.nfe) and out.tpf == 64 / out.nfe


def test_the_vote_beats_every_expert_when_they_fail_on_different_rows():
    """gen 24, experts [2, 4, 6, 8, 12]: each expert fails on one or two rows, never the same
    majority; the vote is right on all three rows, the best single expert on two."""
    oracle = ScheduleOracle([Scenario(ANSWER[:10], pad_distance=7),  # blocks 8 and 12 collapse
                             Scenario(ANSWER[:10], anchor=7),  # 6 starts a block of 2 and of 6
                             Scenario(ANSWER[:10], anchor=5)],  # 4 starts a block of 2 and of 4
                            gen_length=24)
    config = HexConfig(block_lengths=(2, 4, 6, 8, 12))
    out = hex_generate(oracle, _prompts(3), gen_length=24, config=config, kv_cache="none")
    ex = out.experts
    right = {b: _right(oracle, ex.sequences[e]) for e, b in enumerate(ex.block_lengths)}
    assert right == {2: [True, False, False], 4: [True, True, False], 6: [True, False, True],
                     8: [False, True, True], 12: [False, True, True]}
    assert _right(oracle, out.sequences) == [True, True, True]
    best_expert = max(sum(r) for r in right.values())
    assert best_expert == 2
    # The wrong experts agree with each other (same cut, same wrong token), so this is a real
    # majority, 3 of 5 on every row, not the tie rule.
    for r in range(3):
        assert ex.answers[r].count(ex.votes[r]) == 3
    # Budget: every expert used its published 12 passes (2 tokens each), the total is reported.
    assert ex.steps == [12] * 5 and out.nfe == sum(ex.nfe) <= 60
    assert _right(oracle, _single(oracle, 24, 24).sequences) == [False, True, True]  # the full-length block
