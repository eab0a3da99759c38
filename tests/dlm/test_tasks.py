import pytest

from dlm.tasks import (MAX_ANSWER_CHARS, MAX_PROMPT_CHARS, SUITES, TASK_NAMES, Example,
                       extract_number, get_suite, get_task, is_validation, split_of, subset_of)
from dlm.tiny.tokenizer import TinyCharTokenizer

ALL = list(TASK_NAMES)


@pytest.mark.parametrize("name", ALL)
def test_deterministic_and_valid(name):
    task = get_task(name)
    a = task.examples("train", 30, seed=7)
    b = task.examples("train", 30, seed=7)
    c = task.examples("train", 30, seed=8)
    assert a == b
    assert [e.meta for e in a] == [e.meta for e in b]
    assert a != c
    tok = TinyCharTokenizer()
    for ex in a:
        assert ex.task == name
        if name not in SUITES["chains"] + SUITES["chains-hard"]:  # chains have their own lengths (tests/dlm/test_chains.py)
            assert len(ex.answer) <= MAX_ANSWER_CHARS and len(ex.prompt) <= MAX_PROMPT_CHARS
        tok.encode(ex.input_text + ex.answer)  # inside the tiny model's alphabet
        assert task.score(ex, ex.answer) == 1.0
        assert task.score(ex, ex.answer + "\nanything after the first line") == 1.0


@pytest.mark.parametrize("name", ALL)
def test_train_test_disjoint(name):
    task = get_task(name)
    train = task.examples("train", 200, seed=0)
    test = task.examples("test", 40, seed=0)
    assert all(split_of(e.prompt) == "train" for e in train)
    assert all(split_of(e.prompt) == "test" for e in test)
    assert not {e.prompt for e in train} & {e.prompt for e in test}
    assert len({e.prompt for e in test}) == 40  # unique by default


@pytest.mark.parametrize("name", ALL)
def test_validation_split_is_its_own(name):
    task = get_task(name)
    val = task.examples("val", 30, seed=0)
    train = task.examples("train", 200, seed=0)
    test = task.examples("test", 30, seed=0)
    # validation prompts: train-split prompts that is_validation picks, never trained on, never test
    assert all(split_of(e.prompt) == "train" and is_validation(e.prompt) for e in val)
    assert not any(is_validation(e.prompt) for e in train)
    assert [subset_of(e.prompt) for e in val + train + test] == ["val"] * 30 + ["train"] * 200 + ["test"] * 30
    assert not {e.prompt for e in val} & ({e.prompt for e in train} | {e.prompt for e in test})


def test_split_shares():
    # by the hash alone: 10% test, 9% validation (10% of the rest), 81% train
    prompts = [f"prompt {i}" for i in range(20000)]
    share = {k: sum(subset_of(p) == k for p in prompts) / len(prompts) for k in ("train", "val", "test")}
    assert abs(share["test"] - 0.10) < 0.01 and abs(share["val"] - 0.09) < 0.01 and abs(share["train"] - 0.81) < 0.015
    from dlm.tiny.dgemma import is_validation as dgemma_validation  # tiny-dgemma's split is this one
    assert dgemma_validation is is_validation


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("garbage", ["", "   ", "\n\n", "####", "#### x", "?!;", None, "1" * 200])
def test_garbage_does_not_crash(name, garbage):
    task = get_task(name)
    ex = task.examples("test", 1, seed=0)[0]
    task.extract(garbage)
    assert task.score(ex, garbage) in (0.0, 1.0)


def test_registry_errors():
    with pytest.raises(ValueError, match="valid tasks"):
        get_task("nope")
    with pytest.raises(ValueError, match="valid suites"):
        get_suite("nope")
    chains = set(SUITES["chains"]) | set(SUITES["chains-hard"])
    assert {t.name for t in get_suite("all")} | chains == set(SUITES["all"]) | chains == set(ALL)
    assert [t.name for t in get_suite("puzzles")] == ["sudoku", "latin"]
    with pytest.raises(ValueError, match="split must be one of"):
        get_task("copy").examples("dev", 1, 0)


def _ex(task, prompt, answer, **meta):
    return Example(prompt, answer, task, meta)


