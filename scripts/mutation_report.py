"""Mutation testing of the decision code with mutmut 3 (issue 42): stage, run, report.

    scripts/mutation_report.sh run [GROUP ...] [--sample N [--seed S]] [--minutes N] [--tests-ref COMMIT] [--retest-survivors]
    scripts/mutation_report.sh report [GROUP ...] [--sample N [--seed S]] [--json F]   # the per-group table (of the sample)
    scripts/mutation_report.sh survivors GROUP                 # each surviving mutant and its diff
    scripts/mutation_report.sh kills PATTERN TEST...           # which mutants some tests kill (a quick check)

docs/testing.md, "Mutation testing", explains the options and holds the last scores.

GROUPS (below) are the module groups of docs/testing.md. mutmut runs in a staged copy of this
checkout (``.mutation/stage``, git-ignored; the tree you commit never holds mutated code): the tracked
and untracked-but-not-ignored files are copied there, mutmut writes its mutants to
``.mutation/stage/mutants`` and keeps its results there, so a second ``run`` resumes where the first
stopped and re-tests only the mutants of functions that changed since.

One change is made to the staged copy before mutating, and it does not change behaviour: mutmut 3 skips
every decorated function (it cannot re-apply a decorator to each mutant), which would leave out
``run_masked`` (``@torch.no_grad()``), the schedulers' ``__init__`` (``@register_to_config``) and the
properties. The stage writes each such decorator as an assignment after the function
(``f = torch.no_grad()(f)``: what the ``@`` syntax does) so its body is mutated; Triton kernels
(``@triton.jit`` reads the function's source) and property setters stay as they are and unmutated.

mutmut first runs the selected tests once to learn which test calls which function; each mutant then
runs only the tests that call the mutated function (stopping at the first failure). A mutant that makes
those tests fail is killed; one that takes more than ``timeout_multiplier`` x (the tests' time +
``timeout_constant``) is a timeout (it changed behaviour too: an endless loop); one no test reaches is
"no tests" and counts as a survivor. Mutants listed in ``scripts/mutation_equivalent.txt`` (each with
its diff line and the reason it cannot change any result) are left out of the score; an entry whose
diff no longer matches the mutant is reported as stale and not left out.

The score of a group is (killed + timeout) / (mutants tested - equivalent). Only mutmut's
configuration (``[tool.mutmut]`` in pyproject.toml) and this file decide what is mutated and run.
"""
from __future__ import annotations

import argparse
import ast
import fnmatch
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORK = Path(os.environ.get("MUTATION_DIR", ROOT / ".mutation"))
STAGE = WORK / "stage"
EQUIVALENT_FILE = ROOT / "scripts" / "mutation_equivalent.txt"

# Module groups: name -> the files whose mutants make its score (paths relative to the repo root).
GROUPS: dict[str, list[str]] = {
    "unmasking": ["samplers/unmasking/*.py"],
    "contract": ["samplers/contract.py"],
    "driver": ["dlm/engine/*.py"],
    "masked_loop": [f"dlm/engine/masked/{name}.py"
                    for name in ("plan", "loop", "forward", "lookahead", "kv_cache", "elastic", "eos", "inputs")],
    "uniform_noise": ["dlm/engine/uniform/*.py"],
    "block_window": ["dlm/engine/masked/window.py"],
    "solvers": [f"samplers/solvers/{name}.py" for name in ("ddim", "pndm", "dpmpp_2m", "dpm_solver", "unipc", "flow")],
    "caching": ["caching/*.py"],
    "kernels": ["kernels/*.py"],
}

# Decorators kept in place (so their function is not mutated): Triton compiles the source it reads,
# a property setter must follow its getter under the same name, and mutmut handles these two itself.
KEPT_DECORATORS = ("triton.jit", "staticmethod", "classmethod")
# [tool.mutmut] keys that decide which mutants exist.
GENERATION_KEYS = ("source_paths", "only_mutate", "do_not_mutate", "do_not_mutate_patterns", "also_copy",
                   "mutate_only_covered_lines")


