"""A newcomer's first hour (issue 52): threads, quiet output, one set of defaults, the last rough edges.

Each test names the item of the issue it guards and fails when that item comes back.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import dlm
from dlm.cli import build_parser, main as cli_main
from dlm.commands import _common
from dlm.decoding_config import DEFAULT_BLOCK_LENGTH, DEFAULT_GEN_LENGTH, default_block_length
from dlm.outputs import NonFiniteLogitsError
from toy_models import ToyDLM

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tiny():
    return dlm.load("tiny-dlm")


def cli(capsys, *argv):
    code = cli_main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(code, err, fragment):
    assert code == 2, err
    assert fragment in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err


# ------------------------------------------------------------------ 1. threads
def _subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_every_computing_command_takes_threads():
    commands = _subcommands()
    for name, sub in commands.items():
        has = "--threads" in sub._option_string_actions
        # `dlm models` only lists, and stays torch-free; `dlm eval` passes every argument to the harness
        # (DLM_THREADS sets its threads)
        assert has == (name not in ("models", "eval")), name
    assert {"sample", "bench", "image", "train-joint"} <= set(commands)


@pytest.mark.parametrize("flag, env, model, device, expected", [
    (3, "2", "tiny-dlm", "cpu", (3, "--threads")),                    # the flag wins
    (None, "2", "tiny-dlm", "cpu", (2, "DLM_THREADS")),               # then the environment
    (None, None, "tiny-dlm", "cpu", (1, "built-in model")),           # built-ins: one thread
    (None, None, "tiny-dgemma", "cpu", (1, "built-in model")),
    (None, None, "oracle-permutation", "cpu", (1, "built-in model")),
    (None, None, "owner/some-8b", "cpu", (None, "torch's default")),  # a real model keeps every core
    (None, None, "tiny-dlm", "cuda", (None, "torch's default")),      # the CPU threads matter little there
])
def test_thread_count_precedence(monkeypatch, flag, env, model, device, expected):
    monkeypatch.delenv(_common.THREADS_ENV, raising=False)
    if env is not None:
        monkeypatch.setenv(_common.THREADS_ENV, env)
    args = argparse.Namespace(threads=flag, model=model, device=device)
    assert _common.requested_threads(args) == expected


def test_dlm_image_keeps_two_threads_for_its_model(monkeypatch):
    """The digits transformer is faster on two threads than on one (docs/dlm.md, "Threads")."""
    monkeypatch.delenv(_common.THREADS_ENV, raising=False)
    args = build_parser().parse_args(["image"])
    assert _common.requested_threads(args) == (min(2, os.cpu_count() or 1), "built-in model")
    args = build_parser().parse_args(["image", "--threads", "1"])
    assert _common.requested_threads(args) == (1, "--threads")


def test_train_joint_keeps_torchs_threads(monkeypatch):
    """Training batches ran faster on every core (docs/dlm.md, "Threads")."""
    monkeypatch.delenv(_common.THREADS_ENV, raising=False)
    args = build_parser().parse_args(["train-joint", "--model", "tiny-dlm"])
    assert _common.requested_threads(args) == (None, "torch's default")


@pytest.mark.parametrize("value", ["x", "0", "-2", "1.5"])
def test_bad_dlm_threads_is_one_line(capsys, monkeypatch, value):
    monkeypatch.setenv(_common.THREADS_ENV, value)
    code, _, err = cli(capsys, "sample")
    one_line_error(code, err, f"DLM_THREADS={value!r}: expected a positive integer")


def test_summary_line_shows_threads_and_both_times_and_main_restores_threads(capsys, monkeypatch):
    monkeypatch.delenv(_common.THREADS_ENV, raising=False)
    before = torch.get_num_threads()
    code, _, err = cli(capsys, "sample", "--threads", "3")
    assert code == 0 and err.rstrip().endswith("| 3 threads]"), err
    assert "decoding " in err and " s in all |" in err
    assert torch.get_num_threads() == before  # the caller's count comes back
    code, out, _ = cli(capsys, "sample", "--json")
    record = json.loads(out)
    assert record["threads"] == 1 and record["seconds_total"] >= record["seconds"] > 0


# ------------------------------------------------------------------ 2. quiet
class _Terminal(io.StringIO):
    def isatty(self):
        return True


@pytest.mark.parametrize("name", ["tiny-dlm", "tiny-dgemma"])
def test_no_loading_bar_for_built_in_models_even_on_a_terminal(monkeypatch, name):
    term = _Terminal()
    monkeypatch.setattr(sys, "stderr", term)
    dlm.load(name)
    assert "Loading weights" not in term.getvalue()


def test_checkpoint_loading_bar_follows_progress(monkeypatch):
    """A checkpoint folder (here the built-in DiffusionGemma's, given as a path) shows transformers' bar on a
    terminal, and none with progress=False (`--no-progress`)."""
    from dlm.tiny import BUILTIN_MODELS

    path = BUILTIN_MODELS["tiny-dgemma"]
    term = _Terminal()
    monkeypatch.setattr(sys, "stderr", term)
    dlm.load(path, progress=False)
    assert "Loading weights" not in term.getvalue()
    dlm.load(path)
    assert "Loading weights" in term.getvalue()  # the check above can see a bar


def test_plain_dlm_sample_prints_only_its_answer_and_summary():
    """A fresh process, as a user runs it: no third-party warning (torchvision's image extension, in the
    environment the README's test command makes) and no bar; stderr is the summary line alone."""
    env = {k: v for k, v in os.environ.items() if k != _common.THREADS_ENV}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    run = subprocess.run([sys.executable, "-m", "dlm.cli", "sample"], capture_output=True, text=True, cwd=ROOT,
                         env=env, timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout == "bo fay gus ivy tom wes\n"
    lines = run.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("[tiny-dlm | threshold |"), run.stderr


class _NoNetwork:
    """Records every attempt to reach a host, whatever HTTP library is installed: the probe's TCP
    connection, and the name lookup any request starts with (which then fails, as offline)."""

    def __init__(self, monkeypatch):
        import socket

        self.connects, self.lookups = [], []

        def connect(address, *a, **k):
            self.connects.append(address)
            raise OSError("no route to host")

        def lookup(host, *a, **k):
            self.lookups.append(host)
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

        monkeypatch.setattr(socket, "create_connection", connect)
        monkeypatch.setattr(socket, "getaddrinfo", lookup)


def test_hub_id_offline_fails_at_once_without_retries(monkeypatch):
    from huggingface_hub import constants

    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    # huggingface_hub reads HF_HUB_OFFLINE once, when first imported: a test that set it then would leave it on
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    net = _NoNetwork(monkeypatch)
    with pytest.raises(ValueError, match="cannot be reached and it is not in the local Hugging Face cache"):
        dlm.load("no-such-owner/no-such-model")
    # our probe, and at most huggingface_hub's own one-off fetch of its agent registry (once a process):
    # transformers' file request, tried six times over ~27 s before, is never made
    assert 1 <= len(net.connects) <= 2 and net.lookups == [], net.connects


def test_hub_id_with_hf_hub_offline_does_not_even_probe(monkeypatch, capsys):
    from huggingface_hub import constants

    net = _NoNetwork(monkeypatch)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # as when it is set before the process starts
    code, _, err = cli(capsys, "sample", "--model", "no-such-owner/no-such-model")
    one_line_error(code, err, "offline mode is set (HF_HUB_OFFLINE) and it is not in the local Hugging Face cache")
    assert net.connects == [] and net.lookups == []


# ------------------------------------------------------------------ 4. one set of defaults
def test_default_lengths_are_the_constants():
    assert (DEFAULT_GEN_LENGTH, DEFAULT_BLOCK_LENGTH) == (64, 32)
    assert default_block_length(64) == 32 and default_block_length(128) == 32
    assert default_block_length(48) == 48 and default_block_length(16) == 16  # one block, never refused


def _blocks_visited(model, ids, **kw) -> set[int]:
    seen = set()
    dlm.generate(model, ids, sampler="confidence", eos_early_stop=False, callback=lambda r: seen.add(r.block), **kw)
    return seen


def test_generate_pipeline_and_sample_default_to_32_token_blocks(tiny, capsys):
    model, tok = tiny
    ids = torch.tensor([tok.encode_prompt("reverse: ana bo cyd tom")])
    assert _blocks_visited(model, ids) == {0, 1}                 # 64 tokens in blocks of 32
    assert _blocks_visited(model, ids, gen_length=48) == {0}     # 48: one block
    default = dlm.generate(model, ids, sampler="confidence", eos_early_stop=False)
    explicit = dlm.generate(model, ids, sampler="confidence", eos_early_stop=False, block_length=32)
    assert torch.equal(default.sequences, explicit.sequences)
    pipe = dlm.DLMPipeline(model, tok)
    seen = set()
    pipe("reverse: ana bo cyd tom", sampler="confidence", eos_early_stop=False, callback=lambda r: seen.add(r.block))
    assert seen == {0, 1}
    code, out, _ = cli(capsys, "sample", "--prompt", "reverse: ana bo cyd tom", "--sampler", "confidence", "--json")
    record = json.loads(out)
    assert code == 0 and (record["gen_length"], record["block_length"], record["steps"]) == (64, 32, 64)


def test_bench_defaults_to_the_same_lengths():
    from dlm.bench import BenchConfig
    from dlm.bench.harness import model_lengths

    cfg = BenchConfig()
    assert (cfg.gen_length, cfg.block_length) == (DEFAULT_GEN_LENGTH, DEFAULT_BLOCK_LENGTH)
    assert model_lengths(ToyDLM()) == (DEFAULT_GEN_LENGTH, DEFAULT_BLOCK_LENGTH)


@pytest.mark.parametrize("argv, header", [
    ((), {"family": "masked", "gen_length": 64, "block_length": 32, "steps": 64}),
    (("--gen-length", "48", "--steps", "12"), {"gen_length": 48, "block_length": 48, "steps": 12}),
    (("--model", "tiny-dgemma"), {"family": "uniform-noise", "gen_length": 48, "block_length": 16, "steps": 48}),
    (("--model", "tiny-dgemma", "--sampler", "confidence"), {"gen_length": 48, "block_length": 16, "steps": 48}),
])
def test_record_header_stores_the_values_used(capsys, tmp_path, argv, header):
    from dlm.live import read_frames

    path = tmp_path / "run.jsonl"
    code, _, err = cli(capsys, "sample", "--record", str(path), *argv)
    assert code == 0, err
    stored, frames = read_frames(path)
    assert {k: stored[k] for k in header} == header and frames
    assert None not in (stored["gen_length"], stored["block_length"], stored["steps"])


def test_dgemma_record_steps_is_its_rules_budget(capsys, tmp_path):
    """transformers' own rule: max_denoising_steps per canvas, times the canvases (not one token per step)."""
    from dlm.live import read_frames
    from dlm.engine.uniform.plan import resolve_generation_config

    path = tmp_path / "run.jsonl"
    assert cli(capsys, "sample", "--model", "tiny-dgemma", "--record", str(path))[0] == 0
    model = dlm.load("tiny-dgemma").model
    per_canvas = resolve_generation_config(model, None).max_denoising_steps
    assert read_frames(path)[0]["steps"] == per_canvas * 3  # 48 tokens = 3 canvases of 16


def _bench_result(budgets):
    from dlm.bench.harness import BenchResult, PairResult, summarize_targets

    pairs = [PairResult(sampler="confidence", budget=b, engine="dlm", kv_cache="none", n=4, quality=q,
                        quality_by_task={}, nfe=b, nfe_per_call=b, tpf=64 / b, tokens_per_s=1.0, seconds=b / 8,
                        forward_tokens=0, peak_mem_mb=None, mem_method="x") for b, q in budgets]
    result = BenchResult(config={"gen_length": 64, "suite": "list_edits", "model": "tiny-dlm", "block_length": 32,
                                 "batch_size": 4}, meta={"prompts": 4}, pairs=pairs)
    result.meta["targets"] = summarize_targets(result)
    return result


def test_bench_targets_heading_names_only_runs_that_exist():
    from dlm.bench.report import format_table

    with_reference = format_table(_bench_result([(8, 70.0), (64, 71.0)]))
    assert "within 1 point of the sampler's steps=64 run (a budget of one forward per token)" in with_reference
    without = format_table(_bench_result([(8, 70.0), (16, 71.0)]))
    assert "steps=64" not in without and "gen_length run" not in without
    assert "within 1 point of the sampler's largest-budget run (ref q@steps)" in without


# ------------------------------------------------------------------ 5. rough edges
def test_all_zero_attention_mask_row_is_refused(tiny):
    model, tok = tiny
    ids = torch.tensor([tok.encode_prompt("sort: tom fay")] * 2)
    mask = torch.ones_like(ids)
    mask[1] = 0
    with pytest.raises(ValueError, match="attention_mask row 1 is all zeros"):
        dlm.generate(model, ids, attention_mask=mask)


@pytest.mark.parametrize("value", [2, -1])
def test_attention_mask_values_other_than_0_and_1_are_refused(tiny, value):
    model, tok = tiny
    ids = torch.tensor([tok.encode_prompt("sort: tom fay")])
    with pytest.raises(ValueError, match=f"attention_mask must hold only 0 .* and 1 .*, got {value}"):
        dlm.generate(model, ids, attention_mask=torch.full_like(ids, value))


def test_bool_and_int32_attention_masks_give_the_long_masks_tokens(tiny):
    model, tok = tiny
    pipe = dlm.DLMPipeline(model, tok)
    ids, mask = pipe.encode(["sort: tom fay ivy", "copy: bo"])
    want = dlm.generate(model, ids, attention_mask=mask, steps=16).sequences
    for other in (mask.bool(), mask.int()):
        assert torch.equal(dlm.generate(model, ids, attention_mask=other, steps=16).sequences, want)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int16, torch.uint8])
def test_integer_ids_of_any_width_are_cast_safely(tiny, dtype):
    model, tok = tiny
    ids = torch.tensor([tok.encode_prompt("reverse: ana bo cyd tom")])
    want = dlm.generate(model, ids, steps=16)
    got = dlm.generate(model, ids.to(dtype), steps=16)
    assert torch.equal(got.sequences, want.sequences) and got.sequences.dtype == torch.long


@pytest.mark.parametrize("ids, fragment", [
    (torch.tensor([[1.0, 2.0]]), "input_ids must hold integer token ids, got dtype torch.float32"),
    (torch.tensor([[True, False]]), "input_ids must hold integer token ids, got dtype torch.bool"),
    ([[1, 2]], "wrap a list as torch.tensor([ids])"),
    (torch.tensor([1, 2]), "add the batch dimension: input_ids.unsqueeze(0)"),
])
def test_unusable_ids_name_the_fix(tiny, ids, fragment):
    with pytest.raises(ValueError) as error:
        dlm.generate(tiny.model, ids)
    assert fragment in str(error.value)


def test_generate_with_no_model_names_the_model():
    with pytest.raises(ValueError, match="model is None: pass the model itself"):
        dlm.generate(None, torch.tensor([[1, 2, 3]]))
    with pytest.raises(ValueError, match="model must be a callable model"):
        dlm.generate("tiny-dlm", torch.tensor([[1, 2, 3]]))


@pytest.mark.parametrize("prompt, fragment", [
    (None, "prompt must be a string or a list of strings, got NoneType"),
    (123, "prompt must be a string or a list of strings, got int 123"),
    ([1, 2], "prompt 0 is int 1, not text"),
    (["sort: bo", None], "prompt 1 is NoneType None, not text"),
])
def test_pipeline_refuses_prompts_that_are_not_text(tiny, prompt, fragment):
    pipe = dlm.DLMPipeline(*tiny)
    with pytest.raises(ValueError) as error:
        pipe(prompt)
    assert fragment in str(error.value)


@pytest.mark.parametrize("sampler, config, fragment", [
    ("threshold", {"tau": "high"}, "sampler 'threshold' option tau takes a number, got 'high'; e.g. threshold:tau=0.9"),
    ("threshold:tau=abc", None, "sampler 'threshold' option tau takes a number, got 'abc'"),
    ("threshold", {"tau": True}, "option tau takes a number, got True"),
    ("saber", {"backtrack": 3}, "sampler 'saber' option backtrack takes text, got 3"),
    ("lopa", {"published": "yes"}, "sampler 'lopa' option published takes true or false, got 'yes'"),
    ("lopa", {"branches": 2.5}, "sampler 'lopa' option branches takes an integer, got 2.5"),
])
def test_sampler_option_of_the_wrong_type_names_the_option(tiny, sampler, config, fragment):
    model, tok = tiny
    ids = torch.tensor([tok.encode_prompt("sort: tom fay")])
    with pytest.raises(ValueError) as error:
        dlm.generate(model, ids, sampler=sampler, sampler_config=config)
    assert fragment in str(error.value) and "not supported between" not in str(error.value)


def test_sampler_option_types_that_are_right_still_pass():
    from samplers import get_sampler

    assert get_sampler("threshold", tau=1).config.tau == 1           # an int where a float is declared
    assert get_sampler("lopa:rank=none").config.rank is None          # `X | None` takes none
    assert get_sampler("lopa", published=False).config.published is False


def test_cli_sampler_option_error_is_one_line(capsys):
    code, _, err = cli(capsys, "sample", "--sampler", "threshold:tau=abc")
    one_line_error(code, err, "option tau takes a number, got 'abc'")


class _NaNModel(torch.nn.Module):
    def __init__(self, dtype):
        super().__init__()
        self.inner = ToyDLM().to(dtype)
        self.config = self.inner.config

    def forward(self, input_ids, attention_mask=None, **kw):
        return torch.full((*input_ids.shape, 16), float("nan"), dtype=torch.float32)


def test_nan_logits_message_does_not_blame_float16_on_a_float32_model():
    with pytest.raises(NonFiniteLogitsError) as error:
        dlm.generate(_NaNModel(torch.float32), torch.tensor([[1, 2, 3]]), gen_length=8, mask_token_id=15)
    message = str(error.value)
    assert "Likely cause: float16 overflow" not in message and "Check model.dtype" in message


@pytest.mark.parametrize("dtype, says, never", [
    (torch.float16, "Likely cause: float16 overflow", "does not overflow"),
    (torch.float32, "The model runs in float32, which does not overflow as float16 does", "Likely cause: float16"),
    (torch.bfloat16, "The model runs in bfloat16", "Likely cause: float16"),
])
def test_nan_logits_message_by_dtype(dtype, says, never):
    from dlm.outputs import raise_nonfinite

    with pytest.raises(NonFiniteLogitsError) as error:
        raise_nonfinite(3, block=0, step=1, dtype=dtype)
    assert says in str(error.value) and never not in str(error.value)


def test_joint_sampler_runs_with_the_default_cache_and_cli_errors_name_flags(capsys):
    code, out, err = cli(capsys, "sample", "--sampler", "joint")
    assert code == 0 and out.strip(), err  # kv_cache="auto" picks the uncached forward it needs
    code, _, err = cli(capsys, "sample", "--sampler", "joint", "--kv-cache", "prompt")
    one_line_error(code, err, "which need --kv-cache none")
    assert "kv_cache=" not in err


def test_api_keyword_names_become_the_commands_flags():
    from dlm.cli import _in_flag_terms

    sample = _subcommands()["sample"]
    text = "need kv_cache='none'; shorten the prompt or gen_length; block_length=8; steps is prose"
    assert _in_flag_terms(text, sample) == ("need --kv-cache none; shorten the prompt or --gen-length; "
                                            "--block-length=8; steps is prose")


def test_image_output_folder_is_ignored_by_git():
    default = _subcommands()["image"].get_default("out")
    lines = (ROOT / ".gitignore").read_text().split()
    assert f"{default}/" in lines or default in lines


def test_meta_replica_parameters_have_the_dtype_its_info_reports():
    model = dlm.replica("llada-8b", device="meta", dtype=torch.bfloat16)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16} and model.replica_info.dtype == "bfloat16"
    assert {p.device.type for p in model.parameters()} == {"meta"}


