"""The harness model `dlm` (`dlm.lm_eval`): generate_until, loglikelihood, counts and model_args.

Everything runs offline on the built-in models with local task files; no harness task that downloads
a data set is used.
"""
import json
import os

import pytest
import torch

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import dlm  # noqa: E402
import lm_eval  # noqa: E402
from lm_eval.api.instance import Instance  # noqa: E402
from lm_eval.tasks import TaskManager  # noqa: E402

from dlm.evaluation import TASKS_DIR  # noqa: E402
from dlm.evaluation.generation import cut_at_stops, decode_answer  # noqa: E402
from dlm.evaluation.likelihood import estimate_loglikelihoods, request_generator  # noqa: E402
from dlm.lm_eval import DLMEvalLM  # noqa: E402
from dlm.tasks import get_task  # noqa: E402

SETTINGS = dict(sampler="threshold", steps=16, gen_length=64, block_length=32)


@pytest.fixture(scope="module")
def tiny():
    return dlm.load("tiny-dlm")


def _prompts():
    """Test-split prompts of three tasks, of different lengths (so batches are left-padded)."""
    return [ex.prompt for name in ("copy", "reverse", "arithmetic") for ex in get_task(name).examples("test", 3)]


def _generate_requests(prompts, until=("\n",), max_gen_toks=64):
    return [Instance("generate_until", {}, (p, {"until": list(until), "max_gen_toks": max_gen_toks}), i, ("t", i, 1))
            for i, p in enumerate(prompts)]


def _reference_answer(loaded, prompt, **settings):
    """`dlm.generate` on one prompt in the model's prompt format; the text before EOS, cut at a newline."""
    tok = loaded.tokenizer
    ids = torch.tensor([tok.encode_prompt(prompt)])
    out = dlm.generate(loaded.model, ids, mask_token_id=loaded.mask_token_id, eos_token_id=loaded.eos_token_id,
                       **settings)
    row = out.sequences[0, ids.shape[1]:].tolist()
    row = row[:row.index(loaded.eos_token_id)] if loaded.eos_token_id in row else row
    return tok.decode(row, skip_special_tokens=True).split("\n")[0]


def test_harness_task_written_here_gives_dlm_generate_answers(tiny, tmp_path):
    prompts = [p for i, p in enumerate(_prompts()) if i % 3 != 1]  # two of each task
    (tmp_path / "docs.jsonl").write_text("".join(json.dumps({"prompt": p, "answer": "x"}) + "\n" for p in prompts))
    # the local-JSONL recipe: data_files as {split: absolute path} (a bare string would make a "train" split)
    (tmp_path / "mine.yaml").write_text(f"""task: mine
dataset_path: json
dataset_name: null
dataset_kwargs:
  data_files:
    test: {tmp_path / 'docs.jsonl'}
output_type: generate_until
test_split: test
doc_to_text: "{{{{prompt}}}}"
doc_to_target: "{{{{answer}}}}"
generation_kwargs:
  until: ["\\n"]
  max_gen_toks: 64
metric_list:
  - metric: exact_match
""")
    lm = DLMEvalLM(pretrained=tiny, batch_size=4, **SETTINGS)
    results = lm_eval.simple_evaluate(model=lm, tasks=["mine"], log_samples=True,
                                      task_manager=TaskManager(include_path=str(tmp_path), include_defaults=False))
    got = {s["doc_id"]: s["resps"][0][0] for s in results["samples"]["mine"]}
    expected = [_reference_answer(tiny, p, **SETTINGS) for p in prompts]
    assert [got[i] for i in range(len(prompts))] == expected
    assert sum(e != "" for e in expected) >= len(prompts) - 1  # real answers, not empty strings
    records = [r for r in lm.records if r.kind == "generate_until"]
    assert sorted(r.doc_id for r in records) == list(range(len(prompts)))
    assert max(r.call_rows for r in records) == 4  # batched


def test_harness_and_dlm_bench_agree_on_the_same_prompts(tiny):
    from dlm.bench import BenchConfig, run_bench

    n = 6
    bench = run_bench(BenchConfig(model="tiny-dlm", suite="arithmetic", samplers=["threshold"], steps=[16], limit=n,
                                  gen_length=64, block_length=32, batch_size=1, warmup=False), progress=False)
    pair = bench.pairs[0]
    lm = DLMEvalLM(pretrained=tiny, batch_size=1, **SETTINGS)
    results = lm_eval.simple_evaluate(model=lm, tasks=["dlm_tiny_arithmetic"], limit=n,
                                      task_manager=TaskManager(include_path=str(TASKS_DIR), include_defaults=False))
    accuracy = results["results"]["dlm_tiny_arithmetic"]["exact_match,strict-match"]
    assert 100.0 * accuracy == pytest.approx(pair.quality)
    assert 0 < pair.quality < 100  # a discriminating sample: some right, some wrong
    # the same forwards per prompt (both decode one prompt per call here)
    assert sum(r.forwards for r in lm.records) / n == pytest.approx(pair.nfe)


