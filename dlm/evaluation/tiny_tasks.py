"""Harness tasks over the built-in model's task prompts: JSONL files written from `dlm.tasks`.

The shipped tasks (`TASKS_DIR`, group `dlm_tiny`) are the test-split prompts `dlm bench` runs, in the
same order (`Task.examples("test", n, seed=0)`), so `--limit N` in the harness and `dlm bench --limit N`
see the same prompts:

    dlm_tiny_copy / _reverse / _sort   list edits, exact match of the answer line (group
                                       dlm_tiny_list_edits)
    dlm_tiny_arithmetic                word problems answered with a worked chain ending "#### N" (the
                                       GSM8K format), exact match of N through the harness's regex filter
    dlm_tiny_arithmetic_mc             the same problems as multiple choice (the right chain and three
                                       whose last step is off, in the model's zero-padded worked-step
                                       format), scored by `loglikelihood`

`python -m dlm.evaluation.tiny_tasks` rewrites the JSONL files; a test checks they equal what it writes.
"""
from __future__ import annotations

import json
from pathlib import Path

from dlm.evaluation import TASKS_DIR

GENERATE_TASKS = ("copy", "reverse", "sort", "arithmetic")
EXAMPLES_PER_TASK = 50  # as many as `dlm bench` runs per task by default
_OFFSETS = (1, 2, 3, -1, -2, -3)  # how far the distractors' final numbers are from the right one


def task_docs(name: str, n: int = EXAMPLES_PER_TASK, seed: int = 0) -> list[dict]:
    """The first `n` test examples of a `dlm.tasks` task as harness documents:
    `{"prompt", "answer", "value"?}` (value: the arithmetic answer's number)."""
    from dlm.tasks import get_task

    docs = []
    for ex in get_task(name).examples("test", n=n, seed=seed):
        doc = {"prompt": ex.prompt, "answer": ex.answer}
        if "value" in ex.meta:
            doc["value"] = str(ex.meta["value"])
        docs.append(doc)
    return docs


def multiple_choice_docs(docs: list[dict]) -> list[dict]:
    """Arithmetic documents with `choices` (the right chain and three whose last result and final
    number are off by a small amount, never negative) and `label`, the right one's index (cycling
    through 0..3 so that always picking one position scores 25%). Numbers are zero-padded as the
    model writes its worked steps (`dlm.tasks.arithmetic.pad_numbers`)."""
    from dlm.tasks.arithmetic import pad_numbers

    out = []
    for i, doc in enumerate(docs):
        head, value = doc["answer"].rsplit("#### ", 1)
        last_step = head.rstrip().rsplit("=", 1)[0]  # "13-7" of "... 13-7=6."
        right = int(value)
        wrong = [right + d for d in _OFFSETS if right + d >= 0][:3]
        choices = [pad_numbers(f"{last_step}={w}. #### {w}") for w in wrong]
        label = i % 4
        choices.insert(label, pad_numbers(doc["answer"]))
        out.append({"prompt": doc["prompt"], "choices": choices, "label": label})
    return out


def expected_files() -> dict[str, str]:
    """File name -> JSONL text of every shipped task's documents."""
    files = {}
    for name in GENERATE_TASKS:
        files[f"{name}.jsonl"] = _jsonl(task_docs(name))
    files["arithmetic_mc.jsonl"] = _jsonl(multiple_choice_docs(task_docs("arithmetic")))
    return files


def _jsonl(docs: list[dict]) -> str:
    return "".join(json.dumps(d, sort_keys=True) + "\n" for d in docs)


def write_files(directory: str | Path = TASKS_DIR) -> list[Path]:
    out = []
    for name, text in expected_files().items():
        path = Path(directory) / name
        path.write_text(text, encoding="utf-8")
        out.append(path)
    return out


if __name__ == "__main__":
    for p in write_files():
        print(p)
