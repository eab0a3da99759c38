"""The engine's golden fixture (issue 49): every registered sampler under every loop option gives,
at every commit, exactly what it gave at the commit before the engine was restructured: tokens,
forward counts, forward tokens, steps per block, per-sequence forwards, the step trace, and the
refusals' messages. See `tests/dlm/golden/engine_cases.py` for the grid."""
import torch

from tests.dlm.golden.engine_cases import GOLDEN, all_cases, _run


def _first_difference(want: dict, got: dict) -> str:
    for field in sorted(set(want) | set(got)):
        if want.get(field) != got.get(field):
            if field == "trace" and "trace" in want and "trace" in got:
                for i, (a, b) in enumerate(zip(want["trace"], got["trace"])):
                    if a != b:
                        return f"trace record {i}: want {a[:9]}, got {b[:9]}"
                return f"trace length: want {len(want['trace'])}, got {len(got['trace'])}"
            return f"{field}: want {str(want.get(field))[:200]}, got {str(got.get(field))[:200]}"
    return ""


def test_every_case_matches_the_golden_fixture(one_thread):
    golden = torch.load(GOLDEN)
    cases = dict(all_cases())
    assert sorted(cases) == sorted(golden), "the grid changed: regenerate the fixture only at a reference commit"
    differences = []
    for key, call in cases.items():
        got = _run(call)
        if got != golden[key]:
            differences.append(f"{key}: {_first_difference(golden[key], got)}")
    assert not differences, f"{len(differences)} of {len(cases)} cases differ:\n" + "\n".join(differences[:20])


def test_the_fixture_covers_both_families_and_refusals():
    golden = torch.load(GOLDEN)
    ran = [k for k, v in golden.items() if "error" not in v]
    assert any(k.startswith("uniform/") for k in ran) and any(k.startswith("masked/") for k in ran)
    assert any("error" in v for v in golden.values())
    assert sum(len(v["trace"]) for v in golden.values() if "trace" in v) > 1000
