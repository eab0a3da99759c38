"""`dlm sample` and `dlm models` end to end on the shipped tiny model."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from dlm.cli import main


def run_cli(capsys, *argv):
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_models_lists_the_builtin_name_first(capsys):
    code, out, _ = run_cli(capsys, "models")
    assert code == 0 and out.splitlines()[0].split("\t")[:2] == ["tiny-dlm", "ready"]


def test_sample_json_has_the_promised_fields(capsys):
    code, out, _ = run_cli(capsys, "sample", "--json", "--steps", "16", "--block-length", "32")
    assert code == 0
    data = json.loads(out)
    assert {"text", "tokens", "nfe", "tpf", "seconds"} <= set(data)
    assert data["nfe"] <= 16 and len(data["tokens"]) == 64 and isinstance(data["text"], str)


@pytest.mark.parametrize("mode", ["prompt", "auto"])
def test_sample_with_the_exact_prompt_cache_gives_the_uncached_answer(capsys, mode):
    """The shipped model's prompt ignores the response: `--kv-cache prompt` (and `auto`, which picks
    it there) must print the uncached tokens."""
    argv = ("sample", "--json", "--prompt", "shuffle: cyd uma jo ana", "--steps", "32", "--block-length", "32")
    plain = json.loads(run_cli(capsys, *argv)[1])
    cached = json.loads(run_cli(capsys, *argv, "--kv-cache", mode)[1])
    assert cached["tokens"] == plain["tokens"] and cached["nfe"] == plain["nfe"]


@pytest.mark.parametrize("spec", ["saber:backtrack=always:n=3", "credit:tau=0.8", "hierarchical:low=0.5"])
def test_sample_takes_a_sampler_with_options(capsys, spec):
    code, out, _ = run_cli(capsys, "sample", "--json", "--steps", "64", "--block-length", "32", "--sampler", spec)
    data = json.loads(out)
    assert code == 0 and data["sampler"] == spec and data["nfe"] <= 64 and len(data["tokens"]) == 64


@pytest.mark.parametrize("argv,fragment", [
    (["--gen-length", "30", "--block-length", "8"], "must be a multiple of --block-length (8); try --block-length=6"),
    (["--steps", "2", "--block-length", "16"], "at least the number of blocks"),
    (["--sampler", "nope"], "valid samplers"),
    (["--sampler", "saber:foo=1"], "valid options"),
    (["--sampler", "saber:backtrack=sometimes"], "backtrack must be one of"),
    (["--model", "no-such-model"], "unknown model"),
    (["--temperature", "-1"], "temperature"),
    (["--prompt", "  "], "empty"),
    (["--prompt", "copy: " + "x " * 80], "exceeds the model's context"),
    (["--prompt", "Ünïcode"], "not in the tiny-dlm alphabet"),
])
def test_bad_input_is_one_line_and_exit_code_2(capsys, argv, fragment):
    code, _, err = run_cli(capsys, "sample", *argv)
    assert code == 2
    assert fragment in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_console_script_reports_errors_without_traceback():
    proc = subprocess.run([sys.executable, "-m", "dlm.cli", "sample", "--sampler", "nope"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "valid samplers" in proc.stderr


def test_cli_cache_choices_are_the_engine_modes():
    """The parser keeps its own torch-free copy of the modes; it must not drift from the engine's."""
    from dlm.commands._common import KV_CACHE_CHOICES
    from dlm.decoding_config import KV_CACHE_MODES

    assert KV_CACHE_CHOICES == KV_CACHE_MODES
