"""compile=True: the same tokens as the eager step (inductor on CPU), and a clear refusal where
torch.compile cannot run. One compilation per graph is slow on CPU (tens of seconds), so each
family is compiled once with a sampler whose step exercises statistics, scoring and selection."""
from __future__ import annotations

import pytest
import torch

import dlm
import dlm.compiled as compiled_mod
from tests.dlm.dgemma_models import generation_config, left_padded_prompts, tiny_diffusion_gemma

pytestmark = pytest.mark.slow


def test_masked_compiled_step_gives_the_eager_tokens():
    model, tok = dlm.load("tiny-dlm")
    ids = torch.tensor([tok.encode_prompt("reverse: ana bo cyd tom"), tok.encode_prompt("sort: tom ana bo fay")])
    kw = dict(gen_length=32, block_length=16, steps=16, sampler="margin", kv_cache="none", eos_early_stop=False)
    eager = dlm.generate(model, ids, **kw)
    calls = []
    real = compiled_mod._compiled.__wrapped__

    def spy(fn, mode):
        calls.append((fn.__qualname__, mode))
        return real(fn, mode)
    compiled_mod._compiled.cache_clear()
    original = compiled_mod._compiled
    compiled_mod._compiled = spy
    try:
        ours = dlm.generate(model, ids, compile=True, **kw)
    finally:
        compiled_mod._compiled = original
    assert calls == [("MarginSampler.step", None)]  # the step really went through torch.compile
    assert torch.equal(eager.sequences, ours.sequences)
    assert eager.nfe == ours.nfe


def test_uniform_compiled_statistics_give_transformers_tokens():
    model = tiny_diffusion_gemma(2, canvas_length=16)
    ids, mask = left_padded_prompts(2, 8, 2)
    gc = generation_config(max_new_tokens=16, max_denoising_steps=6, entropy_bound=1.5, stability_threshold=0,
                           confidence_threshold=3.5)
    torch.manual_seed(2)
    reference = model.generate(ids, generation_config=gc, attention_mask=mask)
    torch.manual_seed(2)
    ours = dlm.generate(model, ids, generation_config=gc, attention_mask=mask, compile=True)
    assert torch.equal(reference.sequences, ours.sequences)


def test_compile_refused_without_a_compiler(monkeypatch):
    monkeypatch.setattr(compiled_mod.shutil, "which", lambda name: None)
    model, tok = dlm.load("tiny-dlm")
    ids = torch.tensor([tok.encode_prompt("copy: bo")])
    with pytest.raises(ValueError, match="compile=True on CPU needs a C\\+\\+ compiler"):
        dlm.generate(model, ids, gen_length=16, steps=4, compile=True)


def test_compile_must_be_a_bool():
    model, tok = dlm.load("tiny-dlm")
    with pytest.raises(ValueError, match="compile must be True or False"):
        dlm.generate(model, torch.tensor([tok.encode_prompt("copy: bo")]), gen_length=16, compile="yes")
