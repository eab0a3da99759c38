"""The D2F-style multi-block window (`window_blocks`, `window_open_at`): exact when it cannot open a
block early, budget-exact, deterministic, fewer passes when it can, and refusing what it cannot do."""
from __future__ import annotations

import pytest
import torch

import dlm
from dlm.engine.masked.window import BlockWindow, fit_logits
from dlm.decoding_config import DecodingConfig
from dlm.engine.families import UniformNoiseFamily
from samplers import get_sampler
from samplers.unmasking.lopa import LopaSampler, lookahead_branches
from toy_models import ToyDLM

IDS = torch.randint(0, 13, (3, 5), generator=torch.Generator().manual_seed(7))


def gen(model, sampler, ids=IDS, **kw):
    kw.setdefault("gen_length", 24)
    kw.setdefault("block_length", 8)
    kw.setdefault("steps", 24)
    return dlm.generate(model, ids, sampler=sampler, **kw)


@pytest.mark.parametrize("sampler", ["threshold", "confidence", "lopa"])
@pytest.mark.parametrize("eos_early_stop", [False, True])
def test_opening_only_complete_blocks_equals_the_plain_loop(sampler, eos_early_stop):
    """open_at=1 opens a block only once the previous one is complete: the blocks decode one after
    another as without the window, so the tokens must be the plain loop's (LoPA may reuse a
    lookahead's logits across a block boundary, which only saves passes)."""
    model = ToyDLM(seed=3)
    kw = dict(eos_early_stop=eos_early_stop, kv_cache="none")
    plain = gen(model, sampler, **kw)
    windowed = gen(model, sampler, window_blocks=2, window_open_at=1.0, **kw)
    assert torch.equal(plain.sequences, windowed.sequences)
    if sampler == "lopa":
        assert windowed.nfe <= plain.nfe
    else:
        assert windowed.nfe == plain.nfe and windowed.steps_per_block == plain.steps_per_block


def test_one_block_ignores_the_window():
    model = ToyDLM(seed=1)
    plain = gen(model, "lopa", block_length=24)
    windowed = gen(model, "lopa", block_length=24, window_blocks=3, window_open_at=0.0)
    assert torch.equal(plain.sequences, windowed.sequences) and plain.nfe == windowed.nfe


@pytest.mark.parametrize("sampler", ["threshold", "confidence", "lopa"])
@pytest.mark.parametrize("steps", [3, 5, 9, 24])
@pytest.mark.parametrize("window", [(2, 0.0), (3, 0.1), (3, 0.5)])
def test_budget_is_exact_and_every_mask_is_filled(sampler, steps, window):
    model = ToyDLM(seed=2)
    per_row = torch.zeros(IDS.shape[0], dtype=torch.long)

    def count(record):
        per_row[record.rows] += record.forwards

    out = gen(model, sampler, steps=steps, window_blocks=window[0], window_open_at=window[1], callback=count,
              kv_cache="none")
    assert not (out.sequences == model.config.mask_token_id).any()
    assert sum(out.steps_per_block) == out.nfe <= steps
    assert int(per_row.max()) <= out.nfe


def test_the_window_decodes_blocks_at_once_and_saves_passes():
    """A model confident everywhere: with every block opened at once (open_at 0) the threshold
    sampler commits several blocks per pass, where block-by-block decoding needs one pass each."""
    class Sure(torch.nn.Module):
        config = ToyDLM().config

        def forward(self, ids, **kw):  # token (position % 13) with probability ~1 everywhere
            logits = torch.zeros(*ids.shape, 16)
            logits.scatter_(2, (torch.arange(ids.shape[1]) % 13).expand_as(ids).unsqueeze(-1), 30.0)
            return logits

    model = Sure()
    plain = gen(model, "threshold", eos_early_stop=False, kv_cache="none")
    assert plain.nfe == 3  # one pass per block
    windowed = gen(model, "threshold", eos_early_stop=False, kv_cache="none", window_blocks=3, window_open_at=0.0,
                   return_trace=True)
    assert windowed.nfe < plain.nfe
    # The first pass already committed tokens past the first block.
    assert windowed.trace[0].tokens.shape[1] > 8 and windowed.trace[0].committed.min() > 8


def test_lopa_branches_span_the_window():
    seen = []

    class Probe(LopaSampler):
        name = "lopa-probe"

        def step(self, logits, ctx):
            seen.append((ctx.x.shape[1], bool(ctx.candidates[:, 8:].any())))
            return super().step(logits, ctx)

    out = gen(ToyDLM(seed=5), Probe(), window_blocks=2, window_open_at=0.0, kv_cache="none", return_trace=True)
    assert any(width > 8 and later for width, later in seen)
    assert not (out.sequences == 15).any()


@pytest.mark.parametrize("kv_cache", ["auto", "prompt", "none"])
def test_deterministic(kv_cache):
    from dlm.tiny import TinyDLMConfig, TinyDLMModel

    torch.manual_seed(0)
    config = TinyDLMConfig(vocab_size=16, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                           intermediate_size=64, mask_token_id=15, eos_token_id=14, pad_token_id=0)
    model = TinyDLMModel(config).eval()
    runs = [gen(model, "lopa", window_blocks=2, window_open_at=0.25, temperature=1.0, kv_cache=kv_cache,
                generator=torch.Generator().manual_seed(11)) for _ in range(2)]
    assert torch.equal(runs[0].sequences, runs[1].sequences) and runs[0].nfe == runs[1].nfe
    assert not (runs[0].sequences == 15).any()


