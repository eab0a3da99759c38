"""Our samplers as diffusers discrete schedulers (`samplers.unmasking.as_diffusers_scheduler`).

Three parts:
1. Pipelines end to end: diffusers 0.42's `LLaDA2Pipeline` on a tiny random-weight masked diffusion LM
   (our tiny-dlm architecture behind the project's LLaDA2Pipeline model adapter) with an offline-built
   WordLevel tokenizer, and `DiffusionGemmaPipeline` on a tiny random `DiffusionGemmaForBlockDiffusion`
   with an offline-built tokenizer as its processor (through the documented workaround for the
   transformers 5.24 `cache=` rename): our schedulers give the same tokens as diffusers' own
   `BlockRefinementScheduler` / `EntropyBoundScheduler` at matching settings.
2. diffusers' own tests of `BlockRefinementScheduler`, `EntropyBoundScheduler` and
   `DiscreteDDIMScheduler` (tests/schedulers/test_scheduler_{block_refinement,entropy_bound,
   discrete_ddim}.py), adapted to ours: the same calls and the properties they check, where our
   scheduler has the feature (it has no token editing, no top-k/top-p filtering, no D3PM posterior:
   those checks become refusals or are left out, see the comments).
3. Bad input: engine-only samplers, DiffusionGemma-only settings on a masked model and the reverse.
"""
from __future__ import annotations

import inspect
import logging

import pytest
import torch
from diffusers import BlockRefinementScheduler, DiffusionGemmaPipeline, EntropyBoundScheduler, LLaDA2Pipeline
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from samplers.unmasking import UnmaskingScheduler, as_diffusers_scheduler, fix_diffusion_gemma_for_diffusers

torch.set_num_threads(1)

MASK, EOS = 1, 2


# ---------------------------------------------------------------- fixtures: tiny models, offline tokenizers
def _word_tokenizer(n_words: int, specials: list[str], **special_kw) -> PreTrainedTokenizerFast:
    words = specials + [f"w{i}" for i in range(n_words - len(specials))]
    tk = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(words)}, unk_token="w0"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tk, **special_kw)


@pytest.fixture(scope="module")
def llada2():
    """A masked diffusion LM with LLaDA2Pipeline's model interface (`model(ids, attention_mask,
    position_ids).logits`, aligned logits), random weights drawn wide so some confidences pass 0.95."""
    from dlm.bench.diffusers_llada2 import DiffusersModelWrapper
    from dlm.tiny import TinyDLMConfig, TinyDLMModel

    tok = _word_tokenizer(48, ["[PAD]", "[MASK]", "[EOS]"], pad_token="[PAD]", mask_token="[MASK]", eos_token="[EOS]")
    tok.padding_side = "left"
    torch.manual_seed(0)
    cfg = TinyDLMConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=64, initializer_range=1.0, mask_token_id=MASK, eos_token_id=EOS)
    return DiffusersModelWrapper(TinyDLMModel(cfg).eval()), tok


def _llada2(llada2, scheduler, prompts=("w3 w4 w5 w6 w7", "w9 w8 w7"), **call):
    model, tok = llada2
    pipe = LLaDA2Pipeline(model=model, scheduler=scheduler, tokenizer=tok)
    pipe.set_progress_bar_config(disable=True)
    model.reset()
    kw = dict(use_chat_template=False, gen_length=64, output_type="seq", eos_early_stop=False, editing_threshold=None)
    kw.update(call)
    return pipe(prompt=list(prompts), **kw).sequences, model.nfe


