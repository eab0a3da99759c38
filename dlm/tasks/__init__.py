"""Verifiable task suites shared by the tiny model's training and the benchmark.

    task = get_task("reverse")
    for ex in task.examples("test", n=50, seed=0):
        text = my_model(ex.input_text)   # ex.prompt + "\\n" for the built-in tiny model
        ok = task.score(ex, text)        # 1.0 correct/valid, 0.0 not

Suites: "list_edits", "arithmetic", "puzzles", "all" (those three), "chains" (long sequential
answers generated in 128 tokens: `suite_gen_length`) and "chains-hard" (the same length, rules that
the position cannot shortcut).
"""
from __future__ import annotations

from .arithmetic import Arithmetic, extract_number
from .base import (MAX_ANSWER_CHARS, MAX_PROMPT_CHARS, PROMPT_SUFFIX, Example, Task,
                   format_prompt, is_validation, split_of, subset_of)
from .chains import CHAIN_GEN_LENGTH, CHAIN_TASKS, HARD_CHAIN_TASKS
from .list_edits import LIST_EDIT_TASKS, NAMES
from .puzzles import Latin, Sudoku

_TASK_CLASSES = {cls.op: cls for cls in LIST_EDIT_TASKS}
_TASK_CLASSES.update({"arithmetic": Arithmetic, "sudoku": Sudoku, "latin": Latin})
_TASK_CLASSES.update({cls.name: cls for cls in CHAIN_TASKS + HARD_CHAIN_TASKS})

TASK_NAMES = tuple(_TASK_CLASSES)

SUITES: dict[str, tuple[str, ...]] = {
    "list_edits": tuple(cls.op for cls in LIST_EDIT_TASKS),
    "arithmetic": ("arithmetic",),
    "puzzles": ("sudoku", "latin"),
}
SUITES["all"] = SUITES["list_edits"] + SUITES["arithmetic"] + SUITES["puzzles"]
SUITES["chains"] = tuple(cls.name for cls in CHAIN_TASKS)
SUITES["chains-hard"] = tuple(cls.name for cls in HARD_CHAIN_TASKS)

DEFAULT_GEN_LENGTH = 64  # every answer of the short suites plus one EOS fits


def tasks_gen_length(tasks) -> int:
    """Generation length some tasks need: the longest `gen_length` among them (tasks without one,
    and an empty list, need DEFAULT_GEN_LENGTH)."""
    return max([DEFAULT_GEN_LENGTH] + [getattr(task, "gen_length", DEFAULT_GEN_LENGTH) for task in tasks])


def suite_gen_length(name: str) -> int:
    """Generation length a suite (or task) needs (`tasks_gen_length` of its tasks)."""
    return tasks_gen_length(get_suite(name))


def get_task(name: str) -> Task:
    """A fresh task object by name; ValueError lists the valid names."""
    try:
        return _TASK_CLASSES[name]()
    except KeyError:
        raise ValueError(f"unknown task {name!r}; valid tasks: {', '.join(TASK_NAMES)}") from None


def get_suite(name: str) -> list[Task]:
    """The tasks of a suite (or a single task by name); ValueError lists the valid names."""
    if name in SUITES:
        return [get_task(t) for t in SUITES[name]]
    if name in _TASK_CLASSES:
        return [get_task(name)]
    raise ValueError(f"unknown suite {name!r}; valid suites: {', '.join(SUITES)} "
                     f"(or a task: {', '.join(TASK_NAMES)})")


__all__ = ["Example", "Task", "SUITES", "TASK_NAMES", "get_task", "get_suite", "split_of", "is_validation", "subset_of",
           "format_prompt", "PROMPT_SUFFIX", "MAX_ANSWER_CHARS", "MAX_PROMPT_CHARS",
           "extract_number", "NAMES", "suite_gen_length", "tasks_gen_length", "DEFAULT_GEN_LENGTH", "CHAIN_GEN_LENGTH"]
