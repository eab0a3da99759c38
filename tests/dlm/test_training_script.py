"""The training script only ever sees the train split, and its task-weight option fails loudly."""
import random
import re

import pytest
import torch

from dlm.tasks import PROMPT_SUFFIX, get_suite, is_validation, split_of, subset_of
from dlm.tiny import TinyCharTokenizer

from script_loader import load_script  # tests/script_loader.py (tests/ is on sys.path)


@pytest.fixture(scope="module")
def train_script():
    return load_script("train_tiny_dlm.py")


def _row_mean_batch(train_script, suite: str, tok, rng, gen, *, batch_size: int, semi_ar: float):
    """One training batch of `suite` (every task weighted 1, row-mean loss weights)."""
    tasks = get_suite(suite)
    return train_script.build_batch(tasks, [1.0] * len(tasks), tok, rng, batch_size=batch_size, semi_ar=semi_ar,
                                    no_sep=0.0, gen=gen, loss_weighting="row-mean")


def test_training_batches_hold_only_train_split_prompts(train_script):
    tasks = get_suite("all")
    tok = TinyCharTokenizer()
    rng, gen = random.Random(0), torch.Generator().manual_seed(0)
    seen = set()
    for _ in range(3):
        x, clean, att, weights, P = train_script.build_batch(
            tasks, [1.0] * len(tasks), tok, rng, batch_size=24, semi_ar=0.4, no_sep=0.0, gen=gen)
        for row, keep in zip(clean[:, :P].tolist(), att[:, :P].tolist()):
            prompt = tok.decode([t for t, k in zip(row, keep) if k])
            assert prompt.endswith(PROMPT_SUFFIX)
            prompt = prompt[: -len(PROMPT_SUFFIX)]
            assert split_of(prompt) == "train" and not is_validation(prompt), prompt
            seen.add(prompt)
        # the loss only looks at masked response positions
        assert (weights[:, :P] == 0).all()
        assert ((weights[:, P:] > 0) == (x[:, P:] == tok.mask_token_id)).all()
    assert len(seen) > 60  # fresh examples, not a handful repeated


def test_word_vocabulary_is_learned_from_train_split_only(train_script, monkeypatch):
    calls = []
    original = train_script.sample_train_example

    def spy(task, rng):
        ex = original(task, rng)
        calls.append(ex.prompt)
        return ex

    monkeypatch.setattr(train_script, "sample_train_example", spy)
    words = train_script.learn_word_vocabulary(get_suite("list_edits"), min_count=3, samples_per_task=8)
    assert calls and all(split_of(p) == "train" for p in calls)
    assert "copy" in words and "reverse" in words


def test_periodic_evaluation_reads_the_validation_split(train_script, monkeypatch):
    seen = []
    monkeypatch.setattr(train_script, "quick_decode", lambda model, tok, prompts, **kw: seen.extend(prompts) or
                        [""] * len(prompts))
    acc, _ = train_script.quick_eval(torch.nn.Linear(1, 1), TinyCharTokenizer(), get_suite("list_edits"), 3)
    assert len(seen) == 3 * len(get_suite("list_edits")) and set(acc) == {t.name for t in get_suite("list_edits")}
    assert all(subset_of(p) == "val" for p in seen)


def test_task_weight_overrides(train_script):
    weights = train_script.task_weights("copy=1.5, sudoku=0.25")
    assert weights["copy"] == 1.5 and weights["sudoku"] == 0.25
    assert weights["reverse"] == train_script.TASK_WEIGHTS["reverse"]
    for bad in ("nosuchtask=1", "copy", "copy="):
        with pytest.raises(ValueError, match="--task-weights"):
            train_script.task_weights(bad)


def test_row_mean_weighting_gives_every_row_the_same_total(train_script):
    tasks = get_suite("list_edits")
    tok = TinyCharTokenizer()
    x, clean, att, weights, P = train_script.build_batch(
        tasks, [1.0] * len(tasks), tok, random.Random(1), batch_size=16, semi_ar=0.4, no_sep=0.0,
        gen=torch.Generator().manual_seed(1), min_mask_ratio=0.0, loss_weighting="row-mean")
    masked = x[:, P:] == tok.mask_token_id
    assert ((weights[:, P:] > 0) == masked).all()
    # each row's masked positions share weight 1 equally, whatever the row's mask ratio
    torch.testing.assert_close(weights.sum(1), torch.ones(16))
    per_token = weights[:, P:][masked]
    expected = (1.0 / masked.sum(1, keepdim=True).float()).expand_as(masked)[masked]
    torch.testing.assert_close(per_token, expected)


