"""The exact beds made for the seed samplers' own arguments (issue 44) and the where-it-pays script.

- keyed oracle (LoPA: fill order matters): conditionals equal brute-force marginals of the
  enumerated joint; the best order's forwards (`best_order_forwards`) equal what `KeyFirstSampler`
  decodes, and its samples are exact;
- runs oracle (Saber: confidence rises with context): the suite's exact law of symbol changes;
- schedule oracle (HEX: schedules fail differently): which block lengths fail follows the drawn
  padding distance and anchor, prompt by prompt.
"""
from __future__ import annotations

import pytest
import torch

import dlm
from dlm.bench import BenchConfig, run_bench
from dlm.bench.harness import BenchResult, PairResult
from dlm.oracles.keyed import KeyedOracle, KeyFirstSampler, random_codewords
from dlm.oracles.schedules import EOS, Scenario, ScheduleOracle, draw_scenarios
from dlm.tasks.oracle_tasks import ORACLE_SUITES, oracle_metrics
from script_loader import load_script


# ------------------------------------------------------------------------------------------ keyed
def test_codewords_are_a_linear_code_with_fair_bits():
    code = torch.as_tensor(random_codewords(8, 5, seed=3))
    assert len({tuple(c) for c in code.tolist()}) == 8
    assert (code.sum(dim=0) == 4).all()  # every bit a fair coin over the keys
    xor = {tuple(((a + b) % 2).tolist()) for a in code for b in code}
    assert xor == {tuple(c) for c in code.tolist()}  # closed under addition: linear
    with pytest.raises(ValueError, match="power of two"):
        random_codewords(6, 5, seed=0)


def test_keyed_conditionals_are_the_marginals_of_the_joint():
    oracle = KeyedOracle(groups=1, codewords=4, dependents=3, independents=1, seed=1)
    support, log_p = oracle.enumerate_joint()
    p = log_p.exp()
    assert torch.isclose(p.sum(), torch.tensor(1.0, dtype=torch.float64))
    mask = oracle.config.mask_token_id
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        truth = support[torch.multinomial(p, 1, generator=g)].squeeze(0)
        hidden = torch.rand(oracle.n, generator=g) < 0.6
        x = torch.where(hidden, torch.full_like(truth, mask), truth)
        got = oracle.conditionals(torch.cat([torch.tensor([oracle.config.bos_token_id]), x]).unsqueeze(0))[0]
        agree = ((support == x) | hidden).all(dim=1)  # sentences consistent with the visible tokens
        for i in torch.nonzero(hidden).squeeze(1).tolist():
            expected = torch.zeros(oracle.V, dtype=torch.float64)
            expected.index_add_(0, support[agree, i], p[agree])
            torch.testing.assert_close(got[i], expected / expected.sum())


def test_the_best_order_decodes_in_its_forwards_and_stays_exact():
    oracle = KeyedOracle()
    assert oracle.best_order_forwards(0.9) == 4.0  # 2 keys, then 2 independents (bits ride along)
    out = dlm.generate(oracle, oracle.prompt(1024), gen_length=oracle.n, block_length=oracle.n, steps=oracle.n,
                       sampler=KeyFirstSampler(oracle, 0.9), temperature=1.0,
                       generator=torch.Generator().manual_seed(0))
    assert out.nfe == 4
    m = oracle_metrics(oracle, out.sequences)
    assert m.valid_fraction == 1.0 and m.total_variation < m.reference_total_variation + 0.03
    # parallel commits are not free: threshold at 0.4 commits dependent bits together
    low = dlm.generate(oracle, oracle.prompt(512), gen_length=oracle.n, block_length=oracle.n, steps=oracle.n,
                       sampler="threshold", sampler_config={"tau": 0.4}, temperature=1.0,
                       generator=torch.Generator().manual_seed(0))
    assert oracle_metrics(oracle, low.sequences, distribution=False).valid_fraction < 0.5


def test_best_order_forwards_counts_passing_independents_exactly():
    """One group, two independents, tau 0.6: an independent passes a forward when it draws its 0.7
    value. Forward 1 forces the key (both independents may pass); forward 2 passes the bits and
    forces one independent left, the other may pass; only when both were left and the second
    missed again (0.3^2 * 0.3) is a third forward needed."""
    oracle = KeyedOracle(groups=1, codewords=4, dependents=3, independents=2, independent_p=0.7)
    assert oracle.best_order_forwards(0.6) == pytest.approx(2 + 0.3 ** 2 * 0.3)
    assert oracle.best_order_forwards(0.9) == 3.0  # nothing passes: the key, then one forced per independent
    none = KeyedOracle(groups=3, codewords=4, dependents=3, independents=0)
    assert none.best_order_forwards(0.9) == 4.0  # three keys, then the last group's bits


# ------------------------------------------------------------------------------------------- runs
def test_runs_suite_is_a_chain_whose_law_of_changes_is_exact():
    suite = ORACLE_SUITES["oracle-runs"]
    oracle = suite.build()
    law = oracle.switch_count_law()
    assert torch.isclose(law.sum(), torch.tensor(1.0, dtype=torch.float64))
    assert abs(float((law * torch.arange(law.numel())).sum()) - 63 * 0.1) < 1e-9  # stay 0.9: 0.1 per pair
    samples = oracle.sample(4000, torch.Generator().manual_seed(0))
    assert abs(oracle.num_switches(samples).double().mean().item() - 6.3) < 0.2