def test_prompt_cache_equals_no_cache_on_a_model_whose_prompt_ignores_the_response():
    from dlm.tiny import TinyDLMConfig, TinyDLMModel

    torch.manual_seed(1)
    config = TinyDLMConfig(vocab_size=16, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                           intermediate_size=64, mask_token_id=15, eos_token_id=14, pad_token_id=0,
                           position_restart_token_id=13, prompt_attends_response=False)
    model = TinyDLMModel(config).eval()
    ids = torch.cat([IDS.clamp(max=12), torch.full((3, 1), 13)], dim=1)  # prompts end with the separator
    kw = dict(window_blocks=3, window_open_at=0.1, ids=ids)
    plain = gen(model, "lopa", kv_cache="none", **kw)
    cached = gen(model, "lopa", kv_cache="prompt", **kw)
    assert torch.equal(plain.sequences, cached.sequences) and plain.nfe == cached.nfe


def test_a_row_opens_no_block_past_its_eos():
    w = BlockWindow(size=4, open_at=0.0, num_blocks=4, block_length=2, prompt_length=1, batch=2, device="cpu",
                    mask_id=9, eos_id=8)
    x = torch.tensor([[0, 5, 8, 9, 9, 9, 9, 9, 9],
                      [0, 5, 5, 9, 9, 9, 9, 9, 9]])
    rows = torch.arange(2)
    w.advance(x, rows, 0)
    assert w.opened.tolist() == [1, 2]  # row 0 holds an EOS: nothing opens past it
    assert w.span_end(rows, 0) == 1 + 3 * 2  # one block past the last open one
    assert w.eligible(rows, 0, 6).tolist() == [[True] * 2 + [False] * 4, [True] * 4 + [False] * 2]


def test_opening_follows_progress_and_the_window_size():
    w = BlockWindow(size=2, open_at=0.5, num_blocks=4, block_length=4, prompt_length=0, batch=1, device="cpu",
                    mask_id=9, eos_id=None)
    rows = torch.arange(1)
    x = torch.full((1, 16), 9)
    w.advance(x, rows, 0)
    assert w.opened.tolist() == [1]  # block 0 is 0% decoded
    x[0, :2] = 1
    w.advance(x, rows, 0)
    assert w.opened.tolist() == [2]  # 50%: block 1 opens
    x[0, 4:6] = 1
    w.advance(x, rows, 0)
    assert w.opened.tolist() == [2]  # both open blocks still hold masks: the window is full
    x[0, :4] = 1
    w.advance(x, rows, 0)
    assert w.opened.tolist() == [3]  # block 0 is complete and block 1 half decoded: block 2 opens


def test_fit_logits_slices_rows_and_positions_and_pads_unopened_blocks():
    logits = torch.arange(2 * 6 * 3, dtype=torch.float).view(2, 6, 3)
    fitted = fit_logits(logits, torch.tensor([0, 4]), 10, torch.tensor([4]), 12, 6, mask_id=2)
    assert torch.equal(fitted[0, :4], logits[1, 2:])
    assert (fitted[0, 4:, :2] == 0).all() and torch.isinf(fitted[0, 4:, 2]).all()


def test_lopa_min_branch_confidence():
    anchor = torch.tensor([[9, 9, 1, 9]])
    proposal = torch.tensor([[3, 4, 5, 6]])
    conf = torch.tensor([[0.5, 0.8, 0.99, 0.2]])
    branches = lookahead_branches(anchor, proposal, conf, anchor == 9, 3, min_confidence=0.6)
    assert branches.tolist() == [[[9, 9, 1, 9], [9, 4, 1, 9], [9, 9, 1, 9]]]  # 0.5 < 0.6: not tried
    # Never trying an extra token is threshold decoding through the lookahead path.
    model = ToyDLM(seed=6)
    plain = gen(model, "threshold", kv_cache="none")
    strict = gen(model, get_sampler("lopa", branch_min_confidence=1.0), kv_cache="none")
    assert torch.equal(plain.sequences, strict.sequences) and plain.nfe == strict.nfe
    with pytest.raises(ValueError, match="branch_min_confidence"):
        get_sampler("lopa", branch_min_confidence=1.5)


@pytest.mark.parametrize("kw, match", [
    (dict(window_blocks=0), "window_blocks"),
    (dict(window_blocks=1.5), "window_blocks"),
    (dict(window_blocks=True), "window_blocks"),
    (dict(window_blocks=2, window_open_at=-0.1), "window_open_at"),
    (dict(window_blocks=2, window_open_at=1.5), "window_open_at"),
    (dict(window_open_at=0.3), "no effect with window_blocks=1"),
    (dict(window_blocks=2, kv_cache="prefix"), "kv_cache='prefix'"),
    (dict(window_blocks=2, kv_cache="dual"), "kv_cache='dual'"),
])
def test_bad_options_are_refused(kw, match):
    with pytest.raises(ValueError, match=match):
        gen(ToyDLM(), "threshold", **kw)


def test_remasking_samplers_and_uniform_noise_models_refuse_the_window():
    with pytest.raises(ValueError, match="does not remask"):
        gen(ToyDLM(), "saber", window_blocks=2)
    with pytest.raises(ValueError, match="window_blocks does not apply"):
        UniformNoiseFamily().check(DecodingConfig(window_blocks=2))