def test_mask_ratio_power_moves_rows_to_small_ratios(train_script):
    tasks = get_suite("list_edits")
    tok = TinyCharTokenizer()

    def mean_ratio(power):
        x, _, _, _, P = train_script.build_batch(
            tasks, [1.0] * len(tasks), tok, random.Random(2), batch_size=64, semi_ar=0.0, no_sep=0.0,
            gen=torch.Generator().manual_seed(2), short_resp=0.0, min_mask_ratio=0.0,
            mask_ratio_power=power)
        return (x[:, P:] == tok.mask_token_id).float().mean().item()

    # same uniform draws: t = u**power, E[u] = 1/2, E[u**3] = 1/4
    assert mean_ratio(1.0) == pytest.approx(0.5, abs=0.06)
    assert mean_ratio(3.0) == pytest.approx(0.25, abs=0.06)


def test_eos_revealed_rows_mask_only_answer_tokens(train_script):
    tasks = get_suite("list_edits")
    tok = TinyCharTokenizer()

    def batch(share):
        return train_script.build_batch(
            tasks, [1.0] * len(tasks), tok, random.Random(3), batch_size=32, semi_ar=0.0, no_sep=0.0,
            gen=torch.Generator().manual_seed(3), short_resp=0.0, min_mask_ratio=0.5, eos_revealed=share)

    x, clean, _, _, P = batch(1.0)
    masked, eos = x[:, P:] == tok.mask_token_id, clean[:, P:] == tok.eos_token_id
    answer_masked = (masked & ~eos).sum(1)
    # every EOS is visible, except where a row had no masked answer token and one position was forced
    assert ((masked & eos).sum(1) <= (answer_masked == 0).long()).all()
    assert answer_masked.sum() > 0
    x0, clean0, _, _, _ = batch(0.0)  # the same draws without the option: EOS positions get masked too
    assert ((x0[:, P:] == tok.mask_token_id) & (clean0[:, P:] == tok.eos_token_id)).sum() > 100


def test_semi_ar_block_size_one_masks_a_suffix(train_script):
    """`--semi-ar-blocks 1`: each semi-AR row is a clean prefix, at most one randomly masked position,
    then every position masked: the state of left-to-right decoding."""
    tasks = get_suite("arithmetic")
    tok = TinyCharTokenizer()
    x, _, _, _, P = train_script.build_batch(
        tasks, [1.0] * len(tasks), tok, random.Random(3), batch_size=32, semi_ar=1.0, no_sep=0.0,
        gen=torch.Generator().manual_seed(3), short_resp=0.0, min_mask_ratio=0.0, semi_ar_blocks=(1,))
    masked = x[:, P:] == tok.mask_token_id
    for row in masked:
        first = int(row.float().argmax())
        assert row[first + 1:].all(), row  # everything after the first masked position is masked
    assert len({int(r.float().argmax()) for r in masked}) > 5  # the cut point varies across rows


def test_padded_arithmetic_format_keeps_every_value_and_the_score(train_script):
    from dlm.tasks import extract_number

    task = get_suite("arithmetic")[0]
    rng = random.Random(3)
    for _ in range(200):
        ex = task._make(rng)
        padded = train_script.pad_numbers(ex.answer)
        # the same numbers at two digits each, the same text around them, the same score
        assert [int(n) for n in padded.replace("#", " ").split() if n.isdigit()] == \
            [int(n) for n in ex.answer.replace("#", " ").split() if n.isdigit()]
        assert all(len(tok) == 2 for tok in re.findall(r"\d+", padded))
        assert re.sub(r"\d+", "N", padded) == re.sub(r"\d+", "N", ex.answer)
        assert task.score(ex, padded) == 1.0 and extract_number(padded) == ex.meta["value"]
    assert train_script.pad_numbers("3+5=8. 8*3=24. #### 24") == "03+05=08. 08*03=24. #### 24"


