"""D2F-style multi-block window for the masked loop: several blocks decode at once.

Discrete Diffusion Forcing (Wang et al., 2025, "Diffusion LLMs Can Do Faster-Than-AR Inference via
Discrete Diffusion Forcing", arXiv:2508.09192) decodes a pipeline of blocks: a new block is added
(its masks become eligible) once the last block reaches a progress fraction (`block_add_threshold`,
0.1 for math, 0.3 for code in LoPA's scripts), and decoding stops adding blocks once an EOS is
committed. LoPA (arXiv:2512.16229) reports its 10.1 tokens per forward on D2F-Dream with this
window, its branches spanning every open block.

Here, with `window_blocks = W > 1`:
- the *head* is the first block some row has not finished; blocks before it are complete. The
  budget is the loop's: the head gets `ceil(steps_left / blocks_left)` forward passes, and its last
  one offers only the head's masks (filling them), so the budget is never exceeded;
- per row, the block after its last open one opens at the start of a step when that block's
  decoded fraction is >= `open_at`, fewer than W open blocks still hold masks, and (with EOS stop)
  no EOS is committed in its open blocks yet: at most one block per row per step;
- the sampler sees the *span*: from the head to one block past the last open block of any row
  (that block's masks are never candidates). The extra block makes the logits of a lookahead call
  cover any block that opens before the next step, so a sampler's `next_logits` stay usable.

Shapes: B rows of the batch, R rows being decoded, Lb block length, V vocabulary.
"""
from __future__ import annotations

import torch


class BlockWindow:
    """Per-row open blocks of one generation (`opened[b]`: blocks `< opened[b]` are open)."""

    def __init__(self, *, size: int, open_at: float, num_blocks: int, block_length: int, prompt_length: int,
                 batch: int, device, mask_id: int, eos_id: int | None):
        self.size, self.open_at, self.num_blocks = size, open_at, num_blocks
        self.block_length, self.prompt_length = block_length, prompt_length
        self.mask_id, self.eos_id = mask_id, eos_id
        self.opened = torch.ones(batch, dtype=torch.long, device=device)

    def _blocks(self, x_rows: torch.Tensor, head: int) -> torch.Tensor:
        """`[R, num_blocks - head, Lb]`: the blocks from the head on."""
        lo = self.prompt_length + head * self.block_length
        return x_rows[:, lo:].reshape(x_rows.shape[0], self.num_blocks - head, self.block_length)

    def advance(self, x_rows: torch.Tensor, rows: torch.Tensor, head: int) -> None:
        """Open at most one more block per row (the rule in the module docstring); the head is
        always open. `x_rows` `[R, L]`, `rows` `[R]` their batch indices."""
        opened = self.opened[rows].clamp_min(head + 1)
        blocks = self._blocks(x_rows, head)
        masks = (blocks == self.mask_id).sum(dim=2)  # [R, blocks from the head]
        rel = opened - head  # open blocks from the head on, >= 1
        index = torch.arange(masks.shape[1], device=masks.device)
        is_open = index.unsqueeze(0) < rel.unsqueeze(1)
        busy = ((masks > 0) & is_open).sum(dim=1)
        last_masks = masks.gather(1, (rel - 1).unsqueeze(1)).squeeze(1)
        progress = 1 - last_masks.double() / self.block_length
        grow = (opened < self.num_blocks) & (busy < self.size) & (progress >= self.open_at)
        if self.eos_id is not None:  # D2F adds no block once an EOS is committed: what follows it is fill
            has_eos = ((blocks == self.eos_id).any(dim=2) & is_open).any(dim=1)
            grow &= ~has_eos
        self.opened[rows] = opened + grow.long()

    def span_end(self, rows: torch.Tensor, head: int) -> int:
        """Absolute end of the span: one block past the last open block of any row (capped)."""
        last = int(self.opened[rows].max()) if rows.numel() else head + 1
        return self.prompt_length + min(max(last, head + 1) + 1, self.num_blocks) * self.block_length

    def eligible(self, rows: torch.Tensor, head: int, span: int) -> torch.Tensor:
        """`[R, span]` bool: the span's positions inside each row's open blocks."""
        block_of = torch.arange(span, device=self.opened.device) // self.block_length + head
        return block_of.unsqueeze(0) < self.opened[rows].unsqueeze(1)


def fit_logits(logits: torch.Tensor, old_rows: torch.Tensor, old_start: int, rows: torch.Tensor, start: int,
               span: int, mask_id: int) -> torch.Tensor:
    """Reused lookahead logits `[R_old, L_old, V]` (rows `old_rows`, from `old_start`) fitted to the
    current step: rows `rows` (a subset), positions `start .. start+span`. Positions past the old
    span get zero logits; `BlockWindow` guarantees no row has them open (they are never committed)."""
    if old_rows.numel() != rows.numel():
        logits = logits[torch.searchsorted(old_rows, rows)]
    logits = logits[:, start - old_start:]
    missing = span - logits.shape[1]
    if missing > 0:
        pad = logits.new_zeros((logits.shape[0], missing, logits.shape[2]))
        pad[..., mask_id] = float("-inf")
        logits = torch.cat([logits, pad], dim=1)
    return logits[:, :span]
