"""`dlm bench` keeps its work: SIGINT, a crash or an output folder that turns unwritable mid-run
leave every finished pair on disk, and `--resume` finishes the run with the same pairs, pair for pair,
as a run that was never stopped."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dlm.bench import journal as journal_mod
from dlm.cli import main

ROOT = Path(__file__).resolve().parents[2]
TASK_ARGS = ["bench", "--model", "tiny-dlm", "--suite", "copy", "--limit", "2", "--steps", "4,8", "--gen-length", "16",
             "--block-length", "16", "--samplers", "confidence,threshold", "--no-plots", "--threads", "1"]
ORACLE_ARGS = ["bench", "--suite", "oracle-permutation", "--limit", "8", "--steps", "2,4,8", "--samplers",
               "confidence,random", "--no-plots", "--threads", "1"]
TIMING = ("seconds", "tokens_per_s", "peak_mem_mb", "mem_method")


def _pairs(out: Path) -> list[dict]:
    """The pairs of results.json without their timings (which differ between processes)."""
    pairs = json.loads((out / "results.json").read_text())["pairs"]
    return [{k: v for k, v in p.items() if k not in TIMING} for p in pairs]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """Uninterrupted runs of both argument sets: {name: pairs}."""
    out = {}
    for name, args in (("task", TASK_ARGS), ("oracle", ORACLE_ARGS)):
        folder = tmp_path_factory.mktemp(name)
        assert main(args + ["--out", str(folder)]) == 0
        out[name] = _pairs(folder)
    assert len(out["task"]) == 4 and len(out["oracle"]) == 6
    return out


def _stop_after(monkeypatch, n: int, action) -> None:
    """Make `action()` happen right after the n-th pair of a run has been saved."""
    record, count = journal_mod.Journal.record, [0]

    def patched(self, pair):
        record(self, pair)
        count[0] += 1
        if count[0] == n:
            action()
    monkeypatch.setattr(journal_mod.Journal, "record", patched)


def _partial(out: Path) -> dict:
    return json.loads((out / "results.json").read_text())


def test_sigint_mid_benchmark_then_resume_equals_an_uninterrupted_run(reference, tmp_path, capsys):
    """A real SIGINT (the process signals itself right after its second pair is saved), in a child
    process as Ctrl-C would reach it; then --resume in this process."""
    out = tmp_path / "out"
    child = (
        "import os, signal, sys\n"
        # a shell's background job starts with SIGINT ignored; a terminal's foreground run does not
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "from dlm.bench import journal\n"
        "record, n = journal.Journal.record, [0]\n"
        "def patched(self, pair):\n"
        "    record(self, pair); n[0] += 1\n"
        "    if n[0] == 2: os.kill(os.getpid(), signal.SIGINT)\n"
        "journal.Journal.record = patched\n"
        "from dlm.cli import main\n"
        f"sys.exit(main({TASK_ARGS + ['--out', str(out)]!r}))\n")
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, env=env, timeout=120, cwd=ROOT)
    assert proc.returncode == 130, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "interrupted: wrote" in proc.stderr and "2 finished pairs, 2 missing" in proc.stderr
    partial = _partial(out)
    assert partial["meta"]["incomplete"]["missing_pairs"] == ["threshold@4", "threshold@8"]
    assert _pairs(out) == reference["task"][:2]
    assert (out / "results.csv").read_text().count("\n") == 3  # header + the 2 finished pairs

    assert main(TASK_ARGS + ["--out", str(out), "--resume"]) == 0
    assert "reused 2 of 4 pairs (confidence@4, confidence@8); ran 2" in capsys.readouterr().err
    assert _pairs(out) == reference["task"]
    assert "incomplete" not in _partial(out)["meta"]


def test_keyboard_interrupt_in_an_oracle_suite_then_resume(reference, tmp_path, monkeypatch, capsys):
    out = tmp_path / "out"

    def interrupt():
        raise KeyboardInterrupt
    _stop_after(monkeypatch, 3, interrupt)
    assert main(ORACLE_ARGS + ["--out", str(out)]) == 130
    err = capsys.readouterr().err
    assert "3 finished pairs, 3 missing" in err and "dlm: interrupted" in err
    assert _pairs(out) == reference["oracle"][:3]
    monkeypatch.undo()
    assert main(ORACLE_ARGS + ["--out", str(out), "--resume"]) == 0
    assert "reused 3 of 6 pairs" in capsys.readouterr().err
    assert _pairs(out) == reference["oracle"]


def test_a_crash_mid_run_keeps_the_finished_pairs(reference, tmp_path, monkeypatch, capsys):
    from dlm.bench import harness

    out, calls, run = tmp_path / "out", [0], harness._Runner.run

    def failing(self, *args, **kwargs):  # the warm-up call, then 2 pairs of one batch, then a crash
        calls[0] += 1
        if calls[0] == 4:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return run(self, *args, **kwargs)
    monkeypatch.setattr(harness._Runner, "run", failing)
    with pytest.raises(RuntimeError, match="illegal memory access"):
        main(TASK_ARGS + ["--out", str(out)])
    assert "stopped by RuntimeError: wrote" in capsys.readouterr().err
    assert _pairs(out) == reference["task"][:2]
    monkeypatch.undo()
    assert main(TASK_ARGS + ["--out", str(out), "--resume"]) == 0
    assert _pairs(out) == reference["task"]


def test_output_folder_that_becomes_unwritable_mid_run(reference, tmp_path, monkeypatch, capsys):
    """After the first pair the folder is replaced by a file (a lost mount, a deleted folder): the run
    stops at the next pair with one line, and the journal, once the folder is back, resumes."""
    out, away = tmp_path / "out", tmp_path / "away"

    def break_folder():
        out.rename(away)
        out.write_text("not a folder any more")
    _stop_after(monkeypatch, 1, break_folder)
    assert main(TASK_ARGS + ["--out", str(out)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dlm bench: error: cannot write") and "--resume" in lines[0], lines
    monkeypatch.undo()
    out.unlink()
    away.rename(out)
    assert main(TASK_ARGS + ["--out", str(out), "--resume"]) == 0
    assert "reused 1 of 4 pairs" in capsys.readouterr().err
    assert _pairs(out) == reference["task"]


def _disk_full(journal: Path):
    """The journal's writes fail as on a full disk: its path now leads to /dev/full (ENOSPC on write),
    as root too. Returns the undo (the journal's lines back, as when space is freed)."""
    journal.rename(journal.with_suffix(".kept"))
    journal.symlink_to("/dev/full")
    return lambda: (journal.unlink(), journal.with_suffix(".kept").rename(journal))


def _folder_in_its_place(journal: Path):
    """The journal's path is taken by a folder (open for append: EISDIR), as root too."""
    journal.rename(journal.with_suffix(".kept"))
    journal.mkdir()
    return lambda: (journal.rmdir(), journal.with_suffix(".kept").rename(journal))


def _read_only(journal: Path):
    """chmod 444: only refuses a non-root writer."""
    journal.chmod(0o444)
    return lambda: journal.chmod(0o644)


UNWRITABLE = [
    pytest.param(_disk_full, "No space left on device", id="disk-full",
                 marks=pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full on this system")),
    pytest.param(_folder_in_its_place, "Is a directory", id="folder-in-its-place"),
    pytest.param(_read_only, "Permission denied", id="read-only", marks=pytest.mark.skipif(
        os.name != "posix" or os.geteuid() == 0, reason="root writes through file permissions; the two cases above run as root")),
]


@pytest.mark.parametrize("make_unwritable,message", UNWRITABLE)
def test_journal_that_turns_unwritable_mid_run(reference, tmp_path, monkeypatch, capsys, make_unwritable, message):
    out, undo = tmp_path / "out", []
    _stop_after(monkeypatch, 2, lambda: undo.append(make_unwritable(out / journal_mod.JOURNAL_NAME)))
    assert main(TASK_ARGS + ["--out", str(out)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "--resume" in lines[0], lines
    undo[0]()
    monkeypatch.undo()
    assert main(TASK_ARGS + ["--out", str(out), "--resume"]) == 0
    assert "reused 2 of 4 pairs" in capsys.readouterr().err
    assert _pairs(out) == reference["task"]


def test_resume_refuses_another_configuration_and_a_fresh_run_refuses_unfinished_work(tmp_path, monkeypatch, capsys):
    out = tmp_path / "out"

    def interrupt():
        raise KeyboardInterrupt
    _stop_after(monkeypatch, 1, interrupt)
    assert main(TASK_ARGS + ["--out", str(out)]) == 130
    monkeypatch.undo()
    capsys.readouterr()
    other = [a if a != "4,8" else "4,8,16" for a in TASK_ARGS]
    assert main(other + ["--out", str(out), "--resume"]) == 2
    err = capsys.readouterr().err.strip()
    assert "another configuration (steps: [4, 8] there, [4, 8, 16] now)" in err and len(err.splitlines()) == 1
    assert main(TASK_ARGS + ["--out", str(out)]) == 2  # no --resume: the finished pair would be lost
    assert "unfinished run (1 finished pairs); pass --resume" in capsys.readouterr().err


def test_a_half_written_last_line_is_dropped(reference, tmp_path, capsys):
    """A crash in the middle of a write leaves a partial line: resume keeps the whole lines before it."""
    out = tmp_path / "out"
    assert main(TASK_ARGS + ["--out", str(out)]) == 0
    lines = (out / journal_mod.JOURNAL_NAME).read_text().splitlines(keepends=True)
    pair_lines = [i for i, line in enumerate(lines) if line.startswith('{"pair"')]
    cut = "".join(lines[: pair_lines[2]]) + lines[pair_lines[2]][:40]  # 2 whole pairs, a third cut short
    (out / journal_mod.JOURNAL_NAME).write_text(cut)
    capsys.readouterr()
    assert main(TASK_ARGS + ["--out", str(out), "--resume"]) == 0
    assert "reused 2 of 4 pairs" in capsys.readouterr().err
    assert _pairs(out) == reference["task"]
