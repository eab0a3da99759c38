"""scripts/eval_tiny_dlm.py: per-suite curves over several step budgets, on 2 examples per task."""
import json

import pytest

from dlm.tasks import get_task

from script_loader import load_script  # tests/script_loader.py (tests/ is on sys.path)


@pytest.fixture(scope="module")
def eval_script():
    return load_script("eval_tiny_dlm.py")


def run(eval_script, tmp_path, *extra):
    out = tmp_path / "eval.json"
    rc = eval_script.main(["--suite", "puzzles", "--n", "2", "--steps", "64,16", "--show", "0",
                           "--json", str(out), *extra])
    assert rc == 0
    return json.loads(out.read_text())


def test_curve_per_suite_and_scores_recomputed(eval_script, tmp_path, capsys):
    payload = run(eval_script, tmp_path, "--eos-stop")
    assert payload["settings"]["eos_stop"] is True
    by_steps = payload["models"]["tiny-dlm"]
    assert list(by_steps) == ["64", "16"]
    for steps, result in by_steps.items():
        tasks = result["tasks"]
        assert set(tasks) == {"sudoku", "latin"}
        for name, r in tasks.items():
            assert r["n"] == 2 and len(r["samples"]) == 2
            assert 0 < r["nfe"] <= int(steps)  # one batch; eos-stop may end early
            # every stored score is the task verifier's verdict, and the accuracy is their mean
            task = get_task(name)
            for s in r["samples"]:
                ex = next(e for e in task.examples("test", 2, seed=0) if e.prompt == s["prompt"])
                assert task.score(ex, s["output"]) == s["score"]
            assert r["accuracy"] == pytest.approx(sum(s["score"] for s in r["samples"]) / 2)
        accs = [tasks[t]["accuracy"] for t in ("sudoku", "latin")]
        assert result["suites"]["puzzles"] == pytest.approx(sum(accs) / 2)
        assert result["suites"]["mean"] == pytest.approx(sum(accs) / 2)
    table = capsys.readouterr().out
    assert ("| model | suite | 64 steps (budget 1 tok/fwd): acc % (measured tok/fwd) | "
            "16 steps (budget 4 tok/fwd): acc % (measured tok/fwd) |") in table
    # the measured tokens per forward: generated tokens over the forwards taken (one batch per task here)
    row = next(line for line in table.splitlines() if line.startswith("| tiny-dlm | puzzles |"))
    for cell, steps in zip(row.split(" | ")[2:], ("64", "16")):
        nfe = [by_steps[steps]["tasks"][t]["nfe"] for t in ("sudoku", "latin")]
        assert cell.rstrip(" |").endswith(f"({64 * 2 / sum(nfe):.1f})")


def test_engine_matches_the_scripts_reference_loop(eval_script, tmp_path):
    """Without EOS stopping, dlm.generate and the script's own loop decode the same text."""
    engine = run(eval_script, tmp_path)["models"]["tiny-dlm"]
    reference = run(eval_script, tmp_path, "--loop", "simple")["models"]["tiny-dlm"]
    for steps in ("64", "16"):
        for name in ("sudoku", "latin"):
            outs = [s["output"] for s in engine[steps]["tasks"][name]["samples"]]
            assert outs == [s["output"] for s in reference[steps]["tasks"][name]["samples"]]


def test_validation_split_and_excluded_draws(eval_script, tmp_path, capsys):
    from dlm.tasks import subset_of

    def one(*extra):  # one cheap budget: the prompts are what is checked here
        out = tmp_path / "split.json"
        assert eval_script.main(["--suite", "puzzles", "--n", "2", "--steps", "4", "--show", "0", "--json", str(out),
                                 *extra]) == 0
        return json.loads(out.read_text())["models"]["tiny-dlm"]["4"]["tasks"]

    val = one("--split", "val")
    assert all(subset_of(s["prompt"]) == "val" for t in val.values() for s in t["samples"])
    # --exclude: test prompts outside an earlier draw (here the seed-0 draw of 5 per task)
    fresh = one("--exclude", "0:5")
    for name, r in fresh.items():
        earlier = {e.prompt for e in get_task(name).examples("test", 5, seed=0)}
        prompts = [s["prompt"] for s in r["samples"]]
        assert len(prompts) == 2 and not set(prompts) & earlier
        assert all(subset_of(p) == "test" for p in prompts)
    assert "excluding the draws 0:5" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["--exclude", "0-200"], "--exclude"),
    (["--exclude", "a:3"], "--exclude"),
    (["--steps", "64,0"], "--steps"),
    (["--steps", "sixty"], "--steps"),
    (["--suite", "nope"], "unknown suite"),
    (["--model", "/no/such/checkpoint"], "--model"),
])
def test_bad_arguments_exit_2_with_one_line(eval_script, capsys, argv, message):
    assert eval_script.main(["--n", "1", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and err.count("\n") == 1