def test_padded_format_reaches_only_arithmetic_rows(train_script):
    tasks = get_suite("all")
    tok = TinyCharTokenizer()
    weights = [1.0 if t.name in ("arithmetic", "copy") else 0.0 for t in tasks]
    rng, gen = random.Random(1), torch.Generator().manual_seed(1)
    x, clean, att, w, P = train_script.build_batch(tasks, weights, tok, rng, batch_size=32, semi_ar=0.0, no_sep=0.0,
                                                   gen=gen, arithmetic_format="padded")
    kinds = set()
    for row in clean[:, P:].tolist():
        text = tok.decode([t for t in row if t != tok.eos_token_id])
        if "####" in text:  # an arithmetic answer: every number at two digits
            kinds.add("arithmetic")
            assert all(len(n) == 2 for n in re.findall(r"\d+", text)), text
        else:
            kinds.add("copy")
            assert not re.search(r"\d", text)
    assert kinds == {"arithmetic", "copy"}


def test_result_masked_rows_hide_a_result_and_everything_after_it(train_script):
    from dlm.tasks.arithmetic import ArithmeticDrill

    tasks = get_suite("arithmetic") + [ArithmeticDrill()]
    tok = TinyCharTokenizer()
    rng, gen = random.Random(2), torch.Generator().manual_seed(2)
    x, clean, att, w, P = train_script.build_batch(tasks, [1.0, 1.0], tok, rng, batch_size=16, semi_ar=0.0,
                                                   no_sep=0.0, gen=gen, loss_weighting="row-mean",
                                                   arithmetic_format="padded", result_mask=1.0)
    for row_x, row_clean, row_w in zip(x[:, P:].tolist(), clean[:, P:].tolist(), w[:, P:]):
        text = tok.decode([t for t in row_clean if t != tok.eos_token_id])
        start = next(i for i, t in enumerate(row_x) if t == tok.mask_token_id)
        assert all(t == tok.mask_token_id for t in row_x[start:])  # a clean prefix, then all masked
        # the prefix ends with "=": the masked span starts at a result, whose digits carry the loss
        assert text[start - 1] == "=" and text[start:start + 2].isdigit()
        assert torch.allclose(row_w[start:start + 2], torch.full((2,), 0.5)) and row_w.sum().item() == pytest.approx(1.0)


class _LaterIsSurer(torch.nn.Module):
    """Stub model whose confidence rises with position: confidence ordering commits right to left."""

    def __init__(self, vocab: int):
        super().__init__()
        self.vocab = vocab

    def forward(self, x, attention_mask=None):
        B, L = x.shape
        logits = torch.zeros(B, L, self.vocab)
        logits[:, :, 0] = torch.arange(L, dtype=torch.float32) * 0.02  # token 0's probability grows with position (no ties)
        return type("Out", (), {"logits": logits})()


def test_order_rollout_commits_true_tokens_in_the_models_order_within_the_block(train_script):
    tasks = get_suite("arithmetic")
    tok = TinyCharTokenizer()
    rng, gen = random.Random(3), torch.Generator().manual_seed(3)
    x, clean, att, w, P = train_script.build_batch(tasks, [1.0], tok, rng, batch_size=12, semi_ar=0.0, no_sep=0.0,
                                                   gen=gen, loss_weighting="row-mean", arithmetic_format="padded")
    prompt_before = x[:, :P].clone()
    model = _LaterIsSurer(tok.vocab_size).train()
    rows = list(range(0, 12, 2))
    untouched = x[1::2].clone()
    train_script.order_rollout(model, x, clean, att, w, P, rows, tok.mask_token_id, tok.eos_token_id, rng, chunk=3,
                               block=8)
    assert model.training  # restored
    assert torch.equal(x[:, :P], prompt_before) and torch.equal(x[1::2], untouched)
    R = x.shape[1] - P
    committed_counts = []
    for i in rows:
        resp, truth = x[i, P:], clean[i, P:]
        masked = resp == tok.mask_token_id
        assert torch.equal(resp[~masked], truth[~masked])  # teacher forced: the answer's own tokens
        assert masked.any() and w[i, :P].sum() == 0 and w[i, P:][~masked].sum() == 0
        assert w[i, P:].sum().item() == pytest.approx(1.0)
        n = int((~masked).sum())
        answer_len = int((truth != tok.eos_token_id).sum())
        assert n <= min(R - 1, answer_len + 4)
        committed_counts.append(n)
        # whole blocks first, then the current block from its right end (the stub is surest there)
        full, part = divmod(n, 8)
        assert not masked[: full * 8].any()
        block = masked[full * 8:(full + 1) * 8]
        assert block.tolist() == [True] * (len(block) - part) + [False] * part
        assert masked[(full + 1) * 8:].all()
    assert len(set(committed_counts)) > 1  # the number of commits is drawn per row


