"""`dlm image --cache`: a cached run gives the same images twice; bad specs are one-line usage errors."""
import json

import pytest

from dlm.cli import main


@pytest.mark.parametrize("spec", ["tgate:gate_step=3", "forecast:interval=2,warmup_steps=2"])
def test_image_cache_runs_and_repeats(tmp_path, capsys, spec):
    argv = ["image", "--steps", "6", "--digits", "3,8", "--cache", spec, "--json"]
    runs = []
    for k in range(2):
        assert main(argv + ["--out", str(tmp_path / str(k))]) == 0
        runs.append(json.loads(capsys.readouterr().out))
    assert runs[0]["cache"] == spec and runs[0]["nfe"] == 6
    assert [open(f, "rb").read() for f in runs[0]["files"]] == [open(f, "rb").read() for f in runs[1]["files"]]


@pytest.mark.parametrize("spec,msg", [("nope", "unknown cache"), ("block:threshold=x", "must be a float"),
                                      ("deepcache:interval=0", "interval must be >= 1"),
                                      ("forecast:tolerance=0.1,threshold=0.1", "set one of them")])
def test_image_cache_bad_spec(tmp_path, capsys, spec, msg):
    assert main(["image", "--steps", "2", "--cache", spec, "--out", str(tmp_path)]) != 0
    err = capsys.readouterr().err
    assert msg in err and "Traceback" not in err


def _images(tmp_path, capsys, name, extra):
    argv = ["image", "--steps", "6", "--digits", "3,8", "--json", "--out", str(tmp_path / name)] + extra
    assert main(argv) == 0
    return [open(f, "rb").read() for f in json.loads(capsys.readouterr().out)["files"]]


def test_image_forecast_counts_its_schedule_from_this_runs_steps(tmp_path, capsys):
    filled = _images(tmp_path, capsys, "a", ["--cache", "forecast:interval=2"])
    assert filled == _images(tmp_path, capsys, "b", ["--cache", "forecast:interval=2,num_steps=6"])
    assert filled != _images(tmp_path, capsys, "c", ["--cache", "forecast:interval=2,num_steps=0"])
    # a PRK warm-up evaluates some timesteps twice: 6 steps are 9 denoiser steps, and the run completes
    _images(tmp_path, capsys, "d", ["--cache", "forecast:interval=2", "--solver", "pndm"])
