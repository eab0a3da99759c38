"""One consistent command line: the same defaults as the API, help texts for both model families,
whole sentences in `dlm models --samplers`, progress bars that follow the terminal."""
from __future__ import annotations

import copy
import inspect
import sys

import pytest

import dlm
from dlm.cli import build_parser, main
from dlm.commands.models import first_sentence


def _subparsers():
    parser = build_parser()
    action = next(a for a in parser._actions if a.dest == "command")
    return action.choices


def _option(subparser, flag):
    return next(a for a in subparser._actions if flag in a.option_strings)


def test_kv_cache_defaults_to_auto_everywhere():
    subs = _subparsers()
    with_kv = [name for name, p in subs.items() if any("--kv-cache" in a.option_strings for a in p._actions)]
    assert {"sample", "bench"} <= set(with_kv)
    assert all(_option(subs[name], "--kv-cache").default == "auto" for name in with_kv)
    assert inspect.signature(dlm.generate).parameters["kv_cache"].default == "auto"
    assert inspect.signature(dlm.DLMPipeline.__call__).parameters["kv_cache"].default == "auto"
    from dlm.bench import BenchConfig
    assert BenchConfig().kv_cache == "auto"


def test_sample_help_covers_both_families_with_their_defaults():
    sample = _subparsers()["sample"]
    assert "uniform-noise" in sample.description and "masked" in sample.description
    for flag, fragments in {"--gen-length": ["64 on a masked model", "max_new_tokens"],
                            "--block-length": ["masked model", "canvas length on DiffusionGemma"],
                            "--steps": ["masked model", "max_denoising_steps"],
                            "--sampler": ["threshold on a masked model", "DiffusionGemma"],
                            "--kv-cache": ["DiffusionGemma", "(default: auto)"]}.items():
        text = _option(sample, flag).help
        assert all(f in text for f in fragments), (flag, text)
    assert _option(sample, "--gen-length").default is None  # None: the family's own default


def test_pipeline_gen_length_default_is_the_family_default():
    """On DiffusionGemma the default length is the generation config's max_new_tokens (48 for
    tiny-dgemma: 3 canvases of 16), not the masked models' 64 (which would be 4 canvases)."""
    pipe = dlm.DLMPipeline.from_pretrained("tiny-dgemma")
    gc = copy.deepcopy(pipe.model.generation_config)
    gc.eos_token_id = 1  # an id the model never produces, so every planned canvas runs
    out = pipe("copy: bo jo", generation_config=gc)
    assert out.sequences.shape[1] - out.prompt_length == gc.max_new_tokens == 48
    masked = dlm.DLMPipeline.from_pretrained("tiny-dlm")
    assert masked("copy: bo jo", eos_early_stop=False).sequences.shape[1] - masked.encode(["copy: bo jo"])[0].shape[1] == 64


def test_first_sentence_keeps_citations_whole():
    assert first_sentence("Credit decoding (Wang et al., 2025, \"X: Y\nZ\"), as dInfer runs it.\n\nMore.") == \
        "Credit decoding (Wang et al., 2025, \"X: Y Z\"), as dInfer runs it."
    assert first_sentence("One. Two.") == "One."
    assert first_sentence("No period at all") == "No period at all"


def test_models_samplers_prints_whole_first_sentences(capsys):
    from samplers import SAMPLERS

    assert main(["models", "--samplers"]) == 0
    lines = dict(line.split("\t", 1) for line in capsys.readouterr().out.splitlines())
    for name in SAMPLERS:
        doc = sys.modules[SAMPLERS[name].__module__].__doc__
        assert lines[name] == first_sentence(doc) and lines[name].endswith("."), name
        assert len(lines[name]) > len(doc.strip().splitlines()[0]) or doc.strip().splitlines()[0].endswith("."), name


@pytest.mark.parametrize("command", ["sample", "bench", "image"])
def test_progress_follows_the_terminal_unless_forced(command):
    parser = build_parser()
    base = [command]
    assert parser.parse_args(base).progress is None  # None: on when stderr is a terminal
    assert parser.parse_args(base + ["--progress"]).progress is True
    assert parser.parse_args(base + ["--no-progress"]).progress is False


def test_show_progress_is_on_for_a_terminal_only(monkeypatch):
    from dlm._progress import show_progress

    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    assert show_progress(None) and not show_progress(False)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False, raising=False)
    assert not show_progress(None) and show_progress(True)
