"""scripts/train_tiny_dlm.py: a run stopped after its checkpoint and resumed with --resume ends with
the very weights of a run that was never stopped (step, optimizer, clock and RNG restored)."""
from __future__ import annotations

import pytest
import torch

from script_loader import load_script  # tests/script_loader.py (tests/ is on sys.path)

TINY = ["--hidden-size", "32", "--layers", "1", "--heads", "2", "--intermediate", "64", "--batch-size", "4",
        "--tasks", "copy", "--rollout-tasks", "copy", "--word-min-count", "0", "--threads", "1", "--eval-n", "1",
        "--log-every", "100"]


@pytest.fixture(scope="module")
def train():
    return load_script("train_tiny_dlm.py").main


def _state(path):
    return torch.load(path / "trainer_state.pt", weights_only=False)


def test_resume_continues_bit_for_bit(train, tmp_path):
    n = torch.get_num_threads()
    try:
        train(TINY + ["--out", str(tmp_path / "whole"), "--max-steps", "4"])
        train(TINY + ["--out", str(tmp_path / "split"), "--max-steps", "2", "--save-every-steps", "1"])
        assert _state(tmp_path / "split")["step"] == 2
        train(TINY + ["--out", str(tmp_path / "split"), "--max-steps", "4", "--resume"])
    finally:
        torch.set_num_threads(n)  # the script sets its own thread count
    whole, split = _state(tmp_path / "whole"), _state(tmp_path / "split")
    assert whole["step"] == split["step"] == 4
    for key, value in whole["model"].items():
        assert torch.equal(value, split["model"][key]), key


def test_resume_refuses_other_options_and_a_missing_or_damaged_state(train, tmp_path, capsys):
    n = torch.get_num_threads()
    try:
        with pytest.raises(SystemExit):
            train(TINY + ["--out", str(tmp_path / "none"), "--max-steps", "2", "--resume"])
        assert "no " in capsys.readouterr().err
        train(TINY + ["--out", str(tmp_path / "run"), "--max-steps", "1"])
        with pytest.raises(SystemExit):
            train(TINY + ["--out", str(tmp_path / "run"), "--max-steps", "2", "--resume", "--lr", "1e-2"])
        assert "--lr 0.0015 there, 0.01 now" in capsys.readouterr().err
        state = tmp_path / "run" / "trainer_state.pt"
        state.write_bytes(state.read_bytes()[:100])
        with pytest.raises(SystemExit):
            train(TINY + ["--out", str(tmp_path / "run"), "--max-steps", "2", "--resume"])
        assert "the checkpoint is damaged" in capsys.readouterr().err
    finally:
        torch.set_num_threads(n)
