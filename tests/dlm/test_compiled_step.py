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


def test_one_compiled_graph_per_call_at_256_tokens_in_blocks_of_32(monkeypatch):
    """The prefix cache hands the step each block's logits as a slice of a forward whose length grows block
    by block; with `dynamic=False` the compiled step guarded on that slice's strides, compiled one graph per
    block and, at the ninth, hit torch's limit of 8 and ran eager. Counted with dynamo's counting backend
    (the same guards as inductor's, without its compile time): one graph for the whole call, none for a
    second call with another prompt length, and the eager tokens."""
    from torch._dynamo.testing import CompileCounter

    from dlm.replicas import TINY_OVERRIDES, replica

    counter = CompileCounter()
    real_compile = torch.compile

    def counting(fn, *, dynamic, mode):
        assert dynamic is False and mode is None  # what dlm.compiled asks for on CPU
        return real_compile(fn, dynamic=dynamic, backend=counter)
    monkeypatch.setattr(torch, "compile", counting)
    compiled_mod._compiled.cache_clear()
    torch._dynamo.reset()
    model = replica("llada-8b", layers=1, overrides=TINY_OVERRIDES["llada-8b"], device="cpu", dtype=torch.float32)
    gen = torch.Generator().manual_seed(0)
    kw = dict(gen_length=256, block_length=32, steps=64, sampler="confidence", kv_cache="prefix",
              eos_early_stop=False)
    try:
        for batch, prompt, graphs in ((1, 12, 1), (1, 20, 1), (3, 12, 2)):
            ids = torch.randint(0, 500, (batch, prompt), generator=gen)
            ours = dlm.generate(model, ids, compile=True, **kw)
            assert counter.frame_count == graphs, (batch, prompt, counter.frame_count)
            assert torch.equal(ours.sequences, dlm.generate(model, ids, **kw).sequences)
    finally:
        compiled_mod._compiled.cache_clear()  # no counting-backend step leaks into later tests
        torch._dynamo.reset()
