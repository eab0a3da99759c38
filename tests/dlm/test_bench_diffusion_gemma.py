"""`dlm bench` on a DiffusionGemma: our samplers in uniform-noise mode beside the external rows
`transformers-diffusiongemma`, `diffusers-diffusiongemma` and `dlm-exact`, on a tiny random-weight
`DiffusionGemmaForBlockDiffusion` (transformers' class) saved to a temporary folder with the tiny
character tokenizer, as tiny-dgemma ships."""
from __future__ import annotations

import json

import pytest
import torch

from dlm.bench.external_rows import external_rows
from dlm.bench.harness import BenchConfig, parse_sampler_specs
from dlm.bench.transformers_dgemma import generation_config_for
from dlm.cli import main
from dlm.tiny import TinyCharTokenizer
from dlm.tiny.dgemma import generation_config
from tests.dlm.dgemma_models import tiny_diffusion_gemma

ROWS = "transformers-diffusiongemma,diffusers-diffusiongemma,dlm-exact"


@pytest.fixture(scope="module")
def dgemma_dir(tmp_path_factory):
    tok = TinyCharTokenizer()
    model = tiny_diffusion_gemma(0, vocab=tok.vocab_size, eos_token_id=2, pad_token_id=0)
    # confidence 0.5: rows stop denoising at different steps on this random model, as on a trained one
    model.generation_config = generation_config(max_new_tokens=32, max_denoising_steps=8, confidence_threshold=0.5)
    d = tmp_path_factory.mktemp("tiny-dgemma-random")
    model.save_pretrained(d)
    tok.save_pretrained(d)
    return str(d)


@pytest.fixture(scope="module")
def loaded(dgemma_dir):
    import dlm

    obj = dlm.load(dgemma_dir)
    return obj.model, obj.tokenizer


def _row(name, model, tok, gen_length=32):
    cfg = BenchConfig(model="tmp", gen_length=gen_length, block_length=16)
    return external_rows()[name][0](name, model, tok, cfg, None, 2, 0)


def _batch(tok, texts):
    ids, mask = tok.pad_batch([tok.encode_prompt(t) for t in texts])
    return torch.tensor(ids), torch.tensor(mask)