def test_rollout_rows_follow_the_named_tasks_and_arithmetic_includes_its_drills(train_script):
    from dlm.tasks.arithmetic import ArithmeticDrill

    tasks = get_suite("all") + [ArithmeticDrill()]
    tok = TinyCharTokenizer()
    rng, gen = random.Random(5), torch.Generator().manual_seed(5)
    row_tasks = []
    x, *_ = train_script.build_batch(tasks, [1.0] * len(tasks), tok, rng, batch_size=40, semi_ar=0.0, no_sep=0.0,
                                     gen=gen, row_tasks=row_tasks)
    assert len(row_tasks) == x.shape[0] and set(row_tasks) <= {t.name for t in tasks}
    names = train_script.parse_rollout_tasks("arithmetic, shuffle", tasks)
    assert names == {"arithmetic", ArithmeticDrill.name, "shuffle"}
    every = train_script.rollout_rows(row_tasks, names, 1.0, random.Random(0))
    assert every == [i for i, n in enumerate(row_tasks) if n in names] and every
    assert train_script.rollout_rows(row_tasks, names, 0.0, random.Random(0)) == []
    half = train_script.rollout_rows(row_tasks * 20, names, 0.5, random.Random(0))
    assert 0.3 * 20 * len(every) < len(half) < 0.7 * 20 * len(every)
    with pytest.raises(ValueError, match="--rollout-tasks"):
        train_script.parse_rollout_tasks("shufle", tasks)