# -------------------------------------------------------------------------------------- schedules
def test_each_prompt_fails_under_its_own_block_lengths():
    answer = (3, 1, 4, 1, 5, 9, 2, 6)
    oracle = ScheduleOracle([Scenario(answer, pad_distance=5), Scenario(answer, anchor=4), Scenario(answer)], 16)
    prompts = oracle.prompt()
    right = {}
    for block in (2, 4, 8, 16):
        out = dlm.generate(oracle, prompts, gen_length=16, block_length=block, steps=8, sampler="confidence",
                           kv_cache="none")
        right[block] = oracle.score(out.sequences).tolist()
    # padding 5 ahead: blocks longer than 5 collapse; anchor at 4: blocks 2 and 4 put 3 before 4
    assert right == {2: [True, False, True], 4: [True, False, True], 8: [False, True, True], 16: [False, True, True]}
    cut = dlm.generate(oracle, prompts[:1], gen_length=16, block_length=16, steps=8, sampler="confidence",
                       kv_cache="none").sequences[0, 2:]
    assert EOS in cut[:len(answer)].tolist()  # the collapse is end-of-text inside the answer


def test_schedule_scenarios_are_seeded_and_the_suite_scores_hex_experts():
    assert draw_scenarios(10, 32, seed=4) == draw_scenarios(10, 32, seed=4) != draw_scenarios(10, 32, seed=5)
    result = run_bench(BenchConfig(suite="oracle-schedules", samplers=["confidence", "hex:steps=64"], steps=[32],
                                   limit=12, block_length=32, seed=1, warmup=False), progress=False)
    hex_pair = next(p for p in result.pairs if p.sampler.startswith("hex"))
    assert set(hex_pair.extra["expert_quality"]) == {"2", "4", "8", "16"}
    assert hex_pair.extra["best_expert_quality"] == max(hex_pair.extra["expert_quality"].values())
    assert result.config["temperature"] == 0.0


# --------------------------------------------------------------------------------- the script
def _pair(name, quality, nfe):
    return PairResult(sampler=name, budget=8, engine="dlm", kv_cache="none", n=1, quality=quality,
                      quality_by_task={}, nfe=nfe, nfe_per_call=nfe, tpf=1.0, tokens_per_s=1.0, seconds=1.0,
                      forward_tokens=1, peak_mem_mb=None, mem_method="-")


def test_where_it_pays_reads_ratio_beyond_and_below():
    wip = load_script("where_it_pays.py")
    result = BenchResult(config={"gen_length": 8}, meta={}, pairs=[
        _pair("threshold:tau=0.9", 90.0, 8.0), _pair("threshold:tau=0.5", 60.0, 2.0),
        _pair("lopa", 89.5, 4.0), _pair("saber", 99.0, 8.0), _pair("hex", 40.0, 8.0)])
    base = ["threshold:tau=0.9", "threshold:tau=0.5"]
    lopa = wip.read_point(result, base, "lopa")
    assert lopa["status"] == "ratio" and lopa["ratio"] == 2.0 and lopa["baseline"] == "threshold:tau=0.9@8"
    assert wip.read_point(result, base, "saber")["status"] == "beyond"
    assert wip.read_point(result, base, "hex")["status"] == "dominated"  # tau 0.5 is cheaper and 20 points better
    gap = BenchResult(config={"gen_length": 8}, meta={}, pairs=result.pairs[:2] + [_pair("hex", 75.0, 4.0)])
    assert wip.read_point(gap, base, "hex")["status"] == "gap"  # cheaper than tau 0.9, worse, no point of 75%
    table = wip.summarize({"bed": [{"seed": s, "points": {"lopa": dict(lopa, ratio=r)}} for s, r in ((0, 2.0), (1, 1.0), (2, 3.0))]})
    assert table["bed"]["lopa"]["ratio_median"] == 2.0 and table["bed"]["lopa"]["ratio_min"] == 1.0
    assert "**2.00x** (1.00-3.00)" in wip.markdown(table, {"repeats": 3})


def test_where_it_pays_targets_read_each_repeat():
    wip = load_script("where_it_pays.py")
    pairs = [{"sampler": "threshold:tau=0.9", "budget": 14, "quality": 50.0, "nfe": 10.0},
             {"sampler": "threshold:tau=0.5", "budget": 14, "quality": 20.0, "nfe": 3.0},
             {"sampler": "lopa", "budget": 14, "quality": 50.5, "nfe": 5.0},
             {"sampler": "lopa:published=true", "budget": 14, "quality": 90.0, "nfe": 6.0},
             {"sampler": "key-first:tau=0.9", "budget": 14, "quality": 90.0, "nfe": 4.0, "expected_nfe": 4.0}]
    runs = {"oracle-keyed": [{"seed": 0, "points": {}, "pairs": pairs}],
            "oracle-schedules": [{"seed": 0, "points": {"hex": {"quality": 75.0, "best_expert_quality": 70.0}},
                                  "pairs": []}]}
    lines = wip.targets(runs)
    lopa = next(line for line in lines if "LoPA (default)" in line)
    # 2x threshold and 1.25x the best order's forwards, but 40 points worse than it: not at equal TV
    assert "2.00x" in lopa and "1.25x the best order" in lopa and "not equal TV" in lopa and lopa.endswith("| not met |")
    published = next(line for line in lines if "LoPA (published)" in line)
    assert "beyond the frontier" in published and published.endswith("| not met |")  # 6 / 4 = 1.5x the best order
    assert next(line for line in lines if "HEX" in line).endswith("| met on every repeat |")
