"""A benchmark run's journal: every finished (sampler, budget) pair on disk the moment it finishes.

`pairs.jsonl`, beside `results.json`, is append-only JSON lines:

    {"journal": 1, "config": {...}}            the run's options as given (what --resume compares)
    {"run": {"config": {...}, "meta": {...}, "planned": [[sampler, budget], ...]}}   per start
    {"pair": {...}}                              one PairResult, written and fsynced when it finishes
    {"complete": true}                           after the last pair

So an interrupted or crashed run loses at most the pair in progress: `partial_result()` rebuilds a
`BenchResult` from what finished (the CLI writes results.json / results.csv / plots from it), and
`dlm bench --resume` on the same folder reuses every finished pair of an identical configuration
(pairs are seeded one by one, so a reused pair is the pair a fresh run would compute; only its
timings come from the earlier process). A half-written last line (a crash during the write) is
dropped; the file is opened for each append, so a folder that vanishes or turns read-only mid-run
is reported at the pair that could not be saved.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path

JOURNAL_NAME = "pairs.jsonl"
VERSION = 1


class OutputError(ValueError):
    """The output folder cannot be written. A ValueError, so that the CLI prints it as one line."""


def _normal(obj):
    """`obj` as it reads back from JSON (tuples become lists), for comparing configurations."""
    return json.loads(json.dumps(obj))


class Journal:
    """The journal of one output folder; see the module docstring.

    Use `Journal.open(out_dir, config, resume=...)` before any work (it refuses a folder holding an
    unfinished run, unless resuming it), then hand it to `run_bench(..., journal=...)`.
    """

    def __init__(self, path: Path, config: dict):
        self.path, self.config = Path(path), _normal(config)
        self.pairs: dict[tuple[str, int], dict] = {}  # finished pairs (this run's and reused ones)
        self.run: dict | None = None  # the latest "run" record: normalized config, meta, planned pairs
        self.reused: list[tuple[str, int]] = []

    # ------------------------------------------------------------------ opening
    @classmethod
    def open(cls, out_dir: str | os.PathLike, config: dict, *, resume: bool) -> "Journal":
        """The journal for a run of `config` in `out_dir`.

        Without `resume`, a journal of an unfinished run there is refused (its work would be lost)
        and a finished one is replaced. With `resume`, an earlier journal of the same configuration
        is continued (ValueError for another configuration); none there starts afresh.
        """
        journal = cls(Path(out_dir) / JOURNAL_NAME, config)
        old = journal.path.is_file() and journal._read()
        if old and not resume and not old["complete"] and journal.pairs:
            raise ValueError(
                f"{journal.path} holds an unfinished run ({len(journal.pairs)} finished pairs); pass --resume to "
                f"finish it with the same options, or delete {journal.path} (or choose another --out) to start afresh")
        if old and resume:
            if old["config"] != journal.config:
                raise ValueError(f"--resume: {journal.path} was written by another configuration ({_diff(old['config'], journal.config)}); "
                                 "rerun with the recorded options, or use another --out to start afresh")
            return journal
        journal.pairs, journal.run = {}, None
        journal._write({"journal": VERSION, "config": journal.config}, mode="w")
        return journal

    def _read(self) -> dict:
        """Load an existing journal; drops a half-written last line (rewriting the file without it)."""
        try:
            text = self.path.read_text()
        except (OSError, UnicodeDecodeError) as err:
            raise OutputError(f"cannot read {self.path}: {err}") from None
        lines, records = text.splitlines(keepends=True), []
        for i, line in enumerate(lines):
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                if i == len(lines) - 1:  # cut short by a crash: drop it, keep the rest
                    self._write("".join(lines[:i]), mode="w")
                    break
                raise ValueError(f"{self.path}: line {i + 1} is not JSON; the journal is damaged "
                                 "(delete it to start afresh)") from None
        if not records or records[0].get("journal") != VERSION:
            raise ValueError(f"{self.path}: not a dlm bench journal (version {VERSION}); delete it or use another --out")
        complete = False
        for rec in records[1:]:
            if "pair" in rec:
                self.pairs[(rec["pair"]["sampler"], int(rec["pair"]["budget"]))] = rec["pair"]
            elif "run" in rec:
                self.run = rec["run"]
            complete = rec.get("complete", False)
        return {"config": records[0]["config"], "complete": complete}

    def _write(self, record, mode: str = "a") -> None:
        line = record if isinstance(record, str) else json.dumps(record) + "\n"
        try:
            with open(self.path, mode) as f:
                f.write(line)
                f.flush()
                os.fsync(f.fileno())
        except OSError as err:
            kept = f"; the {len(self.pairs)} pairs finished before are kept in it" if self.pairs else ""
            raise OutputError(f"cannot write {self.path}: {err.strerror or err}{kept}; make the folder writable "
                              "and rerun with --resume") from None

    # ------------------------------------------------------------------ hooks of run_bench
    def begin(self, config: dict, meta: dict, planned: list[tuple[str, int]]) -> None:
        """A run starts: its normalized config, its meta known before any pair, the pairs it will make."""
        self.run = {"config": _normal(config), "meta": _normal(meta), "planned": [[s, int(b)] for s, b in planned]}
        self._write({"run": self.run})

    def done(self, sampler: str, budget: int):
        """The finished `PairResult` of (sampler, budget) from an earlier run, else None."""
        from dlm.bench.harness import PairResult

        pair = self.pairs.get((sampler, int(budget)))
        if pair is None:
            return None
        self.reused.append((sampler, int(budget)))
        return PairResult(**pair)

    def record(self, pair) -> None:
        """Append a finished pair (written and fsynced before the next pair starts)."""
        data = asdict(pair)
        self._write({"pair": data})
        self.pairs[(pair.sampler, int(pair.budget))] = data

    def finish(self, result) -> None:
        """Mark the run complete; note the reused pairs in `result.meta`."""
        if self.reused:
            result.meta["resumed"] = {"journal": str(self.path), "reused": len(self.reused),
                                      "reused_pairs": [f"{s}@{b}" for s, b in self.reused]}
        self._write({"complete": True})

    # ------------------------------------------------------------------ after an interrupt
    def missing(self) -> list[str]:
        planned = (self.run or {}).get("planned", [])
        return [f"{s}@{b}" for s, b in planned if (s, int(b)) not in self.pairs]

    def partial_result(self, reason: str):
        """A `BenchResult` of the finished pairs in run order, `meta["incomplete"]` saying what is
        missing and why; None when no pair finished (or the run never started)."""
        from dlm.bench.harness import BenchResult, PairResult, compare_to_baselines, summarize_targets

        if self.run is None or not self.pairs:
            return None
        order = [(s, int(b)) for s, b in self.run["planned"]]
        keys = [k for k in order if k in self.pairs] + [k for k in self.pairs if k not in order]
        result = BenchResult(config=dict(self.run["config"]), meta=dict(self.run["meta"]),
                             pairs=[PairResult(**self.pairs[k]) for k in keys])
        result.meta["targets"] = summarize_targets(result)
        result.meta["vs_diffusers"] = compare_to_baselines(result)
        missing = self.missing()
        result.meta["incomplete"] = {"reason": reason, "finished": len(result.pairs), "missing": len(missing),
                                     "missing_pairs": missing, "journal": str(self.path)}
        return result


def _diff(old: dict, new: dict) -> str:
    """`key: old there, new now` for each differing option."""
    keys = [k for k in dict.fromkeys(list(old) + list(new)) if old.get(k) != new.get(k)]
    return "; ".join(f"{k}: {old.get(k)!r} there, {new.get(k)!r} now" for k in keys)


def write_partial(journal: Journal, out_dir: str | os.PathLike, *, plots: bool, reason: str) -> str | None:
    """After an interrupt or crash: write results.json / results.csv (and plots where possible) of the
    finished pairs; returns the line to tell the user, or None when no pair finished."""
    from dlm.bench.report import plot_results, write_csv, write_json

    result = journal.partial_result(reason)
    if result is None:
        return None
    out_dir = Path(out_dir)
    info = result.meta["incomplete"]
    try:
        files = [write_json(result, out_dir / "results.json"), write_csv(result, out_dir / "results.csv")]
    except OSError as err:
        return (f"{reason}: {info['finished']} pairs finished ({info['missing']} missing) but {out_dir} cannot be "
                f"written ({err.strerror or err}); they are in {journal.path}")
    if plots:
        try:
            files += plot_results(result, out_dir)
        except Exception as err:  # a plot is a convenience: the numbers are already saved
            files.append(f"(no plots: {type(err).__name__})")
    return (f"{reason}: wrote {', '.join(str(f) for f in files)} with {info['finished']} finished pairs, "
            f"{info['missing']} missing; rerun the same command with --resume to finish")
