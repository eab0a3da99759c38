"""`dlm eval`: lm-evaluation-harness's own command line, with our model `dlm` registered.

    dlm eval --model_args pretrained=tiny-dlm,sampler=threshold,steps=16,gen_length=64,block_length=32 \\
        --tasks dlm_tiny_arithmetic --limit 16 --batch_size 8 --output_path runs/eval --log_samples

Every argument goes to the harness (`lm-eval run`'s options; `dlm eval ls tasks` works too). Three
defaults are ours: `--model dlm` when no `--model` is given, `--include_path` the built-in model's task
folder (`dlm.evaluation.TASKS_DIR`) when none is given, and `--device cpu` when none is given and torch
sees no GPU (the harness's default is cuda:0). After the harness's table comes ours: per kind
of request, generated tokens (up to EOS), forwards, TPF, seconds and tokens per second; with
`--output_path` the per-request counts go to `dlm_requests_<date>.jsonl` beside the harness's results
and samples (`task` and `doc_id` join them). docs/eval.md has the model_args and the recipes.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

HARNESS_COMMANDS = ("run", "ls", "validate")


def register(subparsers) -> None:
    # The harness parses the arguments: this parser only collects them (no option of its own, not even
    # -h, which goes to the harness's help).
    p = subparsers.add_parser(
        "eval", add_help=False, prefix_chars="\x00",
        help="lm-evaluation-harness with our engine as the model `dlm` (takes the harness's arguments)",
        description="Run lm-evaluation-harness with the model dlm registered; see `dlm eval --help`.")
    p.add_argument("harness_args", nargs=argparse.REMAINDER, help="lm-eval arguments")
    p.set_defaults(func=run)


def harness_argv(argv: list[str]) -> list[str]:
    """The harness's argv with our defaults (`--model dlm`, `--include_path` of our tasks) added to a run."""
    from dlm.evaluation import TASKS_DIR

    argv = list(argv)
    if argv and argv[0] in ("ls", "validate"):
        return argv
    wants_help = any(a in ("-h", "--help") for a in argv)
    body = argv[1:] if argv and argv[0] == "run" else argv
    if not wants_help:
        if not _given(body, "--model", "-M"):
            body = ["--model", "dlm", *body]
        if not _given(body, "--include_path"):
            body = [*body, "--include_path", str(TASKS_DIR)]
        if not _given(body, "--device"):  # the harness's own default is cuda:0, even on a machine without one
            import torch

            body = [*body, "--device", "cuda:0" if torch.cuda.is_available() else "cpu"]
    return ["run", *body]


def _given(argv: list[str], *names: str) -> bool:
    return any(a in names or any(a.startswith(n + "=") for n in names) for a in argv)


def check_model_args(argv: list[str]) -> None:
    """Validate a run's `--model_args` for `dlm` before the harness indexes its thousands of tasks (seconds):
    parsed by the harness's own parser, checked by `EvalArgs` (ValueError naming the argument)."""
    if not argv or argv[0] != "run" or any(a in ("-h", "--help") for a in argv):
        return
    try:
        from lm_eval._cli.harness import HarnessCLI

        namespace = HarnessCLI()._parser.parse_args(argv)
    except (SystemExit, AttributeError, ImportError):  # a usage error the harness will report itself
        return
    if getattr(namespace, "model", None) != "dlm":
        return
    from lm_eval.utils import simple_parse_args_string

    from dlm.evaluation.args import EvalArgs

    model_args = namespace.model_args or {}
    if isinstance(model_args, str):
        model_args = simple_parse_args_string(model_args)
    extra = {"batch_size": namespace.batch_size} if getattr(namespace, "batch_size", None) is not None else {}
    EvalArgs.from_model_args({**model_args, **extra})


def _output_path(argv: list[str]) -> str | None:
    for i, a in enumerate(argv):
        if a in ("--output_path", "-o") and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith("--output_path="):
            return a.split("=", 1)[1]
    return None


def run(args) -> int:
    from dlm.cli import UsageError

    try:
        import dlm.lm_eval as dlm_lm_eval
        from lm_eval.__main__ import cli_evaluate
    except ImportError as err:
        raise UsageError(f"dlm eval needs lm-evaluation-harness ({err}); install it with: pip install -e \".[eval]\"") from None
    argv = harness_argv(args.harness_args)
    check_model_args(argv)
    if any(a in ("-h", "--help") for a in argv):
        print("dlm eval: lm-evaluation-harness with the model `dlm` registered (defaults: --model dlm, --include_path "
              "the built-in model's tasks). model_args: docs/eval.md. The harness's options:\n")
    runs_before = len(dlm_lm_eval.RUNS)
    saved = sys.argv
    sys.argv = ["dlm eval", *argv]
    try:
        cli_evaluate()
    except SystemExit as exit_:  # argparse's usage errors and --help
        return int(exit_.code or 0)
    except KeyError as err:  # e.g. an unknown model name: the harness's message, first line
        raise UsageError(str(err.args[0] if err.args else err).strip().splitlines()[0]) from None
    finally:
        sys.argv = saved
    if len(dlm_lm_eval.RUNS) > runs_before and dlm_lm_eval.RUNS[-1]:
        _report(dlm_lm_eval.RUNS[-1], _output_path(argv))
    return 0


def _report(records, output_path: str | None) -> None:
    from dlm.evaluation.counts import format_summary, summarize, write_jsonl

    print("dlm: generated tokens are those before EOS; forwards are the model calls each request took part in\n")
    print(format_summary(summarize(records)))
    if output_path is None:
        return
    results = sorted(Path(output_path).glob("**/results_*.json"), key=lambda p: p.stat().st_mtime)
    if not results:
        return
    newest = results[-1]
    path = write_jsonl(records, newest.parent / f"dlm_requests_{newest.stem[len('results_'):]}.jsonl")
    print(f"\ndlm: per-request counts in {path}")
