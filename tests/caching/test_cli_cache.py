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
