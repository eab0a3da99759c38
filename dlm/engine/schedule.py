"""Pure schedule functions of the dLLM driver (no model, no state)."""
from __future__ import annotations

import torch

from samplers.contract import tokens_this_step  # noqa: F401  (the quota lives with the step contract)


def validate_lengths(gen_length: int, block_length: int, steps: int) -> int:
    """Check the block/step arithmetic and return the number of blocks."""
    if not isinstance(gen_length, int) or gen_length <= 0:
        raise ValueError(f"gen_length must be a positive integer, got {gen_length!r}")
    if not isinstance(block_length, int) or block_length <= 0:
        raise ValueError(f"block_length must be a positive integer, got {block_length!r}")
    if gen_length % block_length:
        raise ValueError(
            f"gen_length ({gen_length}) must be a multiple of block_length ({block_length}); "
            f"try block_length={_largest_divisor_at_most(gen_length, block_length)}")
    num_blocks = gen_length // block_length
    if not isinstance(steps, int) or steps < num_blocks:
        raise ValueError(
            f"steps ({steps!r}) must be at least the number of blocks ({num_blocks} = "
            f"gen_length {gen_length} / block_length {block_length}): every block needs a forward pass")
    return num_blocks


def _largest_divisor_at_most(n: int, limit: int) -> int:
    return max(d for d in range(1, min(n, limit) + 1) if n % d == 0)


def block_budget(steps_left: int, blocks_left: int) -> int:
    """Forward passes granted to the next block: ceil(steps_left / blocks_left).

    Equal shares when `steps` divides evenly (LLaDA's `steps // num_blocks`); otherwise earlier
    blocks get one more. Steps a block leaves unused (adaptive samplers) roll over to later blocks.
    Never exceeds `steps_left - (blocks_left - 1)`, so every later block keeps at least one step.
    """
    return -(-steps_left // blocks_left)