def test_list_edit_exact():
    t = get_task("reverse")
    ex = _ex("reverse", "reverse: ana bo cyd", "cyd bo ana", items=["ana", "bo", "cyd"])
    assert t.score(ex, "cyd bo ana") == 1.0
    assert t.score(ex, "  cyd  bo ana \n") == 1.0
    assert t.score(ex, "ana bo cyd") == 0.0
    assert t.score(ex, "cyd bo") == 0.0
    assert t.extract("cyd  bo ana\nzzz") == "cyd bo ana"
    s = get_task("sort")
    ex = _ex("sort", "sort: cyd ana bo", "ana bo cyd", items=["cyd", "ana", "bo"])
    assert s.score(ex, "ana bo cyd") == 1.0 and s.score(ex, "ana cyd bo") == 0.0


def test_list_edit_index_semantics():
    for name, prompt, ans in [("insert_index", "insert 1 eli: ana bo cyd", "ana eli bo cyd"),
                              ("remove_index", "remove 1: ana bo cyd", "ana cyd"),
                              ("replace_index", "replace 1 eli: ana bo cyd", "ana eli cyd")]:
        # generated examples follow the documented 0-based semantics
        task = get_task(name)
        for ex in task.examples("train", 20, seed=1):
            xs, i = ex.meta["items"], ex.meta["index"]
            got = ex.answer.split()
            if name == "insert_index":
                assert got == xs[:i] + [ex.meta["name"]] + xs[i:]
            elif name == "remove_index":
                assert got == xs[:i] + xs[i + 1:]
            else:
                assert got == xs[:i] + [ex.meta["name"]] + xs[i + 1:]
        assert task.score(_ex(name, prompt, ans), ans) == 1.0


def test_shuffle_validity():
    t = get_task("shuffle")
    ex = _ex("shuffle", "shuffle: ana bo cyd", "bo ana cyd", items=["ana", "bo", "cyd"])
    assert t.score(ex, "cyd ana bo") == 1.0
    assert t.score(ex, "ana bo cyd") == 0.0        # identical to input
    assert t.score(ex, "ana ana cyd") == 0.0       # not a permutation
    assert t.score(ex, "bo cyd") == 0.0


def test_insert_random_validity():
    t = get_task("insert_random")
    ex = _ex("insert_random", "insert eli: ana bo", "eli ana bo", items=["ana", "bo"], name="eli")
    for ok in ["eli ana bo", "ana eli bo", "ana bo eli"]:
        assert t.score(ex, ok) == 1.0
    for bad in ["ana bo", "bo eli ana", "ana eli eli bo", "ana dex bo"]:
        assert t.score(ex, bad) == 0.0


def test_replace_random_validity():
    t = get_task("replace_random")
    ex = _ex("replace_random", "replace eli: ana bo cyd", "eli bo cyd",
             items=["ana", "bo", "cyd"], name="eli")
    assert t.score(ex, "ana eli cyd") == 1.0
    assert t.score(ex, "ana bo eli") == 1.0
    for bad in ["ana bo cyd", "eli eli cyd", "ana dex cyd", "ana eli", "ana eli cyd bo"]:
        assert t.score(ex, bad) == 0.0


def test_valid_answers_are_exactly_what_score_accepts():
    import itertools
    from dlm.tasks.list_edits import NAMES
    for name in ("shuffle", "insert_random", "replace_random", "copy", "reverse"):
        t = get_task(name)
        small = [ex for ex in t.examples("test", 30, seed=1) if len(ex.meta["items"]) <= 4]  # brute force below
        assert len(small) >= 3
        for ex in small[:4]:
            answers = t.valid_answers(ex)
            assert all(t.score(ex, " ".join(a)) == 1.0 for a in answers)
            n = len(answers[0])
            pool = sorted(set(ex.meta["items"]) | {ex.meta.get("name", ex.meta["items"][0])})
            accepted = [list(a) for a in itertools.product(pool, repeat=n) if t.score(ex, " ".join(a)) == 1.0]
            assert sorted(accepted) == sorted(answers), name
            assert set(pool) <= set(NAMES)


