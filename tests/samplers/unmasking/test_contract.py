"""The contract every registered dLLM sampler must honour (DESIGN.md, "Conventions").

Parametrised over the registry at collection time, so a newly registered sampler is tested too,
plus two stand-in samplers defined here that exercise the driver's side of the contract whatever
the registry holds: one that remasks (`remasks = True`) and one that looks ahead greedily, calling
`ctx.forward` as often as the driver lets it.
"""
from __future__ import annotations

import pytest
import torch

import dlm
from samplers import SAMPLERS, Sampler, StepResult, available_samplers, get_sampler
from samplers.unmasking._common import commit, step_stats, top_k_mask
from toy_models import ToyDLM


class _Remasker(Sampler):
    """Commits one token more than asked, then masks again the committed token of the block it is
    least sure of now (unless this is the block's last step): net progress of one or more."""

    name = "test-remasker"
    remasks = True
    adaptive = True  # its first step commits two: it may finish before the budget

    def step(self, logits, ctx):
        s = step_stats(logits, ctx)
        x = commit(ctx.x, s.proposal, top_k_mask(s.confidence, ctx.candidates, ctx.num_transfer + 1))
        if not ctx.last_step:
            done = ~ctx.candidates & (ctx.x != ctx.mask_token_id)
            worst = top_k_mask(-s.confidence, done, torch.ones_like(ctx.num_transfer))
            x = torch.where(worst, torch.full_like(x, ctx.mask_token_id), x)
        return StepResult(x, s.proposal, s.confidence)


class _GreedyLookahead(Sampler):
    """Calls `ctx.forward` on 2 candidates as long as the driver allows, commits one token per call,
    and hands the last call's logits back for reuse: it tries to spend more passes than it has."""

    name = "test-greedy-lookahead"
    adaptive = True
    looks_ahead = True

    def step(self, logits, ctx):
        s = step_stats(logits, ctx)
        x = commit(ctx.x, s.proposal, top_k_mask(s.confidence, ctx.candidates, ctx.num_transfer))
        nxt = None
        while ctx.forward is not None and ctx.forwards_left > 0 and bool((x == ctx.mask_token_id).any()):
            out = ctx.forward(torch.stack([x, x], dim=1))
            ctx.forwards_left -= 1
            s2 = step_stats(out[:, 0], ctx)
            x = commit(x, s2.proposal, top_k_mask(s2.confidence, x == ctx.mask_token_id, torch.ones_like(ctx.num_transfer)))
            nxt = None  # logits of the state before this commit: not reusable
        return StepResult(x, s.proposal, s.confidence, next_logits=nxt)


STAND_INS = {cls.name: cls for cls in (_Remasker, _GreedyLookahead)}
ALL = available_samplers() + sorted(STAND_INS)
PROMPT = torch.tensor([[1, 2, 3, 4, 5], [6, 7, 8, 9, 10]])


def _sampler(name, model):
    """A sampler that carries a layer trained for one model (`joint`) gets one made for the toy."""
    if name == "joint":
        from joint_toy import toy_joint_sampler
        return toy_joint_sampler(model)
    if name == "hex":
        # HEX's published setting fixes its passes (experts x gen/2, 24 here) and refuses a smaller
        # total, so the budget sweep below runs its shared-budget rule; test_hex*.py cover the default.
        from samplers import get_sampler
        return get_sampler("hex", budget="split")
    return name


def cached_model():
    """A random-weight instance of the built-in model's architecture, which has a KV cache."""
    from dlm.tiny import TinyDLMConfig, TinyDLMModel

    torch.manual_seed(0)
    config = TinyDLMConfig(vocab_size=16, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                           intermediate_size=64, mask_token_id=15, eos_token_id=14, pad_token_id=0)
    return TinyDLMModel(config).eval()


def sampler_class(name):
    return STAND_INS.get(name) or SAMPLERS[name]


def run(name, model=None, steps=16, temperature=1.0, seed=0, prompt=PROMPT, **kw):
    model = model or ToyDLM()
    gen = torch.Generator().manual_seed(seed)
    kw.setdefault("gen_length", 16)
    kw.setdefault("block_length", 8)
    kw.setdefault("eos_early_stop", False)  # the budget checks below need every block decoded
    sampler = STAND_INS[name]() if name in STAND_INS else _sampler(name, model)
    if sampler_class(name).drafts_and_verifies:
        temperature = 0.0  # it reproduces a greedy decode (and refuses temperature > 0: test_lossless.py)
    return dlm.generate(model, prompt, steps=steps, sampler=sampler, temperature=temperature, generator=gen, **kw)


@pytest.mark.parametrize("name", ALL)
def test_shapes_prompt_and_no_mask_left(name):
    out = run(name)
    assert out.sequences.shape == (2, 5 + 16)
    assert torch.equal(out.sequences[:, :5], PROMPT)
    assert not (out.sequences == ToyDLM().config.mask_token_id).any()


@pytest.mark.parametrize("name", ALL)
def test_seeded_determinism(name):
    a, b = run(name, seed=3), run(name, seed=3)
    assert torch.equal(a.sequences, b.sequences)


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("steps,kv_cache", [(2, "none"), (5, "none"), (8, "none"), (16, "none"),
                                            (5, "prefix"), (16, "prefix")])
