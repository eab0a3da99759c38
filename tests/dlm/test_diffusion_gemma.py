"""DiffusionGemma in the engine: token equality with transformers' generate, less work, bad input,
our samplers in uniform-noise mode, loading. Tiny random-weight models of transformers' real class."""
from __future__ import annotations

import copy
import json
import pytest
import torch

import dlm
from dlm.outputs import NonFiniteLogitsError
from tests.dlm.dgemma_models import generation_config, left_padded_prompts, tiny_diffusion_gemma

# (canvas_length, layers, sliding_window) x (batch, max_new_tokens, EOS ids, steps, bound, stability, confidence):
# the second config has a sliding window shorter than prompt + canvases (the cache keeps only the window).
CONFIGS = [(16, 2, 64), (8, 3, 8), (16, 2, 64)]
CASES = [
    (1, 40, list(range(1, 13)), 8, 0.1, 1, 0.5),
    (4, 24, list(range(1, 31)), 10, 1.5, 2, 1.0),
    (3, 40, list(range(1, 21)), 10, 4.0, 0, 3.5),
]


@pytest.fixture(scope="module")
def models():
    return [tiny_diffusion_gemma(i, canvas_length=c, layers=n, sliding_window=w) for i, (c, n, w) in enumerate(CONFIGS)]


def _case(seed):
    batch, new, eos, steps, bound, stability, confidence = CASES[seed]
    ids, mask = left_padded_prompts(batch, 9, seed)
    gc = generation_config(max_new_tokens=new, eos_token_id=eos, max_denoising_steps=steps, entropy_bound=bound,
                           stability_threshold=stability, confidence_threshold=confidence)
    return ids, mask, gc, ({"attention_mask": mask} if batch > 1 else {})


def test_tokens_equal_transformers_generate_over_configs_and_seeds(models):
    """3 configs x 3 seeds, from the same torch.manual_seed: same tokens, same shape, same
    per-row decoder-forward count as transformers' tokens-per-forward. The cases cover left padding,
    several canvases, EOS (pad after it), a generation cut short because every row ended, rows
    stopping denoising at different steps, and a sliding window shorter than the context."""
    cut_short = full = padded = staggered = 0
    for config_index, model in enumerate(models):
        C = model.config.canvas_length
        for seed in range(3):
            ids, mask, gc, kw = _case(seed)
            torch.manual_seed(seed)
            reference = model.generate(ids, generation_config=gc, **kw)
            torch.manual_seed(seed)
            ours = dlm.generate(model, ids, generation_config=gc, **kw)
            where = f"config {config_index}, seed {seed}"
            assert ours.sequences.shape == reference.sequences.shape, where
            assert torch.equal(ours.sequences, reference.sequences), where
            generated = ours.sequences[:, ids.shape[1]:]
            valid = (generated != gc.pad_token_id).sum(dim=1)
            assert torch.allclose(valid / ours.nfe_per_sequence, reference.tokens_per_forward), where
            canvases, planned = generated.shape[1] // C, -(-gc.max_new_tokens // C)
            cut_short += canvases < planned
            full += canvases == planned > 1
            padded += bool((generated == gc.pad_token_id).any())
            staggered += any(n % gc.max_denoising_steps for n in ours.nfe_per_sequence.tolist())
    assert cut_short and full and padded >= 3 and staggered, (cut_short, full, padded, staggered)


def test_model_generation_config_is_the_default_and_nothing_is_mutated(models):
    model = copy.deepcopy(models[0])
    ids, mask, gc, kw = _case(1)
    model.generation_config = gc
    before_gc, before_ids = gc.to_dict(), ids.clone()
    torch.manual_seed(3)
    reference = model.generate(ids, **kw)
    torch.manual_seed(3)
    ours = dlm.generate(model, ids, **kw)
    assert torch.equal(ours.sequences, reference.sequences)
    assert gc.to_dict() == before_gc and torch.equal(ids, before_ids)


def test_rows_that_stopped_leave_the_decoder_batch(models):
    """Same tokens, fewer decoder rows: transformers runs every row at every step."""
    model = models[1]
    ids, mask, gc, kw = _case(2)  # no stability condition: rows stop at different steps
    rows = {"ours": 0, "transformers": 0}
    seen = []
    hook = model.model.decoder.register_forward_hook(lambda m, a, k, out: seen.append(out.last_hidden_state.shape[0]),
                                                     with_kwargs=True)
    try:
        torch.manual_seed(2)
        reference = model.generate(ids, generation_config=gc, **kw)
        rows["transformers"], seen[:] = sum(seen), []
        torch.manual_seed(2)
        ours = dlm.generate(model, ids, generation_config=gc, **kw)
        rows["ours"] = sum(seen)
    finally:
        hook.remove()
    assert torch.equal(ours.sequences, reference.sequences)
    assert rows["ours"] < rows["transformers"]


