"""pytest plugin for the mutation runs (scripts/mutation_report.py): cheapest tests first.

mutmut runs a mutant's tests with ``-x`` (stop at the first failure) in the order it lists them, which
is arbitrary; a mutant most unit tests kill then often waits for an end-to-end test first. This sorts
the collected tests by the call time mutmut measured in its stats run (``MUTATION_DURATIONS``, its
``mutmut-stats.json``), in coarse bands so that a module's tests stay together within a band (its
module fixtures are not set up again and again). Which tests run does not change, only their order,
and only when every test passes (a surviving mutant) does the whole list run.
"""
from __future__ import annotations

import bisect
import json
import os

BANDS_S = (0.02, 0.1, 0.5, 2.0)  # upper bounds of the duration bands, in seconds


def _load() -> dict[str, float]:
    path = os.environ.get("MUTATION_DURATIONS")
    if not path or not os.path.exists(path):
        return {}
    with open(path) as f:
        return json.load(f).get("duration_by_test", {})


_DURATIONS = _load()  # read once: mutmut's fork server imports this before it forks each mutant's run


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