# HEX runs 4 experts of (gen_length / 2) passes each; the joint sampler reads hidden states (no KV cache)
_SAMPLER_OPTIONS = {"hex": {"steps": 32}, "joint": {"kv_cache": "none"}}


def test_batch_size_changes_no_output_for_any_sampler(tiny):
    import samplers

    prompts = _prompts()[2::3]  # one of each task, three lengths
    for name in samplers.available_samplers():
        kw = {**dict(sampler=name, steps=8, gen_length=16, block_length=16), **_SAMPLER_OPTIONS.get(name, {})}
        reqs = _generate_requests(prompts, max_gen_toks=kw["gen_length"])
        outs = [DLMEvalLM(pretrained=tiny, batch_size=bs, **kw).generate_until(reqs, disable_tqdm=True)
                for bs in (1, len(prompts))]
        assert outs[0] == outs[1], name
        assert any(outs[0]), name


def test_sampling_is_seeded_per_request(tiny):
    prompts = _prompts()[::2]  # two arithmetic prompts among them: their worked steps vary when sampled

    def run(batch_size, seed):
        lm = DLMEvalLM(pretrained=tiny, batch_size=batch_size, temperature=1.0, seed=seed, sampler="threshold",
                       steps=8, gen_length=32, block_length=32)
        return lm.generate_until(_generate_requests(prompts), disable_tqdm=True), lm

    a, lm = run(1, 3)
    b, lm_batched = run(3, 3)
    assert a == b
    assert lm_batched._generator.stochastic  # found out from its first batched call
    assert run(3, 4)[0] != a  # the seed matters
    # the same request twice (a task's repeats) gets two seeds, the first the one it has alone
    twice = DLMEvalLM(pretrained=tiny, batch_size=2, temperature=1.0, seed=3, sampler="threshold", steps=8,
                      gen_length=32, block_length=32)
    reqs = _generate_requests([prompts[4], prompts[4]])
    assert twice.generate_until(reqs, disable_tqdm=True)[0] == a[4]
    seeds = twice._generator._seeds([twice._generation_request(r) for r in reqs])
    assert seeds[0] != seeds[1]


def test_counts_are_generated_tokens_before_eos(tiny):
    lm = DLMEvalLM(pretrained=tiny, batch_size=3, **SETTINGS)
    prompts = _prompts()
    texts = lm.generate_until(_generate_requests(prompts, until=()), disable_tqdm=True)
    tok = tiny.tokenizer
    for text, record in zip(texts, lm.records):
        assert record.stop == "eos"
        assert record.generated_tokens == len(tok.encode(text))  # no prompt, no EOS padding
        assert 1 <= record.forwards <= 16
    summary = lm.summary()["generate_until"]
    assert summary["generated_tokens"] == sum(len(tok.encode(t)) for t in texts)
    assert summary["tpf"] == pytest.approx(summary["generated_tokens"] / summary["forwards"])
    assert summary["calls"] == 3 and summary["requests"] == len(prompts)
    assert f"|generate_until|{len(prompts)}|" in lm.summary_table()


def test_stop_sequences_and_specials():
    assert cut_at_stops("ab\ncd###e", ["###", "\n"]) == ("ab", "\n")
    assert cut_at_stops("abc", ["x", ""]) == ("abc", None)

    class Tok:
        def decode(self, ids, skip_special_tokens=False):
            return "".join({5: "a", 6: "b", 7: "<eot>", 2: "<eos>"}[i] for i in ids)

    assert decode_answer(Tok(), [5, 6, 7, 5, 2, 2], 2, ["<eot>"], ["<eot>"]) == ("ab", 4, "<eot>")
    assert decode_answer(Tok(), [5, 7, 6, 2, 2, 2], 2, [], ["<eot>"]) == ("ab", 3, "eos")
    assert decode_answer(Tok(), [5, 6], 2, [], []) == ("ab", 2, "length")


