"""scripts/bench_lossless.py counts what it claims: verification passes, plain passes, rounds and the
acceptance rate are checked against exact oracles (models on which every draft is right, or none is,
whose counts follow from a plain loop written here), against the model calls themselves (a hook counts
the rows of every call), and the cost model's gain against its two limits; the --smoke run writes its
JSON, tables and plot with every prompt identical to the base."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from script_loader import load_script  # tests/script_loader.py (tests/ is on sys.path)
from toy_models import StaticLogits

script = load_script("bench_lossless.py")


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


class NoDraftRight(torch.nn.Module):
    """The confidence order over positions is fixed (position 0 first), and every position's best token
    is 1 or 2 by the parity of the masks left in the row: the draft d_1, made from the logits of one
    more mask, always holds the other token than the base's next step, so every round accepts 1 step."""

    def __init__(self):
        super().__init__()
        self.config = SimpleNamespace(mask_token_id=5, eos_token_id=None, pad_token_id=None, vocab_size=6)

    def forward(self, input_ids, attention_mask=None, **kw):
        B, L = input_ids.shape
        token = 1 + (input_ids == 5).sum(dim=1) % 2  # [B]
        logits = torch.zeros(B, L, 6)
        logits.scatter_(2, token.view(B, 1, 1).expand(B, L, 1), (2 + torch.linspace(3, 0, L)).expand(B, L).unsqueeze(2))
        return SimpleNamespace(logits=logits)


def _row(model, prompts, gen, block):
    return dict(name="stand-in", bed="stand-in", model=model, gen=gen, block=block, prompts=prompts, pad=0, eos=None,
                mask=model.config.mask_token_id, extra_kv=(), timed=False)


def _rounds_when_every_draft_is_right(steps: int, depth: int) -> tuple[int, int]:
    """(verification passes, rounds without one) of one block: each round with more than one step left
    verifies and commits min(depth, left) steps; the last step alone needs no pass."""
    passes = unverified = 0
    while steps:
        if steps == 1:
            unverified, steps = unverified + 1, 0
        else:
            passes, steps = passes + 1, steps - min(depth, steps)
    return passes, unverified


@pytest.mark.parametrize("depth", [2, 3, 4, 7])
def test_counts_when_every_draft_is_right(depth):
    """Two prompts at batch 1, two blocks of 13 steps each: 13 leaves one step alone after depths 2, 3 and
    4 (13 = 6x2+1 = 4x3+1 = 3x4+1), none after 7 (13 = 7+6)."""
    res = script.measure_setting(_row(StaticLogits(seed=3), [[0, 1, 2], [3, 4]], 26, 13), "confidence", "none", 1,
                                 depths=(depth,))
    base, counts = res["base"], res["depths"][str(depth)]["counts"]
    info = script.derived(base, counts, depth)
    passes, unverified = _rounds_when_every_draft_is_right(13, depth)
    calls_blocks = 2 * 2  # two calls, two blocks each
    assert base["nfe"] == base["steps"] == base["rounds"] == 2 * 26  # the base: one forward per step
    assert counts["steps"] == base["nfe"]  # lossless takes the base's steps
    assert info["verification_passes"] == calls_blocks * passes
    assert info["plain_passes"] == calls_blocks  # each block's first forward only
    assert counts["rounds"] == calls_blocks * (passes + unverified)
    assert info["acceptance"] == (13 - unverified) / passes
    assert info["forward_ratio"] == 26 / (2 + 2 * passes)
    assert counts["branch"] == calls_blocks * (1 + depth * passes)
    assert res["depths"][str(depth)]["identical"] == 2 and res["depths"][str(depth)]["same_budget"] == 2


@pytest.mark.parametrize("depth", [2, 5])
def test_counts_when_no_draft_is_right(depth):
    res = script.measure_setting(_row(NoDraftRight(), [[0, 1]], 16, 8), "confidence", "none", 1, depths=(depth,))
    base, counts = res["base"], res["depths"][str(depth)]["counts"]
    info = script.derived(base, counts, depth)
    assert res["depths"][str(depth)]["identical"] == 1
    # per block: 7 rounds verify and accept one step each, the 8th step alone needs no pass
    assert info["acceptance"] == 1.0 and info["verification_passes"] == 2 * 7
    assert counts["nfe"] == base["nfe"] == 16 and info["forward_ratio"] == 1.0
    assert counts["rounds"] == 16 and counts["branch"] == 2 * (1 + depth * 7)


