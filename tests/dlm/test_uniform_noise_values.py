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


@pytest.mark.parametrize("mode", ["transformers", "confidence", "threshold", "lopa"])
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


@pytest.mark.parametrize("gen_length", [16, 48])
def test_forward_tokens_of_one_and_of_three_canvases(model, gen_length):
    """The prompt is encoded once and each finished canvas after it, counted exactly. A count that gave
    the first canvas a canvas's length and the second the prompt's adds up to the same total whenever
    there are two canvases or more: only the one-canvas call tells it apart."""
    ids, mask = left_padded_prompts(2, 9, 0)
    counts, hooks = _count_positions(model)
    try:
        out = dlm.generate(model, ids, attention_mask=mask, sampler="confidence", steps=gen_length // 2,
                           gen_length=gen_length, block_length=8,
                           generator=torch.Generator().manual_seed(0))
    finally:
        for hook in hooks:
            hook.remove()
    assert counts["encoder"] == 2 * 9 + 2 * CANVAS * (gen_length // CANVAS - 1)
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


def test_a_row_that_ended_is_not_decoded_in_later_canvases():
    """The entropy-bound rule in sampler mode (our generator): a row whose sequence ended (an EOS) leaves
    the decoder batch for every later canvas. Counted from the output alone: a row is live in canvas c
    exactly when no EOS stands in its tokens before that canvas, so each decoder call of canvas c gets
    that many rows, and each row's forward count is the passes of the canvases it was live in.
    The case (seed 2, canvases of 8, EOS any of ids 1-24) ends row 0 in canvas 0 and row 2 in canvas 1."""
    C, eos = 8, list(range(1, 25))
    model = tiny_diffusion_gemma(0, canvas_length=C, eos_token_id=eos)
    ids, mask = left_padded_prompts(3, 9, 2)
    rows_seen = []
    hook = model.model.decoder.register_forward_hook(
        lambda m, args, kwargs, out: rows_seen.append(out.last_hidden_state.shape[0]), with_kwargs=True)
    try:
        out = dlm.generate(model, ids, attention_mask=mask, sampler="entropy_bound", steps=24, gen_length=24,
                           generator=torch.Generator().manual_seed(2))
    finally:
        hook.remove()
    generated = out.sequences[:, ids.shape[1]:].tolist()
    first_eos = [next((i for i, t in enumerate(row) if t in eos), len(row)) for row in generated]
    live = [[first_eos[r] >= c * C for r in range(3)] for c in range(len(out.steps_per_block))]
    assert [sum(canvas) for canvas in live] == [3, 2, 1]  # the case really ends rows between canvases
    expected_rows = [sum(canvas) for canvas, passes in zip(live, out.steps_per_block) for _ in range(passes)]
    assert rows_seen == expected_rows
    assert out.nfe_per_sequence.tolist() == [sum(p for canvas, p in zip(live, out.steps_per_block) if canvas[r])
                                             for r in range(3)]


@pytest.mark.parametrize("full_stream", [True, False])
def test_a_new_canvas_starts_on_the_device_and_with_the_rows_still_running(full_stream):
    """`EntropyBoundRule.start` on the meta device (shapes, no data: a tensor made on the CPU instead
    raises on use): its state is on the device; in sampler mode (`full_stream=False`) the rows whose
    sequence ended are skipped and the first step decodes the others; in transformers' mode (the full
    random stream) every row keeps running, as transformers does."""
    from dlm.engine.uniform.rules import EntropyBoundRule
    from samplers.unmasking.entropy_bound import EntropyBoundConfig

    meta = torch.device("meta")
    rule = EntropyBoundRule(EntropyBoundConfig(stability_threshold=2), max_steps=4, vocab_size=11, canvas_length=5,
                            embed_dtype=torch.float32, full_stream=full_stream)
    ended = [False, True, False, True]
    first = rule.start(4, meta, torch.tensor(ended).to(meta), ended)
    assert first == (None if full_stream else [0, 2])
    assert rule.canvas.shape == rule.argmax.shape == (4, 5) and rule.canvas.dtype == torch.long
    assert rule.done.shape == rule.skip.shape == (4,) and rule.done.dtype == rule.skip.dtype == torch.bool
    assert rule.stop.history.shape == (2, 4, 5) and rule.stop.history.device == meta
    live = rule.live_mask()  # ~(done | skip): meets every state tensor on the device
    assert live.device == meta and all(t.device == meta for t in (rule.canvas, rule.argmax, rule.done, rule.skip))
    assert rule.soft is None and rule.batch == 4
    # the same on the CPU, where the values can be read: no row done, the ended rows skipped in sampler mode
    first = rule.start(4, torch.device("cpu"), torch.tensor(ended), ended)
    assert rule.live_mask().tolist() == ([True] * 4 if full_stream else [not e for e in ended])
    assert not rule.done.any() and first == (None if full_stream else [0, 2])
    assert rule.start(4, torch.device("cpu"), torch.zeros(4, dtype=torch.bool), [False] * 4) is None


def test_lookahead_branches_are_decoded_as_their_rows_alone(model):
    """`RowSubsetDecoder.branches` (a look-ahead sampler's k candidate canvases per row, one batched call)
    against the loop's own decoder call on each candidate alone, with that row's cache, padding mask and
    self-conditioning: rows 1 and 2 of a left-padded batch (2 and 3 pad tokens), k = 2, the same logits."""
    from transformers import DynamicCache

    from dlm.engine.uniform.canvas_model import DiffusionGemmaCanvasModel, RowSubsetDecoder

    cm = DiffusionGemmaCanvasModel(model)
    ids, mask = left_padded_prompts(3, 9, 0)
    mask2d = mask.bool()
    P, C, V = ids.shape[1], CANVAS, cm.vocab_size
    cache = DynamicCache(config=model.config.get_text_config(decoder=True))
    enc_positions = torch.arange(P, dtype=torch.int32).unsqueeze(0)
    with torch.no_grad():
        cache = cm.encode(ids, mask2d, cache, enc_positions, is_prefill=True)
        decoder = RowSubsetDecoder(cm, cache, torch.nn.functional.pad(mask2d, (0, C), value=True),
                                   torch.arange(P, P + C, dtype=torch.int32).unsqueeze(0), batch=3)
        g = torch.Generator().manual_seed(3)
        rows, k = torch.tensor([1, 2]), 2
        canvases = torch.randint(0, V, (len(rows) * k, C), generator=g)
        hidden = model.model.decoder.embed_tokens.weight.shape[1]
        soft = torch.randn(len(rows), C, hidden, generator=g)
        together = decoder.branches(canvases, soft, rows, k)
        for i in range(len(rows) * k):
            row = int(rows[i // k])
            alone = decoder(canvases[i:i + 1], soft[i // k: i // k + 1], torch.tensor([row]), [row])
            assert torch.allclose(together[i], alone[0], atol=1e-4, rtol=1e-4), (row, i % k)
        # the padding matters here: row 2 decoded without its mask is another result
        unpadded = RowSubsetDecoder(cm, cache, torch.ones(3, P + C, dtype=torch.bool), decoder.positions, batch=3)
        assert not torch.allclose(unpadded(canvases[2:3], soft[1:2], torch.tensor([2]), [2])[0], together[2], atol=1e-3)


def test_a_new_canvas_of_a_masked_sampler_starts_on_the_device_and_with_the_rows_still_running():
    """`AcceptRule.start` (any masked sampler of ours on a canvas) on the meta device, as above: the
    canvas, the accepted flags and the skipped rows on the device; the first step decodes the rows
    whose sequence has not ended, and none is accepted yet."""
    from dlm.engine.uniform.rules import AcceptRule, AcceptSettings
    from samplers import get_sampler

    meta = torch.device("meta")
    policy = get_sampler("confidence")
    settings = AcceptSettings(canvas_length=8, block_length=4, vocab_size=11, embed_dtype=torch.float32,
                              temperature=0.0, generator=None, t_min=0.4, t_max=0.8, sampler_step=policy.step)
    rule = AcceptRule(policy, 6, settings, state={})
    ended = [True, False, False]
    assert rule.start(3, meta, torch.tensor(ended).to(meta), ended) == [1, 2]
    assert rule.canvas.shape == (3, 8) and rule.accepted.shape == (3, 8) and rule.skip.shape == (3,)
    live = rule.live_mask()  # reads the accepted flags and the skipped rows together, on the device
    assert live.device == meta and all(t.device == meta for t in (rule.canvas, rule.accepted, rule.skip))
    assert (rule.sub_blocks, rule.sub_budget) == (2, 3)  # 6 passes over 2 sub-blocks of 4
    assert rule.start(3, torch.device("cpu"), torch.tensor(ended), ended) == [1, 2]
    assert rule.live_mask().tolist() == [False, True, True] and not rule.accepted.any()
    assert rule.start(3, torch.device("cpu"), torch.zeros(3, dtype=torch.bool), [False] * 3) is None
