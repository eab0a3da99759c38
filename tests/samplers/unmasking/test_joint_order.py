"""The joint sampler's commit order: `order="random"` draws the positions uniformly at random (the order
under which one-token-per-step sampling is exact), `order="confidence"` takes the most probable one.
Mutation testing found the random order unchecked: with it replaced by the confidence order every test
passed (docs/testing.md)."""
from __future__ import annotations

import pytest
import torch

import dlm
from joint_toy import toy_joint_sampler
from toy_models import ToyDLM


def _first_committed(order, seed):
    model = ToyDLM()
    out = dlm.generate(model, torch.tensor([[1, 2, 3, 4, 5]]), gen_length=8, block_length=8, steps=8,
                       sampler=toy_joint_sampler(model, order=order), temperature=0.0,
                       generator=torch.Generator().manual_seed(seed), return_trace=True)
    first = out.trace[0].tokens[0] != model.config.mask_token_id
    return int(first.nonzero().squeeze())


@pytest.mark.filterwarnings("ignore:.*trained for order")  # the toy layer's order is beside the point
def test_random_order_spreads_the_first_commit_and_confidence_order_does_not():
    random_first = [_first_committed("random", seed) for seed in range(40)]
    confident_first = {_first_committed("confidence", seed) for seed in range(5)}
    assert len(confident_first) == 1  # greedy and confidence-ordered: the same position every time
    counts = torch.bincount(torch.tensor(random_first), minlength=8)
    assert (counts > 0).sum() >= 6, counts  # 40 uniform draws over 8 positions leave at most 2 unseen (p > 0.99)