def test_verification_passes_are_the_model_calls_of_depth_rows():
    """On the trained model at batch 1, the passes the script infers are the model's own calls: one row
    for a plain pass, `depth` rows for a verification pass (a hook sees every call's batch size)."""
    from dlm.bench.harness import load_model

    model, tok, ids = load_model("tiny-dlm")
    prompts = [tok.encode("reverse: ana bo cyd tom\n"), tok.encode("sort: tom fay ivy gus\n")]
    sizes = []
    hook = model.register_forward_pre_hook(
        lambda m, args, kwargs: sizes.append((args[0] if args else kwargs["input_ids"]).shape[0]), with_kwargs=True)
    try:
        for prompt, kv, depth in ((prompts[0], "none", 3), (prompts[1], "prompt", 4)):
            row = dict(_row(model, [prompt], 64, 32), pad=tok.pad_token_id, eos=ids["eos_token_id"],
                       mask=ids["mask_token_id"])
            sizes.clear()
            res = script.measure_setting(row, "confidence", kv, 1, depths=(depth,))
            base, counts = res["base"], res["depths"][str(depth)]["counts"]
            info = script.derived(base, counts, depth)
            assert sizes[:base["nfe"]] == [1] * base["nfe"]  # the base's calls, then lossless's
            mine = sizes[base["nfe"]:]
            assert len(mine) == counts["nfe"]
            assert mine.count(depth) == info["verification_passes"] > 0
            assert mine.count(1) == info["plain_passes"]
            assert res["depths"][str(depth)]["identical"] == 1
            assert 1 < info["acceptance"] <= depth
    finally:
        hook.remove()


def test_expected_gain_meets_its_two_limits():
    """Priced with c(K) = c(1) (a verification pass costs one forward: memory-bound) the gain is the
    forward ratio; with c(K) = K c(1) (compute-bound) it is the base's passes over every row lossless
    ran (its branch forwards at batch 1)."""
    res = script.measure_setting(_row(NoDraftRight(), [[0, 1]], 16, 8), "confidence", "none", 1, depths=(4,))
    base, counts = res["base"], res["depths"]["4"]["counts"]
    flat = {"1": {"ms": 2.0}, "4": {"ms": 2.0}}
    linear = {"1": {"ms": 2.0}, "4": {"ms": 8.0}}
    assert script.expected_gain(base, counts, 4, flat) == pytest.approx(base["nfe"] / counts["nfe"])
    assert script.expected_gain(base, counts, 4, linear) == pytest.approx(base["nfe"] / counts["branch"])
    assert script.expected_gain(base, counts, 4, linear) < 1  # nothing accepted: the extra rows are pure cost


def test_smoke_run_writes_every_table_with_identical_tokens(tmp_path):
    assert script.main(["--smoke", "--quiet", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "lossless.json").read_text())
    md = (tmp_path / "lossless.md").read_text()
    assert (tmp_path / "lossless.png").stat().st_size > 10_000
    assert set(data["rows"]) == {"tiny-dlm", "oracle-schedules", "oracle-permutation", "llada-replica"}
    assert data["rows"]["tiny-dlm"]["exact_kv"] == "prompt" and data["rows"]["llada-replica"]["kv"] == ["none", "dual"]
    for name, row in data["rows"].items():
        for base, by_kv in row["runs"].items():
            for kv, by_batch in by_kv.items():
                for batch, res in by_batch.items():
                    assert res["base"]["nfe"] == res["base"]["steps"] == res["base"]["rounds"], (name, base, kv)
                    for depth, entry in res["depths"].items():
                        assert entry["identical"] == res["prompts"], (name, base, kv, batch, depth)
                        assert entry["same_budget"] == entry["counts"]["calls"]
                        assert entry["counts"]["steps"] == res["base"]["nfe"]
    table = script.summarize(data)
    info = table["tiny-dlm"]["confidence"]["depths"]["4"]
    assert 1 <= info["acceptance"] <= 4 and info["cpu_time_ratio"]["min"] <= info["cpu_time_ratio"]["max"]
    assert f"| tiny-dlm | confidence | {info['base_nfe_per_prompt']:.1f} |" in md
    assert "Lossless on top of an already parallel decode" in md and "Target: >= 2x" in md
    assert script.main(["--report", str(tmp_path)]) == 0  # the tables again from the JSON
    assert (tmp_path / "lossless.md").read_text() == md


def test_bad_options_exit_2_in_one_line(capsys):
    assert script.main(["--beds", "tiny-dgemma"]) == 2
    assert script.main(["--depths", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "unknown bed 'tiny-dgemma'" in err[0] and "--depths" in err[1]