def test_order_rollout_blocks_cap_reaches_past_the_padding_of_short_answers(train_script):
    tok = TinyCharTokenizer()
    rng, gen = random.Random(4), torch.Generator().manual_seed(4)
    x, clean, att, w, P = _row_mean_batch(train_script, "list_edits", tok, rng, gen, batch_size=48, semi_ar=0.0)
    model = _LaterIsSurer(tok.vocab_size)
    rows = list(range(48))
    train_script.order_rollout(model, x, clean, att, w, P, rows, tok.mask_token_id, tok.eos_token_id, rng, chunk=4,
                               block=32, commit_cap="blocks")
    past_answer_cap = 0
    for i in rows:
        masked = x[i, P:] == tok.mask_token_id
        n_committed, answer_len = int((~masked).sum()), int((clean[i, P:] != tok.eos_token_id).sum())
        assert n_committed <= -(-answer_len // 32) * 32 - 1  # never past the answer's last block
        assert torch.equal(x[i, P:][~masked], clean[i, P:][~masked])
        past_answer_cap += n_committed > answer_len + 4
    assert past_answer_cap > 0  # states the "answer" cap never reaches
    with pytest.raises(ValueError, match="commit_cap"):
        train_script.order_rollout(model, x, clean, att, w, P, rows, tok.mask_token_id, tok.eos_token_id, rng,
                                   commit_cap="all")


def test_soft_targets_cover_hidden_name_slots_of_random_edits_only(train_script):
    from dlm.tiny import CHECKPOINT_DIR
    tasks = get_suite("list_edits")
    tok = TinyCharTokenizer.from_pretrained(CHECKPOINT_DIR)  # names are single tokens there
    rng, gen = random.Random(5), torch.Generator().manual_seed(5)
    row_examples = []
    x, clean, att, w, P = train_script.build_batch(tasks, [1.0] * len(tasks), tok, rng, batch_size=48, semi_ar=0.0,
                                                   no_sep=0.0, gen=gen, min_mask_ratio=0.0, row_examples=row_examples)
    assert len(row_examples) == 48
    rows, cols, q = train_script.soft_answer_targets(x, P, row_examples, tok, tok.mask_token_id)
    assert len(rows) > 0 and q.shape == (len(rows), tok.vocab_size)
    assert torch.allclose(q.sum(1), torch.ones(len(rows)))
    assert (x[rows, cols] == tok.mask_token_id).all()  # hidden slots only
    assert (q[torch.arange(len(rows)), clean[rows, cols]] > 0).all()  # the sampled answer is one of the valid ones
    spread = 0
    for k, (i, c) in enumerate(zip(rows.tolist(), cols.tolist())):
        task, ex = row_examples[i]
        assert task.random_edit and (c - P) % 2 == 0
        shown = {int(t) for t in x[i, P:P + 2 * len(ex.answer.split()):2] if int(t) != tok.mask_token_id}
        assert all(q[k, t] == 0 for t in shown) or task.name != "shuffle"  # a shown name is never due again
        spread += int((q[k] > 0).sum()) > 1
    assert spread > 0  # some slots really are uncertain
    deterministic = [i for i, (t, _) in enumerate(row_examples) if not t.random_edit]
    assert deterministic and not set(deterministic) & set(rows.tolist())
    with pytest.raises(ValueError, match="single-token names"):  # a character tokenizer spells names out
        char_tok = TinyCharTokenizer()
        x, _, _, _, P = train_script.build_batch(tasks, [1.0] * len(tasks), char_tok, rng, batch_size=48, semi_ar=0.0,
                                                 no_sep=0.0, gen=gen, row_examples=(rows_of_char := []))
        train_script.soft_answer_targets(x, P, rows_of_char, char_tok, char_tok.mask_token_id)


def test_cut_trailing_rows_hide_a_tail_keep_some_loss_and_each_rows_total(train_script):
    tok = TinyCharTokenizer()
    rng, gen = random.Random(3), torch.Generator().manual_seed(3)
    x, clean, att, w, P = _row_mean_batch(train_script, "all", tok, rng, gen, batch_size=64, semi_ar=0.4)
    att0, w0 = att.clone(), w.clone()
    train_script.cut_trailing_rows(att, w, P, share=0.5, gen=torch.Generator().manual_seed(4))
    assert torch.equal(att[:, :P], att0[:, :P])  # the prompt is never cut
    cut = (att[:, P:] == 0).any(1)
    assert 10 < int(cut.sum()) < 54  # about half the rows
    for i in range(x.shape[0]):
        kept = att[i, P:].bool()
        if cut[i]:
            c = int(kept.sum())
            assert kept[:c].all() and not kept[c:].any()  # one contiguous tail is hidden
            assert (w[i, P + c:] == 0).all() and (w[i, P:P + c] > 0).any()  # no loss on it; some loss kept
        else:
            assert torch.equal(w[i], w0[i])
        torch.testing.assert_close(w[i].sum(), w0[i].sum())  # each row keeps its total weight
    untouched_att, untouched_w = att0.clone(), w0.clone()
    train_script.cut_trailing_rows(untouched_att, untouched_w, P, share=0.0, gen=gen)
    assert torch.equal(untouched_att, att0) and torch.equal(untouched_w, w0)


def test_chains_batches_use_the_long_response(train_script):
    from dlm.tiny import CHECKPOINT_DIR

    tasks = get_suite("chains")
    tok = TinyCharTokenizer.from_pretrained(CHECKPOINT_DIR)  # whole names are one token each
    rng, gen = random.Random(1), torch.Generator().manual_seed(1)
    x, clean, att, weights, P = train_script.build_batch(
        tasks, [1.0, 1.0], tok, rng, batch_size=8, semi_ar=0.5, no_sep=0.0, gen=gen,
        loss_weighting="row-mean", response_len=128)
    assert x.shape[1] == P + 128
    for row in clean[:, P:].tolist():
        answer = tok.decode([t for t in row if t != tok.eos_token_id])
        assert len(answer) >= 79 and row[-1] == tok.eos_token_id  # the whole long answer, then EOS padding
    assert torch.allclose(weights[:, P:].sum(1), torch.ones(8))  # row-mean: every row weighs 1
    # the chains-hard tasks are drawn only when named, so earlier runs' commands draw what they drew
    assert train_script.chain_weights("walk=2") == {"count": 1.0, "walk": 2.0, "sum": 0.0, "fib": 0.0}
    assert train_script.chain_weights("sum=3")["sum"] == 3.0
    with pytest.raises(ValueError, match="chains-weights"):
        train_script.chain_weights("copy=1")
