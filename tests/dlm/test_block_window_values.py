"""`dlm.engine.masked.window` value for value against a plain-Python reference of its rules (module docstring):
random windows, progress, EOS and heads, every row and block checked, and `fit_logits` position by
position. test_block_window.py checks the window through generations and on two hand-made cases."""
from __future__ import annotations

import random

import pytest
import torch

from dlm.engine.masked.window import BlockWindow, fit_logits

MASK, EOS = 9, 8


def _advance_reference(opened, x, *, size, open_at, num_blocks, block_length, prompt_length, head, eos_id):
    """The opened count of one row after `advance` (plain Python on a list of tokens)."""
    opened = max(opened, head + 1)
    blocks = [x[prompt_length + b * block_length: prompt_length + (b + 1) * block_length] for b in range(num_blocks)]
    open_blocks = range(head, opened)
    busy = sum(1 for b in open_blocks if MASK in blocks[b])
    progress = 1 - blocks[opened - 1].count(MASK) / block_length
    grow = opened < num_blocks and busy < size and progress >= open_at
    if eos_id is not None and any(eos_id in blocks[b] for b in open_blocks):
        grow = False
    return opened + int(grow)


@pytest.mark.parametrize("eos", [None, EOS])
def test_advance_span_and_eligible_equal_the_reference(eos):
    rng = random.Random(str(eos))
    for _ in range(300):
        num_blocks, block_length = rng.randrange(1, 5), rng.randrange(1, 4)
        prompt_length, batch = rng.randrange(0, 3), rng.randrange(1, 4)
        size, open_at = rng.randrange(1, 4), rng.choice([0.0, 0.25, 0.5, 1.0])
        head = rng.randrange(0, num_blocks)
        w = BlockWindow(size=size, open_at=open_at, num_blocks=num_blocks, block_length=block_length,
                        prompt_length=prompt_length, batch=batch, device="cpu", mask_id=MASK, eos_id=eos)
        w.opened = torch.tensor([rng.randrange(1, num_blocks + 1) for _ in range(batch)])
        before = w.opened.tolist()
        length = prompt_length + num_blocks * block_length
        x = torch.tensor([[rng.choice([MASK, MASK, 3, 4, EOS]) for _ in range(length)] for _ in range(batch)])
        rows = torch.tensor(sorted(rng.sample(range(batch), rng.randrange(1, batch + 1))))
        w.advance(x[rows], rows, head)
        want = list(before)
        for r in rows.tolist():
            want[r] = _advance_reference(before[r], x[r].tolist(), size=size, open_at=open_at, num_blocks=num_blocks,
                                         block_length=block_length, prompt_length=prompt_length, head=head,
                                         eos_id=eos)
        assert w.opened.tolist() == want, (before, x.tolist(), rows.tolist(), head)

        last = max(want[r] for r in rows.tolist())
        span_blocks = min(max(last, head + 1) + 1, num_blocks)
        assert w.span_end(rows, head) == prompt_length + span_blocks * block_length
        span = (span_blocks - head) * block_length
        eligible = [[p // block_length + head < want[r] for p in range(span)] for r in rows.tolist()]
        assert w.eligible(rows, head, span).tolist() == eligible


def test_span_of_no_rows_is_one_block_past_the_head():
    w = BlockWindow(size=2, open_at=0.5, num_blocks=5, block_length=3, prompt_length=2, batch=2, device="cpu",
                    mask_id=MASK, eos_id=None)
    assert w.span_end(torch.tensor([], dtype=torch.long), 1) == 2 + 3 * 3


def test_progress_threshold_is_inclusive():
    # 2 of 4 positions decoded is exactly open_at = 0.5: the next block opens (>=, not >).
    w = BlockWindow(size=2, open_at=0.5, num_blocks=2, block_length=4, prompt_length=0, batch=1, device="cpu",
                    mask_id=MASK, eos_id=None)
    x = torch.tensor([[1, 1, MASK, MASK, MASK, MASK, MASK, MASK]])
    w.advance(x, torch.tensor([0]), 0)
    assert w.opened.tolist() == [2]


def test_fit_logits_equals_the_reference():
    rng = random.Random(0)
    vocab = 5
    for _ in range(100):
        old_rows = sorted(rng.sample(range(6), rng.randrange(1, 5)))
        rows = sorted(rng.sample(old_rows, rng.randrange(1, len(old_rows) + 1)))
        old_start, old_len = rng.randrange(0, 5), rng.randrange(2, 8)
        start = old_start + rng.randrange(0, old_len)
        span = rng.randrange(1, 8)
        logits = torch.randn(len(old_rows), old_len, vocab, generator=torch.Generator().manual_seed(rng.randrange(99)))
        got = fit_logits(logits, torch.tensor(old_rows), old_start, torch.tensor(rows), start, span, mask_id=2)
        assert got.shape == (len(rows), span, vocab)
        for i, r in enumerate(rows):
            for p in range(span):
                old_p = start - old_start + p
                if old_p < old_len:
                    assert torch.equal(got[i, p], logits[old_rows.index(r), old_p])
                else:  # past the old span: zero logits, the mask id impossible
                    want = torch.zeros(vocab)
                    want[2] = float("-inf")
                    assert torch.equal(got[i, p], want)


def test_the_head_counts_as_open_before_any_advance():
    # A fresh window (every row has only block 0 open) asked about head 2: the head is open, so the span
    # ends one block past it.
    w = BlockWindow(size=2, open_at=0.5, num_blocks=6, block_length=3, prompt_length=1, batch=2, device="cpu",
                    mask_id=MASK, eos_id=None)
    assert w.span_end(torch.tensor([0, 1]), 2) == 1 + 4 * 3


def test_every_tensor_stays_on_the_callers_device():
    # The meta device has no data but checks placement: a tensor made on the default device (CPU) instead
    # of the window's device would meet a meta tensor and raise, as it would on a GPU.
    w = BlockWindow(size=2, open_at=0.5, num_blocks=3, block_length=2, prompt_length=1, batch=2, device="meta",
                    mask_id=MASK, eos_id=EOS)
    assert w.opened.device.type == "meta"
    rows = torch.arange(2, device="meta")
    w.advance(torch.empty(2, 7, dtype=torch.long, device="meta"), rows, 0)
    assert w.opened.device.type == "meta"
    assert w.eligible(rows, 0, 4).device.type == "meta"