@pytest.mark.parametrize("bad, match", [
    (dict(mask_token_id=5), "mask_token_id does not apply"),
    (dict(kv_cache="prefix"), "kv_cache='prefix' does not apply"),
    (dict(cfg_scale=1.0), "cfg_scale does not apply"),
    (dict(cache_refresh_every=2), "cache_refresh_every does not apply"),
    (dict(shift_logits=True), "shift_logits does not apply"),
    (dict(generator=torch.Generator()), "generator is for sampler mode"),
    (dict(steps=8), "need sampler"),
    (dict(sampler="confidence", block_length=5), "must divide the model's canvas_length"),
    (dict(sampler="confidence", steps=1, gen_length=32), "steps \\(1\\) must be at least 2"),
])
def test_options_the_engine_cannot_honour_are_refused(models, bad, match):
    ids, _, _, _ = _case(0)
    with pytest.raises(ValueError, match=match):
        dlm.generate(models[0], ids, **bad)


def test_kv_cache_none_and_auto_are_accepted_and_change_nothing(models):
    """The encoder's exact cache is the family's design: "none" and "auto" both name it, and give the
    tokens of the default call (only the Fast-dLLM modes are refused, above)."""
    ids, _, gc, _ = _case(0)
    outs = []
    for kv in (None, "none", "auto"):
        torch.manual_seed(2)
        outs.append(dlm.generate(models[0], ids, generation_config=gc, **({} if kv is None else {"kv_cache": kv})))
    assert all(torch.equal(o.sequences, outs[0].sequences) for o in outs[1:])


def test_static_cache_and_foreign_configs_are_refused(models):
    ids, _, gc, _ = _case(0)
    static = copy.deepcopy(gc)
    static.cache_implementation = "static"
    with pytest.raises(ValueError, match="cache_implementation='static' is not implemented"):
        dlm.generate(models[0], ids, generation_config=static)
    from transformers import GenerationConfig
    with pytest.raises(ValueError, match="must be a DiffusionGemmaGenerationConfig"):
        dlm.generate(models[0], ids, generation_config=GenerationConfig(max_new_tokens=4))
    with pytest.raises(ValueError, match="outside the model's vocabulary"):
        dlm.generate(models[0], torch.tensor([[3, 999]]), generation_config=gc)


def test_a_masked_model_refuses_a_generation_config():
    from tests.dlm.test_generate import PROMPT, ToyDLM
    with pytest.raises(ValueError, match="generation_config is for uniform-noise models"):
        dlm.generate(ToyDLM(), PROMPT, gen_length=8, generation_config=generation_config())


def test_nonfinite_logits_raise_naming_canvas_and_step(models):
    model = copy.deepcopy(models[0])
    calls = {"n": 0}

    def poison(module, args, out):
        calls["n"] += 1
        if calls["n"] == 3:  # the LM head's third call: canvas 0, step 2
            out = out.clone()
            out[0, 2, 7] = float("nan")
        return out

    model.lm_head.register_forward_hook(poison)
    ids, _, gc, _ = _case(0)
    with pytest.raises(NonFiniteLogitsError, match="1 position\\(s\\) in canvas 0, step 2"):
        dlm.generate(model, ids, generation_config=gc)


# ------------------------------------------------------------------------------------------------
# Our samplers in uniform-noise mode: the contract of tests/samplers/unmasking/test_contract.py
# ------------------------------------------------------------------------------------------------
def _uniform_samplers():
    from samplers import available_samplers
    # joint: a layer trained on a masked model; lossless: refused there (test_lossless.py)
    return [name for name in available_samplers() if name not in ("joint", "lossless")]


@pytest.mark.parametrize("name", _uniform_samplers())
def test_every_sampler_keeps_the_contract_on_a_uniform_noise_model(models, name):
    model = models[0]
    ids, mask, _, _ = _case(1)  # batch 4, left-padded
    steps, gen = 12, 32  # two canvases of 16
    if name == "hex":  # the published HEX setting: experts [2, 4, 8] x 8 passes per canvas x 2 canvases
        steps = 48
    def run(global_seed):
        torch.manual_seed(global_seed)
        g = torch.Generator().manual_seed(7)
        return dlm.generate(model, ids, attention_mask=mask, sampler=name, steps=steps, gen_length=gen, generator=g,
                            temperature=0.7)
    out = run(0)
    again = run(123)  # randomness comes from the generator only
    assert torch.equal(out.sequences, again.sequences)
    assert out.nfe <= steps
    assert torch.equal(out.sequences[:, :ids.shape[1]], ids)
    generated = out.sequences[:, ids.shape[1]:]
    assert generated.shape[1] in (16, 32) and bool((generated >= 0).all()) and bool((generated < 300).all())


def test_accept_rule_accepts_one_position_per_forward_and_spends_the_budget_exactly(models):
    """One token per forward: confidence accepts exactly one position per step (16 steps, 16
    positions), and the not-accepted count falls by one each step to zero."""
    model = models[0]
    ids, _, _, _ = _case(0)
    out = dlm.generate(model, ids, sampler="confidence", steps=16, gen_length=16, return_trace=True,
                       generator=torch.Generator().manual_seed(0))
    assert out.nfe == 16
    assert [int(t.committed.sum()) for t in out.trace] == [1] * 16
    assert [int(t.masks_left.sum()) for t in out.trace] == list(range(15, -1, -1))
    # the last step's canvas is the output: every position accepted, nothing renoised after it
    assert torch.equal(out.trace[-1].tokens[0], out.sequences[0, ids.shape[1]:])