@pytest.fixture(scope="module")
def dgemma():
    """A tiny random DiffusionGemmaForBlockDiffusion (vocab 300, hidden 48, 2 layers, 4 experts top-2,
    canvas 16, one-layer vision tower) and a tokenizer with a chat template as its processor."""
    from transformers import DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion

    tok = _word_tokenizer(300, ["[PAD]", "[BOS]", "[EOS]", "user", "model", ":"], pad_token="[PAD]",
                          eos_token="[EOS]", bos_token="[BOS]")
    tok.chat_template = ("{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} {% endfor %}"
                         "{% if add_generation_prompt %}model : {% endif %}")
    text = dict(vocab_size=300, hidden_size=48, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                num_key_value_heads=1, head_dim=24, global_head_dim=24, num_global_key_value_heads=1,
                max_position_embeddings=256, layer_types=["sliding_attention", "full_attention"], sliding_window=64,
                num_experts=4, top_k_experts=2, moe_intermediate_size=32, pad_token_id=0, eos_token_id=EOS,
                bos_token_id=1, initializer_range=0.2)
    vision = dict(model_type="gemma4_vision", hidden_size=8, intermediate_size=8, num_hidden_layers=1,
                  num_attention_heads=1, num_key_value_heads=1, head_dim=8, patch_size=2, position_embedding_size=4,
                  pooling_kernel_size=1)
    torch.manual_seed(0)
    model = DiffusionGemmaForBlockDiffusion(DiffusionGemmaConfig(text_config=text, vision_config=vision,
                                                                 canvas_length=16)).eval()
    with torch.no_grad():  # sharpen: mean token entropy 2.2 -> 0.8 nats over a canvas, so several
        for name, p in model.named_parameters():  # positions pass the bound and the stop rule can fire
            if "embed_tokens" in name and "vision" not in name:
                p.mul_(16.0)
    return model, tok


def _dgemma(dgemma, scheduler, seed=3, **call):
    model, tok = dgemma
    pipe = DiffusionGemmaPipeline(model=model, scheduler=scheduler, processor=tok)
    pipe.set_progress_bar_config(disable=True)
    kw = dict(gen_length=32, num_inference_steps=8, output_type="seq", eos_early_stop=False)
    kw.update(call)
    return pipe(prompt=["w5 w6 w7", "w8 w9 w10"], generator=torch.Generator().manual_seed(seed), **kw).sequences


# ---------------------------------------------------------------- 1. LLaDA2Pipeline: token equality
def test_llada2_threshold_at_block_refinement_defaults_equals_diffusers(llada2):
    # BlockRefinementScheduler's defaults: block_length 32, 32 steps, threshold 0.95. LLaDA2Pipeline passes
    # its own threshold to every step, so the call sets 0.95 too (editing off: our policies never edit).
    ref = BlockRefinementScheduler()
    ours = as_diffusers_scheduler("threshold", tau=0.95)
    assert (ours.config.block_length, ours.num_inference_steps) == (ref.config.block_length, ref.config.num_inference_steps)
    a, nfe_a = _llada2(llada2, ref, num_inference_steps=32, threshold=0.95)
    b, nfe_b = _llada2(llada2, ours, num_inference_steps=32, threshold=0.95)
    assert torch.equal(a, b)
    assert nfe_a == nfe_b
    assert nfe_b < 32 * 3  # the threshold committed several tokens in some steps (3 blocks of 32 steps)
    assert not (b == MASK).any()


@pytest.mark.parametrize("tau", [0.5, 0.9])
@pytest.mark.parametrize("steps", [8, 4, 3])
def test_llada2_threshold_fixed_quota_equals_diffusers_at_any_step_count(llada2, tau, steps):
    # quota="fixed" is BlockRefinementScheduler's split of block_length over the steps.
    a, nfe_a = _llada2(llada2, BlockRefinementScheduler(), block_length=8, num_inference_steps=steps, threshold=tau)
    b, nfe_b = _llada2(llada2, as_diffusers_scheduler("threshold", tau=tau, quota="fixed"), block_length=8,
                       num_inference_steps=steps, threshold=tau)
    assert torch.equal(a, b) and nfe_a == nfe_b


