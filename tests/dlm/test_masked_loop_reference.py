"""The masked-diffusion loop against the published decoding loops, written again here in plain torch.

- LLaDA (Nie et al., 2025, "Large Language Diffusion Models", the `generate` of its repository):
  blocks decoded left to right, each with `steps / num_blocks` forward passes over the whole sequence;
  block b's n masks are spread as n // S per step with the first n % S steps one larger; each step
  commits the quota's most probable greedy tokens among the block's masks (low-confidence remasking).
- Fast-dLLM (Wu et al., 2025, threshold decoding without cache): each forward commits every mask of the
  block whose probability is at least the threshold, and at least the most probable one; a block ends
  when it has no mask left.

`dlm.generate` must give the same tokens and the same number of forward passes, row for row, on a
seeded random model (ToyDLM) over block and step layouts (uneven budgets included). Both references
are greedy (temperature 0): the field's samplers draw noise in another order than ours.
"""
from __future__ import annotations

import pytest
import torch

import dlm
from toy_models import ToyDLM


@torch.no_grad()
def llada_generate(model, prompt, *, gen_length, block_length, steps, mask_id):
    """LLaDA's loop: `[B, P]` prompt -> `[B, P + gen_length]`, and the number of forward passes."""
    batch, plen = prompt.shape
    x = torch.cat([prompt, torch.full((batch, gen_length), mask_id)], dim=1)
    blocks = gen_length // block_length
    per_block = steps // blocks
    calls = 0
    for b in range(blocks):
        lo, hi = plen + b * block_length, plen + (b + 1) * block_length
        masks = (x[:, lo:hi] == mask_id).sum(dim=1)
        quota = [[int(n) // per_block + (1 if s < int(n) % per_block else 0) for s in range(per_block)] for n in masks]
        for s in range(per_block):
            logits = model(x).logits
            calls += 1
            probs = torch.softmax(logits.double(), dim=-1)
            x0 = logits.argmax(dim=-1)
            p0 = probs.gather(-1, x0.unsqueeze(-1)).squeeze(-1)
            for r in range(batch):
                open_ = [j for j in range(lo, hi) if x[r, j] == mask_id]
                best = sorted(open_, key=lambda j: (-float(p0[r, j]), j))[:quota[r][s]]
                for j in best:
                    x[r, j] = x0[r, j]
    return x, calls


@torch.no_grad()
def fast_dllm_generate(model, prompt, *, gen_length, block_length, threshold, mask_id):
    """Fast-dLLM's threshold loop (no cache): returns the tokens and the number of forward passes."""
    batch, plen = prompt.shape
    x = torch.cat([prompt, torch.full((batch, gen_length), mask_id)], dim=1)
    calls = 0
    for b in range(gen_length // block_length):
        lo, hi = plen + b * block_length, plen + (b + 1) * block_length
        while bool((x[:, lo:hi] == mask_id).any()):
            logits = model(x).logits
            calls += 1
            probs = torch.softmax(logits.double(), dim=-1)
            x0 = logits.argmax(dim=-1)
            p0 = probs.gather(-1, x0.unsqueeze(-1)).squeeze(-1)
            for r in range(batch):
                open_ = sorted((j for j in range(lo, hi) if x[r, j] == mask_id), key=lambda j: (-float(p0[r, j]), j))
                chosen = open_[:1] + [j for j in open_[1:] if float(p0[r, j]) >= threshold]
                for j in chosen:
                    x[r, j] = x0[r, j]
    return x, calls


PROMPTS = torch.tensor([[1, 2, 3, 4, 5], [6, 7, 8, 9, 10]])


@pytest.mark.parametrize("gen_length,block_length,steps", [(8, 8, 8), (8, 8, 3), (12, 4, 6), (12, 4, 9), (16, 8, 4)])
def test_confidence_sampler_equals_llada_generate(gen_length, block_length, steps):
    model = ToyDLM(seed=0)
    mask = model.config.mask_token_id
    want, calls = llada_generate(model, PROMPTS, gen_length=gen_length, block_length=block_length, steps=steps,
                                 mask_id=mask)
    out = dlm.generate(model, PROMPTS, gen_length=gen_length, block_length=block_length, steps=steps,
                       sampler="confidence", kv_cache="none", eos_early_stop=False)
    assert torch.equal(out.sequences, want)
    assert out.nfe == calls


@pytest.mark.parametrize("threshold", [0.3, 0.6, 0.95])
@pytest.mark.parametrize("gen_length,block_length", [(8, 8), (12, 4)])
def test_threshold_sampler_equals_fast_dllm(threshold, gen_length, block_length):
    model = ToyDLM(seed=3)
    mask = model.config.mask_token_id
    want, calls = fast_dllm_generate(model, PROMPTS, gen_length=gen_length, block_length=block_length,
                                     threshold=threshold, mask_id=mask)
    # One forward pass per token as the budget: the quota floor is 1, Fast-dLLM's "at least one".
    out = dlm.generate(model, PROMPTS, gen_length=gen_length, block_length=block_length, steps=gen_length,
                       sampler="threshold", sampler_config={"tau": threshold}, kv_cache="none", eos_early_stop=False)
    assert torch.equal(out.sequences, want)
    assert out.nfe == calls