def group_files(group: str, root: Path = ROOT) -> list[str]:
    """The repo-relative .py files of one group, sorted."""
    files = set()
    for pattern in GROUPS[group]:
        files |= {str(p.relative_to(root)) for p in root.glob(pattern) if p.is_file()}
    return sorted(files)


def module_of(path: str) -> str:
    """Dotted module of a repo-relative path, as mutmut names it (``pkg/__init__.py`` -> ``pkg``)."""
    dotted = path[: -len(".py")].replace("/", ".")
    return dotted[: -len(".__init__")] if dotted.endswith(".__init__") else dotted


# --------------------------------------------------------------------------------------------- staging

def _tracked_files() -> list[str]:
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                         check=True, capture_output=True).stdout
    return [p for p in out.decode().split("\0") if p and (ROOT / p).is_file()]


def _decorator_source(source: str, decorator: ast.expr) -> str:
    return ast.get_source_segment(source, decorator)


def undecorate(source: str) -> str:
    """``source`` with each decorated function (module level or in a class body) rewritten as the plain
    function followed by ``name = deco(name)``: the same object, but mutmut mutates its body.
    Decorators in ``KEPT_DECORATORS``, ``@x.setter``/``@x.deleter`` and nested functions are left alone."""
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    edits = []  # (first decorator line, def line, end line, indent, name, decorator sources)

    def visit(body):
        for node in body:
            if isinstance(node, ast.ClassDef):
                visit(node.body)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.decorator_list:
                texts = [_decorator_source(source, d) for d in node.decorator_list]
                if any(t in KEPT_DECORATORS or t.endswith((".setter", ".deleter")) for t in texts):
                    continue
                first = min(d.lineno for d in node.decorator_list)
                indent = lines[node.lineno - 1][: len(lines[node.lineno - 1]) - len(lines[node.lineno - 1].lstrip())]
                edits.append((first, node.lineno, node.end_lineno, indent, node.name, texts))

    visit(tree.body)
    for first, def_line, end, indent, name, texts in sorted(edits, reverse=True):
        wrapped = name
        for text in reversed(texts):
            wrapped = f"{text}({wrapped})"
        assignment = f"{indent}{name} = {wrapped}  # decorator applied after the def so mutmut mutates the body\n"
        lines[end:end] = [assignment]
        del lines[first - 1:def_line - 1]
    out = "".join(lines)
    ast.parse(out)
    return out