def test_llada2_adaptive_quota_equals_diffusers_when_steps_equal_block_length(llada2):
    # With one token per step the two quotas agree. With fewer steps than the block's length they need
    # not: in the first block, which the prompt partly fills, ours asks ceil(masks / steps) and spreads
    # the few masks over the whole budget, while diffusers' split of the full block length finishes it
    # sooner; and after a step where the threshold committed extra tokens ours asks for fewer.
    a, _ = _llada2(llada2, BlockRefinementScheduler(), block_length=8, num_inference_steps=8, threshold=0.9)
    b, _ = _llada2(llada2, as_diffusers_scheduler("threshold", tau=0.9), block_length=8, num_inference_steps=8,
                   threshold=0.9)
    assert torch.equal(a, b)
    c, nfe_c = _llada2(llada2, BlockRefinementScheduler(), block_length=8, num_inference_steps=4, threshold=0.9)
    d, nfe_d = _llada2(llada2, as_diffusers_scheduler("threshold", tau=0.9), block_length=8, num_inference_steps=4,
                       threshold=0.9)
    f, nfe_f = _llada2(llada2, as_diffusers_scheduler("threshold", tau=0.9, quota="fixed"), block_length=8,
                       num_inference_steps=4, threshold=0.9)
    assert not (d == MASK).any() and nfe_d <= 9 * (4 + 1)  # 9 blocks (prompt's + 8), budget + 1 each
    # diffusers' run at 4 steps is what quota="fixed" reproduces; the adaptive quota is another rule: it
    # spreads the first block's few masks over the budget, so it takes more forwards and other tokens here
    # (34 forwards for diffusers' split, 36 for ours, 53 of 128 tokens differ)
    assert torch.equal(f, c) and nfe_f == nfe_c
    assert not torch.equal(d, c) and nfe_d > nfe_c


def test_llada2_confidence_equals_diffusers_top_k(llada2):
    # `confidence` (LLaDA's low-confidence remasking) is BlockRefinementScheduler with the threshold off.
    a, _ = _llada2(llada2, BlockRefinementScheduler(), block_length=16, num_inference_steps=8, threshold=2.0)
    b, _ = _llada2(llada2, as_diffusers_scheduler("confidence", quota="fixed"), block_length=16, num_inference_steps=8,
                   threshold=2.0)
    assert torch.equal(a, b)


@pytest.mark.parametrize("name,opts", [("random", {}), ("margin", {}), ("entropy", {}), ("eb", {}), ("position", {}),
                                       ("credit", {}), ("hierarchical", {}), ("saber", {}), ("threshold", {"tau": 0.7})])
def test_llada2_every_one_forward_sampler_runs_and_fills_the_blocks(llada2, name, opts):
    sched = as_diffusers_scheduler(name, **opts)
    seqs, nfe = _llada2(llada2, sched, block_length=8, num_inference_steps=4, generator=torch.Generator().manual_seed(0))
    again, _ = _llada2(llada2, as_diffusers_scheduler(name, **opts), block_length=8, num_inference_steps=4,
                       generator=torch.Generator().manual_seed(0))
    assert seqs.shape == (2, 64) and not (seqs == MASK).any()
    assert torch.equal(seqs, again)  # seeded determinism through the pipeline's generator
    # At most the budget plus the pipeline's one extra pass on a block that finished early.
    assert nfe <= 9 * (4 + 1)


def test_llada2_temperature_draws_from_the_generator_only(llada2):
    sched = as_diffusers_scheduler("confidence")
    assert "generator" in inspect.signature(sched.step).parameters
    torch.manual_seed(123)
    before = torch.get_rng_state()
    a, _ = _llada2(llada2, sched, block_length=8, num_inference_steps=8, temperature=1.0,
                   generator=torch.Generator().manual_seed(1))
    assert torch.equal(torch.get_rng_state(), before)  # the global RNG was not used
    b, _ = _llada2(llada2, sched, block_length=8, num_inference_steps=8, temperature=1.0,
                   generator=torch.Generator().manual_seed(1))
    c, _ = _llada2(llada2, sched, block_length=8, num_inference_steps=8, temperature=1.0,
                   generator=torch.Generator().manual_seed(2))
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_llada2_pipeline_thresholds_are_ignored_with_one_warning(llada2, caplog):
    # The scheduler's config wins over the threshold / editing_threshold the pipeline passes each step.
    with caplog.at_level(logging.WARNING, logger="samplers.unmasking.diffusers_scheduler"):
        a, _ = _llada2(llada2, as_diffusers_scheduler("threshold", tau=0.95), block_length=8, num_inference_steps=8,
                       threshold=0.3, editing_threshold=0.5)
    b, _ = _llada2(llada2, as_diffusers_scheduler("threshold", tau=0.95), block_length=8, num_inference_steps=8,
                   threshold=0.95)
    assert torch.equal(a, b)
    warnings = [r for r in caplog.records if "ignored" in r.getMessage()]
    assert len(warnings) == 1 and "threshold=0.3" in warnings[0].getMessage()
    assert "editing_threshold=0.5" in warnings[0].getMessage()


