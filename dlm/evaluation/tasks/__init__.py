"""Harness task files (YAML, JSONL) of the built-in model; a package so that its `utils.py` ships."""
