"""`dlm bench` end to end on a random-weight tiny model, and the diffusers LLaDA2 baseline wrapper."""
from __future__ import annotations

import csv
import json

import pytest
import torch

from dlm.bench.diffusers_llada2 import build_pipeline, run_llada2, steps_per_block
from dlm.bench.harness import parse_sampler_specs
from dlm.cli import main
from dlm.tiny import TinyCharTokenizer, TinyDLMConfig, TinyDLMModel


def _tiny(seed: int = 0) -> TinyDLMModel:
    torch.manual_seed(seed)
    cfg = TinyDLMConfig(vocab_size=TinyCharTokenizer().vocab_size, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
    return TinyDLMModel(cfg).eval()


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny-random")
    _tiny().save_pretrained(d)
    TinyCharTokenizer().save_pretrained(d)
    return str(d)


def test_bench_end_to_end_json(tiny_dir, tmp_path, capsys):
    out = tmp_path / "run"
    rc = main(["bench", "--model", tiny_dir, "--suite", "copy", "--samplers", "confidence,diffusers-llada2",
               "--steps", "4,16", "--limit", "4", "--gen-length", "16", "--block-length", "8",
               "--batch-size", "3", "--out", str(out), "--json"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    summary = json.loads(captured.out)  # stdout holds only the JSON summary
    assert "quality%" in captured.err  # the table went to stderr
    pairs = summary["pairs"]
    assert [(p["sampler"], p["budget"]) for p in pairs] == [
        ("confidence", 4), ("confidence", 16), ("diffusers-llada2", 4), ("diffusers-llada2", 16)]
    for p in pairs:
        assert p["n"] == 4 and 0 <= p["quality"] <= 100 and p["nfe"] > 0 and p["seconds"] > 0
        assert p["tpf"] == pytest.approx(16 / p["nfe"])
    ours = {p["budget"]: p for p in pairs if p["engine"] == "dlm"}
    assert ours[4]["nfe"] <= 4 and ours[16]["nfe"] <= 16  # our engine honours the budget
    for name in ("results.json", "results.csv", "quality_vs_nfe.png", "quality_vs_seconds.png"):
        assert (out / name).stat().st_size > 0, name
    full = json.loads((out / "results.json").read_text())
    assert len(full["pairs"]) == 4 and full["config"]["suite"] == "copy"
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert len(rows) == 4 and float(rows[0]["nfe"]) > 0 and "quality[copy]" in rows[0]


def test_table_on_stdout_without_json(tiny_dir, tmp_path, capsys):
    rc = main(["bench", "--model", tiny_dir, "--suite", "list-edits", "--samplers", "threshold:kv=dual",
               "--steps", "2", "--limit", "1", "--gen-length", "8", "--block-length", "8", "--out", str(tmp_path),
               "--no-plots"])
    out = capsys.readouterr().out
    assert rc == 0 and "threshold:kv=dual" in out and "quality% by task" in out and "shuffle" in out


@pytest.mark.parametrize("args, needle", [
    (["--suite", "no-such-suite"], "unknown suite 'no-such-suite'"),
    (["--samplers", "confidence,bogus"], "unknown sampler 'bogus'"),
    (["--samplers", "threshold:tau=7"], "tau"),
    (["--model", "/no/such/model"], "/no/such/model"),
    (["--limit", "0"], "no examples"),
    (["--samplers", "diffusers-llada2:kv=dual"], "no KV cache"),
])
def test_user_errors_exit_2_with_one_line(args, needle, tmp_path, capsys):
    rc = main(["bench", "--suite", "copy", "--limit", "1", "--out", str(tmp_path)] + args)
    err = capsys.readouterr().err
    assert rc == 2
    lines = [l for l in err.splitlines() if l.strip()]
    assert len(lines) == 1 and needle in lines[0] and lines[0].startswith("dlm bench: error:")


def test_sampler_spec_parsing():
    a, b, c = parse_sampler_specs("confidence, threshold:tau=0.7:kv=prefix,diffusers-llada2:threshold=0.9")
    assert (a.name, a.kv_cache, a.option_dict) == ("confidence", None, {})
    assert (b.name, b.kv_cache, b.option_dict, b.label) == ("threshold", "prefix", {"tau": 0.7}, "threshold:tau=0.7:kv=prefix")
    assert c.is_external and c.option_dict == {"threshold": 0.9}


def test_steps_spec_gives_an_entry_its_own_budgets(tiny_dir, tmp_path, capsys):
    (spec,) = parse_sampler_specs("confidence:steps=16/4")
    assert spec.budgets_for([8, 2]) == [16, 4] and parse_sampler_specs("threshold")[0].budgets_for([8, 2]) == [8, 2]
    for bad in ("confidence:steps=0", "confidence:steps=4/x", "confidence:steps="):
        with pytest.raises(ValueError, match="steps="):
            parse_sampler_specs(bad)
    out = tmp_path / "run"
    rc = main(["bench", "--model", tiny_dir, "--suite", "copy", "--samplers", "threshold,confidence:steps=16",
               "--steps", "4,8", "--limit", "2", "--gen-length", "16", "--block-length", "8", "--no-plots",
               "--out", str(out), "--json"])
    assert rc == 0, capsys.readouterr().err
    pairs = json.loads(capsys.readouterr().out)["pairs"]
    assert [(p["sampler"], p["budget"]) for p in pairs] == [("threshold", 4), ("threshold", 8), ("confidence:steps=16", 16)]


def test_window_spec_decodes_several_blocks_at_once(tiny_dir, tmp_path, capsys):
    (spec,) = parse_sampler_specs("lopa:window=2:open=0.25")
    assert (spec.window_blocks, spec.window_open_at, spec.option_dict) == (2, 0.25, {})
    rc = main(["bench", "--model", tiny_dir, "--suite", "copy", "--samplers", "threshold,threshold:window=2",
               "--steps", "16", "--limit", "2", "--gen-length", "16", "--block-length", "4", "--no-plots",
               "--out", str(tmp_path / "run"), "--json"])
    assert rc == 0, capsys.readouterr().err
    pairs = json.loads(capsys.readouterr().out)["pairs"]
    assert [p["sampler"] for p in pairs] == ["threshold", "threshold:window=2"] and all(p["nfe"] <= 16 for p in pairs)


def test_xblock_spec_needs_a_cache():
    (d,) = parse_sampler_specs("confidence:kv=dual:xblock=1")
    assert d.cache_across_blocks and d.kv_cache == "dual" and d.option_dict == {}
    for bad in ("confidence:xblock=1", "confidence:kv=none:xblock=1", "confidence:kv=dual:xblock=yes"):
        with pytest.raises(ValueError, match="xblock"):
            parse_sampler_specs(bad)


def test_refresh_spec_rebuilds_the_cache_and_refresh_1_is_the_uncached_engine(tiny_dir, tmp_path, capsys):
    (d,) = parse_sampler_specs("threshold:kv=dual:refresh=2")
    assert d.cache_refresh_every == 2 and d.kv_cache == "dual" and d.option_dict == {}
    for bad in ("threshold:refresh=2", "threshold:kv=none:refresh=1", "threshold:kv=dual:refresh=x",
                "threshold:kv=dual:refresh=-1", "diffusers-llada2:refresh=1"):
        with pytest.raises(ValueError, match="refresh"):
            parse_sampler_specs(bad)
    out = tmp_path / "run"
    rc = main(["bench", "--model", tiny_dir, "--suite", "copy", "--samplers", "confidence,confidence:kv=dual:refresh=1,"
               "confidence:kv=dual", "--steps", "8", "--limit", "4", "--gen-length", "16", "--block-length", "8",
               "--out", str(out), "--json", "--no-plots"])
    assert rc == 0, capsys.readouterr().err
    pairs = {p["sampler"]: p for p in json.loads((out / "results.json").read_text())["pairs"]}
    plain, refreshed, cached = pairs["confidence"], pairs["confidence:kv=dual:refresh=1"], pairs["confidence:kv=dual"]
    # a cache rebuilt before every step is the uncached computation: same outputs, full-length forwards
    assert [s["output"] for s in refreshed["samples"]] == [s["output"] for s in plain["samples"]]
    assert refreshed["quality"] == plain["quality"] and refreshed["forward_tokens"] == plain["forward_tokens"]
    assert cached["forward_tokens"] < refreshed["forward_tokens"]  # without refresh the cache saves positions



def test_elastic_spec_sets_the_drift_test_and_refreshing_every_step_is_the_uncached_engine(tiny_dir, tmp_path, capsys):
    (e,) = parse_sampler_specs("confidence:kv=elastic:drift=0.9995:probe=8")
    assert e.kv_cache == "elastic" and e.option_dict == {}
    assert e.engine_kwargs() == {"cache_drift_threshold": 0.9995, "cache_drift_probe": 8}
    for bad, needle in (("confidence:drift=0.9", "add kv=elastic"), ("confidence:kv=dual:probe=2", "add kv=elastic"),
                        ("diffusers-llada2:drift=0.9", "add kv=elastic"), ("confidence:kv=elastic:drift=x", "drift="),
                        ("confidence:kv=elastic:drift=-1", "cache_drift_threshold"),
                        ("confidence:kv=elastic:probe=x", "probe="), ("confidence:kv=elastic:xblock=1", "xblock")):
        with pytest.raises(ValueError, match=needle):
            parse_sampler_specs(bad)
    out = tmp_path / "run"
    rc = main(["bench", "--model", tiny_dir, "--suite", "copy", "--samplers", "confidence:kv=none,"
               "confidence:kv=elastic:drift=1.5,confidence:kv=elastic", "--steps", "16", "--limit", "4",
               "--gen-length", "16", "--block-length", "8", "--out", str(out), "--json", "--no-plots"])
    assert rc == 0, capsys.readouterr().err
    pairs = {p["sampler"]: p for p in json.loads((out / "results.json").read_text())["pairs"]}
    plain, always, elastic = (pairs[k] for k in ("confidence:kv=none", "confidence:kv=elastic:drift=1.5",
                                                  "confidence:kv=elastic"))
    assert always["kv_cache"] == elastic["kv_cache"] == "elastic"
    # drift=1.5 reached the engine: a refresh at every step is the uncached computation
    assert [s["output"] for s in always["samples"]] == [s["output"] for s in plain["samples"]]
    assert always["quality"] == plain["quality"] and always["forward_tokens"] == plain["forward_tokens"]
    assert elastic["forward_tokens"] < plain["forward_tokens"]  # the default test keeps the cache


def test_block_spec_runs_an_entry_at_its_own_block_length_on_either_engine(tiny_dir, tmp_path, capsys):
    (d,) = parse_sampler_specs("threshold:kv=dual:block=4")
    assert d.block_length == 4 and d.option_dict == {}
    for bad in ("threshold:block=0", "threshold:block=x", "diffusers-llada2:block=-4"):
        with pytest.raises(ValueError, match="block"):
            parse_sampler_specs(bad)
    common = ["--model", tiny_dir, "--suite", "copy", "--steps", "8", "--limit", "4", "--gen-length", "16",
              "--json", "--no-plots"]
    runs = {}
    for name, samplers, block in (("mixed", "confidence:block=4,diffusers-llada2:block=4", "8"),
                                  ("plain", "confidence,diffusers-llada2", "4")):
        rc = main(["bench", *common, "--samplers", samplers, "--block-length", block, "--out", str(tmp_path / name)])
        assert rc == 0, capsys.readouterr().err
        runs[name] = {p["sampler"].split(":")[0]: p for p in json.loads((tmp_path / name / "results.json").read_text())["pairs"]}
    # an entry's block=4 inside a run at --block-length 8 is the run at --block-length 4
    for engine in ("confidence", "diffusers-llada2"):
        mixed, plain = runs["mixed"][engine], runs["plain"][engine]
        assert [s["output"] for s in mixed["samples"]] == [s["output"] for s in plain["samples"]]
        assert mixed["nfe"] == plain["nfe"] and mixed["forward_tokens"] == plain["forward_tokens"]


@pytest.mark.parametrize("samplers, steps, needle", [
    ("confidence:block=3", "8", "block=3 must divide --gen-length (16)"),
    ("confidence:block=4", "2,8", "--steps [2] below its number of blocks (4 of 4 tokens)"),
])
def test_block_spec_errors_before_any_work(samplers, steps, needle, tiny_dir, tmp_path, capsys):
    rc = main(["bench", "--model", tiny_dir, "--suite", "copy", "--samplers", samplers, "--steps", steps, "--limit", "1",
               "--gen-length", "16", "--block-length", "8", "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert rc == 2 and needle in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "run" / "results.json").exists()

class _CountCalls:
    def __init__(self, module):
        self.n, self.lengths = 0, []
        module.register_forward_pre_hook(self)

    def __call__(self, module, args):
        self.n += 1
        self.lengths.append(args[0].shape[1])


@pytest.mark.parametrize("prompt_len, expected", [
    # prompt fills block 0; windows 16 and 24: 4 steps of 2 tokens each, no spare call
    (8, [16] * 4 + [24] * 4),
    # prompt ends inside block 1: 6 masks there take 3 steps plus the pipeline's one extra forward
    # that discovers the block is done; then two full windows of 4 steps (the last holds the tail)
    (10, [16] * 4 + [24] * 4 + [32] * 4),
])
def test_llada2_pipeline_on_tiny_model_counts_nfe(prompt_len, expected):
    model, tok = _tiny(1), TinyCharTokenizer()
    pipe, wrapper = build_pipeline(model, tok)
    calls = _CountCalls(model)
    ids = torch.tensor([tok.encode("copy: ana bo cyd"[:prompt_len])] * 2)
    out = run_llada2(pipe, wrapper, ids, None, gen_length=16, block_length=8, steps=8,
                     options={"eos_early_stop": False})
    assert steps_per_block(8, 16, 8) == 4 == out.num_inference_steps
    assert out.windows == expected and calls.lengths == expected
    assert out.nfe == calls.n == len(expected)
    assert out.forward_tokens == 2 * sum(expected)
    assert out.sequences.shape == (2, 16) and not (out.sequences == tok.mask_token_id).any()


def test_llada2_wrapper_left_padding_matches_unpadded_row():
    model, tok = _tiny(2), TinyCharTokenizer()
    pipe, wrapper = build_pipeline(model, tok)
    short, long = tok.encode("copy: bo"), tok.encode("copy: ana bo cyd")
    ids, att = tok.pad_batch([short, long])
    batched = run_llada2(pipe, wrapper, torch.tensor(ids), torch.tensor(att), gen_length=8, block_length=8, steps=8,
                         options={"eos_early_stop": False})
    alone = run_llada2(pipe, wrapper, torch.tensor([short]), None, gen_length=8, block_length=8, steps=8,
                       options={"eos_early_stop": False})
    # Blocks are absolute in diffusers, so compare a row whose window layout is the same either way:
    # the padded row's tokens after its prompt must match when positions come from the mask.
    assert batched.sequences.shape == (2, 8) and alone.sequences.shape == (1, 8)
    logits_pad = wrapper(torch.tensor(ids)[:1], attention_mask=torch.tensor(att)[:1]).logits[0, -len(short):]
    logits_alone = wrapper(torch.tensor([short]), attention_mask=torch.ones(1, len(short), dtype=torch.long)).logits[0]
    torch.testing.assert_close(logits_pad, logits_alone, rtol=1e-4, atol=1e-4)


def _pair(sampler, budget, quality, nfe, seconds, engine="dlm"):
    from dlm.bench.harness import PairResult
    return PairResult(sampler=sampler, budget=budget, engine=engine, kv_cache="none", n=10, quality=quality,
                      quality_by_task={}, nfe=nfe, nfe_per_call=nfe, tpf=64 / nfe, tokens_per_s=1.0, seconds=seconds,
                      forward_tokens=0, peak_mem_mb=None, mem_method="x")


def test_targets_and_equal_quality_ratios():
    from dlm.bench.harness import BenchResult, compare_to_baselines, summarize_targets
    pairs = [_pair("confidence", 16, 70.0, 16, 2.0), _pair("confidence", 32, 79.5, 32, 4.0),
             _pair("confidence", 64, 80.0, 64, 8.0),
             _pair("diffusers-llada2", 32, 79.0, 36, 12.0, "diffusers"), _pair("diffusers-llada2", 64, 79.0, 70, 24.0, "diffusers")]
    result = BenchResult(config={"gen_length": 64}, meta={}, pairs=pairs)
    t = summarize_targets(result)
    assert t["confidence"]["min_budget"] == 32 and t["confidence"]["reference_quality"] == 80.0
    assert t["confidence"]["tpf"] == 2.0 and t["diffusers-llada2"]["min_budget"] == 32
    cmp = compare_to_baselines(result)["diffusers-llada2"]
    ours = cmp["ours"]["confidence"]
    assert cmp["budget"] == 32 and ours["budget"] == 32  # the fastest of ours within 1 point of 79.0
    assert ours["wall_ratio"] == pytest.approx(3.0) and ours["nfe_ratio"] == pytest.approx(36 / 32)


def test_bench_counts_lookahead_branches(tiny_dir, tmp_path, capsys):
    """A lookahead sampler's batched branch call is one NFE; branch forwards count each branch."""
    rc = main(["bench", "--model", tiny_dir, "--suite", "copy", "--samplers", "threshold,lopa:branches=3:kv=prefix",
               "--steps", "16", "--limit", "3", "--gen-length", "16", "--block-length", "8",
               "--out", str(tmp_path), "--no-plots", "--json"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    assert "branchF/seq" in captured.err
    pairs = {p["sampler"]: p for p in json.loads(captured.out)["pairs"]}
    assert pairs["threshold"]["branch_forwards"] == pairs["threshold"]["nfe"]
    lopa = pairs["lopa:branches=3:kv=prefix"]
    assert lopa["nfe"] <= 16
    # Every pass but each block's first is a 3-branch lookahead call (the random model is unsure).
    assert lopa["nfe"] < lopa["branch_forwards"] <= 3 * lopa["nfe"]
    rows = list(csv.DictReader((tmp_path / "results.csv").open()))
    assert float(rows[1]["branch_forwards"]) == pytest.approx(lopa["branch_forwards"])


def test_bench_runs_hex_with_the_suite_extractor(tiny_dir, tmp_path, capsys):
    """hex by name in the bench: its NFE is the experts' total, each expert's quality is reported.
    The published setting gives each of the 3 experts gen/2 = 8 passes, so the budget is 24."""
    rc = main(["bench", "--model", tiny_dir, "--suite", "arithmetic", "--samplers", "hex:block_lengths=4/8/16",
               "--steps", "24", "--limit", "2", "--gen-length", "16", "--block-length", "8",
               "--out", str(tmp_path), "--no-plots"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    assert "ensemble vs its experts" in captured.out
    pair = json.loads((tmp_path / "results.json").read_text())["pairs"][0]
    assert 8 < pair["nfe"] <= 24 and pair["branch_forwards"] == pair["nfe"]  # more than one expert's passes
    assert set(pair["extra"]["expert_quality"]) == {"4", "8", "16"}
    assert 0 <= pair["extra"]["token_vote_quality"] <= 100  # the vote on tokens, kept beside the task vote


def test_bench_reads_hex_experts_suite_by_suite(tiny_dir, tmp_path):
    """A multi-suite run: each suite's view of a HEX pair carries that suite's experts, and the
    whole run's expert quality is the prompt-weighted mean of the suites'."""
    from dlm.bench import BenchConfig, run_bench

    result = run_bench(BenchConfig(model=tiny_dir, suite="all", samplers=["hex:block_lengths=4/8"], steps=[16],
                                   limit=1, gen_length=16, block_length=8, warmup=False), progress=False)
    pair = result.pairs[0]
    suites = pair.by_suite
    assert set(suites) == {"list_edits", "arithmetic", "puzzles"}
    for block in ("4", "8"):
        weighted = sum(v["n"] * v["extra"]["expert_quality"][block] for v in suites.values()) / pair.n
        assert weighted == pytest.approx(pair.extra["expert_quality"][block])


def test_multi_suite_run_times_and_compares_each_suite_apart(tiny_dir, tmp_path, capsys):
    from dlm.bench.harness import _suite_batches, collect_examples, resolve_suite, suite_of
    from dlm.tasks import SUITES

    examples = collect_examples(resolve_suite("all"), 2, 0)
    batches = _suite_batches(examples, 5)
    assert all(len({suite_of(ex.task) for ex in chunk}) == 1 for _, chunk in batches)  # never mixed
    assert [len(c) for _, c in batches] == [5, 5, 5, 3, 2, 4] and sum(len(c) for _, c in batches) == len(examples)

    out = tmp_path / "all"
    rc = main(["bench", "--model", tiny_dir, "--suite", "all", "--samplers", "confidence,diffusers-llada2",
               "--steps", "2,8", "--limit", "2", "--gen-length", "16", "--block-length", "8",
               "--batch-size", "5", "--out", str(out), "--no-plots"])
    text = capsys.readouterr().out
    assert rc == 0
    full = json.loads((out / "results.json").read_text())
    sizes = {s: 2 * len(SUITES[s]) for s in ("list_edits", "arithmetic", "puzzles")}
    for p in full["pairs"]:
        assert {s: v["n"] for s, v in p["by_suite"].items()} == sizes
        assert sum(v["seconds"] for v in p["by_suite"].values()) == pytest.approx(p["seconds"])
        for suite, v in p["by_suite"].items():  # each suite's quality is the mean of its tasks' (equal n)
            tasks = SUITES[suite]
            assert v["quality"] == pytest.approx(sum(p["quality_by_task"][t] for t in tasks) / len(tasks))
        assert sum(v["nfe"] * v["n"] for v in p["by_suite"].values()) == pytest.approx(p["nfe"] * p["n"])
    by_suite = full["meta"]["vs_diffusers_by_suite"]
    assert set(by_suite) == set(sizes) and all("diffusers-llada2" in v for v in by_suite.values())
    assert "[arithmetic] vs diffusers-llada2" in text and "[puzzles] vs diffusers-llada2" in text
    from dlm.bench.report import load_result, plot_results

    plots = plot_results(load_result(out / "results.json"), tmp_path / "plots")
    by_suite_plot = tmp_path / "plots" / "quality_vs_seconds_by_suite.png"
    assert by_suite_plot in plots and by_suite_plot.stat().st_size > 0


def test_compare_by_suite_picks_each_suites_own_operating_point():
    from dlm.bench.harness import BenchResult, compare_by_suite

    def with_suites(pair, **suites):
        pair.by_suite = {s: {"n": 10, "quality": q, "nfe": nfe, "tpf": 64 / nfe, "seconds": sec}
                         for s, (q, nfe, sec) in suites.items()}
        return pair

    pairs = [with_suites(_pair("confidence", 8, 0, 8, 2.0), a=(90.0, 8, 1.0), b=(10.0, 8, 1.0)),
             with_suites(_pair("confidence", 64, 0, 64, 9.0), a=(91.0, 64, 4.0), b=(50.0, 64, 5.0)),
             with_suites(_pair("diffusers-llada2", 64, 0, 60, 30.0, "diffusers"), a=(80.0, 60, 12.0), b=(40.0, 60, 18.0))]
    cmp = compare_by_suite(BenchResult(config={"gen_length": 64}, meta={}, pairs=pairs))
    a, b = cmp["a"]["diffusers-llada2"], cmp["b"]["diffusers-llada2"]
    assert a["quality"] == 80.0 and a["ours"]["confidence"]["budget"] == 8
    assert a["ours"]["confidence"]["wall_ratio"] == pytest.approx(12.0)
    assert b["quality"] == 40.0 and b["ours"]["confidence"]["budget"] == 64  # 8 steps is too poor on b
    assert b["ours"]["confidence"]["wall_ratio"] == pytest.approx(18.0 / 5.0)


@pytest.fixture
def keep_threads():
    """`--threads 1` sets torch's process-wide thread count: restored after the test."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_bench_runs_lossless_beside_its_base_at_equal_quality(tmp_path, capsys, keep_threads):
    """`lossless:base=confidence` is a sampler entry like the others: on the trained model it gives its
    base's outputs (so its quality, by construction) in fewer forward passes per sequence, and its
    verification rows show as branch forwards. Also on an oracle suite (greedy there)."""
    rc = main(["bench", "--model", "tiny-dlm", "--suite", "reverse", "--samplers",
               "confidence,lossless:base=confidence", "--steps", "64",
               "--limit", "3", "--batch-size", "1", "--threads", "1", "--out", str(tmp_path / "tiny"), "--no-plots", "--json"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    pairs = {p["sampler"]: p for p in json.loads((tmp_path / "tiny" / "results.json").read_text())["pairs"]}
    base = pairs["confidence"]
    assert base["quality"] > 50  # the trained model: a quality that could differ
    pair = pairs["lossless:base=confidence"]
    assert pair["quality_by_task"] == base["quality_by_task"]
    assert [s["output"] for s in pair["samples"]] == [s["output"] for s in base["samples"]]
    assert pair["nfe"] < base["nfe"] and pair["branch_forwards"] > pair["nfe"]
    rc = main(["bench", "--suite", "oracle-schedules", "--samplers", "confidence,lossless:base=confidence:depth=4",
               "--steps", "32", "--limit", "6", "--threads", "1", "--out", str(tmp_path / "oracle"), "--no-plots", "--json"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    base, lossless = json.loads(captured.out)["pairs"]
    assert lossless["quality"] == base["quality"] and lossless["nfe"] < base["nfe"]