def test_bench_runs_our_samplers_and_the_external_rows_on_one_run(dgemma_dir, tmp_path, capsys):
    out = tmp_path / "run"
    rc = main(["bench", "--model", dgemma_dir, "--suite", "copy", "--samplers", f"threshold,entropy_bound,{ROWS}",
               "--steps", "8,32", "--limit", "2", "--batch-size", "2", "--out", str(out), "--json"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    pairs = {(p["sampler"], p["budget"]): p for p in json.loads(captured.out)["pairs"]}
    assert set(pairs) == {(s, b) for s in ["threshold", "entropy_bound", *ROWS.split(",")] for b in (8, 32)}
    engines = {s: p["engine"] for (s, _), p in pairs.items()}
    assert engines == {"threshold": "dlm", "entropy_bound": "dlm", "transformers-diffusiongemma": "transformers",
                       "diffusers-diffusiongemma": "diffusers", "dlm-exact": "dlm"}
    for (name, budget), p in pairs.items():
        assert p["n"] == 2 and 0 <= p["quality"] <= 100 and p["seconds"] > 0
        assert p["nfe"] > 0 and p["nfe_per_call"] > 0, (name, budget)
        if engines[name] == "dlm" and name != "dlm-exact":
            assert p["nfe"] <= budget  # our samplers keep the step budget
    full = json.loads((out / "results.json").read_text())
    # lengths default to the model's: generation_config max_new_tokens and canvas_length
    assert (full["config"]["gen_length"], full["config"]["block_length"]) == (32, 16)
    samples = {(p["sampler"], p["budget"]): p["samples"] for p in full["pairs"]}
    for budget in (8, 32):  # same prompts and seeds: the exact engine writes transformers' answers
        assert samples[("dlm-exact", budget)] == samples[("transformers-diffusiongemma", budget)]
        assert pairs[("dlm-exact", budget)]["nfe"] == pairs[("transformers-diffusiongemma", budget)]["nfe"]
    assert {"transformers-diffusiongemma", "diffusers-diffusiongemma"} <= set(full["meta"]["vs_diffusers"])
    for name in ("results.csv", "quality_vs_nfe.png", "quality_vs_seconds.png"):
        assert (out / name).stat().st_size > 0


def test_exact_row_is_transformers_token_for_token_with_its_per_row_count(loaded):
    model, tok = loaded
    ids, mask = _batch(tok, ["copy: ab cd ef", "copy: x", "reverse: ana bo cyd ee"])
    assert int((mask == 0).sum()) > 0  # left padding is exercised
    spec_t, spec_e = parse_sampler_specs("transformers-diffusiongemma,dlm-exact")
    hf, ours = _row(spec_t.name, model, tok), _row(spec_e.name, model, tok)
    for budget, seed in ((32, 0), (8, 1), (4, 2)):
        ref = hf.run(spec_t, budget, ids, mask, torch.Generator().manual_seed(seed))
        got = ours.run(spec_e, budget, ids, mask, torch.Generator().manual_seed(seed))
        assert torch.equal(got.sequences, ref.sequences)
        # transformers' count recovered from its tokens_per_forward equals the engine's own count
        assert got.nfe_per_row == ref.nfe_per_row and max(ref.nfe_per_row) <= ref.nfe
        assert got.nfe <= ref.nfe  # rows that stopped leave our decoder batch


def test_budget_points_map_to_entropy_bounds(loaded):
    model, _ = loaded
    shipped = float(model.generation_config.sampler_config.entropy_bound)
    at_ref = generation_config_for(model, 32, 32)
    assert at_ref.sampler_config.entropy_bound == pytest.approx(shipped) and at_ref.max_new_tokens == 32
    assert at_ref.max_denoising_steps == model.generation_config.max_denoising_steps
    assert generation_config_for(model, 8, 32).sampler_config.entropy_bound == pytest.approx(4 * shipped)
    fixed = generation_config_for(model, 8, 32, {"entropy_bound": 0.3, "max_denoising_steps": 3})
    assert fixed.sampler_config.entropy_bound == 0.3 and fixed.max_denoising_steps == 3
    assert model.generation_config.sampler_config.entropy_bound == shipped  # the model's own is untouched


def test_diffusers_row_runs_the_pipeline_on_the_harness_ids(loaded):
    from diffusers import DiffusionGemmaPipeline

    model, tok = loaded
    ids, mask = _batch(tok, ["copy: ab", "copy: a b c d"])
    (spec,) = parse_sampler_specs("diffusers-diffusiongemma:max_denoising_steps=3:confidence_threshold=None")
    row = _row(spec.name, model, tok)
    seen = []
    original = DiffusionGemmaPipeline._prepare_inputs
    DiffusionGemmaPipeline._prepare_inputs = lambda self, **kw: seen.append(original(self, **kw)) or seen[-1]
    try:
        out = row.run(spec, 32, ids, mask, torch.Generator().manual_seed(0))
        again = row.run(spec, 32, ids, mask, torch.Generator().manual_seed(0))
    finally:
        DiffusionGemmaPipeline._prepare_inputs = original
    assert torch.equal(seen[0][0], ids) and torch.equal(seen[0][1], mask)  # the pipeline decodes our batch
    # no adaptive stop: 3 decoder calls per canvas, every row in each, 2 canvases of 16
    assert out.nfe == 6 and out.nfe_per_row == [6, 6] and out.sequences.shape == (2, 32)
    assert torch.equal(out.sequences, again.sequences)  # the generator alone decides the draws


@pytest.mark.parametrize("samplers, needle", [
    ("transformers-diffusiongemma:kv=dual", "has no KV cache option"),
    ("diffusers-diffusiongemma:block=4", "decodes whole canvases"),
    ("transformers-diffusiongemma:bound=0.2", "unknown transformers-diffusiongemma option(s) bound; valid: entropy_bound"),
    ("dlm-exact:refresh=2", "refresh="),
    ("diffusers-llada2:threshold=0.9:cut=1", "cut=1"),
    ("diffusers-llada2", "diffusers-llada2 runs on a masked model"),
    ("threshold:kv=dual", "kv_cache='dual' does not apply to a uniform-noise model"),
])
def test_bad_entries_are_refused_with_one_line(samplers, needle, dgemma_dir, tmp_path, capsys):
    rc = main(["bench", "--model", dgemma_dir, "--suite", "copy", "--samplers", samplers, "--steps", "8",
               "--limit", "1", "--gen-length", "16", "--block-length", "16", "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert rc == 2 and len(lines) == 1 and needle in lines[0] and lines[0].startswith("dlm bench: error:"), err
    assert not (tmp_path / "run" / "results.json").exists()


def test_a_diffusion_gemma_row_on_a_masked_model_is_refused(tmp_path, capsys):
    from dlm.tiny import TinyDLMConfig, TinyDLMModel

    torch.manual_seed(0)
    d = tmp_path / "masked"
    TinyDLMModel(TinyDLMConfig(vocab_size=TinyCharTokenizer().vocab_size, hidden_size=32, num_hidden_layers=1,
                               num_attention_heads=2, intermediate_size=64)).save_pretrained(d)
    TinyCharTokenizer().save_pretrained(d)
    capsys.readouterr()  # saving reports its progress on stderr
    rc = main(["bench", "--model", str(d), "--suite", "copy", "--samplers", "confidence,dlm-exact", "--steps", "8",
               "--limit", "1", "--gen-length", "16", "--block-length", "8", "--out", str(tmp_path / "run")])
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert rc == 2 and len(lines) == 1 and "dlm-exact runs on a uniform-noise model" in lines[0]