def test_llada2_eos_early_stop_through_our_helpers(llada2):
    # The pipeline's EOS bookkeeping runs our check_eos_finished / check_block_should_continue.
    model, tok = llada2
    seqs, _ = _llada2(llada2, as_diffusers_scheduler("confidence", quota="fixed"), block_length=8,
                      num_inference_steps=8, eos_early_stop=True, eos_token_id=EOS, threshold=2.0)
    ref, _ = _llada2(llada2, BlockRefinementScheduler(), block_length=8, num_inference_steps=8, eos_early_stop=True,
                     eos_token_id=EOS, threshold=2.0)
    assert torch.equal(seqs, ref)


# ---------------------------------------------------------------- 1. DiffusionGemmaPipeline
def test_diffusion_gemma_pipeline_needs_the_workaround_on_this_transformers(dgemma):
    # diffusers 0.42.1 passes past_key_values= to a method transformers 5.24 renamed to cache=.
    from transformers import DiffusionGemmaDecoderModel

    params = inspect.signature(DiffusionGemmaDecoderModel.create_diffusion_decoder_attention_mask).parameters
    model, tok = dgemma
    if "past_key_values" in params:
        pytest.skip("this transformers accepts past_key_values: the workaround is a no-op")
    model.model.decoder.__dict__.pop("create_diffusion_decoder_attention_mask", None)
    with pytest.raises(TypeError, match="past_key_values"):
        _dgemma(dgemma, EntropyBoundScheduler())
    fix_diffusion_gemma_for_diffusers(model)
    fix_diffusion_gemma_for_diffusers(model)  # idempotent
    assert _dgemma(dgemma, EntropyBoundScheduler()).shape == (2, 32)
    # Only this instance is patched.
    assert "past_key_values" not in inspect.signature(DiffusionGemmaDecoderModel.create_diffusion_decoder_attention_mask).parameters


@pytest.mark.parametrize("bound", [0.1, 1.0, 4.0])
@pytest.mark.parametrize("confidence_threshold", [None, 0.005])
@pytest.mark.parametrize("t", [(0.8, 0.4), (1.0, 0.2)])
def test_diffusion_gemma_entropy_bound_equals_diffusers(dgemma, bound, confidence_threshold, t):
    fix_diffusion_gemma_for_diffusers(dgemma[0])
    t_max, t_min = t
    ref = EntropyBoundScheduler(entropy_bound=bound, t_max=t_max, t_min=t_min)
    ours = as_diffusers_scheduler("entropy_bound", entropy_bound=bound, t_max=t_max, t_min=t_min)
    a = _dgemma(dgemma, ref, confidence_threshold=confidence_threshold)
    b = _dgemma(dgemma, ours, confidence_threshold=confidence_threshold)
    assert torch.equal(a, b)


def test_diffusion_gemma_adaptive_stop_reads_our_pred_logits_like_diffusers(dgemma, monkeypatch):
    # A random model's argmax never settles, so the pipeline's stop rule (argmax of the scheduler's
    # pred_logits stable for a step, their mean entropy under confidence_threshold) is driven here by a
    # decoder stand-in whose logits settle on one token per row after two steps (diffusers' own
    # adaptive-stopping test does the same). Both schedulers must stop at the same step.
    from types import SimpleNamespace

    fix_diffusion_gemma_for_diffusers(dgemma[0])
    calls = []

    def forward(decoder_input_ids=None, **kwargs):
        b, c = decoder_input_ids.shape
        k = len(calls)
        calls.append(k)
        tokens = torch.tensor([[7, 9], [8, 9], [10, 11], [10, 11], [10, 11], [10, 11]][min(k % 6, 5)])
        logits = torch.full((b, c, 300), -30.0)
        logits.scatter_(-1, tokens.view(b, 1, 1).expand(b, c, 1), 30.0)
        return SimpleNamespace(logits=logits)

    monkeypatch.setattr(dgemma[0], "forward", forward)
    a = _dgemma(dgemma, EntropyBoundScheduler(entropy_bound=1.0), gen_length=16, confidence_threshold=0.005)
    n_ref = len(calls)
    calls.clear()
    b = _dgemma(dgemma, as_diffusers_scheduler("entropy_bound", entropy_bound=1.0), gen_length=16,
                confidence_threshold=0.005)
    assert torch.equal(a, b) and len(calls) == n_ref == 4  # stopped after 4 of 8 steps
    assert (a[0] == 10).all() and (a[1] == 9).all()  # row 1 settled (and froze) at its second step


