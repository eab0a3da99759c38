"""What a new user hits first: prompt convention, bad input, defaults, startup and output checks."""
from __future__ import annotations

import math
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

import dlm
from dlm.cli import main as cli_main
from toy_models import ToyDLM

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROMPT = torch.tensor([[1, 2, 3, 4, 5], [6, 7, 8, 9, 10]])


@pytest.fixture(scope="module")
def pipe():
    return dlm.DLMPipeline.from_pretrained("tiny-dlm")


def cli(capsys, *argv):
    code = cli_main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(code, err, fragment):
    assert code == 2, err
    assert fragment in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


# ------------------------------------------------------------------ prompt convention
def test_format_prompt_is_idempotent(pipe):
    tok = pipe.tokenizer
    assert tok.format_prompt("sort: bo al") == "sort: bo al\n"
    assert tok.format_prompt(tok.format_prompt("sort: bo al")) == "sort: bo al\n"
    assert tok.encode_prompt("sort: bo al") == tok.encode("sort: bo al\n")


def test_same_answer_from_pipeline_generate_and_cli(pipe, capsys):
    text = "reverse: ana bo cyd tom"
    a = pipe(text, num_inference_steps=16, gen_length=32, block_length=32).texts[0]
    b = pipe(text + "\n", num_inference_steps=16, gen_length=32, block_length=32).texts[0]
    ids = torch.tensor([pipe.tokenizer.encode_prompt(text)])
    out = dlm.generate(pipe.model, ids, gen_length=32, block_length=32, steps=16)
    c = pipe.decode(out.sequences, ids.shape[1])[0]
    code, stdout, _ = cli(capsys, "sample", "--prompt", text, "--steps", "16", "--gen-length", "32", "--block-length", "32")
    assert code == 0
    assert a == b == c == stdout.strip()
    assert a  # not the empty answer a missing separator used to give


def test_generate_refuses_a_prompt_without_the_models_separator(pipe):
    ids = torch.tensor([pipe.tokenizer.encode("sort: tom fay")])
    with pytest.raises(ValueError, match="encode_prompt"):
        dlm.generate(pipe.model, ids, gen_length=32)


# ------------------------------------------------------------------ bad input in the API
@pytest.mark.parametrize("temperature", [math.nan, math.inf, -0.5])
def test_non_finite_or_negative_temperature_is_refused(temperature):
    with pytest.raises(ValueError, match="temperature must be a finite number"):
        dlm.generate(ToyDLM(), PROMPT, gen_length=8, temperature=temperature)


def test_out_of_vocabulary_ids_are_refused():
    with pytest.raises(ValueError, match="outside the model's vocabulary"):
        dlm.generate(ToyDLM(), torch.tensor([[1, 2, 99]]), gen_length=8)
    with pytest.raises(ValueError, match="outside the model's vocabulary"):
        dlm.generate(ToyDLM(), torch.tensor([[1, -3, 2]]), gen_length=8)


def test_mask_id_inside_the_prompt_is_refused():
    mask = ToyDLM().config.mask_token_id
    with pytest.raises(ValueError, match="contains the mask token id"):
        dlm.generate(ToyDLM(), torch.tensor([[1, mask, 2]]), gen_length=8)


class Returns(torch.nn.Module):
    """Wrap ToyDLM and return its logits in another container."""

    def __init__(self, kind):
        super().__init__()
        self.inner, self.kind = ToyDLM(), kind
        self.config = self.inner.config

    def forward(self, input_ids, **kw):
        logits = self.inner(input_ids, **kw).logits
        return {"dict": {"logits": logits}, "tuple": (logits, None), "tensor": logits,
                "nothing": 3}[self.kind]


@pytest.mark.parametrize("kind", ["dict", "tuple", "tensor"])
def test_model_outputs_in_any_common_container_give_the_same_tokens(kind):
    ref = dlm.generate(ToyDLM(), PROMPT, gen_length=16, block_length=8, steps=8)
    out = dlm.generate(Returns(kind), PROMPT, gen_length=16, block_length=8, steps=8)
    assert torch.equal(out.sequences, ref.sequences)


def test_model_output_without_logits_is_a_clear_error():
    with pytest.raises(ValueError, match="returned int, not logits"):
        dlm.generate(Returns("nothing"), PROMPT, gen_length=8)


def test_left_padding_without_mask_is_detected():
    model = ToyDLM()
    pad = model.config.pad_token_id
    batch = torch.tensor([[pad, pad, 3, 4, 5], [1, 2, 3, 4, 5]])
    explicit = (batch != pad).long()
    a = dlm.generate(model, batch, gen_length=16, block_length=8, steps=8)
    b = dlm.generate(model, batch, attention_mask=explicit, gen_length=16, block_length=8, steps=8)
    assert torch.equal(a.sequences, b.sequences)


def test_left_padding_is_refused_when_pad_is_also_eos():
    model = ToyDLM()
    model.config = SimpleNamespace(**{**vars(model.config), "pad_token_id": model.config.eos_token_id})
    batch = torch.tensor([[model.config.eos_token_id, 3, 4], [1, 2, 3]])
    with pytest.raises(ValueError, match="pass attention_mask"):
        dlm.generate(model, batch, gen_length=8)


