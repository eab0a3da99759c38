"""Your own evaluation set as a task: one JSON object per line, scored by a named extractor.

    {"prompt": "Q: ... A:", "answer": "... #### 72", "id": "gsm8k-17"}

- `prompt` (string) is fed to the model verbatim: put any chat template or few-shot text in it.
- `answer` (string or number) is the reference; the extractor is applied to it too, so a full
  GSM8K solution ending in `#### 72` works as well as a bare `72`.
- `id` (optional, string or number) is kept in `Example.meta["id"]`.
Blank lines are skipped; anything else that is not such an object is an error naming its line.

Extractors (`EXTRACTORS`), each `text -> str | None`:
    boxed        content of the last \\boxed{...} (nested braces allowed)      MATH-style
    hash         number after the last `####`                                 GSM8K
    last-number  last number in the text (thousands commas dropped)
    first-line   first non-empty line, stripped
    exact        the whole text, stripped
    contains     scores 1 when the reference (stripped) occurs in the output
Scoring: 1.0 when the extracted output equals the extracted reference (numbers compared as
numbers: `72`, `72.0` and `$72` match), else 0.0. No generated code is executed: for HumanEval-style
sets use `contains` or `exact` on a reference completion, or score the written outputs elsewhere.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from .base import Example, Task

_NUMBER = re.compile(r"-?\$?\d[\d,]*(?:\.\d+)?|-?\.\d+")
_HASH = re.compile(r"####\s*([^\n]*)")


def _boxed(text: str) -> Optional[str]:
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    i, depth, out = start + len("\\boxed{"), 1, []
    while i < len(text):
        ch = text[i]
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return "".join(out).strip()
        out.append(ch)
        i += 1
    return None  # unbalanced: the answer was cut off


def _last_number(text: str) -> Optional[str]:
    found = _NUMBER.findall(text)
    return found[-1] if found else None


def _hash(text: str) -> Optional[str]:
    found = _HASH.findall(text)
    if not found:
        return None
    return _last_number(found[-1]) or (found[-1].strip() or None)


def _first_line(text: str) -> Optional[str]:
    for line in text.splitlines():
        if line.strip():
            return line.strip()
    return None


def _exact(text: str) -> Optional[str]:
    return text.strip() or None


EXTRACTORS: dict[str, Callable[[str], Optional[str]]] = {
    "boxed": _boxed, "hash": _hash, "last-number": _last_number, "first-line": _first_line,
    "exact": _exact, "contains": _exact,
}


def normalize(value: Optional[str]) -> Optional[str]:
    """Numbers to a canonical form (`$1,200.0` -> `1200`), other text stripped."""
    if value is None:
        return None
    s = value.strip().rstrip(".")
    num = s.replace(",", "").replace("$", "")
    try:
        f = float(num)
    except ValueError:
        return s
    return str(int(f)) if f == int(f) else repr(f)


@dataclass(frozen=True)
class JsonlExample(Example):
    """An `Example` whose model input is the prompt verbatim (no task separator added)."""

    @property
    def input_text(self) -> str:
        return self.prompt


class JsonlTask(Task):
    """Examples read from a JSONL file; `examples("test", n)` returns the first `n` lines in file order."""

    def __init__(self, path: str | Path, examples: list[Example], extractor: str):
        self.path = Path(path)
        self.name = self.path.stem
        self.extractor = extractor
        self._examples = examples
        self.default_limit = len(examples)

    def examples(self, split: str = "test", n: int | None = None, seed: int = 0, unique: bool = True) -> list[Example]:
        if split != "test":
            raise ValueError(f"a JSONL task has only a 'test' split, got {split!r}")
        return list(self._examples if n is None else self._examples[:n])

    def extract(self, output_text: str) -> Optional[str]:
        return EXTRACTORS[self.extractor](output_text if isinstance(output_text, str) else "")

    def reference(self, example: Example) -> str:
        """The extracted reference answer (the raw answer when the extractor finds nothing in it)."""
        if self.extractor in ("exact", "contains"):
            return example.answer.strip()
        got = EXTRACTORS[self.extractor](example.answer)
        return got if got is not None else example.answer.strip()

    def score(self, example: Example, output_text: str) -> float:
        text = output_text if isinstance(output_text, str) else ""
        ref = self.reference(example)
        if self.extractor == "contains":
            return 1.0 if ref and ref in text else 0.0
        got = self.extract(text)
        return 1.0 if got is not None and normalize(got) == normalize(ref) else 0.0


def read_jsonl_examples(path: str | Path, task_name: str | None = None) -> list[Example]:
    """Parse the file; ValueError `PATH:LINE: reason` on the first malformed line."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no JSONL file at {path}")
    name = task_name or path.stem
    out: list[Example] = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{lineno}: not valid JSON ({err.msg} at column {err.colno})") from None
            if not isinstance(obj, dict):
                raise ValueError(f"{path}:{lineno}: expected a JSON object with \"prompt\" and \"answer\", got {type(obj).__name__}")
            for key in ("prompt", "answer"):
                if key not in obj:
                    raise ValueError(f"{path}:{lineno}: missing \"{key}\"")
            prompt, answer = obj["prompt"], obj["answer"]
            if not isinstance(prompt, str) or not prompt:
                raise ValueError(f"{path}:{lineno}: \"prompt\" must be a non-empty string")
            if isinstance(answer, bool) or not isinstance(answer, (str, int, float)):
                raise ValueError(f"{path}:{lineno}: \"answer\" must be a string or a number")
            meta = {"line": lineno}
            if "id" in obj:
                if not isinstance(obj["id"], (str, int)):
                    raise ValueError(f"{path}:{lineno}: \"id\" must be a string or an integer")
                meta["id"] = obj["id"]
            out.append(JsonlExample(prompt, str(answer), name, meta))
    if not out:
        raise ValueError(f"{path}: no examples (the file is empty)")
    return out


def load_jsonl_task(path: str | Path, extractor: str = "exact") -> JsonlTask:
    """A `JsonlTask` over `path` with a named extractor (see `EXTRACTORS`)."""
    if extractor not in EXTRACTORS:
        raise ValueError(f"unknown extractor {extractor!r}; valid: {', '.join(EXTRACTORS)}")
    return JsonlTask(path, read_jsonl_examples(path), extractor)


__all__ = ["EXTRACTORS", "JsonlExample", "JsonlTask", "load_jsonl_task", "normalize", "read_jsonl_examples"]
