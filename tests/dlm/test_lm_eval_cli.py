"""`dlm eval` (the harness's command line with `dlm` registered) and scripts/dlm_eval_table.py, offline."""
import json
import os

import pytest

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from dlm.cli import main  # noqa: E402
from dlm.commands.eval import harness_argv  # noqa: E402
from dlm.evaluation import TASKS_DIR  # noqa: E402
from script_loader import load_script  # noqa: E402  (tests/ is on sys.path)


def test_dlm_eval_runs_a_task_and_logs_counts_beside_the_samples(tmp_path, capsys):
    out = tmp_path / "out"
    code = main(["eval", "--model_args", "pretrained=tiny-dlm,sampler=threshold,steps=16,gen_length=32,block_length=32",
                 "--tasks", "dlm_tiny_copy", "--limit", "3", "--batch_size", "2", "--output_path", str(out),
                 "--log_samples"])
    printed = capsys.readouterr().out
    assert code == 0
    assert "|dlm_tiny_copy|" in printed.replace(" ", "")  # the harness's table
    assert "|generate_until|3|" in printed  # ours under it
    [samples] = list(out.glob("*/samples_dlm_tiny_copy_*.jsonl"))
    [counts] = list(samples.parent.glob("dlm_requests_*.jsonl"))
    assert counts.name.split("_", 2)[2] == samples.name.split("_", 4)[4]  # the same run stamp
    resps = {s["doc_id"]: s["resps"][0][0] for s in map(json.loads, samples.read_text().splitlines())}
    records = [json.loads(line) for line in counts.read_text().splitlines()]
    assert sorted(r["doc_id"] for r in records) == [0, 1, 2]
    import dlm

    tok = dlm.load("tiny-dlm").tokenizer
    for r in records:  # generated tokens are the answer's tokens: no prompt, no EOS padding
        assert r["task"] == "dlm_tiny_copy" and r["stop"] == "eos"
        assert r["generated_tokens"] == len(tok.encode(resps[r["doc_id"]])) > 0
        assert r["tpf"] == pytest.approx(r["generated_tokens"] / r["forwards"])


@pytest.mark.parametrize("model_args, message", [
    ("pretrained=tiny-dlm,foo=1", "model_args: unknown key 'foo'"),
    ("pretrained=tiny-dlm,sampler=nope", "unknown sampler 'nope'"),
    ("pretrained=tiny-dlm,steps=abc", "steps must be a whole number"),
])
def test_dlm_eval_bad_model_args_are_one_line(model_args, message, capsys):
    assert main(["eval", "--model_args", model_args, "--tasks", "dlm_tiny_copy"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dlm eval: error:") and message in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_dlm_eval_defaults_are_added_only_when_missing():
    argv = harness_argv(["--model_args", "pretrained=tiny-dlm", "--tasks", "x"])
    assert argv[:3] == ["run", "--model", "dlm"] and argv[argv.index("--include_path") + 1] == str(TASKS_DIR)
    assert "--device" in argv
    argv = harness_argv(["run", "--model", "hf", "--include_path", "/x", "--device", "cuda:1", "--tasks", "x"])
    assert argv == ["run", "--model", "hf", "--include_path", "/x", "--device", "cuda:1", "--tasks", "x"]
    assert harness_argv(["ls", "tasks"]) == ["ls", "tasks"]


def test_eval_table_script_writes_table_json_and_plot(tmp_path, capsys):
    script = load_script("dlm_eval_table.py")
    out = tmp_path / "table"
    code = script.main(["--model", "tiny-dlm", "--tasks", "dlm_tiny_copy:0", "--run", "sampler=confidence,steps=gen",
                        "--run", "sampler=threshold", "--gen-lengths", "32", "--block-length", "32", "--limit", "3",
                        "--batch-size", "3", "--local-tasks-only", "--out", str(out)])
    assert code == 0
    table = json.loads((out / "table.json").read_text())
    base, fast = table["rows"]
    assert base["run"] == "sampler=confidence,steps=gen" and base["speedup"] == 1.0 and base["tpf_ratio"] == 1.0
    assert base["model_args"]["steps"] == 32 and fast["model_args"]["steps"] == 32  # steps=gen is the default
    assert base["requests"] == fast["requests"] == 3
    assert base["tpf"] <= 1.0 < fast["tpf"]  # one token per step at most; threshold commits several
    assert fast["tpf_ratio"] == pytest.approx(fast["tpf"] / base["tpf"])
    assert fast["speedup"] == pytest.approx(fast["tokens_per_s"] / base["tokens_per_s"])
    assert all(0 <= r["accuracy"] <= 100 and r["metric"] == "exact_match,none" for r in table["rows"])
    md = (out / "table.md").read_text()
    assert "python scripts/dlm_eval_table.py --model tiny-dlm" in md and md.count("|dlm_tiny_copy|32|") == 2
    assert (out / "accuracy_vs_tpf.png").read_bytes()[:4] == b"\x89PNG"


def test_eval_table_script_refuses_lengths_in_a_run(capsys):
    script = load_script("dlm_eval_table.py")
    with pytest.raises(ValueError, match="gen_length comes from the script's options"):
        script.parse_run("sampler=threshold,gen_length=64")
    assert script.parse_tasks("gsm8k:5,humaneval") == [("gsm8k", 5), ("humaneval", None)]
    assert script.headline_metric({"exact_match,none": 0.5, "exact_match,strict-match": 0.25,
                                   "exact_match_stderr,none": 0.1, "alias": "x"}) == ("exact_match,strict-match", 0.25)
