"""JSONL task loader: parsing, line-numbered errors, extractors and scoring."""
from __future__ import annotations

import json

import pytest

from dlm.tasks.jsonl import EXTRACTORS, load_jsonl_task, normalize, read_jsonl_examples


def _write(tmp_path, lines, name="mine.jsonl"):
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return path


def test_parses_prompts_answers_ids_and_skips_blank_lines(tmp_path):
    path = _write(tmp_path, [json.dumps({"prompt": "2+2=", "answer": 4, "id": "a"}), "",
                             json.dumps({"prompt": "q2", "answer": "x #### 1,200"})])
    exs = read_jsonl_examples(path)
    assert [(e.prompt, e.answer, e.task) for e in exs] == [("2+2=", "4", "mine"), ("q2", "x #### 1,200", "mine")]
    assert exs[0].meta == {"line": 1, "id": "a"} and exs[1].meta == {"line": 3}
    assert exs[0].input_text == "2+2="  # verbatim: no separator appended


@pytest.mark.parametrize("bad, needle", [
    ("{not json", "not valid JSON"),
    ('["prompt", "answer"]', "expected a JSON object"),
    ('{"prompt": "p"}', 'missing "answer"'),
    ('{"answer": "a"}', 'missing "prompt"'),
    ('{"prompt": "", "answer": "a"}', '"prompt" must be a non-empty string'),
    ('{"prompt": "p", "answer": [1]}', '"answer" must be a string or a number'),
])
def test_malformed_line_reports_its_number(tmp_path, bad, needle):
    path = _write(tmp_path, [json.dumps({"prompt": "p", "answer": "a"}), "", bad])
    with pytest.raises(ValueError) as err:
        read_jsonl_examples(path)
    assert f"{path}:3:" in str(err.value) and needle in str(err.value)


def test_empty_and_missing_files(tmp_path):
    with pytest.raises(ValueError, match="no examples"):
        read_jsonl_examples(_write(tmp_path, [""]))
    with pytest.raises(FileNotFoundError):
        read_jsonl_examples(tmp_path / "nope.jsonl")
    with pytest.raises(ValueError, match="unknown extractor 'nope'"):
        load_jsonl_task(_write(tmp_path, ['{"prompt": "p", "answer": "a"}']), extractor="nope")


@pytest.mark.parametrize("name, text, want", [
    ("boxed", r"so \boxed{\frac{1}{2}} and \boxed{3}", "3"),
    ("boxed", r"\boxed{\frac{1}{2}}", r"\frac{1}{2}"),
    ("boxed", r"\boxed{12", None),
    ("hash", "a 3 b\n#### 1,234", "1,234"),
    ("hash", "no marker 5", None),
    ("last-number", "we get 12 then -3.5.", "-3.5"),
    ("first-line", "\n  ana bo \ncyd", "ana bo"),
    ("exact", "  x y  ", "x y"),
])
def test_extractors(name, text, want):
    assert EXTRACTORS[name](text) == want


def test_scoring_by_extractor(tmp_path):
    path = _write(tmp_path, [json.dumps({"prompt": "p1", "answer": "steps 3+4=7 #### 7"}),
                             json.dumps({"prompt": "p2", "answer": 1200}),
                             json.dumps({"prompt": "p3", "answer": "def f"})])
    hash_task = load_jsonl_task(path, extractor="hash")
    e1, e2, e3 = hash_task.examples("test", n=3)
    assert hash_task.score(e1, "3+4=7 #### 7") == 1.0 and hash_task.score(e1, "#### 8") == 0.0
    assert hash_task.score(e2, "#### $1,200.00") == 1.0
    last = load_jsonl_task(path, extractor="last-number")
    assert last.score(e1, "the answer is 7.") == 1.0 and last.score(e1, "") == 0.0
    contains = load_jsonl_task(path, extractor="contains")
    assert contains.score(e3, "x\ndef f(): pass") == 1.0 and contains.score(e3, "def g") == 0.0
    assert hash_task.examples("test", n=1) == [e1]
    with pytest.raises(ValueError, match="only a 'test' split"):
        hash_task.examples("train", n=1)
    assert normalize("72.0") == "72" and normalize("$1,200") == "1200" and normalize(" ana ") == "ana"


def test_bench_runs_a_jsonl_suite(tmp_path, capsys):
    import torch
    from dlm.cli import main
    from dlm.tiny import TinyCharTokenizer, TinyDLMConfig, TinyDLMModel

    torch.manual_seed(0)
    d = tmp_path / "m"
    TinyDLMModel(TinyDLMConfig(vocab_size=TinyCharTokenizer().vocab_size, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                               intermediate_size=64)).save_pretrained(d)
    TinyCharTokenizer().save_pretrained(d)
    path = _write(tmp_path, [json.dumps({"prompt": "copy: ana bo\n", "answer": "ana bo"})] * 2)
    rc = main(["bench", "--model", str(d), "--suite", f"jsonl:{path}", "--extractor", "first-line",
               "--samplers", "confidence", "--steps", "8", "--gen-length", "8", "--block-length", "8",
               "--out", str(tmp_path / "o"), "--json", "--no-plots"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    summary = json.loads(out.out)
    assert summary["pairs"][0]["n"] == 2 and summary["pairs"][0]["quality_by_task"].keys() == {"mine"}
