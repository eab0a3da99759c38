"""The examples in README.md and docs/dlm.md that show output are run, and their output compared.

Two conventions mark such an example (write new ones the same way and they are tested here):
- a ```python block that prints, with the expected output as the comment lines ("# ...") right
  after the code, the last of them ending in "(real output ...)";
- a ```console block: `$ dlm ...` command lines, each followed by what it prints (stdout, then
  stderr), as on a terminal.
Numbers that vary from run to run (seconds) are compared as "some number" (`SECONDS`)."""
from __future__ import annotations

import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ["README.md", "docs/dlm.md"]
SECONDS = [re.compile(r"\d+\.\d+ s\b"), re.compile(r'"seconds(_total)?": \d+(\.\d+)?')]


def _blocks(path: str, lang: str) -> list[tuple[int, str]]:
    """(line number, text) of every ```lang block of the file."""
    lines = (ROOT / path).read_text(encoding="utf-8").splitlines()
    found, start = [], None
    for i, line in enumerate(lines):
        if start is None and line.strip() == f"```{lang}":
            start = i + 1
        elif start is not None and line.strip() == "```":
            found.append((start, "\n".join(lines[start:i])))
            start = None
    return found


def _python_examples(path: str) -> list[tuple[int, str]]:
    return [(line, code) for line, code in _blocks(path, "python") if "(real output" in code]


def _console_examples() -> list:
    return [pytest.param(text, id=f"{path}:{line}") for path in DOCS for line, text in _blocks(path, "console")]


def _expected_python_output(code: str) -> list[str]:
    """The run of comment lines that ends with the one saying "(real output", without "# "."""
    lines = code.splitlines()
    last = next(i for i, line in enumerate(lines) if "(real output" in line)
    first = last
    while first > 0 and lines[first - 1].startswith("# "):
        first -= 1
    expected = [line[2:].rstrip() for line in lines[first:last + 1]]
    expected[-1] = expected[-1][:expected[-1].index("(real output")].rstrip()
    return expected


def _normalise(text: str) -> str:
    for pattern in SECONDS:
        text = pattern.sub(lambda m: re.sub(r"\d+(\.\d+)?", "N", m.group(0)), text)
    return text


def test_the_docs_have_examples_to_run():
    """The files keep output examples of both kinds (a rename of the markers must not empty this test)."""
    assert sum(len(_python_examples(path)) for path in DOCS) >= 4 and len(_console_examples()) >= 2


@pytest.mark.parametrize("path", DOCS)
def test_python_examples_print_what_the_doc_shows(path):
    """A file's examples run in order in one namespace, as a reader runs them (a later example may use
    the `pipe` an earlier one made)."""
    namespace = {"__name__": "__doc_example__"}
    for line, code in _python_examples(path):
        captured = io.StringIO()
        with contextlib.redirect_stdout(captured):
            exec(compile(code, f"{path}:{line}", "exec"), namespace)
        assert captured.getvalue().rstrip("\n").splitlines() == _expected_python_output(code), f"{path}:{line}"


@pytest.mark.parametrize("text", _console_examples())
def test_console_example_prints_what_the_doc_shows(text, capsys):
    from dlm.cli import main

    sessions, current = [], None
    for line in text.splitlines():
        if line.startswith("$ "):
            current = (line[2:], [])
            sessions.append(current)
        else:
            assert current is not None, f"output before any command: {line!r}"
            current[1].append(line)
    for command, expected in sessions:
        argv = shlex.split(command)
        assert argv[0] == "dlm", f"only dlm commands are run here: {command!r}"
        code = main(argv[1:])
        captured = capsys.readouterr()
        shown = (captured.out + captured.err).rstrip("\n").splitlines()
        assert code == 0, (command, captured.err)
        assert [_normalise(s) for s in shown] == [_normalise(e) for e in expected], command


def _readme_command_lines() -> list:
    """Every `dlm ...` line of the README's bash blocks after the first two (the CI commands, run by
    `.ci/run`): the command-line and own-model examples."""
    lines = []
    for line_no, block in _blocks("README.md", "bash")[2:]:
        for offset, line in enumerate(block.splitlines()):
            if line.startswith("dlm "):
                lines.append(pytest.param(line, id=f"README.md:{line_no + offset + 1}"))
    return lines


def test_the_readme_has_command_lines_to_check():
    assert len(_readme_command_lines()) >= 10


@pytest.mark.parametrize("line", _readme_command_lines())
def test_readme_command_lines_parse(line, monkeypatch):
    """Each README command line names a real command and real flags with valid values (they load
    models or run benchmarks, so they are parsed, not run; the runnable ones are console examples).
    `--device cuda` is taken as valid here: the README shows it for GPU machines."""
    from dlm.commands import _common

    monkeypatch.setattr(_common, "device_value", str)
    from dlm.cli import build_parser

    argv = shlex.split(line, comments=True)
    try:
        args = build_parser().parse_args(argv[1:])
    except SystemExit as exit_:
        pytest.fail(f"{line!r} does not parse (exit {exit_.code})")
    assert callable(getattr(args, "func", None)), line
