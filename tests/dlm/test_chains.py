"""The `chains` suite: long sequential answers with exact verifiers (issue 33)."""
import pytest

import json

import torch

from dlm.cli import main
from dlm.tasks import NAMES, SUITES, get_task, suite_gen_length
from dlm.tasks.chains import CHAIN_GEN_LENGTH
from dlm.tiny import CHECKPOINT_DIR, TinyCharTokenizer, TinyDLMConfig, TinyDLMModel


def test_suite_registered_with_its_length():
    assert SUITES["chains"] == ("count", "walk")
    assert suite_gen_length("chains") == CHAIN_GEN_LENGTH == 128
    assert suite_gen_length("list_edits") == 64 and suite_gen_length("all") == 64
    assert not set(SUITES["chains"]) & set(SUITES["all"])  # the short suites' benchmarks are unchanged
    assert SUITES["chains-hard"] == ("sum", "fib") and suite_gen_length("chains-hard") == 128


def test_running_sum_answer_adds_the_next_prompt_digit_mod_10():
    task = get_task("sum")
    for ex in task.examples("train", 50, seed=6):
        digits = [int(d) for d in ex.prompt.removeprefix("sum: ").split()]
        sums = [int(v) for v in ex.answer.split()]
        assert digits == ex.meta["digits"] and len(sums) == len(digits) == ex.meta["n"]
        assert 40 <= len(sums) <= 56 and sums[0] == digits[0]
        assert all(s == (prev + d) % 10 for prev, s, d in zip(sums, sums[1:], digits[1:]))


def test_fibonacci_answer_adds_the_two_items_before_mod_10():
    task = get_task("fib")
    for ex in task.examples("train", 50, seed=7):
        a, b = ex.meta["start"]
        assert ex.prompt == f"fib {ex.meta['n']} from {a} {b}:"
        values = [int(v) for v in ex.answer.split()]
        assert len(values) == ex.meta["n"] and 40 <= len(values) <= 56 and values[:2] == [a, b]
        assert all(z == (x + y) % 10 for x, y, z in zip(values, values[1:], values[2:]))


def test_a_training_curriculum_widens_one_instance_not_the_suite():
    """train_tiny_dlm --chains-min-items lowers min_items on its own task objects; the suite's
    examples (what the benchmark scores) keep their range."""
    short = get_task("sum")
    short.min_items = 4
    assert min(ex.meta["n"] for ex in short.examples("train", 200, seed=9)) < 40
    assert min(ex.meta["n"] for ex in get_task("sum").examples("train", 200, seed=9)) >= 40


def test_count_answer_adds_the_step_mod_10():
    task = get_task("count")
    for ex in task.examples("train", 50, seed=3):
        start, step, n = ex.meta["start"], ex.meta["step"], ex.meta["n"]
        assert ex.prompt == f"count {n} from {start} by {step}:"
        values = [int(v) for v in ex.answer.split()]
        assert len(values) == n and 40 <= n <= 56 and values[0] == start
        assert all(b == (a + step) % 10 for a, b in zip(values, values[1:]))
        assert len(set(values[:10])) == 10  # a step coprime to 10 visits every digit


def test_walk_answer_steps_around_the_sorted_ring():
    task = get_task("walk")
    ring = sorted(NAMES)
    for ex in task.examples("train", 50, seed=4):
        names = ex.answer.split()
        assert len(names) == ex.meta["n"] and 40 <= len(names) <= 56 and names[0] == ex.meta["start"]
        prev = ring.index(ex.meta["start"])
        for name in names[1:]:
            assert ring.index(name) == (prev + ex.meta["step"]) % len(ring)
            prev = ring.index(name)
        assert len(set(names[:24])) == 24  # the step is coprime to 24


@pytest.mark.parametrize("name", SUITES["chains"] + SUITES["chains-hard"])
def test_exact_match_scoring(name):
    task = get_task(name)
    ex = task.examples("test", 1, seed=0)[0]
    assert task.score(ex, ex.answer) == 1.0
    assert task.score(ex, ex.answer + "\nmore lines") == 1.0
    wrong = " ".join(ex.answer.split()[:-1])  # one item short
    assert task.score(ex, wrong) == 0.0
    assert task.score(ex, "") == 0.0 and task.score(ex, None) == 0.0


@pytest.mark.parametrize("name", SUITES["chains"] + SUITES["chains-hard"])
def test_answers_fit_the_generation_length_in_tokens(name):
    tok = TinyCharTokenizer.from_pretrained(CHECKPOINT_DIR)  # the built-in models' tokenizer
    lengths = [len(tok.encode(ex.answer)) for ex in get_task(name).examples("train", 200, seed=5)]
    assert max(lengths) < CHAIN_GEN_LENGTH  # room for at least one EOS
    assert min(lengths) >= 79  # long answers: the point of the suite


def test_bench_uses_the_suites_own_generation_length(tmp_path):
    torch.manual_seed(0)
    tok = TinyCharTokenizer()
    cfg = TinyDLMConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=320)
    d = tmp_path / "tiny"
    TinyDLMModel(cfg).eval().save_pretrained(d)
    tok.save_pretrained(d)
    args = ["bench", "--model", str(d), "--suite", "chains", "--samplers", "threshold", "--steps", "8",
            "--limit", "1", "--no-plots"]

    def gen_length(out):
        return json.loads((out / "results.json").read_text())["config"]["gen_length"]

    assert main(args + ["--out", str(tmp_path / "a")]) == 0
    assert gen_length(tmp_path / "a") == 128
    assert main(args + ["--out", str(tmp_path / "b"), "--gen-length", "64"]) == 0  # an explicit length wins
    assert gen_length(tmp_path / "b") == 64


@pytest.mark.parametrize("name,task", [("tiny-dlm-chains", "count"), ("tiny-dlm-chains-hard", "sum")])
def test_builtin_chains_model_loads_both_ways_and_answers_a_chain(name, task):
    """The shipped chains models: dlm.load and transformers' AutoModel give the same model, its
    positions cover a chains prompt plus 128 tokens, and it writes a chain's first items right."""
    import dlm
    from transformers import AutoModel

    from dlm.tiny import BUILTIN_MODELS

    path = BUILTIN_MODELS[name]
    model, tok = dlm.load(name)
    assert tok.vocab_size == model.config.vocab_size and model.config.max_position_embeddings >= 320
    auto = AutoModel.from_pretrained(path).eval()
    ex = get_task(task).examples("test", 1, seed=0)[0]
    ids = torch.tensor([tok.encode_prompt(ex.prompt)])
    x = torch.cat([ids, torch.full((1, 128), tok.mask_token_id)], 1)
    torch.testing.assert_close(auto(x).logits, model(x).logits)
    out = dlm.generate(model, ids, gen_length=128, block_length=32, steps=128, sampler="confidence")
    first = tok.decode(out.sequences[0, ids.shape[1]:ids.shape[1] + 6].tolist())
    assert first.split()[:2] == ex.answer.split()[:2]  # the start copied, then one step of the rule