def test_budget_is_never_exceeded(name, steps, kv_cache):
    model = ToyDLM() if kv_cache == "none" else cached_model()
    calls = []
    hook = model.register_forward_pre_hook(lambda module, args: calls.append(1))
    try:
        out = run(name, model=model, steps=steps, kv_cache=kv_cache, return_trace=True)
    finally:
        hook.remove()
    assert out.nfe <= steps
    assert len(calls) == out.nfe  # one model call per counted pass, lookahead calls included
    assert sum(out.steps_per_block) == out.nfe == sum(r.forwards for r in out.trace)
    assert out.branch_forwards == sum(r.branch_forwards for r in out.trace) >= out.nfe
    assert not (out.sequences == model.config.mask_token_id).any()
    cls = sampler_class(name)
    if not cls.looks_ahead:
        assert out.branch_forwards == out.nfe
    if not cls.adaptive:
        assert out.nfe == steps  # fixed schedules use exactly the budget they are given


@pytest.mark.parametrize("name", ALL)
def test_committed_tokens_stay_and_every_step_progresses(name):
    model = ToyDLM()
    out = run(name, model=model, steps=16, return_trace=True)
    mask_id = model.config.mask_token_id
    # Block states before/after every step, from the trace (lookahead calls feed the model
    # candidate blocks, so the model's inputs are not the sequence of states). An ensemble's trace
    # holds one generation per expert, each starting again at block 0, step 0.
    runs = []
    for r in out.trace:
        if r.block == 0 and r.step == 0:
            runs.append([])
        runs[-1].append(r)
    finals = out.sequences.unsqueeze(0) if out.experts is None else out.experts.sequences
    assert len(runs) == len(finals)
    for run_trace, final in zip(runs, finals):
        for block in sorted({r.block for r in run_trace}):
            states = [r.tokens for r in run_trace if r.block == block]
            width = states[0].shape[1]
            start = 5 + width * block
            before = [torch.full_like(states[0], mask_id)] + states[:-1]
            for prev, new in zip(before, states):
                if not sampler_class(name).remasks:
                    committed = prev != mask_id
                    assert torch.equal(prev[committed], new[committed])
            assert torch.equal(states[-1], final[:, start:start + width])
    for record in out.trace:
        progressed = record.committed[record.masks_left + record.committed > 0]
        assert (progressed >= 1).all()


def test_remasking_stand_in_does_remask():
    """The remasking case above is not vacuous: committed tokens do change."""
    out = run("test-remasker", steps=16, return_trace=True)
    mask_id = ToyDLM().config.mask_token_id
    states = [r.tokens for r in out.trace if r.block == 0]
    remasked = sum(int(((a != mask_id) & (b == mask_id)).sum()) for a, b in zip(states, states[1:]))
    assert remasked > 0


@pytest.mark.parametrize("name", [n for n in ALL if n not in ("random", "joint")])  # random order draws depend on the batch
def test_left_padded_batch_matches_rows_alone(name):
    """Greedy decoding of a left-padded batch equals decoding each prompt on its own."""
    model = ToyDLM()
    short, long = torch.tensor([[3, 4, 5]]), torch.tensor([[1, 2, 3, 4, 5, 6]])
    pad = model.config.pad_token_id
    batch = torch.tensor([[pad, pad, pad, 3, 4, 5], [1, 2, 3, 4, 5, 6]])
    mask = (torch.arange(6) >= torch.tensor([[3], [0]])).long()
    together = run(name, model=model, prompt=batch, attention_mask=mask, temperature=0.0, steps=8)
    alone_short = run(name, model=model, prompt=short, temperature=0.0, steps=8)
    alone_long = run(name, model=model, prompt=long, temperature=0.0, steps=8)
    assert torch.equal(together.sequences[0, 3:], alone_short.sequences[0])
    assert torch.equal(together.sequences[1], alone_long.sequences[0])


@pytest.mark.parametrize("name", available_samplers())
def test_config_round_trips_through_json(name):
    sampler = get_sampler(name)
    config = type(sampler.config).from_json(sampler.config.to_json())
    assert config == sampler.config


def test_unknown_sampler_lists_valid_names():
    with pytest.raises(ValueError, match="valid samplers: .*confidence"):
        get_sampler("nope")


class _Overspender(_GreedyLookahead):
    """Ignores `ctx.forwards_left` and keeps calling."""

    name = "test-overspender"

    def step(self, logits, ctx):
        while ctx.forward is not None:
            ctx.forward(torch.stack([ctx.x], dim=1))
        return super().step(logits, ctx)


class _ForeignLogits(_GreedyLookahead):
    """Hands back logits that no ctx.forward call produced."""

    name = "test-foreign-logits"

    def step(self, logits, ctx):
        s = step_stats(logits, ctx)
        x = commit(ctx.x, s.proposal, top_k_mask(s.confidence, ctx.candidates, ctx.num_transfer))
        return StepResult(x, s.proposal, s.confidence, next_logits=logits)


def test_driver_refuses_lookahead_past_the_budget():
    with pytest.raises(RuntimeError, match="budget is spent"):
        dlm.generate(ToyDLM(), PROMPT, gen_length=16, block_length=8, steps=4, sampler=_Overspender())
    with pytest.raises(RuntimeError, match="must come from this step's ctx.forward"):
        dlm.generate(ToyDLM(), PROMPT, gen_length=16, block_length=8, steps=16, sampler=_ForeignLogits())
