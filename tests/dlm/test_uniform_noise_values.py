"""Counts and sub-block budgets of the uniform-noise loop, checked against what the model was given.

`forward_tokens` must equal the positions the model processed: the encoder's (the prompt, then each
finished canvas) plus the decoder's (the live rows' canvases at every denoising step), counted here by
hooks on transformers' own modules. In sampler mode a canvas split into sub-blocks gives each the fair
share of the passes left (`block_budget`). Mutation testing found both unchecked (docs/testing.md).
"""
from __future__ import annotations

import pytest
import torch

import dlm
from tests.dlm.dgemma_models import generation_config, left_padded_prompts, tiny_diffusion_gemma

CANVAS = 16


@pytest.fixture(scope="module")
def model():
    return tiny_diffusion_gemma(0, canvas_length=CANVAS)


def _count_positions(model):
    """Hooks counting encoder positions (its token embedding) and decoder positions (its first layer)."""
    counts = {"encoder": 0, "decoder": 0}

    def decoder_layer(module, args, kwargs):
        hidden = kwargs.get("hidden_states", args[0] if args else None)
        counts["decoder"] += hidden.shape[0] * hidden.shape[1]

    hooks = [model.get_input_embeddings().register_forward_hook(
                 lambda m, args, out: counts.__setitem__("encoder", counts["encoder"] + args[0].numel())),
             model.model.decoder.layers[0].register_forward_pre_hook(decoder_layer, with_kwargs=True)]
    return counts, hooks


@pytest.mark.parametrize("mode", ["transformers", "confidence", "threshold"])
def test_forward_tokens_count_every_position_the_model_processes(model, mode):
    ids, mask = left_padded_prompts(2, 9, 0)
    counts, hooks = _count_positions(model)
    try:
        torch.manual_seed(0)
        if mode == "transformers":
            out = dlm.generate(model, ids, attention_mask=mask, generation_config=generation_config(max_new_tokens=32))
        else:
            out = dlm.generate(model, ids, attention_mask=mask, sampler=mode, steps=16, gen_length=32, block_length=8,
                               generator=torch.Generator().manual_seed(0))
    finally:
        for hook in hooks:
            hook.remove()
    assert out.forward_tokens == counts["encoder"] + counts["decoder"]


def test_sub_blocks_share_the_canvas_budget_fairly(model):
    # 16 positions in 4 sub-blocks of 4 with 8 passes: each sub-block gets 2 passes and, with one-at-a-time
    # confidence commits, accepts 2 positions per pass.
    ids, _ = left_padded_prompts(1, 9, 1)
    out = dlm.generate(model, ids, sampler="confidence", steps=8, gen_length=16, block_length=4, return_trace=True,
                       generator=torch.Generator().manual_seed(0))
    assert out.nfe == 8
    assert [int(t.committed.sum()) for t in out.trace] == [2] * 8



@pytest.mark.parametrize("sampler", ["confidence", "lopa"])
def test_nfe_counts_every_decoder_call_lookahead_branches_included(model, sampler):
    """`nfe` is the number of (batched) decoder forwards: a hook on the decoder's first layer counts them,
    LoPA's batched branch calls included (one call for all k branches of all rows)."""
    calls = [0]
    hook = model.model.decoder.layers[0].register_forward_pre_hook(lambda m, a: calls.__setitem__(0, calls[0] + 1))
    try:
        ids, mask = left_padded_prompts(2, 9, 0)
        out = dlm.generate(model, ids, attention_mask=mask, sampler=sampler, steps=8, gen_length=32, block_length=8,
                           generator=torch.Generator().manual_seed(0))
    finally:
        hook.remove()
    assert out.nfe == calls[0] and out.nfe > 0


class _Signature:
    """A model stub with just what DiffusionGemmaCanvasModel reads at construction."""

    def __init__(self, prepare):
        from types import SimpleNamespace
        self.config = SimpleNamespace(canvas_length=4, text_config=SimpleNamespace(vocab_size=10))
        decoder = SimpleNamespace(embed_tokens=torch.nn.Embedding(10, 2), self_conditioning=torch.nn.Identity())
        self.model = SimpleNamespace(decoder=decoder)
        self._prepare_encoder_inputs = prepare


def test_cache_keyword_follows_the_installed_transformers(model):
    """transformers 5.24 renamed `past_key_values` to `cache`: the engine passes whichever name the installed
    release's `_prepare_encoder_inputs` takes."""
    import inspect

    from dlm.engine.uniform.canvas_model import DiffusionGemmaCanvasModel

    installed = DiffusionGemmaCanvasModel(model).cache_kw
    assert installed in inspect.signature(model._prepare_encoder_inputs).parameters

    def before_5_24(input_ids, attention_mask, encoder_position_ids, past_key_values, is_prefill, canvas_length,
                    batch_size):
        pass

    def since_5_24(input_ids, attention_mask, encoder_position_ids, cache, is_prefill, canvas_length, batch_size):
        pass

    assert DiffusionGemmaCanvasModel(_Signature(before_5_24)).cache_kw == "past_key_values"
    assert DiffusionGemmaCanvasModel(_Signature(since_5_24)).cache_kw == "cache"


def test_the_default_budget_in_sampler_mode_is_one_pass_per_position(model):
    """Without steps, a canvas gets one pass per position (C), so one-at-a-time confidence commits fill
    each of the two canvases in exactly C passes."""
    ids, _ = left_padded_prompts(1, 9, 1)
    out = dlm.generate(model, ids, sampler="confidence", gen_length=2 * CANVAS, generator=torch.Generator().manual_seed(0))
    assert out.nfe == 2 * CANVAS
