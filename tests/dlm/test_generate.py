"""The decoding loop: budget arithmetic, validation, shifted logits, EOS handling."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import dlm
from dlm.engine.schedule import block_budget, tokens_this_step
from toy_models import ShiftedToy, ToyDLM

PROMPT = torch.tensor([[1, 2, 3, 4]])


def test_block_budgets_spread_the_remainder_first():
    steps_left, shares = 10, []
    for blocks_left in range(4, 0, -1):
        shares.append(block_budget(steps_left, blocks_left))
        steps_left -= shares[-1]
    assert shares == [3, 3, 2, 2]


def test_tokens_per_step_matches_llada_split():
    masks, got = torch.tensor([32]), []
    for s in range(10):
        k = tokens_this_step(masks, 10 - s)
        got.append(int(k))
        masks = masks - k
    assert got == [4, 4] + [3] * 8 and sum(got) == 32


def test_uneven_budget_is_used_exactly():
    out = dlm.generate(ToyDLM(), PROMPT, gen_length=32, block_length=8, steps=10, eos_early_stop=False)
    assert out.steps_per_block == [3, 3, 2, 2] and out.nfe == 10


def test_adaptive_sampler_rolls_unused_steps_over():
    out = dlm.generate(ToyDLM(), PROMPT, gen_length=16, block_length=8, steps=16, sampler="threshold",
                       sampler_config={"tau": 0.05})
    assert out.nfe < 16 and out.tpf > 1
    assert sum(out.steps_per_block) == out.nfe


@pytest.mark.parametrize("kwargs,match", [
    ({"gen_length": 30, "block_length": 8}, "multiple of block_length"),
    ({"gen_length": 32, "block_length": 8, "steps": 3}, "at least the number of blocks"),
    ({"temperature": -1.0}, "temperature"),
    ({"kv_cache": "full"}, "kv_cache"),
    ({"kv_cache": "prefix"}, "KV-cache support"),
    ({"gen_length": 200}, "exceeds the model's context"),
    ({"sampler": "fastest"}, "valid samplers"),
])
def test_bad_arguments_are_refused_with_the_fix(kwargs, match):
    with pytest.raises(ValueError, match=match):
        dlm.generate(ToyDLM(), PROMPT, **kwargs)


@pytest.mark.parametrize("gen_length, block_length, fix", [(30, 8, 6), (7, 4, 1), (12, 5, 4), (30, 29, 15), (9, 10, 9)])
def test_a_block_length_that_does_not_divide_is_refused_with_the_largest_that_does(gen_length, block_length, fix):
    """The fix the message offers is the largest divisor of gen_length up to block_length (worked by hand
    here: 1 for a prime gen_length, gen_length itself when block_length exceeds it)."""
    with pytest.raises(ValueError, match=rf"multiple of block_length \({block_length}\); try block_length={fix}$"):
        dlm.generate(ToyDLM(), PROMPT, gen_length=gen_length, block_length=block_length, steps=gen_length)


def test_empty_prompt_and_missing_mask_id_are_refused():
    with pytest.raises(ValueError, match="empty"):
        dlm.generate(ToyDLM(), torch.zeros(1, 0, dtype=torch.long))
    bare = lambda ids, attention_mask=None: torch.zeros(*ids.shape, 5)  # noqa: E731
    with pytest.raises(ValueError, match="mask_token_id"):
        dlm.generate(bare, PROMPT, gen_length=4)


def test_shifted_logits_give_the_same_generation():
    """A Dream-style model (logits shifted by one) decodes exactly like its aligned twin."""
    inner = ToyDLM(seed=1)
    aligned = dlm.generate(inner, PROMPT, gen_length=16, block_length=8, steps=8)
    shifted = dlm.generate(ShiftedToy(inner), PROMPT, gen_length=16, block_length=8, steps=8, shift_logits=True)
    assert torch.equal(aligned.sequences, shifted.sequences)


def test_shift_is_inferred_from_a_dream_config():
    model = ShiftedToy(ToyDLM())
    model.config = SimpleNamespace(**vars(model.config), model_type="Dream")
    assert dlm.DLMAdapter.wrap(model).shift_logits


class EosAfter(torch.nn.Module):
    """Predicts token 5 at generation position < n and EOS afterwards, confidently."""

    def __init__(self, prompt_length, n):
        super().__init__()
        self.config = SimpleNamespace(mask_token_id=9, eos_token_id=8, vocab_size=10)
        self.prompt_length, self.n = prompt_length, n
        self.rows_seen = []

    def forward(self, ids, attention_mask=None, **kw):
        self.rows_seen.append(ids.shape[0])
        logits = torch.full((*ids.shape, 10), -10.0)
        pos = torch.arange(ids.shape[1]) - self.prompt_length
        logits[:, pos < self.n, 5] = 10.0
        logits[:, pos >= self.n, 8] = 10.0
        return logits


def test_eos_early_stop_skips_the_remaining_blocks():
    model = EosAfter(prompt_length=4, n=3)
    out = dlm.generate(model, PROMPT, gen_length=32, block_length=8, steps=32, eos_early_stop=True, sampler="confidence")
    assert out.sequences[0, 4:7].tolist() == [5, 5, 5]
    assert (out.sequences[0, 7:] == 8).all()
    # Only the first block is decoded, and only until its answer is fixed: ties commit left to right,
    # so after 4 steps the block reads 5 5 5 EOS with nothing masked before the EOS.
    assert out.nfe == 4
    plain = dlm.generate(EosAfter(4, 3), PROMPT, gen_length=32, block_length=8, steps=32, eos_early_stop=False, sampler="confidence")
    assert plain.nfe == 32 and torch.equal(plain.sequences, out.sequences)
    default = dlm.generate(EosAfter(4, 3), PROMPT, gen_length=32, block_length=8, steps=32, sampler="confidence")
    assert default.nfe == 4  # on by default when the EOS id is known


def test_finished_rows_leave_the_batch():
    model = EosAfter(prompt_length=4, n=3)
    prompts = PROMPT.repeat(2, 1)
    dlm.generate(model, prompts, gen_length=16, block_length=8, steps=16, eos_early_stop=True, sampler="confidence")
    # Both rows are fixed after 4 steps of block 0 (5 5 5 EOS); no call for the rest or block 1.
    assert model.rows_seen == [2] * 4


def test_classifier_free_guidance_runs_one_batched_call():
    model = ToyDLM()
    # eos_early_stop=False: this toy emits EOS early, and the per-step EOS stop would end the block.
    out = dlm.generate(model, PROMPT, gen_length=8, steps=8, cfg_scale=1.5, eos_early_stop=False)
    assert out.nfe == 8 and len(model.calls) == 8 and model.calls[0].shape[0] == 2
    unguided = dlm.generate(ToyDLM(), PROMPT, gen_length=8, steps=8)
    assert out.sequences.shape == unguided.sequences.shape


class RecordingConfidence(__import__("samplers").unmasking.confidence.ConfidenceSampler):
    """The confidence sampler, keeping the logits and block tokens it is given at every step."""

    name = "recording-confidence-test"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seen = []

    def step(self, logits, ctx):
        self.seen.append((logits.clone(), ctx.x.clone(), ctx.rows.clone()))
        return super().step(logits, ctx)


@pytest.mark.parametrize("scale", [0.5, 1.5, 3.0])
def test_classifier_free_guidance_values_are_llada_guidance(scale):
    """LLaDA's guidance (Nie et al. 2025, generate.py): the unconditional pass sees the prompt masked, and
    the sampler gets ``un + (w + 1) (cond - un)``. Checked at every step against the two passes run here
    on the model directly, with the step's full sequence rebuilt from the block the sampler saw. On this
    toy (attention over all positions) masking the prompt changes the logits, so ``cond + w (un - cond)``
    or an unmasked unconditional pass (un = cond) would differ."""
    model = ToyDLM(seed=3)
    mask_id = model.config.mask_token_id
    prompts = torch.tensor([[1, 2, 3, 4], [5, 6, 2, 7]])
    P = prompts.shape[1]
    sampler = RecordingConfidence()
    dlm.generate(model, prompts, gen_length=8, block_length=8, steps=8, cfg_scale=scale, sampler=sampler,
                 eos_early_stop=False)
    assert len(sampler.seen) == 8
    differ = 0.0
    with torch.no_grad():
        for logits, block, rows in sampler.seen:
            x = torch.cat([prompts[rows], block], dim=1)  # one block: the whole sequence at that step
            unconditional = x.clone()
            unconditional[:, :P] = mask_id
            cond = model(x).logits[:, P:].double()
            un = model(unconditional).logits[:, P:].double()
            expected = un + (scale + 1) * (cond - un)
            finite = torch.isfinite(expected)
            assert finite[..., :mask_id].all() and not finite[..., mask_id].any()  # only the mask token is -inf
            assert torch.isneginf(logits[..., mask_id]).all()
            torch.testing.assert_close(logits.double()[finite], expected[finite], atol=1e-5, rtol=1e-5)
            differ = max(differ, (cond - un)[finite].abs().max().item())
    assert differ > 0.1  # the prompt matters to this model: the check above can tell the variants apart


def test_trace_and_callback_see_every_step():
    seen = []
    out = dlm.generate(ToyDLM(), PROMPT, gen_length=16, block_length=8, steps=8, callback=seen.append, return_trace=True)
    assert len(seen) == len(out.trace) == out.nfe
    assert sum(int(r.committed.sum()) for r in seen) == 16


class LazySampler(__import__("samplers").Sampler):
    """Commits nothing and remasks everything: the driver must still honour its guarantees."""

    name = "lazy-test"
    remasks = True

    def step(self, logits, ctx):
        from samplers.unmasking._common import propose
        proposal, confidence, _ = propose(logits, ctx)
        return __import__("samplers").StepResult(torch.full_like(ctx.x, ctx.mask_token_id), proposal, confidence)


def test_driver_forces_progress_and_fills_on_the_last_step():
    out = dlm.generate(ToyDLM(), PROMPT, gen_length=16, block_length=8, steps=4, sampler=LazySampler(), return_trace=True)
    assert out.nfe == 4 and not (out.sequences == ToyDLM().config.mask_token_id).any()
    assert [int(r.committed) for r in out.trace] == [1, 7, 1, 7]  # one forced commit, then the last-step fill
