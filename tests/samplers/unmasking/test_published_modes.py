"""The seed samplers' published modes, token for token against transcriptions of the authors' loops.

`authors_loops.py` transcribes each released loop (Saber's `generate_with_saber`, LoPA's Dream
D2F round, HEX's LLaDA experts and vote) in plain torch, one prompt at a time, no cache, greedy,
no end-of-text stop. Each published mode runs through our driver on the same prompts and must give
the same tokens and the same number of forward passes. Two models: the shipped tiny-dlm on task
prompts, and a random-weight tiny model whose flat outputs make the modes differ, so that a
departure from the reference shows (each test also checks that our default mode does differ there).
"""
from __future__ import annotations

import pytest
import torch

import dlm
from authors_loops import engine_logits, hex_vote, llada_blocks_loop, lopa_loop, saber_loop
from dlm.ensemble import hex_generate
from dlm.tiny import TinyDLMConfig, TinyDLMModel
from samplers import get_sampler
from samplers.unmasking.hex import HexConfig, majority_vote

GREEDY = dict(temperature=0.0, eos_early_stop=False, kv_cache="none")


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def tiny_dlm():
    loaded = dlm.load("tiny-dlm")
    return loaded.model.eval(), loaded.tokenizer


def task_prompts(tokenizer, tasks: dict[str, int]) -> list[torch.Tensor]:
    """`[1, P]` prompts: the first `n` test examples of each task."""
    from dlm.tasks import get_task

    return [torch.tensor([tokenizer.encode(ex.input_text)])
            for name, n in tasks.items() for ex in get_task(name).examples("test", n=n, seed=0)]


def random_model() -> TinyDLMModel:
    torch.manual_seed(0)
    config = TinyDLMConfig(vocab_size=16, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                           intermediate_size=64, mask_token_id=15, eos_token_id=14, pad_token_id=0)
    return TinyDLMModel(config).eval()


def random_prompts(n: int, length: int = 5) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return [torch.randint(1, 14, (1, length), generator=g) for _ in range(n)]


# --------------------------------------------------------------------------------------- Saber
# the random list edits are where the authors' remasking rules change tokens on tiny-dlm
SABER_TASKS = {"shuffle": 3, "insert_random": 4, "replace_random": 1, "arithmetic": 1}


def _saber(model, prompt, gen, block, config):
    return dlm.generate(model, prompt, gen_length=gen, block_length=gen, steps=gen, sampler="saber",
                        sampler_config=config, **GREEDY)


def _check_saber(model, prompts, gen, block, mask_id):
    fn = engine_logits(model, mask_id)
    published = {"backtrack": "published", **({"block_length": block} if block != gen else {})}
    departures = 0
    for prompt in prompts:
        ref, forwards = saber_loop(fn, prompt, gen, block, mask_id)
        out = _saber(model, prompt, gen, block, published)
        assert torch.equal(out.sequences, ref) and out.nfe == forwards
        if block == gen:  # our "always" mode (the reference's unconditional backtracking, our other rules)
            always = _saber(model, prompt, gen, block, {"backtrack": "always"})
            departures += not torch.equal(always.sequences, ref) or always.nfe != forwards
    return departures


@pytest.mark.slow
def test_saber_published_equals_generate_with_saber_on_tiny_dlm(tiny_dlm):
    model, tokenizer = tiny_dlm
    prompts = task_prompts(tokenizer, SABER_TASKS)
    assert _check_saber(model, prompts, 32, 32, model.config.mask_token_id) >= 1  # "always" is not the reference
    _check_saber(model, prompts[:4], 32, 16, model.config.mask_token_id)  # the reference's blocks, reopened


def test_saber_published_equals_generate_with_saber_on_a_random_model():
    model = random_model()
    prompts = random_prompts(4)
    assert _check_saber(model, prompts, 16, 16, 15) >= 1
    _check_saber(model, prompts, 16, 8, 15)


def test_saber_published_refuses_a_driver_block_and_a_block_that_does_not_divide():
    model = random_model()
    with pytest.raises(ValueError, match="one driver block"):
        dlm.generate(model, random_prompts(1)[0], gen_length=16, block_length=8, steps=16, sampler="saber",
                     sampler_config={"backtrack": "published"}, **GREEDY)
    with pytest.raises(ValueError, match="must divide"):
        _saber(model, random_prompts(1)[0], 16, 16, {"backtrack": "published", "block_length": 6})
    with pytest.raises(ValueError, match="only applies with backtrack='published'"):
        _saber(model, random_prompts(1)[0], 16, 16, {"block_length": 8})


# ---------------------------------------------------------------------------------------- LoPA
def _lopa(model, prompt, gen, block, config, window=True):
    kw = {"window_blocks": 2, "window_open_at": 1.0} if window and gen > block else {}
    return dlm.generate(model, prompt, gen_length=gen, block_length=block, steps=gen, sampler="lopa",
                        sampler_config=config, **kw, **GREEDY)