def test_sampler_spec_strings_and_option_errors():
    from samplers import get_sampler

    assert get_sampler("threshold:tau=0.8").config.tau == 0.8
    with pytest.raises(ValueError, match="has no option foo; valid options: factor, tau"):
        get_sampler("threshold", foo=1)
    with pytest.raises(ValueError, match="option tau takes a number, got 'abc'"):
        get_sampler("threshold:tau=abc")
    with pytest.raises(ValueError, match="must be key=value"):
        get_sampler("threshold:tau")


def test_eos_early_stop_default_is_the_same_in_generate_and_pipeline(pipe):
    ids, mask = pipe.encode(["copy: bo al"])
    by_default = dlm.generate(pipe.model, ids, attention_mask=mask, gen_length=64, block_length=16)
    explicit = dlm.generate(pipe.model, ids, attention_mask=mask, gen_length=64, block_length=16, eos_early_stop=True)
    piped = pipe("copy: bo al", gen_length=64, block_length=16)
    assert by_default.nfe == explicit.nfe == piped.nfe < 64  # EOS early, later blocks skipped


# ------------------------------------------------------------------ the CLI
@pytest.mark.parametrize("argv,fragment", [
    (["sample", "--temperature", "nan"], "finite number"),
    (["sample", "--temperature", "inf"], "finite number"),
    (["sample", "--sampler", "threshold:foo=1"], "valid options: factor, tau"),
    (["sample", "--sampler", "threshold:tau=5"], "tau must be in (0, 1]"),
    (["bench", "--samplers", "threshold:foo=1", "--limit", "1"], "valid options"),
])
def test_cli_bad_input_is_one_line(capsys, argv, fragment):
    assert_one_line_error(*cli(capsys, *argv)[::2], fragment)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cli_cuda_device_without_cuda(capsys):
    for argv in (["sample", "--device", "cuda"], ["bench", "--device", "cuda"]):
        assert_one_line_error(*cli(capsys, *argv)[::2], "sees no CUDA device")


@pytest.mark.parametrize("command", ["bench", "image"])
def test_output_path_under_a_file_fails_before_any_work(capsys, tmp_path, command, monkeypatch):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    import dlm.bench.harness as harness
    import dlm.image.digits_model as digits_model

    def must_not_run(*a, **k):
        raise AssertionError("work started before the output path was checked")

    monkeypatch.setattr(harness, "run_bench", must_not_run)
    monkeypatch.setattr(digits_model, "load_digits_pipeline", must_not_run)
    code, _, err = cli(capsys, command, "--out", str(blocker / "sub"))
    assert_one_line_error(code, err, "is a file")


def test_models_lists_the_diffusers_baselines(capsys):
    code, out, _ = cli(capsys, "models", "--samplers")
    names = [line.split("\t")[0] for line in out.splitlines()]
    assert code == 0 and "diffusers-llada2" in names and "confidence" in names


def test_dlm_models_starts_without_torch():
    code = "import sys, dlm.cli; dlm.cli.main(['models']); print('torch' in sys.modules, 'transformers' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "False False"


def test_no_progress_bars_when_stderr_is_not_a_terminal():
    proc = subprocess.run([sys.executable, "-m", "dlm.cli", "sample", "--steps", "8", "--gen-length", "32",
                           "--block-length", "32"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "Loading weights" not in proc.stderr and "it/s" not in proc.stderr and "nfe/s" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("[tiny-dlm | threshold | nfe")


def test_image_grid_is_labelled_and_readable():
    from dlm.image.digits_model import image_grid, labeled_grid

    images = torch.zeros(3, 1, 8, 8)
    plain = image_grid(images, scale=8)
    grid = labeled_grid(images, ["asked 1 / got 1"] * 3, "ddim, 10 steps", scale=12)
    assert grid.width > plain.width and grid.height > plain.height + 30  # captions and a title row
    with pytest.raises(ValueError, match="captions"):
        labeled_grid(images, ["x"], "t")


def test_library_log_handlers_follow_the_current_stderr():
    """diffusers binds its log handler to the stderr of its first message; once that stream is closed
    (an earlier `main()` under capture), its next message would be a "--- Logging error ---"
    traceback. main() points the handler at the current stderr and drops handlers on closed streams."""
    import io
    import logging

    from diffusers.utils import logging as diffusers_logging

    diffusers_logging.get_logger("diffusers")  # configures the library's StreamHandler
    logger = logging.getLogger("diffusers")
    handler = next(h for h in logger.handlers if type(h) is logging.StreamHandler)
    stale = io.StringIO()
    handler.stream = stale
    stale.close()
    dead = logging.FileHandler(os.devnull, delay=False)
    dead.stream.close()
    logger.addHandler(dead)
    try:
        assert cli_main(["models"]) == 0
        assert handler.stream is sys.stderr
        assert dead not in logger.handlers
    finally:
        logger.removeHandler(dead)