def test_diffusion_gemma_entropy_bound_step_equals_diffusers_field_by_field(dgemma):
    # One step at a time on the same logits and generator state: every field the pipeline reads.
    torch.manual_seed(0)
    logits = torch.randn(2, 16, 300) * 4
    logits[0, :5, 7] = 40.0  # low-entropy positions, so several are accepted
    sample = torch.randint(0, 300, (2, 16))
    ref, ours = EntropyBoundScheduler(entropy_bound=0.5), as_diffusers_scheduler("entropy_bound", entropy_bound=0.5)
    for s in (ref, ours):
        s.set_timesteps(6)
    for step in range(6):
        a = ref.step(logits, step, sample, generator=torch.Generator().manual_seed(step))
        b = ours.step(logits, step, sample, mask_token_id=None, generator=torch.Generator().manual_seed(step))
        for field in ("prev_sample", "accepted_index", "sampled_tokens", "sampled_probs", "pred_logits"):
            assert torch.equal(getattr(a, field), getattr(b, field)), (step, field)
        assert int(b.accepted_index[0].sum()) >= 5


@pytest.mark.parametrize("name", ["threshold", "confidence", "eb", "saber"])
def test_diffusion_gemma_runs_our_masked_policies_by_accept_and_renoise(dgemma, name):
    fix_diffusion_gemma_for_diffusers(dgemma[0])
    a = _dgemma(dgemma, as_diffusers_scheduler(name), confidence_threshold=None)
    b = _dgemma(dgemma, as_diffusers_scheduler(name), confidence_threshold=None)
    c = _dgemma(dgemma, as_diffusers_scheduler(name), seed=4, confidence_threshold=None)
    assert a.shape == (2, 32) and torch.equal(a, b) and not torch.equal(a, c)
    assert int(a.min()) >= 0 and int(a.max()) < 300


# ---------------------------------------------------------------- 2. diffusers' scheduler tests, adapted
def _block_logits(conf_order: list[float], vocab: int = 32) -> torch.Tensor:
    """`[1, L, V]` logits whose argmax at position i is token i with a logit of `conf_order[i]`."""
    logits = torch.zeros(1, len(conf_order), vocab)
    for i, v in enumerate(conf_order):
        logits[0, i, i] = v
    return logits


def test_set_timesteps_and_invalid():
    s = as_diffusers_scheduler("threshold")
    s.set_timesteps(8)
    assert s.num_inference_steps == 8 and s.timesteps.tolist() == list(range(8))
    for bad in (0, -3):
        with pytest.raises(ValueError, match="num_inference_steps"):
            s.set_timesteps(bad)
    with pytest.raises(ValueError, match="block_length"):
        s.set_timesteps(8, block_length=0)


@pytest.mark.parametrize("name,opts", [("threshold", {"tau": 0.8}), ("entropy_bound", {"entropy_bound": 0.3, "t_max": 0.9}),
                                       ("saber", {"n": 3})])
def test_save_load_config_round_trip_and_from_config(tmp_path, name, opts):
    s = as_diffusers_scheduler(name, block_length=16, num_inference_steps=4, **opts)
    s.save_config(tmp_path)
    loaded = UnmaskingScheduler.from_pretrained(tmp_path)
    again = UnmaskingScheduler.from_config(s.config)
    for t in (loaded, again):
        assert t.config.sampler == name and t.config.block_length == 16 and t.config.num_inference_steps == 4
        assert t.policy.config == s.policy.config
    # The reloaded scheduler decides the same step.
    logits, sample = torch.randn(2, 16, 32) * 3, torch.full((2, 16), 31)
    mask = None if name == "entropy_bound" else 31
    outs = [t.step(logits, 0, sample, mask_token_id=mask, generator=torch.Generator().manual_seed(0)).prev_sample
            for t in (s, loaded)]
    assert torch.equal(*outs)


