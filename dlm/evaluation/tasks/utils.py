"""Functions the task YAML files of this folder name (`!function utils.<name>`)."""
from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent


def load_docs(jsonl: str, **_):
    """The harness's `custom_dataset`: the JSONL file beside this module as a `test` split.

    It is called with the run's metadata (the model_args among them) as well, which it ignores. A
    path inside the package, so the tasks work from any working directory (a `data_files` path in a
    YAML would resolve against the current directory)."""
    import datasets

    path = HERE / jsonl
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})