# The fit check is held to what building and one forward really take: a child process builds a one-layer
# llada-8b of the real vocabulary at a reduced width, runs a forward of FIT_FORWARD_TOKENS tokens and the
# float32 softmax decoding takes of it, and reports its peak resident memory above where it started. The
# kernel's high-water mark is reset at the start (/proc/self/clear_refs), since the lifetime peak may
# predate it: file pages the imports touched can be reclaimed under memory pressure, lowering the start.
_PEAK = r"""
import json, sys, torch
torch.set_num_threads(1)
import dlm
from dlm.replicas import build
def status(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field + ":"))
overrides = dict(hidden_size=256, num_attention_heads=4, num_key_value_heads=4, intermediate_size=1024)
dtype = getattr(torch, sys.argv[1])
meta = dlm.replica("llada-8b", layers=1, device="meta", dtype=dtype, overrides=overrides)
x = torch.randint(0, 1000, (1, build.FIT_FORWARD_TOKENS))
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # the high-water mark starts again from the current resident size
start = status("VmRSS")
model = dlm.replica("llada-8b", layers=1, device="cpu", dtype=dtype, overrides=overrides)
built = status("VmHWM") - start
with torch.no_grad():
    probs = model(x).logits.float().softmax(-1)
peak = status("VmHWM") - start
print(json.dumps({"built": built, "peak": peak, "weights": meta.replica_info.parameter_bytes,
                  "building": build.build_bytes(dtype), "working": build.working_bytes(meta, dtype)}))
"""


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="reads the resident peak from /proc (Linux)")
def test_fit_check_counts_what_building_and_one_forward_take():
    # every allocation over 64 KiB its own mapping, so that the resident peak follows live tensors rather
    # than what glibc's heap kept from freed ones (the project's method: dlm.bench.gpu, scripts/bench_*_memory)
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", OMP_NUM_THREADS="1",
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    run = subprocess.run([sys.executable, "-c", _PEAK, "bfloat16"], capture_output=True, text=True, env=env,
                         timeout=300)
    assert run.returncode == 0, run.stderr
    got = json.loads(run.stdout.splitlines()[-1])
    assert got["built"] <= got["weights"] + got["building"], got  # building: the weights and a scan piece
    estimate = got["weights"] + got["working"]
    assert got["peak"] <= estimate, got               # the check never allows less than was used
    assert got["peak"] > got["weights"] + 0.5 * got["working"], got  # and counts something real beyond weights


def test_fit_suggestion_leaves_room_for_building_and_a_forward(monkeypatch):
    """With free memory for 2.5 layers beside the rest and the working memory, the suggestion is 2, and
    the old weights-only rule (which would say 3 with that memory minus the working share) is gone."""
    import dlm.replicas.build as build
    from dlm.replicas import ReplicaTooLarge

    meta = dlm.replica("dream-7b", device="meta")
    layers = build._decoder_layers(meta)
    per_layer = build.parameter_bytes(layers, torch.float32) / len(layers)
    rest = build.parameter_bytes(meta, torch.float32) - len(layers) * per_layer
    working = build.working_bytes(meta, torch.float32)
    assert working > per_layer  # the case that matters: forgetting it would overshoot by a layer or more
    monkeypatch.setattr(build, "_free_bytes", lambda device: int(rest + 2.5 * per_layer + working + build.HEADROOM_BYTES))
    with pytest.raises(ReplicaTooLarge) as error:
        dlm.replica("dream-7b", device="cpu")
    assert error.value.fit_layers == 2 and "pass layers=2 or fewer" in str(error.value)
    assert "and run one 512-token forward" in str(error.value) and "\n" not in str(error.value)