def _settings_fingerprint() -> str:
    """What decides which mutants exist besides the sources: mutmut's version, the [tool.mutmut] keys that
    choose what is mutated, the staging. (mutmut itself re-tests what a change of the tests, their
    options or the timeouts can change.)"""
    import hashlib
    import inspect
    import tomllib
    from importlib.metadata import version
    settings = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mutmut"]
    settings = {key: settings.get(key) for key in GENERATION_KEYS}
    text = json.dumps([version("mutmut"), settings, inspect.getsource(undecorate), KEPT_DECORATORS], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def _tests_at(ref: str) -> dict[str, bytes]:
    """The files under tests/ at git commit ``ref``."""
    names = subprocess.run(["git", "ls-tree", "-r", "-z", "--name-only", ref, "--", "tests"], cwd=ROOT, check=True,
                           capture_output=True).stdout.decode().split("\0")
    return {name: subprocess.run(["git", "show", f"{ref}:{name}"], cwd=ROOT, check=True, capture_output=True).stdout
            for name in names if name}


def _write_if_changed(dst: Path, data: bytes, mode_from: Path | None = None) -> bool:
    """Write ``data`` to ``dst`` unless it already holds it; True when it wrote."""
    if dst.exists() and dst.read_bytes() == data:
        return False
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_bytes(data)
    if mode_from is not None:
        shutil.copymode(mode_from, dst)
    return True


def stage(tests_ref: str | None = None) -> None:
    """Copy the checkout into STAGE (only files whose content changed, so mutmut's caches hold) and
    undecorate the files of every group. mutmut re-makes the mutants of a file only when the file
    changes, so a change of its settings or of the staging starts the stage afresh.

    tests_ref: take tests/ from this git commit instead of the checkout (the suite *before* new tests,
    to measure the scores before and after on the same code); mutmut keeps a mutant's verdict, so
    re-test a group's survivors after switching (``run GROUP --retest-survivors``)."""
    fingerprint = _settings_fingerprint()
    stamp = WORK / "settings.sha256"
    if STAGE.exists() and (not stamp.exists() or stamp.read_text() != fingerprint):
        print("mutation settings changed: starting from a fresh stage", flush=True)
        shutil.rmtree(STAGE)
    STAGE.mkdir(parents=True, exist_ok=True)
    stamp.write_text(fingerprint)
    mutated = {f for group in GROUPS for f in group_files(group)}
    tests = _tests_at(tests_ref) if tests_ref else None
    for rel in _tracked_files():
        if tests is not None and rel.startswith("tests/"):
            continue
        data = (ROOT / rel).read_bytes()
        if rel in mutated:
            data = undecorate(data.decode()).encode()
        _write_if_changed(STAGE / rel, data, ROOT / rel)
    if tests is None:
        tests = {rel: (ROOT / rel).read_bytes() for rel in _tracked_files() if rel.startswith("tests/")}
    tests_changed = False
    for rel, data in tests.items():
        tests_changed |= _write_if_changed(STAGE / rel, data)
    # mutmut learns which tests reach which function once, and afterwards only for test names it has
    # not seen: a changed test body (a new call of a function) would keep its old, narrower reach and
    # the mutants it now kills would stay survivors. So any change of the suite re-learns it all.
    stats = STAGE / "mutants" / "mutmut-stats.json"
    if tests_changed and stats.exists():
        print("the suite changed: mutmut re-learns which tests reach which function", flush=True)
        stats.unlink()
    # mutmut copies tests/ into mutants/ without deleting: remove the test files the chosen suite lacks.
    for copy in (STAGE / "tests", STAGE / "mutants" / "tests"):
        if copy.exists():
            for path in copy.rglob("*.py"):
                if str(Path("tests") / path.relative_to(copy)) not in tests:
                    path.unlink()


# ----------------------------------------------------------------------------------------- mutmut state

def _meta(path: str) -> dict:
    meta = STAGE / "mutants" / (path + ".meta")
    if not meta.exists():
        return {}
    return json.loads(meta.read_text()).get("exit_code_by_key", {})


def _status(exit_code) -> str:
    from mutmut.stats import status_by_exit_code
    return status_by_exit_code[exit_code]


def _generate_mutants() -> None:
    """Write the mutants of every group into STAGE/mutants (mutmut's own generation step, which
    ``mutmut run`` repeats as a no-op), so the mutants still to test can be named before running."""
    code = ("import os, sys\n"
            "from mutmut.__main__ import copy_src_dir, copy_also_copy_files, create_mutants\n"
            "from mutmut.mutation.trampoline import set_mutant_under_test\n"
            "set_mutant_under_test('mutant_generation')\n"
            "os.makedirs('mutants', exist_ok=True)\n"
            "copy_src_dir(); copy_also_copy_files(); create_mutants(1)\n")
    subprocess.run([sys.executable, "-c", code], cwd=STAGE, check=True, stdout=subprocess.DEVNULL)


def _all_mutants(group: str) -> list[str]:
    return sorted(key for path in group_files(group, STAGE) for key in _meta(path))


def sample_of(group: str, size: int, seed: int = 0) -> list[str]:
    """The first ``size`` mutants of the group in a fixed random order (the same seed gives the same
    order, so a larger sample extends a smaller one; another seed draws a fresh sample, one that took
    no part in writing the tests of an earlier one)."""
    import random
    names = _all_mutants(group)
    random.Random(f"{seed}:{group}").shuffle(names)
    return names[:size]


def _survivors(group: str, sample: int | None = None, seed: int = 0) -> list[str]:
    """The group's surviving mutants (of the sample), less those listed as equivalent."""
    codes = {key: code for path in group_files(group, STAGE) for key, code in _meta(path).items()}
    names = sample_of(group, sample, seed) if sample is not None else sorted(codes)
    equivalent = equivalents()
    return [key for key in names if _status(codes[key]) in ("survived", "no tests")
            and not (key in equivalent and _equivalent_holds(key, equivalent[key][0]))]


def _unclear(group: str, sample: int | None = None, seed: int = 0) -> list[str]:
    """The group's mutants (of the sample) whose run ended in no verdict: an exit code mutmut does not
    know ("suspicious"), a crash, an interruption. Re-tested with the survivors."""
    known = ("killed", "timeout", "survived", "no tests", "not checked", "caught by type check", "skipped")
    codes = {key: code for path in group_files(group, STAGE) for key, code in _meta(path).items()}
    names = sample_of(group, sample, seed) if sample is not None else sorted(codes)
    return [key for key in names if _status(codes[key]) not in known]


def _untested(group: str, sample: int | None = None, seed: int = 0) -> list[str]:
    codes = {key: code for path in group_files(group, STAGE) for key, code in _meta(path).items()}
    names = sample_of(group, sample, seed) if sample is not None else sorted(codes)
    return [key for key in names if codes[key] is None]


def _stop(proc: subprocess.Popen) -> None:
    """Stop mutmut and its fork server's workers (a finished mutant keeps its result, a running one stays
    untested)."""
    for sig, wait in ((signal.SIGINT, 60), (signal.SIGTERM, 30), (signal.SIGKILL, 30)):
        try:
            os.killpg(proc.pid, sig)
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue
        except ProcessLookupError:
            return


def run(groups: list[str], minutes: float | None, sample: int | None = None, tests_ref: str | None = None,
        retest_survivors: bool = False, seed: int = 0) -> None:
    stage(tests_ref)
    _generate_mutants()
    deadline = None if minutes is None else time.monotonic() + 60 * minutes
    plugins = WORK / "plugins"
    plugins.mkdir(exist_ok=True)
    shutil.copy(ROOT / "scripts" / "mutation_test_order.py", plugins / "mutation_test_order.py")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the tests import from mutants/
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", PYTHONPATH=str(plugins),
               PYTEST_PLUGINS="mutation_test_order", MUTATION_DURATIONS=str(STAGE / "mutants" / "mutmut-stats.json"),
               MUTATION_MODULES=str(WORK / "modules.txt"))
    # Groups one after the other (the first group's mutants are all tested before the next group's);
    # with --sample, all groups in one mutmut run, since each run first runs its tests once unmutated.
    batches = [groups] if sample is not None else [[group] for group in groups]
    for batch in batches:
        names = []
        for group in batch:
            todo = _untested(group, sample, seed) + (_survivors(group, sample, seed) + _unclear(group, sample, seed)
                                                     if retest_survivors else [])
            print(f"== {group}: {len(todo)} mutants to test", flush=True)
            names += todo
        if not names:
            continue
        if deadline is not None and time.monotonic() >= deadline:
            print("time limit reached", flush=True)
            break
        proc = subprocess.Popen(["mutmut", "run", "--max-children", os.environ.get("MUTATION_JOBS", "1"), *names],
                                cwd=STAGE, env=env, start_new_session=True)
        try:
            proc.wait(timeout=None if deadline is None else max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            print("time limit reached: stopping mutmut (finished mutants keep their result)", flush=True)
            _stop(proc)
            break
        except KeyboardInterrupt:
            _stop(proc)
            raise
    report(groups, sample=sample, seed=seed)


# ----------------------------------------------------------------------------------------------- report

def equivalents() -> dict[str, tuple[str, str]]:
    """mutant name -> (the changed line the mutant must show, why no result can change)."""
    out = {}
    if not EQUIVALENT_FILE.exists():
        return out
    for raw in EQUIVALENT_FILE.read_text().splitlines():
        if not raw.strip() or raw.lstrip().startswith("#"):
            continue
        name, _, rest = raw.partition(" | ")
        line, _, reason = rest.rpartition(" | ")  # the code line may hold " | " itself, the reason may not
        name, line, reason = name.strip(), line.strip(), reason.strip()
        out[name] = (line, reason)
    return out


def mutant_diff(name: str) -> str:
    return subprocess.run(["mutmut", "show", name], cwd=STAGE, capture_output=True, text=True).stdout


def _equivalent_holds(name: str, line: str) -> bool:
    """The listed changed line is still what the mutant does (its number may have moved to another change)."""
    added = [l[1:].strip() for l in mutant_diff(name).splitlines() if l.startswith("+") and not l.startswith("+++")]
    return line in added


def tally(group: str, equivalent: dict[str, tuple[str, str]], sample: int | None = None, seed: int = 0) -> dict:
    """Counts of the group's mutants by verdict, or of its random sample of ``sample`` (``run --sample``)
    only: results of mutants outside the sample (earlier samples, ``kills`` checks) are left out, so
    the score is that of one random sample. ``mutants`` is the group's size either way."""
    counts = dict(mutants=0, killed=0, timeout=0, survived=0, no_tests=0, untested=0, other=0, equivalent=0,
                  stale_equivalent=0)
    chosen = set(sample_of(group, sample, seed)) if sample is not None else None
    for path in group_files(group, STAGE):
        for key, code in _meta(path).items():
            counts["mutants"] += 1
            if chosen is not None and key not in chosen:
                counts["untested"] += 1
                continue
            status = _status(code)
            if status == "not checked":
                counts["untested"] += 1
                continue
            if status in ("survived", "no tests") and key in equivalent:
                if _equivalent_holds(key, equivalent[key][0]):
                    counts["equivalent"] += 1
                    continue
                counts["stale_equivalent"] += 1
            field = {"killed": "killed", "timeout": "timeout", "survived": "survived", "no tests": "no_tests"}
            counts[field.get(status, "other")] += 1
    tested = counts["mutants"] - counts["untested"]
    scored = tested - counts["equivalent"]
    caught = counts["killed"] + counts["timeout"]
    counts["score"] = caught / scored if scored else None
    counts["interval"] = wilson(caught, scored) if scored and counts["untested"] else None
    return counts


def wilson(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of a proportion: the score's range when the tested mutants are a random
    sample of the group (``run --sample``)."""
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * ((p * (1 - p) / n + z * z / (4 * n * n)) ** 0.5) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def report(groups: list[str], json_path: str | None = None, sample: int | None = None, seed: int = 0) -> None:
    equivalent = equivalents()
    rows = {group: tally(group, equivalent, sample, seed) for group in groups}
    head = ("group", "mutants", "tested", "killed", "timeout", "survived", "no tests", "equivalent", "other", "score")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for group, c in rows.items():
        score = "-" if c["score"] is None else f"{100 * c['score']:.1f}%"
        if c["interval"] is not None:
            score += f" ({100 * c['interval'][0]:.0f}-{100 * c['interval'][1]:.0f}%)"
        print(f"| {group} | {c['mutants']} | {c['mutants'] - c['untested']} | {c['killed']} | {c['timeout']} | "
              f"{c['survived']} | {c['no_tests']} | {c['equivalent']} | {c['other']} | {score} |")
    stale = sum(c["stale_equivalent"] for c in rows.values())
    if stale:
        print(f"{stale} entries of {EQUIVALENT_FILE.name} no longer match their mutant: counted as survivors")
    if json_path:
        Path(json_path).write_text(json.dumps(rows, indent=1))


def survivors(group: str) -> None:
    equivalent = equivalents()
    for path in group_files(group, STAGE):
        for key, code in _meta(path).items():
            if _status(code) in ("survived", "no tests") and key not in equivalent:
                print(f"### {key}: {_status(code)}")
                print(mutant_diff(key))


_KILLS_CHILD = """
import json, os, sys
import pytest
names, tests = json.loads(sys.argv[1]), json.loads(sys.argv[2])
result = {}
for name in names:
    os.environ["MUTANT_UNDER_TEST"] = name
    code = pytest.main(["-x", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", *tests])
    result[name] = int(code)
print("KILLS-RESULT " + json.dumps(result))
"""


def kills(pattern: str, tests: list[str]) -> None:
    """Which mutants matching ``pattern`` (an fnmatch pattern on mutant names, e.g. a function's
    ``samplers.contract.x_tokens_this_step__mutmut_*``, or a group name for its survivors) the given
    test files kill, run in one process against a scratch copy of the mutants. A quick check while
    writing tests; the scores come from ``run``."""
    scratch = WORK / "scratch"
    shutil.copytree(STAGE / "mutants", scratch, dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("*.meta", "mutmut-stats.json", ".hypothesis"))
    rel = []
    for test in tests:
        path = Path(test).resolve().relative_to(ROOT)
        (scratch / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / path, scratch / path)
        rel.append(str(path))
    if pattern in GROUPS:
        names = [key for path in group_files(pattern, STAGE) for key, code in _meta(path).items()
                 if _status(code) in ("survived", "no tests")]
    else:
        names = sorted({key for group in GROUPS for key in _all_mutants(group) if fnmatch.fnmatch(key, pattern)})
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYTHONPATH=str(scratch), OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-c", _KILLS_CHILD, json.dumps(names), json.dumps(rel)], cwd=scratch,
                         env=env, capture_output=True, text=True)
    line = [l for l in out.stdout.splitlines() if l.startswith("KILLS-RESULT ")]
    if not line:
        print(out.stdout[-3000:], out.stderr[-3000:])
        raise SystemExit("the check did not finish")
    result = json.loads(line[0].split(" ", 1)[1])
    alive = [name for name, code in result.items() if code == 0]
    print(f"{len(result) - len(alive)} of {len(result)} mutants killed by {' '.join(rel)}")
    for name in alive:
        print("alive:", name)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_run = sub.add_parser("run", help="test the mutants not yet tested, group by group")
    p_run.add_argument("groups", nargs="*", help=f"default: all, in this order: {' '.join(GROUPS)}")
    p_run.add_argument("--minutes", type=float, help="stop after this long (finished mutants keep their result)")
    p_run.add_argument("--sample", type=int, help="test only this many mutants per group, drawn at random "
                       "(a fixed order: a larger sample extends a smaller one); the report gives the "
                       "score's 95%% interval")
    p_run.add_argument("--seed", type=int, default=0, help="which random order --sample draws from (default 0; "
                       "another seed gives a fresh sample)")
    p_run.add_argument("--tests-ref", help="take tests/ from this git commit (e.g. the commit before new tests)")
    p_run.add_argument("--retest-survivors", action="store_true",
                       help="also re-test the surviving mutants (after adding tests) and those whose run gave "
                       "no verdict (mutmut's 'suspicious': an exit code it does not know)")
    p_report = sub.add_parser("report", help="per-group table of the last results")
    p_report.add_argument("groups", nargs="*")
    p_report.add_argument("--json", help="also write the counts to this file")
    p_report.add_argument("--sample", type=int, default=None,
                          help="count only the random sample of N mutants per group that run --sample N tests")
    p_report.add_argument("--seed", type=int, default=0, help="the --seed of that run")
    p_surv = sub.add_parser("survivors", help="the surviving mutants of one group with their diffs")
    p_surv.add_argument("group", choices=list(GROUPS))
    p_kills = sub.add_parser("kills", help="which mutants some test files kill (a quick check, not a score)")
    p_kills.add_argument("pattern", help="a group (its survivors) or a pattern of mutant names")
    p_kills.add_argument("tests", nargs="+", help="test files")
    args = parser.parse_args(argv)
    for group in getattr(args, "groups", []) or []:
        if group not in GROUPS:
            parser.error(f"unknown group {group!r}; groups: {', '.join(GROUPS)}")
    if shutil.which("mutmut") is None:
        parser.error("mutmut is not installed: pip install -e '.[mutation]'")
    groups = getattr(args, "groups", None) or list(GROUPS)
    if args.command == "run":
        run(groups, args.minutes, args.sample, args.tests_ref, args.retest_survivors, args.seed)
    elif args.command == "report":
        report(groups, args.json, args.sample, args.seed)
    elif args.command == "kills":
        kills(args.pattern, args.tests)
    else:
        survivors(args.group)
    return 0


if __name__ == "__main__":
    sys.exit(main())
