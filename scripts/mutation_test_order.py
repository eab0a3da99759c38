"""pytest plugin for the mutation runs (scripts/mutation_report.py): cheapest tests first, libraries
imported once.

Order: mutmut runs a mutant's tests with ``-x`` (stop at the first failure) in the order it lists them,
which is arbitrary; a mutant most unit tests kill then often waits for an end-to-end test first. This
sorts the collected tests by the call time mutmut measured in its stats run (``MUTATION_DURATIONS``,
its ``mutmut-stats.json``), in coarse bands so that a module's tests stay together within a band (its
module fixtures are not set up again and again). Which tests run does not change, only their order, and
only when every test passes (a surviving mutant) does the whole list run.

Imports: mutmut forks each mutant's run from a server that has collected the tests, but the libraries
tests import inside their bodies (transformers' model classes, diffusers' pipelines, SGLang) would be
imported again by every mutant, often the larger part of a killed mutant's time on a loaded machine.
The unmutated runs (mutmut's stats and clean runs) record the modules they imported in
``MUTATION_MODULES``; the server imports those (third-party only: never our own packages or the tests,
which must come from the mutants) before it forks.
"""
from __future__ import annotations

import bisect
import importlib
import json
import os
import sys

BANDS_S = (0.02, 0.1, 0.5, 2.0)  # upper bounds of the duration bands, in seconds
OWN = ("dlm", "samplers", "caching", "kernels", "video", "tests", "conftest", "mutation_test_order")


def _load() -> dict[str, float]:
    path = os.environ.get("MUTATION_DURATIONS")
    if not path or not os.path.exists(path):
        return {}
    with open(path) as f:
        return json.load(f).get("duration_by_test", {})


def _third_party(name: str) -> bool:
    top = name.partition(".")[0]
    module = sys.modules.get(name)
    path = getattr(module, "__file__", None) or ""
    return top not in OWN and ("site-packages" in path or "/lib/python" in path)


def _preload() -> None:
    path = os.environ.get("MUTATION_MODULES")
    if not path or not os.path.exists(path):
        return
    with open(path) as f:
        names = [line.strip() for line in f if line.strip()]
    for name in names:
        if name.partition(".")[0] in OWN or name in sys.modules:
            continue
        try:
            importlib.import_module(name)
        except BaseException:  # a module that imports only in some context: the test imports it itself
            pass


_DURATIONS = _load()  # read once: mutmut's fork server imports this before it forks each mutant's run
_preload()


def pytest_collection_modifyitems(session, config, items):
    if not _DURATIONS:
        return
    unknown = len(BANDS_S)  # tests the stats run did not time go last
    order = {id(item): index for index, item in enumerate(items)}

    def key(item):
        duration = _DURATIONS.get(item.nodeid)
        band = unknown if duration is None else bisect.bisect_left(BANDS_S, duration)
        return band, item.nodeid.partition("::")[0], order[id(item)]

    items.sort(key=key)


def pytest_sessionfinish(session, exitstatus):
    path = os.environ.get("MUTATION_MODULES")
    if not path or os.environ.get("MUTANT_UNDER_TEST", "") not in ("", "stats"):
        return  # only the unmutated runs record what the tests import
    known = set()
    if os.path.exists(path):
        with open(path) as f:
            known = {line.strip() for line in f if line.strip()}
    names = known | {name for name in list(sys.modules) if _third_party(name)}
    if names != known:
        with open(path + ".tmp", "w") as f:
            f.write("\n".join(sorted(names)) + "\n")
        os.replace(path + ".tmp", path)