def test_slot_marginals_are_the_posterior_over_valid_answers():
    shuffle = get_task("shuffle")
    ex = _ex("shuffle", "shuffle: ana bo cyd", "bo ana cyd", items=["ana", "bo", "cyd"])
    # nothing shown: the 5 orders other than the input; slot 0 holds ana in one (acb), bo and cyd in two
    assert shuffle.slot_marginals(ex, [None] * 3)[0] == {"ana": 0.2, "bo": 0.4, "cyd": 0.4}
    # bo shown in slot 1: only cyd-bo-ana remains (ana-bo-cyd is the input itself)
    assert shuffle.slot_marginals(ex, [None, "bo", None]) == [{"cyd": 1.0}, {"bo": 1.0}, {"ana": 1.0}]
    # a shown name is never offered again in a hidden slot
    for slot in shuffle.slot_marginals(ex, ["cyd", None, None])[1:]:
        assert "cyd" not in slot and abs(sum(slot.values()) - 1) < 1e-12
    replace = get_task("replace_random")
    ex = _ex("replace_random", "replace eli: ana bo cyd", "eli bo cyd", items=["ana", "bo", "cyd"], name="eli")
    assert replace.slot_marginals(ex, [None, "eli", None]) == [{"ana": 1.0}, {"eli": 1.0}, {"cyd": 1.0}]
    assert replace.slot_marginals(ex, ["ana", None, None])[1] == {"bo": 0.5, "eli": 0.5}
    insert = get_task("insert_random")
    ex = _ex("insert_random", "insert eli: ana bo", "eli ana bo", items=["ana", "bo"], name="eli")
    assert insert.slot_marginals(ex, [None] * 3)[1] == {"ana": 1 / 3, "eli": 1 / 3, "bo": 1 / 3}
    copy = get_task("copy")
    ex = _ex("copy", "copy: ana bo", "ana bo", items=["ana", "bo"])
    assert copy.slot_marginals(ex, [None, None]) == [{"ana": 1.0}, {"bo": 1.0}]
    with pytest.raises(ValueError, match="no valid shuffle answer"):
        shuffle.slot_marginals(_ex("shuffle", "shuffle: ana bo", "bo ana", items=["ana", "bo"]), ["ana", None])


def test_arithmetic_extract_and_score():
    assert extract_number("3+5=8. 8-2=6. #### 6") == 6
    assert extract_number("#### 12 then #### 13") == 13
    assert extract_number("the answer is 7 or 9") == 9
    assert extract_number("no digits here") is None
    assert extract_number(None) is None
    assert extract_number("####") is None
    t = get_task("arithmetic")
    ex = _ex("arithmetic", "ann has 3 figs. she gets 5. she loses 2. how many?",
             "3+5=8. 8-2=6. #### 6", value=6)
    assert t.score(ex, "3+5=8. 8-2=6. #### 6") == 1.0
    assert t.score(ex, "#### 6") == 1.0
    assert t.score(ex, "3+5=8. 8-2=5. #### 5") == 0.0
    assert t.extract("3+5=8. #### 06") == "6"
    for ex in t.examples("train", 50, seed=3):
        assert 0 <= ex.meta["value"] <= 99
        assert ex.answer.endswith(f"#### {ex.meta['value']}")
        # every worked step is true arithmetic
        for step in ex.answer.split(" #### ")[0].rstrip(".").split(". "):
            lhs, rhs = step.split("=")
            assert eval(lhs) == int(rhs)


def test_sudoku_scoring():
    t = get_task("sudoku")
    ex = _ex("sudoku", "sudoku: 1.3. .4.. .1.. 4...", "1234 3412 2143 4321",
             puzzle="1.3. .4.. .1.. 4...")
    assert t.score(ex, "1234 3412 2143 4321") == 1.0
    assert t.score(ex, "1234 3412 2143 4312") == 0.0   # column repeats
    assert t.score(ex, "1234 3421 2143 4312") == 1.0   # another valid completion
    assert t.score(ex, "2134 3412 1243 4321") == 0.0   # breaks a clue (and a box)
    assert t.score(ex, "1234 3412") == 0.0
    assert t.extract("1234 3412 2143 4321 trailing") == "1234 3412 2143 4321"
    # a Latin square that is not a Sudoku (boxes repeat)
    ex2 = _ex("sudoku", "sudoku: .... .... .... ....", "", puzzle=".... .... .... ....")
    assert t.score(ex2, "1234 2341 3412 4123") == 0.0
    assert get_task("latin").score(
        _ex("latin", "", "", puzzle=".... .... .... ...."), "1234 2341 3412 4123") == 1.0


def test_puzzles_any_valid_completion_counts():
    t = get_task("latin")
    ex = _ex("latin", "", "", puzzle="1... .... .... ....")
    assert t.score(ex, "1234 2143 3412 4321") == 1.0
    assert t.score(ex, "1234 4321 2143 3412") == 1.0
    assert t.score(ex, "2134 1243 3412 4321") == 0.0   # violates the clue


def test_puzzle_blanks():
    for name in ("sudoku", "latin"):
        for ex in get_task(name).examples("train", 30, seed=2):
            assert 4 <= ex.meta["puzzle"].count(".") <= 8