# the alternative that must differ: our default rule (p(x0) rank and fill, non-strict threshold) on
# one block; on several, the published rules without the window, which cannot see the next block
DEFAULT_RULES = ({"rank": "probability"}, True)
NO_NEXT_BLOCK = ({"published": True}, False)


def _check_lopa(model, prompts, gen, block, factor, mask_id, alternative):
    fn = engine_logits(model, mask_id)
    departures = 0
    for prompt in prompts:
        ref, forwards = lopa_loop(fn, prompt, gen, block, mask_id, branching_factor=factor)
        out = _lopa(model, prompt, gen, block, {"published": True, "branches": factor + 1})
        assert torch.equal(out.sequences, ref) and out.nfe == forwards
        other, window = alternative
        alt = _lopa(model, prompt, gen, block, {**other, "branches": factor + 1}, window)
        departures += not torch.equal(alt.sequences, ref) or alt.nfe != forwards
    return departures


def test_lopa_published_equals_the_released_dream_round_on_tiny_dlm(tiny_dlm):
    model, tokenizer = tiny_dlm
    prompts = task_prompts(tokenizer, {"copy": 1, "shuffle": 2, "insert_random": 2, "arithmetic": 1, "sudoku": 1})
    assert _check_lopa(model, prompts, 32, 32, 2, model.config.mask_token_id, DEFAULT_RULES) >= 1


@pytest.mark.parametrize("gen, block, factor, alternative", [(16, 16, 2, DEFAULT_RULES), (16, 4, 2, NO_NEXT_BLOCK),
                                                              (24, 8, 3, NO_NEXT_BLOCK)])
def test_lopa_published_equals_the_released_dream_round_on_a_random_model(gen, block, factor, alternative):
    """Several blocks: the window (2 blocks, the next opened when the last is complete) shows the
    next block, on which the reference scores a branch that completes its block, and whose logits
    start that block; without it the published rules lose both (the alternative)."""
    assert _check_lopa(random_model(), random_prompts(4), gen, block, factor, 15, alternative) >= 1


def test_lopa_published_refuses_settings_it_fixes():
    with pytest.raises(ValueError, match="published=True"):
        get_sampler("lopa", published=True, rank="probability")
    with pytest.raises(ValueError, match="published=True"):
        get_sampler("lopa", published=True, branch_min_confidence=0.5)
    with pytest.raises(ValueError, match="rank must be one of"):
        get_sampler("lopa", rank="margin")


# ----------------------------------------------------------------------------------------- HEX
def test_hex_experts_and_vote_equal_the_authors_on_tiny_dlm(tiny_dlm):
    model, tokenizer = tiny_dlm
    mask, eos = model.config.mask_token_id, model.config.eos_token_id
    from dlm.tasks import get_task

    fn = engine_logits(model, mask)
    task = get_task("arithmetic")
    for ex in task.examples("test", n=2, seed=0):
        prompt = torch.tensor([tokenizer.encode(ex.input_text)])

        def extract(row, generated):
            ids = generated.tolist()
            return task.extract(tokenizer.decode(ids[: ids.index(eos)] if eos in ids else ids, skip_special_tokens=True))

        out = hex_generate(model, prompt, gen_length=32, extract=extract, **GREEDY)
        answers = []
        for e, block in enumerate(out.experts.block_lengths):
            ref, forwards = llada_blocks_loop(fn, prompt, 32, block, 16, mask)
            assert torch.equal(out.experts.sequences[e], ref) and out.experts.nfe[e] == forwards
            answers.append(extract(0, ref[0, prompt.shape[1]:]))
        assert out.experts.answers[0] == answers
        assert out.experts.winner[0] == (hex_vote(answers) or 0)


def test_the_vote_rule_equals_the_authors_on_random_answer_lists():
    g = torch.Generator().manual_seed(0)
    pool = [None, "1", "2", "3"]
    for _ in range(500):
        answers = [pool[int(i)] for i in torch.randint(0, 4, (int(torch.randint(1, 7, (1,), generator=g)),), generator=g)]
        assert majority_vote(answers) == hex_vote(answers)


def test_hex_keeps_the_token_vote_beside_the_task_vote():
    """Three experts on a random model: the task vote (an extractor that reads only the first
    token) and the token vote (whole generations) are both kept, each by the authors' rule."""
    model = random_model()
    prompts = torch.cat(random_prompts(3))
    out = hex_generate(model, prompts, gen_length=16, config=HexConfig(block_lengths=(2, 4, 8)),
                       extract=lambda row, gen: int(gen[0]), **GREEDY)
    ex = out.experts
    for r in range(3):
        assert ex.winner[r] == majority_vote(ex.answers[r])
        assert ex.token_winner[r] == (majority_vote(ex.token_answers[r]) or 0)
        assert ex.answers[r] == [int(ex.sequences[e, r, 5]) for e in range(3)]
    plain = hex_generate(model, prompts, gen_length=16, config=HexConfig(block_lengths=(2, 4, 8)), **GREEDY)
    assert plain.experts.token_winner == plain.experts.winner  # no task: one vote, on tokens
