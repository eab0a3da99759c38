"""scripts/bench_window_positions.py counts the positions each engine feeds the model."""
import torch

from dlm.bench.harness import (BenchConfig, _Runner, collect_examples, encoded_suite_batches, load_model,
                               parse_sampler_specs, resolve_suite)

from script_loader import load_script  # tests/script_loader.py (tests/ is on sys.path)


def test_cut_window_is_prompt_plus_one_block_at_one_forward_per_block():
    script = load_script("bench_window_positions.py")
    model, tok, ids = load_model("tiny-dlm")
    cfg = BenchConfig(model="tiny-dlm", suite="puzzles", samplers="threshold:cut=1", steps=[2], limit=2,
                      temperature=0.0)
    runner = _Runner(model, tok, cfg, ids)
    examples = collect_examples(resolve_suite("puzzles", None), 2, 0)
    batches = encoded_suite_batches(tok, examples, 16, runner.pad_id, torch.device("cpu"))
    cut, exact = (script.positions_per_row(runner, spec, 2, batches)
                  for spec in parse_sampler_specs("threshold:cut=1,threshold"))
    assert cut["calls"] == exact["calls"] == 1.0  # budget 2: each puzzle fits the first block (EOS stop)
    assert cut["positions"] == cut["prompt"] + 32  # prompt + the first block only
    assert exact["positions"] == exact["prompt"] + 64  # prompt + the whole generation


def test_main_prints_one_row_per_suite_and_sampler(capsys):
    load_script("bench_window_positions.py").main(
        ["--suites", "puzzles", "--samplers", "threshold:cut=1,diffusers-llada2-thr", "--limit", "1"])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| puzzles |")]
    assert len(rows) == 2 and "`diffusers-llada2-thr`" in rows[1]
