"""`dlm image` end to end (tiny step counts) and its usage errors."""
import json

import pytest

from dlm.cli import main


def test_image_writes_pngs_and_json(tmp_path, capsys):
    out = tmp_path / "img"
    rc = main(["image", "--steps", "2", "--digits", "3,8", "--num-samples", "3", "--out", str(out), "--json"])
    assert rc == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["digits"] == [3, 8, 3] and summary["nfe"] == 2
    assert len(summary["files"]) == 3
    for f in summary["files"] + [summary["grid"]]:
        assert (tmp_path / "img").exists() and open(f, "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def test_image_text_output_and_search(tmp_path, capsys):
    rc = main(["image", "--steps", "2", "--digits", "5", "--search", "random", "--budget", "6", "--out", str(tmp_path)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "NFE 6" in text and "grid.png" in text
    assert (tmp_path / "digit_000_5.png").stat().st_size > 0


def test_image_with_the_learned_solver(tmp_path, capsys):
    rc = main(["image", "--solver", "bespoke", "--steps", "8", "--digits", "3,7", "--out", str(tmp_path), "--json"])
    assert rc == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["solver"] == "bespoke" and summary["nfe"] == 8


@pytest.mark.parametrize("argv", [
    ["image", "--solver", "no-such-solver"],
    ["image", "--digits", "1,10"],
    ["image", "--digits", "a"],
    ["image", "--solver", "diffusers-dpm", "--steps", "1"],
    ["image", "--solver", "bespoke", "--steps", "7"],  # no learned table for 7 steps
    ["image", "--steps", "0"],
    ["image", "--search", "random", "--steps", "4", "--budget", "3"],
    ["image", "--budget", "10"],
])
def test_bad_input_exits_2(argv, tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:  # argparse errors exit directly
        rc = main(argv + ["--out", str(tmp_path)])
        raise SystemExit(rc)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err and len(err.splitlines()) == 1