def test_step_commits_the_quota_then_the_threshold():
    # diffusers' test_step_commits_tokens: 8 masks over 2 steps commit 4 on the first (decreasing confidence).
    s = as_diffusers_scheduler("threshold", tau=0.95, block_length=8)
    s.set_timesteps(2)
    out = s.step(_block_logits([10.0 - i for i in range(8)]), 0, torch.full((1, 8), 31), mask_token_id=31)
    assert out.transfer_index[0].tolist() == [True] * 4 + [False] * 4  # p > 0.95 only at the first 4
    assert out.prev_sample[0, :4].tolist() == [0, 1, 2, 3] and (out.prev_sample[0, 4:] == 31).all()
    # diffusers' test_threshold_commits_beyond_quota: 20 near-certain positions all commit in one step.
    s = as_diffusers_scheduler("threshold", tau=0.5, block_length=64)
    s.set_timesteps(16)
    logits = torch.zeros(1, 64, 100)
    logits[0, :20, 0] = 1e6
    out = s.step(logits, 0, torch.full((1, 64), 99), mask_token_id=99)
    assert int(out.transfer_index.sum()) == 20


def test_step_never_touches_committed_or_prompt_tokens():
    # diffusers' test_step_no_editing_by_default / test_step_prompt_mask_prevents_editing: our policies
    # never edit, whatever editing_threshold the call passes.
    s = as_diffusers_scheduler("threshold", block_length=4)
    s.set_timesteps(2)
    sample = torch.tensor([[10, 20, 31, 31]])
    logits = torch.zeros(1, 4, 32)
    logits[0, :, 5] = 50.0  # confident, different token everywhere
    out = s.step(logits, 0, sample, mask_token_id=31, editing_threshold=0.1,
                 prompt_mask=torch.tensor([True, False, False, False]))
    assert out.prev_sample[0, :2].tolist() == [10, 20] and not out.editing_transfer_index.any()
    assert out.transfer_index[0].tolist() == [False, False, True, True]


def test_step_return_tuple_batched_and_shapes():
    s = as_diffusers_scheduler("confidence", block_length=4)
    s.set_timesteps(2)
    logits, sample = torch.randn(3, 4, 32), torch.full((3, 4), 31)
    tup = s.step(logits, 0, sample, mask_token_id=31, return_dict=False)
    s.set_timesteps(2)
    out = s.step(logits, 0, sample, mask_token_id=31)
    assert isinstance(tup, tuple) and len(tup) == 7
    names = ("prev_sample", "transfer_index", "editing_transfer_index", "sampled_tokens", "sampled_probs",
             "pred_logits", "accepted_index")
    for value, name in zip(tup, names):
        assert torch.equal(value, getattr(out, name))
    for name in names:
        want = (3, 4, 32) if name == "pred_logits" else (3, 4)
        assert tuple(getattr(out, name).shape) == want
    assert (out.transfer_index.sum(dim=1) == 2).all()  # 4 masks over 2 steps


def test_check_block_should_continue_cases():
    s = as_diffusers_scheduler("threshold")
    s.set_timesteps(8)
    none = torch.zeros(1, 32, dtype=torch.bool)
    call = dict(editing_enabled=False, editing_transfer_index=none, post_steps=0, max_post_steps=16)
    assert not s.check_block_should_continue(step_idx=0, masks_remaining=True, finished=torch.tensor([True, True]),
                                             **call)
    assert s.check_block_should_continue(step_idx=3, masks_remaining=True, finished=torch.tensor([False]), **call)
    assert not s.check_block_should_continue(step_idx=8, masks_remaining=True, finished=torch.tensor([False]), **call)
    assert not s.check_block_should_continue(step_idx=5, masks_remaining=False, finished=torch.tensor([False]),
                                             **{**call, "editing_enabled": True, "post_steps": 1})
    changed = none.clone()
    changed[0, 3] = True
    assert s.check_block_should_continue(step_idx=5, masks_remaining=False, finished=torch.tensor([False]),
                                         **{**call, "editing_enabled": True, "editing_transfer_index": changed})
    assert not s.check_block_should_continue(step_idx=5, masks_remaining=False, finished=torch.tensor([False]),
                                             **{**call, "editing_enabled": True, "editing_transfer_index": changed,
                                                "post_steps": 17})


