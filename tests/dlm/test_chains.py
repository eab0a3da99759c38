"""The `chains` suite: long sequential answers with exact verifiers (issue 33)."""
import pytest

import json

import torch

from dlm.cli import main
from dlm.tasks import SUITES, get_task, suite_gen_length
from dlm.tasks.chains import CHAIN_GEN_LENGTH
from dlm.tiny import CHECKPOINT_DIR, TinyCharTokenizer, TinyDLMConfig, TinyDLMModel


def _running_sum(start, digits):
    out, acc = [], start
    for d in digits:
        acc = (acc + d) % 10
        out.append(acc)
    return out


def test_suite_registered_with_its_length():
    assert SUITES["chains"] == ("running_sum", "follow")
    assert suite_gen_length("chains") == CHAIN_GEN_LENGTH == 128
    assert suite_gen_length("list_edits") == 64 and suite_gen_length("all") == 64
    assert "running_sum" not in SUITES["all"]  # the short suites' benchmarks are unchanged


def test_running_sum_answer_is_the_prefix_sum():
    task = get_task("running_sum")
    for ex in task.examples("train", 50, seed=3):
        start, digits = ex.meta["start"], ex.meta["digits"]
        assert ex.prompt == f"running_sum {start}: {''.join(map(str, digits))}"
        assert [int(c) for c in ex.answer] == _running_sum(start, digits)
        assert 64 <= len(ex.answer) <= 100


def test_follow_answer_walks_a_single_cycle():
    task = get_task("follow")
    for ex in task.examples("train", 50, seed=4):
        succ = ex.meta["successor"]
        # one cycle through every name of the table
        seen, cur = [], ex.meta["start"]
        for _ in succ:
            cur = succ[cur]
            seen.append(cur)
        assert sorted(seen) == sorted(succ)
        chain = ex.answer.split()
        assert 32 <= len(chain) <= 48
        assert chain[0] == succ[ex.meta["start"]]
        assert all(succ[a] == b for a, b in zip(chain, chain[1:]))
        for name, nxt in succ.items():
            assert f"{name}={nxt}" in ex.prompt


@pytest.mark.parametrize("name", SUITES["chains"])
def test_exact_match_scoring(name):
    task = get_task(name)
    ex = task.examples("test", 1, seed=0)[0]
    assert task.score(ex, ex.answer) == 1.0
    assert task.score(ex, ex.answer + "\nmore lines") == 1.0
    wrong = ex.answer[:-1] + ("0" if ex.answer[-1] != "0" else "1") if name == "running_sum" \
        else " ".join(ex.answer.split()[:-1])
    assert task.score(ex, wrong) == 0.0
    assert task.score(ex, "") == 0.0 and task.score(ex, None) == 0.0


@pytest.mark.parametrize("name", SUITES["chains"])
def test_answers_fit_the_generation_length_in_tokens(name):
    tok = TinyCharTokenizer.from_pretrained(CHECKPOINT_DIR)  # the built-in models' tokenizer
    lengths = [len(tok.encode(ex.answer)) for ex in get_task(name).examples("train", 200, seed=5)]
    assert max(lengths) < CHAIN_GEN_LENGTH  # room for at least one EOS
    assert min(lengths) >= 63  # long answers: the point of the suite


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