def test_entropy_bound_sampler_mode_draws_from_the_generator_only(models):
    model = models[2]
    ids, mask, _, _ = _case(2)
    outs = []
    for global_seed in (0, 1):
        torch.manual_seed(global_seed)
        outs.append(dlm.generate(model, ids, attention_mask=mask, sampler="entropy_bound", steps=20, gen_length=32,
                                 generator=torch.Generator().manual_seed(5)))
    assert torch.equal(outs[0].sequences, outs[1].sequences) and outs[0].nfe <= 20


def test_hex_votes_over_sub_block_experts_on_a_canvas(models):
    model = models[0]
    ids, _, _, _ = _case(0)
    out = dlm.generate(model, ids, sampler="hex", sampler_config={"block_lengths": (4, 8, 16)}, steps=24, gen_length=16,
                       generator=torch.Generator().manual_seed(0))
    assert out.experts.block_lengths == [4, 8, 16] and out.experts.steps == [8] * 3 and out.nfe <= 24  # gen/2 each
    assert out.sequences.shape[1] == ids.shape[1] + 16
    # per-sequence forwards (transformers' count) are the experts' sums, as nfe is
    assert out.nfe_per_sequence.shape == (ids.shape[0],) and 0 < int(out.nfe_per_sequence.max()) <= out.nfe


def test_joint_refuses_a_model_its_layer_was_not_trained_for(models):
    ids, _, _, _ = _case(0)
    with pytest.raises(ValueError, match="trained"):
        dlm.generate(models[0], ids, sampler="joint", steps=16, gen_length=16)


# ------------------------------------------------------------------------------------------------
# Loading: a folder through transformers' Auto classes, the pipeline and the CLI
# ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def saved_folder(tmp_path_factory, models):
    from tokenizers import Tokenizer, models as tok_models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    folder = tmp_path_factory.mktemp("dgemma")
    vocab = {"<pad>": 0, "<eos>": 1, "<bos>": 2}
    vocab.update({f"w{i}": i for i in range(3, 300)})
    core = Tokenizer(tok_models.WordLevel(vocab, unk_token="<pad>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>")
    model = copy.deepcopy(models[0])
    model.generation_config = generation_config(max_new_tokens=32, eos_token_id=[1, 5, 9], max_denoising_steps=12)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder, model


def test_load_a_diffusion_gemma_folder_and_match_generate(saved_folder):
    folder, model = saved_folder
    loaded = dlm.load(str(folder))
    assert loaded.family == "uniform-noise" and loaded.mask_token_id is None
    assert type(loaded.model).__name__ == "DiffusionGemmaForBlockDiffusion"
    ids = torch.tensor([[5, 17, 23, 42]])
    torch.manual_seed(0)
    reference = model.generate(ids)
    torch.manual_seed(0)
    ours = dlm.generate(loaded.model, ids)
    assert torch.equal(ours.sequences, reference.sequences)


def test_pipeline_and_cli_run_a_diffusion_gemma_folder(saved_folder, capsys):
    folder, _ = saved_folder
    pipe = dlm.DLMPipeline.from_pretrained(str(folder))
    out = pipe(["w5 w6 w7", "w9"], gen_length=32)
    assert len(out.texts) == 2 and out.sequences.shape[1] > out.prompt_length
    out_sampler = pipe("w5 w6", sampler="threshold", num_inference_steps=8, gen_length=32,
                       generator=torch.Generator().manual_seed(0))
    assert out_sampler.nfe <= 8
    from dlm.cli import main
    code = main(["sample", "--model", str(folder), "--prompt", "w5 w6 w7", "--gen-length", "32", "--json"])
    data = json.loads(capsys.readouterr().out)
    assert code == 0 and data["sampler"] == "diffusiongemma" and data["nfe"] >= 1


def test_the_family_needs_both_the_config_type_and_the_encoder(models):
    """Uniform-noise decoding is chosen for a DiffusionGemma config on a model with an encoder; a
    masked model whose inner module happens to have an `encoder`, or a DiffusionGemma config on a
    model without one, stays masked."""
    from types import SimpleNamespace

    from dlm.engine.families import MaskedFamily, UniformNoiseFamily, family_of

    assert isinstance(family_of(models[0]), UniformNoiseFamily)
    with_encoder = SimpleNamespace(config=SimpleNamespace(model_type="llada"),
                                   model=SimpleNamespace(encoder=object()))
    no_encoder = SimpleNamespace(config=SimpleNamespace(model_type="diffusion_gemma"), model=SimpleNamespace())
    assert isinstance(family_of(with_encoder), MaskedFamily)
    assert isinstance(family_of(no_encoder), MaskedFamily)