@pytest.mark.parametrize("cur_x,sampled,transfer,finished,expected", [
    ([[10, 11, 5, 2, 99, 99]], [[0, 0, 0, 2]], [[False, False, False, True]], [False], [True]),  # EOS committed
    ([[10, 11, 99, 2]], [[0, 0]], [[False, True]], [False], [False]),  # a mask before the EOS
    ([[10, 11, 5, 6]], [[0, 0]], [[False, False]], [True], [True]),  # already finished stays so
    ([[2, 11, 5, 2]], [[0, 2]], [[False, True]], [False], [False]),  # first EOS is in the prompt
    ([[10, 11, 5, 2], [10, 11, 2, 99]], [[0, 2], [2, 0]], [[False, True], [True, False]], [False, False],
     [True, True]),
])
def test_check_eos_finished_matches_diffusers(cur_x, sampled, transfer, finished, expected):
    args = dict(cur_x=torch.tensor(cur_x), sampled_tokens=torch.tensor(sampled),
                final_transfer=torch.tensor(transfer), eos_token_id=2, mask_token_id=99, prompt_length=2)
    ours = UnmaskingScheduler.check_eos_finished(finished=torch.tensor(finished), **args)
    ref = BlockRefinementScheduler.check_eos_finished(finished=torch.tensor(finished), **args)
    assert ours.tolist() == ref.tolist() == expected


def test_uniform_quota_progression_last_step_and_reset():
    # diffusers' BlockRefinementSchedulerUniformTest, on our accept-and-renoise mode.
    s = as_diffusers_scheduler("threshold", tau=1.0, block_length=256)
    s.set_timesteps(48)
    g = torch.Generator().manual_seed(0)
    sample = torch.randint(0, 1000, (1, 256), generator=g)
    logits = torch.randn(1, 256, 1000, generator=g)
    out0 = s.step(logits, 0, sample, mask_token_id=None)
    assert int(out0.accepted_index.sum()) == 6  # ceil(256 / 48)
    out1 = s.step(logits, 1, out0.prev_sample, mask_token_id=None)
    assert int(out1.accepted_index.sum()) == 6 + 6  # ceil(250 / 47)
    assert torch.equal(out1.prev_sample[out0.accepted_index], out0.prev_sample[out0.accepted_index])  # kept
    last = s.step(logits, 47, out1.prev_sample, mask_token_id=None)
    assert last.accepted_index.all()  # the last step accepts everything
    reset = s.step(logits, 0, sample, mask_token_id=None)
    assert int(reset.accepted_index.sum()) == 6  # a new canvas starts from nothing accepted


def test_uniform_threshold_accepts_beyond_quota_and_renoises_the_rest():
    s = as_diffusers_scheduler("threshold", tau=0.5, block_length=256)
    s.set_timesteps(48)
    sample = torch.randint(0, 10000, (1, 256), generator=torch.Generator().manual_seed(1))
    logits = torch.zeros(1, 256, 10000)
    logits[0, :20, 0] = 1e6
    out = s.step(logits, 0, sample, mask_token_id=None, generator=torch.Generator().manual_seed(2))
    assert int(out.accepted_index.sum()) == 20 and (out.prev_sample[0, :20] == 0).all()
    renoised = out.prev_sample[0, 20:]
    assert not torch.equal(renoised, sample[0, 20:])  # fresh random tokens, not the old ones


def test_entropy_bound_adapted_checks():
    # diffusers' test_scheduler_entropy_bound.py: zero-entropy positions accepted with their token;
    # a higher bound accepts at least as many; output shapes.
    def step(bound, logits, sample):
        s = as_diffusers_scheduler("entropy_bound", entropy_bound=bound, num_inference_steps=8)
        return s.step(logits, 0, sample, mask_token_id=None, generator=torch.Generator().manual_seed(0))

    sample = torch.randint(0, 10000, (1, 256))
    logits = torch.zeros(1, 256, 10000)
    logits[0, :9, 0] = 1e6
    out = step(0.1, logits, sample)
    assert int(out.accepted_index.sum()) >= 9 and (out.prev_sample[0, :9] == 0).all()
    logits = torch.zeros(1, 256, 10000)
    logits[0, 0, 0], logits[0, 1, 1], logits[0, 2, 2] = 18.0, 14.5, 14.5
    low, high = step(1e-2, logits, sample), step(1e-1, logits, sample)
    assert int(high.accepted_index.sum()) >= int(low.accepted_index.sum())
    out = step(0.1, torch.randn(3, 16, 100), torch.randint(0, 100, (3, 16)))
    assert out.prev_sample.shape == out.accepted_index.shape == (3, 16)