def test_loglikelihood_of_one_token_is_the_models_conditional(tiny):
    tok = tiny.tokenizer
    lm = DLMEvalLM(pretrained=tiny, mc_num=3, batch_size=8)
    context, continuation = "copy: ana bo", "ana"
    (ll, greedy), = lm.loglikelihood([Instance("loglikelihood", {}, (context, continuation), 0, ("t", 0, 1))])
    target = tok.encode(continuation)
    assert len(target) == 1
    x = torch.tensor([tok.encode_prompt(context) + [tiny.mask_token_id]])
    with torch.no_grad():
        expected = torch.log_softmax(tiny.model(x).logits[0, -1].double(), dim=-1)[target[0]].item()
    assert ll == pytest.approx(expected, abs=1e-4)
    assert greedy is False


def test_loglikelihood_maps_requests_to_the_estimator(tiny):
    tok = tiny.tokenizer
    lm = DLMEvalLM(pretrained=tiny, mc_num=4, batch_size=5, seed=11, check_greedy=True)
    reqs = [Instance("loglikelihood", {}, ("copy: dex jo bo", "dex jo bo"), 0, ("t", 0, 1)),
            Instance("loglikelihood", {}, ("copy: dex jo bo", "bo jo dex"), 1, ("t", 0, 1))]
    out = lm.loglikelihood(reqs)
    prefix = tok.encode_prompt("copy: dex jo bo")
    pairs = [(prefix, tok.encode("dex jo bo")), (prefix, tok.encode("bo jo dex"))]
    ref = estimate_loglikelihoods(tiny.model, pairs, mask_token_id=tiny.mask_token_id, mc_num=4, rows_per_forward=5,
                                  pad_token_id=tiny.pad_token_id,
                                  generators=[request_generator(11, *pairs[0]), request_generator(11, *pairs[1])])
    assert [o[0] for o in out] == pytest.approx([r.loglikelihood for r in ref], abs=1e-6)
    assert out[0][0] > out[1][0]  # the right copy is the likelier
    assert [o[1] for o in out] == [True, False]  # greedy decoding writes the copy, not its reverse
    assert [r.kind for r in lm.records] == ["loglikelihood", "loglikelihood"]


def test_uniform_noise_model_has_no_likelihood_and_rolling_is_refused():
    loaded = dlm.load("tiny-dgemma")
    lm = DLMEvalLM(pretrained=loaded, batch_size=2)
    with pytest.raises(ValueError, match="uniform-noise model \\(DiffusionGemma family\\).*generate_until"):
        lm.loglikelihood([Instance("loglikelihood", {}, ("copy: a", "a"), 0, ("t", 0, 1))])
    with pytest.raises(ValueError, match="loglikelihood_rolling .* not supported"):
        lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, ("text",), 0, ("t", 0, 1))])
    # its generation runs, and its noise does not make outputs depend on the batch size
    prompts = _prompts()[:4]
    outs = [DLMEvalLM(pretrained=loaded, batch_size=bs).generate_until(_generate_requests(prompts, max_gen_toks=32),
                                                                        disable_tqdm=True) for bs in (1, 4)]
    assert outs[0] == outs[1] and any(outs[0])


@pytest.mark.parametrize("args, message", [
    ({"foo": 1}, "model_args: unknown key 'foo'; valid keys: pretrained"),
    ({"sampler": "nope"}, "model_args: sampler: unknown sampler 'nope'"),
    ({"sampler": "threshold:tau=abc"}, "model_args: sampler: .*option tau takes a number"),
    ({"steps": "abc"}, "model_args: steps must be a whole number >= 1, got 'abc'"),
    ({"temperature": "hot"}, "model_args: temperature must be a finite number"),
    ({"kv_cache": "big"}, "model_args: kv_cache must be one of"),
    ({"check_greedy": 1}, "model_args: check_greedy must be true or false"),
    ({"gen_length": 60, "block_length": 32}, "gen_length \\(60\\) must be a multiple of block_length"),
    ({"batch_size": "auto"}, "automatic batch sizes are not supported"),
])
def test_bad_model_args_name_the_argument(args, message):
    with pytest.raises(ValueError, match=message) as err:
        DLMEvalLM(pretrained="tiny-dlm", **args)
    assert "\n" not in str(err.value)


def test_shipped_task_files_are_what_the_generator_writes():
    from dlm.evaluation.tiny_tasks import expected_files

    for name, text in expected_files().items():
        assert (TASKS_DIR / name).read_text(encoding="utf-8") == text, name
