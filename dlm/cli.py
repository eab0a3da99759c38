"""The `dlm` console script.

Each subcommand lives in its own module under `dlm.commands` and exposes
`register(subparsers)`, which adds its parser and sets `func=<callable(args) -> int>`.
Errors a user can fix (`ValueError`, `FileNotFoundError`, `KeyError` raised as
`UsageError`) are printed as one line on stderr with exit code 2, never a traceback; for a command
whose every decoding option is a flag (`flag_terms=True`: `dlm sample`) the API's keyword names in
them (`kv_cache='none'`) are given as its flags (`--kv-cache none`). (`dlm bench` is left alone: a
sampler entry's `kv=` sets the same option there, so the flag would misname what the user wrote.)
Every command gets `--threads N` (and reads `DLM_THREADS`), applied before it runs
(`dlm.commands._common.requested_threads`); `args.started` is when `main` began, for whole-run times.
"""
from __future__ import annotations

import argparse
import importlib
import logging
import re
import sys
import time
import warnings

# Order here is the order in `dlm --help`. Add a module name to register a subcommand.
# A command that computes nothing (listing) sets `computes=False` and gets no --threads.
COMMAND_MODULES = [
    "dlm.commands.sample",
    "dlm.commands.models",
    "dlm.commands.bench",
    "dlm.commands.image",
    "dlm.commands.train_joint",
    "dlm.commands.eval",
]


class UsageError(Exception):
    """A mistake in what the user asked for; printed as one line, exit code 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse's own errors: keep them to one line too
        self.exit(2, f"dlm: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="dlm", description="Fast sampling for diffusion models.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    from dlm.commands._common import add_threads_argument

    for command in sub.choices.values():
        # `dlm eval` hands every argument to the harness (its parser has no options: DLM_THREADS applies)
        takes_options = "-" in command.prefix_chars
        if takes_options and command.get_default("computes") is not False and "--threads" not in command._option_string_actions:
            add_threads_argument(command)
    return parser


def _quiet_third_party_warnings() -> None:
    """Warnings the user can do nothing about, from packages the test set-up installs beside torch.

    torchvision (a dependency of SGLang's modules, installed by scripts/install_test_extras.sh) is
    imported by transformers' image utilities at the first model load; the build that imports beside
    the CPU torch cannot load its optional image-decoding extension and says so on every command,
    although nothing here decodes images through it. Only that message is silenced."""
    warnings.filterwarnings("ignore", message=r"Failed to load image Python extension", category=UserWarning)


def _in_flag_terms(message: str, command: argparse.ArgumentParser | None) -> str:
    """`message` with the API's keyword names that are flags of `command` written as those flags:
    "kv_cache='none'" -> "--kv-cache none", "gen_length" -> "--gen-length". Only names with an
    underscore are rewritten (a plain word such as "steps" may be prose)."""
    if command is None:
        return message
    for option in command._option_string_actions:
        if not option.startswith("--") or "-" not in option[2:]:
            continue
        name = option[2:].replace("-", "_")
        message = re.sub(rf"\b{name}\s*=\s*'([^']*)'", rf"{option} \1", message)
        message = re.sub(rf"(?<![\w-]){name}\b", option, message)
    return message


def _log_to_current_stderr() -> None:
    """Point diffusers'/transformers' log handlers at the current `sys.stderr`.

    Those libraries bind a StreamHandler to whatever `sys.stderr` was when they first logged. When
    `main()` runs more than once in a process (tests capturing stderr, notebooks), that stream may be
    closed by now, and their next warning would print a "--- Logging error ---" traceback instead of
    our one-line output. Libraries not yet imported are left alone (no import cost).
    """
    for name in ("diffusers", "transformers"):
        if name not in sys.modules:
            continue
        logger = logging.getLogger(name)
        for handler in list(logger.handlers):
            stream = getattr(handler, "stream", None)
            if type(handler) is logging.StreamHandler and stream is not sys.stderr:
                with handler.lock:  # not setStream(): it flushes the old, possibly closed, stream
                    handler.stream = sys.stderr
            elif getattr(stream, "closed", False):
                # Someone else's handler on a closed stream (e.g. a finished capture): it can only
                # print "--- Logging error ---" tracebacks now, so it is detached.
                logger.removeHandler(handler)


def main(argv: list[str] | None = None) -> int:
    started = time.perf_counter()
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # argparse's one-line usage errors (exit 2) and --help (exit 0)
        return int(exit_.code or 0)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return 2
    args.started = started
    _log_to_current_stderr()
    with warnings.catch_warnings():
        _quiet_third_party_warnings()
        try:
            with _threads(args):
                return int(args.func(args) or 0)
        except (UsageError, ValueError, FileNotFoundError) as err:
            command = _subparsers(parser).get(args.command) if getattr(args, "flag_terms", False) else None
            print(f"dlm {args.command}: error: {_in_flag_terms(str(err), command)}", file=sys.stderr)
            return 2
        except BrokenPipeError:  # output piped into `head` and closed: not an error
            sys.stderr.close()
            return 0
        except KeyboardInterrupt:
            print("dlm: interrupted", file=sys.stderr)
            return 130


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


class _threads:
    """Apply the command's thread count for its run; the caller's count comes back afterwards (main()
    also runs inside other processes: tests, notebooks)."""

    def __init__(self, args: argparse.Namespace):
        self.args, self.previous = args, None

    def __enter__(self):
        from dlm.commands._common import apply_threads, requested_threads

        if getattr(self.args, "computes", True) is not False and requested_threads(self.args)[0] is not None:
            import torch

            self.previous = torch.get_num_threads()
            apply_threads(self.args)
        return self

    def __exit__(self, *exc):
        if self.previous is not None:
            import torch

            torch.set_num_threads(self.previous)
        return False


if __name__ == "__main__":
    sys.exit(main())