def test_discrete_ddim_adapted_checks():
    # diffusers' test_scheduler_discrete_ddim.py (uniform-noise canvas): set_timesteps ascending, the last
    # step leaves no noise (every position holds its accepted token), positions accepted earlier keep
    # their token, output shapes. (Its D3PM posterior and corrector are not a policy of ours.)
    s = as_diffusers_scheduler("confidence", num_inference_steps=8, block_length=16)
    s.set_timesteps(16)
    assert s.timesteps[0].item() == 0 and s.timesteps[-1].item() == 15
    s.set_timesteps(8)
    g = torch.Generator().manual_seed(0)
    sample = torch.randint(0, 100, (2, 16), generator=g)
    logits = torch.randn(2, 16, 100, generator=g) * 3
    x = sample
    for t in range(8):
        out = s.step(logits, t, x, mask_token_id=None, temperature=1.0, generator=g)
        if t:
            assert torch.equal(out.prev_sample[prev_acc], x[prev_acc])
        x, prev_acc = out.prev_sample, out.accepted_index
        assert tuple(out.sampled_tokens.shape) == tuple(out.sampled_probs.shape) == (2, 16)
    assert out.accepted_index.all() and torch.equal(out.prev_sample[out.transfer_index],
                                                     out.sampled_tokens[out.transfer_index])


# ---------------------------------------------------------------- 3. bad input
@pytest.mark.parametrize("name", ["lopa", "hex"])
def test_engine_only_samplers_name_the_engine_call(name):
    with pytest.raises(ValueError, match=rf"dlm\.generate\(model, input_ids, sampler='{name}'"):
        as_diffusers_scheduler(name)


def test_joint_needs_prepare_and_checks_its_layer():
    from pathlib import Path

    import samplers.unmasking as pkg

    layer = str(Path(pkg.__file__).parent / "checkpoints" / "joint-oracle-hmm.safetensors")
    s = as_diffusers_scheduler("joint", layer=layer, block_length=4)
    with pytest.raises(ValueError, match=r"prepare\(pipe\.model\)"):
        s.step(torch.randn(1, 4, 5), 0, torch.full((1, 4), 4), mask_token_id=4)
    with pytest.raises(ValueError):
        s.prepare(torch.nn.Linear(2, 2))  # not the model the layer was trained for


def test_family_mismatches_and_unsupported_options():
    logits, masked = torch.randn(1, 8, 32), torch.full((1, 8), 31)
    with pytest.raises(ValueError, match="DiffusionGemma's uniform-noise rule"):
        as_diffusers_scheduler("entropy_bound").step(logits, 0, masked, mask_token_id=31)
    with pytest.raises(ValueError, match="quota='fixed'"):
        as_diffusers_scheduler("threshold", quota="fixed").step(logits, 0, masked, mask_token_id=None)
    with pytest.raises(ValueError, match="confidence_threshold"):
        as_diffusers_scheduler("entropy_bound", confidence_threshold=0.01)
    with pytest.raises(ValueError, match="temperature"):
        as_diffusers_scheduler("entropy_bound").step(logits, 0, masked, mask_token_id=None, temperature=0.5)
    s = as_diffusers_scheduler("threshold")
    with pytest.raises(ValueError, match="top_k"):
        s.step(logits, 0, masked, mask_token_id=31, top_k=5)
    with pytest.raises(ValueError, match="top_p"):
        s.step(logits, 0, masked, mask_token_id=31, top_p=0.9)
    with pytest.raises(ValueError, match="sampling_method"):
        s.step(logits, 0, masked, mask_token_id=31, sampling_method="beam")
    with pytest.raises(ValueError, match="unknown sampler"):
        as_diffusers_scheduler("nope")
    with pytest.raises(ValueError, match="tau"):
        as_diffusers_scheduler("threshold", tau=2.0)
    with pytest.raises(ValueError, match="no option"):
        as_diffusers_scheduler("threshold", taus=0.5)
    with pytest.raises(ValueError, match="quota"):
        as_diffusers_scheduler("threshold", quota="sometimes")
