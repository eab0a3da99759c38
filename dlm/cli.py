"""The `dlm` console script.

Each subcommand lives in its own module under `dlm.commands` and exposes
`register(subparsers)`, which adds its parser and sets `func=<callable(args) -> int>`.
Errors a user can fix (`ValueError`, `FileNotFoundError`, `KeyError` raised as
`UsageError`) are printed as one line on stderr with exit code 2, never a traceback.
"""
from __future__ import annotations

import argparse
import importlib
import logging
import sys

# Order here is the order in `dlm --help`. Add a module name to register a subcommand.
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
    return parser


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
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # argparse's one-line usage errors (exit 2) and --help (exit 0)
        return int(exit_.code or 0)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return 2
    _log_to_current_stderr()
    try:
        return int(args.func(args) or 0)
    except (UsageError, ValueError, FileNotFoundError) as err:
        print(f"dlm {args.command}: error: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # output piped into `head` and closed: not an error
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        print("dlm: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
