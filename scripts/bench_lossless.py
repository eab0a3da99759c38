"""Lossless draft-and-verify measured (issue 50): `sampler="lossless"` against its base sampler, on every
masked bed we have, in one run; token identity, sequential forwards, their price, and the time on CPU.

    python scripts/bench_lossless.py --out runs/bench-lossless            # every bed (CPU, one thread: ~1 h)
    python scripts/bench_lossless.py --out runs/l --beds chains-hard      # one bed
    python scripts/bench_lossless.py --report runs/bench-lossless          # the tables and plot again, from the JSON
    python scripts/bench_lossless.py --report runs/a --merge runs/b        # one table from two runs over other beds
    python scripts/bench_lossless.py --smoke --out runs/smoke              # the tests' tiny run (seconds)

Beds (rows): the tiny-dlm suites (list_edits, arithmetic, puzzles; test split), chains on tiny-dlm-chains and
chains-hard on tiny-dlm-chains-hard (gen 128), the exact oracles decoded greedily (`oracle-schedules` with its
48 prompts; the others from their one BOS prompt, so one distinct greedy sequence each) and a random-weight
LLaDA-shaped replica (`dlm.replica("llada-8b", layers=2, overrides=...)`, random prompts of random lengths,
left-padded). tiny-dgemma is not a bed: a uniform-noise model refuses `lossless` (every step's input holds
fresh noise and self-conditioning, so later states cannot be drafted).

Per row, for each base (`confidence`, `margin`, `entropy`, `threshold`, `eb`), every prompt is decoded by the
base and by `lossless:base=NAME:depth=K` for each depth (2, 4, 8), at batch 1 and batched (`--batch-size`
rows, left-padded as `dlm bench` pads), with `kv_cache="none"` and with the model's exact cache mode (what
`kv_cache="auto"` resolves to: `prompt` on the tiny models, `none` elsewhere; the replica adds `dual`, the
GPU row's mode, where lossless is exact relative to the base under the same cache). The budget is one step
per token (`steps = gen_length`: `confidence` at one token per step is LLaDA's reference decode); EOS stop
is on (the engine's default) wherever the model has an EOS. Greedy (temperature 0) throughout.

What is counted, per `dlm.generate` call (exact integers, from the call's own tally):
- identity: prompts whose whole sequence equals the base's, and calls whose per-block schedule steps
  (`schedule_steps_per_block`) equal the base's `steps_per_block` (the budget rolls over the same way);
- sequential forwards `nfe` (a batched call counts once); the forward ratio = base nfe / lossless nfe,
  summed over the same calls;
- verification passes V = (branch_forwards - nfe) / (depth - 1): a verification pass is one forward of
  depth rows per row, counted as 1 nfe and depth branch forwards; every other forward is a plain one (P =
  nfe - V: each block's first, and any after a round that could not verify);
- rounds T (driver steps, from the step trace) and base steps S (`schedule_steps_per_block` summed, equal to
  the base's nfe); a round without a verification pass commits exactly one base step, so the acceptance
  rate, base steps per verification pass, is (S - (T - V)) / V (<= depth);
- forward tokens per generated token (`forward_tokens / (rows x gen_length)`): the compute price; with
  branch_forwards (verification rows) beside it.
Wall time (CPU): torch.set_num_threads(--threads, default 1), batch 1, the exact cache mode, on the first
`--time-prompts` prompts of each row, every setting run `--repeats` times interleaved (base, depth 2, 4,
8, base, ...) so a change of machine load hits all alike; the ratio base / lossless per repeat, median and
min-max. This CPU is compute-bound: a verification pass of K rows costs about K forwards here.
Expected GPU gain at batch 1 (a model, not a measurement): the measured P, V and S of a row priced with
the roofline floor of one LLaDA-8B forward (`dlm.replicas.cost.forward_cost`, bf16, max(bytes / bandwidth,
FLOPs / matmul rate), H100 SXM: 3,000 GB/s, 790 TFLOP/s, ALGORITHMS 4.2) of 1 row (base steps, plain
passes) or K rows (verification passes): gain = S c(1) / (P c(1) + V c(K)), for a 32-token block against
256 cached positions (dual cache: memory-bound, c(K) ~ c(1)) and for an uncached 288-token forward
(compute-bound already at one row, c(K) ~ K c(1)). It assumes LLaDA-8B accepts drafts as the row's model
does and leaves out the drafting's own kernels.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from tqdm.auto import tqdm  # noqa: E402

from dlm.bench import lossless_counts  # noqa: E402

BASES = ("confidence", "margin", "entropy", "threshold", "eb")
PARALLEL = ("threshold", "eb")  # bases that commit several tokens per step on their own
DEPTHS = (2, 4, 8)
GPU = {"card": "H100 SXM", "copy_gbps": 3000.0, "matmul_tflops": 790.0, "model": "llada-8b", "dtype": "bfloat16"}
SHAPES = {"cached": {"query_tokens": 32, "cached_positions": 256, "what": "32-token block, 256 cached positions"},
          "uncached": {"query_tokens": 288, "cached_positions": 0, "what": "288 tokens, no cache"}}
REPLICA_OVERRIDES = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=4,
                         vocab_size=300, mask_token_id=299, eos_token_id=298, pad_token_id=298)
TARGET = ("tiny-dlm", "chains-hard")  # the issue's >= 2x at depth 4


# ------------------------------------------------------------------------------------------- counting
def call_counts(out, rows: int, gen_length: int, rounds: int, seconds: float) -> dict:
    """The integers of one `dlm.generate` call: nfe, branch forwards, forward tokens, base steps S (the
    schedule steps the call took), rounds T, its rows and generated positions, and its wall time."""
    steps = out.schedule_steps_per_block or out.steps_per_block
    return {"calls": 1, "rows": rows, "gen_tokens": rows * gen_length, "nfe": int(out.nfe),
            "branch": int(out.branch_forwards), "forward_tokens": int(out.forward_tokens), "steps": int(sum(steps)),
            "rounds": int(rounds), "seconds": seconds}


def add(total: dict, counts: dict) -> dict:
    """`total` + `counts`, key by key (numbers only)."""
    for key, value in counts.items():
        total[key] = total.get(key, 0) + value
    return total


def verification_passes(counts: dict, depth: int) -> int:
    """V: a verification pass adds 1 to nfe and `depth` to branch forwards; a plain pass 1 to each."""
    return lossless_counts.verification_passes(counts["nfe"], counts["branch"], depth)


def derived(base: dict, lossless: dict, depth: int) -> dict:
    """What a lossless run's counts mean against its base's over the same calls (see the module docstring)."""
    v = verification_passes(lossless, depth)
    return {
        "forward_ratio": base["nfe"] / lossless["nfe"],
        "verification_passes": v, "plain_passes": lossless["nfe"] - v,
        "acceptance": lossless_counts.acceptance(lossless["steps"], lossless["rounds"], v),
        "steps_per_forward": lossless["steps"] / lossless["nfe"],
        "branch_per_call": lossless["branch"] / lossless["calls"],
        "forward_tokens_per_token": lossless["forward_tokens"] / lossless["gen_tokens"],
        "base_forward_tokens_per_token": base["forward_tokens"] / base["gen_tokens"],
        "compute_price": lossless["forward_tokens"] / base["forward_tokens"],
    }


def gpu_pass_costs(depths=DEPTHS) -> dict:
    """Roofline floor (ms) of one LLaDA-8B forward of r rows at each shape (`SHAPES`), r in 1 and `depths`."""
    import dlm
    from dlm.replicas.cost import forward_cost

    model = dlm.replica(GPU["model"], device="meta", dtype=torch.bfloat16)
    out = {}
    for name, shape in SHAPES.items():
        out[name] = {}
        for rows in (1, *depths):
            c = forward_cost(model, rows=rows, query_tokens=shape["query_tokens"],
                             cached_positions=shape["cached_positions"], dtype=torch.bfloat16)
            out[name][str(rows)] = {"bytes": c.bytes, "flops": c.flops, "memory_ms": c.floor_ms(GPU["copy_gbps"]),
                                    "compute_ms": c.compute_floor_ms(GPU["matmul_tflops"])}
            out[name][str(rows)]["ms"] = max(out[name][str(rows)]["memory_ms"], out[name][str(rows)]["compute_ms"])
    return out


def expected_gain(base: dict, lossless: dict, depth: int, costs: dict) -> float:
    """S c(1) / (P c(1) + V c(K)): the base's steps and lossless's passes priced at one shape's floors."""
    v = verification_passes(lossless, depth)
    one, many = costs["1"]["ms"], costs[str(depth)]["ms"]
    return base["nfe"] * one / ((lossless["nfe"] - v) * one + v * many)


# ------------------------------------------------------------------------------------------- beds
def _tiny_rows(name: str, model_name: str, suites: tuple, gen: int, limit: int, seed: int) -> list[dict]:
    from dlm.bench.harness import collect_examples, load_model, resolve_suite

    model, tok, ids = load_model(model_name)
    pad = tok.pad_token_id if tok.pad_token_id is not None else ids.get("eos_token_id")
    rows = []
    for suite in suites:
        examples = collect_examples(resolve_suite(suite), limit, seed)
        prompts = [list(tok.encode(ex.input_text, add_special_tokens=False)) for ex in examples]
        rows.append(dict(name=f"{name} {suite}" if len(suites) > 1 else name, bed=name, model=model, gen=gen,
                         block=32, prompts=prompts, pad=pad, eos=ids.get("eos_token_id"),
                         mask=ids.get("mask_token_id"), extra_kv=(), timed=True))
    return rows


def _oracle_rows(limit: int | None, seed: int, names=None) -> list[dict]:
    from dlm.tasks.oracle_tasks import ORACLE_SUITES

    rows = []
    for name, suite in ORACLE_SUITES.items():
        if names is not None and name not in names:
            continue
        oracle = suite.build(seed=seed) if getattr(suite, "seeded", False) else suite.build()
        distinct = getattr(suite, "seeded", False)  # the others' prompts are all one BOS sequence
        n = (suite.num_samples if limit is None else min(limit, suite.num_samples)) if distinct else 1
        prompts = suite.prompts(oracle, n).tolist()
        rows.append(dict(name=name, bed="oracles", model=oracle, gen=oracle.gen_length, block=oracle.gen_length,
                         prompts=prompts, pad=None, eos=None, mask=oracle.config.mask_token_id, extra_kv=(),
                         timed=False, batched=distinct))
    return rows


def _replica_row(n: int, gen: int, seed: int) -> dict:
    import dlm

    model = dlm.replica("llada-8b", layers=2, device="cpu", dtype=torch.float32, seed=seed,
                        overrides=REPLICA_OVERRIDES)
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(4, 13, (n,), generator=g).tolist()
    prompts = [torch.randint(0, 290, (k,), generator=g).tolist() for k in lengths]
    return dict(name="llada-replica", bed="llada-replica", model=model, gen=gen, block=32 if gen % 32 == 0 else gen,
                prompts=prompts, pad=REPLICA_OVERRIDES["pad_token_id"], eos=REPLICA_OVERRIDES["eos_token_id"],
                mask=REPLICA_OVERRIDES["mask_token_id"], extra_kv=("dual",), timed=True)


BEDS = ("tiny-dlm", "chains", "chains-hard", "oracles", "llada-replica")


def build_rows(beds, limit: int, seed: int, smoke: bool) -> list[dict]:
    rows = []
    for bed in beds:
        if bed == "tiny-dlm":
            suites = ("arithmetic",) if smoke else ("list_edits", "arithmetic", "puzzles")
            rows += _tiny_rows("tiny-dlm", "tiny-dlm", suites, 64, limit, seed)
        elif bed == "chains":
            rows += _tiny_rows("chains", "tiny-dlm-chains", ("chains",), 128, limit, seed)
        elif bed == "chains-hard":
            rows += _tiny_rows("chains-hard", "tiny-dlm-chains-hard", ("chains-hard",), 128, limit, seed)
        elif bed == "oracles":
            rows += _oracle_rows(2 if smoke else None, seed, ("oracle-schedules", "oracle-permutation") if smoke else None)
        elif bed == "llada-replica":
            rows.append(_replica_row(2 if smoke else 16, 32 if smoke else 64, seed))
        else:
            raise ValueError(f"unknown bed {bed!r}; valid: {', '.join(BEDS)}")
    return rows


def exact_cache_mode(row: dict) -> str:
    """What `kv_cache="auto"` resolves to on the row's model (the fastest exact mode)."""
    from dlm.adapters import DLMAdapter
    from dlm.engine.masked.forward import resolve_kv_cache

    return resolve_kv_cache("auto", DLMAdapter.wrap(row["model"], mask_token_id=row["mask"], eos_token_id=row["eos"]))


def batches_of(row: dict, size: int) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    """`(input_ids [B, P], attention_mask [B, P] or None)` batches of at most `size` prompts, left-padded."""
    out = []
    for i in range(0, len(row["prompts"]), size):
        chunk = row["prompts"][i:i + size]
        width = max(map(len, chunk))
        if all(len(p) == width for p in chunk):
            out.append((torch.tensor(chunk), None))
            continue
        ids = torch.tensor([[row["pad"]] * (width - len(p)) + p for p in chunk])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk])
        out.append((ids, mask))
    return out


# ------------------------------------------------------------------------------------------- running
def run_call(row: dict, ids, mask, kv: str, base: str, depth: int | None):
    """One `dlm.generate` call: the base (`depth` None) or lossless over it. Returns `(sequences, counts)`."""
    import dlm

    rounds = lossless_counts.RoundCounter()
    kw = dict(gen_length=row["gen"], block_length=row["block"], steps=row["gen"], kv_cache=kv, attention_mask=mask,
              mask_token_id=row["mask"], callback=rounds, temperature=0.0)
    if row["eos"] is not None:
        kw["eos_token_id"] = row["eos"]
    if depth is None:
        sampler, config = base, None
    else:
        sampler, config = "lossless", {"base": base, "depth": depth}
    started = time.perf_counter()
    out = dlm.generate(row["model"], ids, sampler=sampler, sampler_config=config, **kw)
    seconds = time.perf_counter() - started
    return out, call_counts(out, ids.shape[0], row["gen"], rounds.rounds, seconds)


def measure_setting(row: dict, base: str, kv: str, batch: int, depths=DEPTHS, bar=None,
                    time_prompts: int = 0, repeats: int = 1) -> dict:
    """Every prompt of `row` by `base` and by lossless at each depth, `batch` prompts per call. With
    `time_prompts` > 0 (batch 1), the first `time_prompts` prompts run `repeats` times, interleaved, and
    their wall time per repeat is kept (`timing`). Returns counts, identity and timing."""
    settings = [None, *depths]
    result = {"prompts": 0, "base": {}, "depths": {str(d): {"counts": {}, "identical": 0, "same_budget": 0}
                                                   for d in depths}}
    timing = {str(s): [0.0] * repeats for s in settings}
    for index, (ids, mask) in enumerate(batches_of(row, batch)):
        timed = batch == 1 and index < time_prompts
        outs = {}
        for rep in range(repeats if timed else 1):
            for s in settings:
                out, counts = run_call(row, ids, mask, kv, base, s)
                if rep == 0:
                    outs[s] = (out, counts)
                elif not torch.equal(out.sequences, outs[s][0].sequences):
                    result["repeat_mismatch"] = result.get("repeat_mismatch", 0) + 1  # nondeterminism: reported
                if timed:
                    timing[str(s)][rep] += counts["seconds"]
                if bar is not None and rep == 0:
                    bar.update(ids.shape[0])
        ref, ref_counts = outs[None]
        result["prompts"] += ids.shape[0]
        add(result["base"], ref_counts)
        for d in depths:
            out, counts = outs[d]
            entry = result["depths"][str(d)]
            add(entry["counts"], counts)
            entry["identical"] += int((out.sequences == ref.sequences).all(dim=1).sum())
            entry["same_budget"] += int(out.schedule_steps_per_block == ref.steps_per_block)
    if time_prompts:
        result["timing"] = {"prompts": min(time_prompts, result["prompts"]), "repeats": repeats, "seconds": timing}
    return result


def run_rows(rows: list[dict], bases, depths, batch: int, time_prompts: int, repeats: int, progress: bool,
             save=None) -> dict:
    """Every (row, base, cache mode, batch size) setting (`measure_setting`); `save(partial)` after each."""
    plan = []
    for row in rows:
        exact = exact_cache_mode(row)
        kvs = list(dict.fromkeys(["none", exact, *row["extra_kv"]]))
        batches = [1] + ([batch] if row.get("batched", True) and batch > 1 else [])
        row["kv"], row["exact"], row["batches"] = kvs, exact, batches
        plan += [(row, base, kv, b) for base in bases for kv in kvs for b in batches]
    units = sum(len(row["prompts"]) * (1 + len(depths)) for row, *_ in plan)
    bar = tqdm(total=units, desc="lossless", unit="decode", disable=not progress, file=sys.stderr)
    out, warm = {}, set()
    for row, base, kv, b in plan:
        bar.set_postfix_str(f"{row['name']} {base} kv={kv} batch={b}")
        if row["name"] not in warm:  # one untimed call first: the process's and the model's first-call costs
            warm.add(row["name"])
            run_call(row, *batches_of(row, 1)[0], row["exact"], base, depths[0])
        timed = time_prompts if (row["timed"] and b == 1 and kv == row["exact"]) else 0
        entry = out.setdefault(row["name"], {"bed": row["bed"], "gen": row["gen"], "block": row["block"],
                                             "steps": row["gen"], "prompts": len(row["prompts"]), "kv": row["kv"],
                                             "exact_kv": row["exact"], "batches": row["batches"], "runs": {}})
        runs = entry["runs"].setdefault(base, {}).setdefault(kv, {})
        runs[str(b)] = measure_setting(row, base, kv, b, depths, bar, timed, repeats if timed else 1)
        if save is not None:
            save(out)
    bar.close()
    return out


# ------------------------------------------------------------------------------------------- summary
def _spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def summarize(data: dict) -> dict:
    """Per row and base: identity over every run, and at batch 1 / batched in the exact cache mode the
    derived numbers per depth (forward ratio, acceptance, price, CPU time ratio, expected GPU gain)."""
    costs = data["gpu_costs"]
    table = {}
    for name, row in data["rows"].items():
        table[name] = {}
        for base, by_kv in row["runs"].items():
            prompts = identical = budget = calls = 0
            for by_batch in by_kv.values():
                for res in by_batch.values():
                    for entry in res["depths"].values():
                        prompts += res["prompts"]
                        identical += entry["identical"]
                        budget += entry["same_budget"]
                        calls += entry["counts"]["calls"]
            cell = {"identical": identical, "prompt_runs": prompts, "same_budget": budget, "calls": calls, "depths": {}}
            exact = by_kv.get(row["exact_kv"], {})
            for depth in exact.get("1", {}).get("depths", {}):
                d = int(depth)
                one = exact["1"]
                info = derived(one["base"], one["depths"][depth]["counts"], d)
                info["base_nfe_per_prompt"] = one["base"]["nfe"] / one["prompts"]
                info["nfe_per_prompt"] = one["depths"][depth]["counts"]["nfe"] / one["prompts"]
                info["branch_per_prompt"] = one["depths"][depth]["counts"]["branch"] / one["prompts"]
                info["gpu_gain"] = {shape: expected_gain(one["base"], one["depths"][depth]["counts"], d, costs[shape])
                                    for shape in costs}
                batched = [k for k in exact if k != "1"]
                if batched:
                    many = exact[batched[0]]
                    info["batched"] = derived(many["base"], many["depths"][depth]["counts"], d)
                    info["batched"]["batch"] = int(batched[0])
                timing = one.get("timing")
                if timing:
                    secs = timing["seconds"]
                    ratios = [b / s for b, s in zip(secs["None"], secs[depth])]
                    info["cpu_time_ratio"] = _spread(ratios)
                    info["cpu_seconds_per_prompt"] = statistics.median(secs[depth]) / timing["prompts"]
                    info["cpu_base_seconds_per_prompt"] = statistics.median(secs["None"]) / timing["prompts"]
                    info["timed_prompts"], info["repeats"] = timing["prompts"], timing["repeats"]
                cell["depths"][depth] = info
            table[name][base] = cell
    return table


def _fmt(x, digits=2, suffix="") -> str:
    return "-" if x is None else f"{x:.{digits}f}{suffix}"


def _depth_cells(cell: dict, key, digits=2, suffix="") -> str:
    return " / ".join(_fmt(key(info), digits, suffix) for info in cell["depths"].values())


def _forward_rows(table: dict, bases: list[str]) -> list[str]:
    """The forward table's lines for `bases`, grouped by base."""
    lines = ["| row | base | base F/prompt | lossless F/prompt | ratio | acceptance | ratio batched (rows) |",
             "|---|---|---|---|---|---|---|"]
    for base in bases:
        for name, cells in table.items():
            cell = cells.get(base)
            if not cell or not cell["depths"]:
                continue
            first = next(iter(cell["depths"].values()))
            batch = first.get("batched", {}).get("batch")
            lines.append(f"| {name} | {base} | {first['base_nfe_per_prompt']:.1f} | "
                         f"{_depth_cells(cell, lambda i: i['nfe_per_prompt'], 1)} | "
                         f"{_depth_cells(cell, lambda i: i['forward_ratio'], 2, 'x')} | "
                         f"{_depth_cells(cell, lambda i: i['acceptance'])} | "
                         + ("-" if batch is None else
                            f"{_depth_cells(cell, lambda i: i['batched']['forward_ratio'], 2, 'x')} ({batch})")
                         + " |")
    return lines


def targets(table: dict) -> list[str]:
    """The issue's target: >= 2x fewer sequential forwards at depth 4 on tiny-dlm and chains-hard
    (`confidence`, one token per step), read at batch 1 and batched."""
    lines = []
    for name, cells in table.items():
        if not any(name == t or name.startswith(t + " ") for t in TARGET) or "confidence" not in cells:
            continue
        info = cells["confidence"]["depths"].get("4")
        if info is None:
            continue
        one = info["forward_ratio"]
        many = info.get("batched", {}).get("forward_ratio")
        lines.append(f"| {name} | {one:.2f}x ({'met' if one >= 2 else '**not met**'}) | "
                     + ("-" if many is None else f"{many:.2f}x ({'met' if many >= 2 else '**not met**'})")
                     + f" | {info['acceptance']:.2f} |")
    if lines:
        lines = ["| row | batch 1: base / lossless forwards | batched | acceptance (batch 1) |", "|---|---|---|---|"] + lines
    return lines


def markdown(data: dict, table: dict) -> str:
    meta = data["meta"]
    depths = "/".join(str(d) for d in meta["depths"])
    out = ["Token identity (every prompt, every depth, batch 1 and batched, `kv_cache=\"none\"` and the exact "
           "mode; cell: prompts identical to the base / prompts decoded):", "",
           "| row | prompts | kv modes | " + " | ".join(meta["bases"]) + " |", "|---|---|---|" + "---|" * len(meta["bases"])]
    for name, cells in table.items():
        row = data["rows"][name]
        kv = ", ".join(k + (" (exact)" if k == row["exact_kv"] else "") for k in row["kv"])
        parts = []
        for base in meta["bases"]:
            c = cells.get(base)
            parts.append("-" if c is None else f"{c['identical']}/{c['prompt_runs']}"
                         + ("" if c["same_budget"] == c["calls"] else f" (budget differs in {c['calls'] - c['same_budget']} calls)"))
        out.append(f"| {name} | {row['prompts']} | {kv} | " + " | ".join(parts) + " |")
    one_per_step = [b for b in meta["bases"] if b not in PARALLEL]
    parallel = [b for b in meta["bases"] if b in PARALLEL]
    out += ["", f"Sequential forwards at batch 1, exact cache mode, one token per step (depth {depths}): base "
            "forwards per prompt, lossless forwards per prompt, the ratio, the acceptance (base steps per "
            "verification pass), and the ratio batched:", ""] + _forward_rows(table, one_per_step)
    if parallel:
        out += ["", f"Lossless on top of an already parallel decode (the same columns; `threshold` at tau 0.9 and "
                f"`eb` at gamma 0.1 commit several tokens per step on their own):", ""] + _forward_rows(table, parallel)
    out += ["", f"The price at batch 1, exact cache mode (depth {depths}): verification rows (branch forwards) per "
            "prompt, forward tokens per generated token (base, then lossless), CPU wall time ratio base / lossless "
            f"(median, min-max over {meta['repeats']} repeats, one thread), and the expected GPU gain at batch 1 "
            "from the cost model (LLaDA-8B, H100; cached block / uncached):", "",
            "| row | base | branchF/prompt | fwd tokens/token | CPU time ratio | expected GPU gain cached | uncached |",
            "|---|---|---|---|---|---|---|"]
    for name, cells in table.items():
        for base, cell in cells.items():
            if not cell["depths"]:
                continue
            first = next(iter(cell["depths"].values()))
            cpu = "-"
            if "cpu_time_ratio" in first:
                cpu = " / ".join(f"{i['cpu_time_ratio']['median']:.2f}x ({i['cpu_time_ratio']['min']:.2f}-"
                                 f"{i['cpu_time_ratio']['max']:.2f})" for i in cell["depths"].values())
            out.append(f"| {name} | {base} | {_depth_cells(cell, lambda i: i['branch_per_prompt'], 1)} | "
                       f"{first['base_forward_tokens_per_token']:.1f} -> "
                       f"{_depth_cells(cell, lambda i: i['forward_tokens_per_token'], 1)} | {cpu} | "
                       f"{_depth_cells(cell, lambda i: i['gpu_gain']['cached'], 2, 'x')} | "
                       f"{_depth_cells(cell, lambda i: i['gpu_gain']['uncached'], 2, 'x')} |")
    costs = data["gpu_costs"]
    out += ["", f"The cost model's floors (one LLaDA-8B forward, bf16, {GPU['card']}: {GPU['copy_gbps']:.0f} GB/s, "
            f"{GPU['matmul_tflops']:.0f} TFLOP/s; ms = max(memory, compute)):", "",
            "| shape | " + " | ".join(f"{r} row{'s' if r != '1' else ''}" for r in costs["cached"]) + " |",
            "|---|" + "---|" * len(costs["cached"])]
    for shape, by_rows in costs.items():
        out.append(f"| {SHAPES[shape]['what']} | " + " | ".join(
            f"{c['ms']:.2f} ms ({'memory' if c['memory_ms'] >= c['compute_ms'] else 'compute'})" for c in by_rows.values()) + " |")
    lines = targets(table)
    if lines:
        out += ["", "Target: >= 2x fewer sequential forwards at depth 4 (`confidence`, one token per step):", ""] + lines
    merged = "".join(f"; merged with `{c}`" for c in meta.get("merged", []))
    out += ["", f"Prompts per task: {meta['limit']}; threads: {meta['threads']}; seconds: {meta.get('seconds', 0):.0f}"
            f"{' (partial run)' if data.get('partial') else ''}; command: `{meta['command']}`{merged}."]
    return "\n".join(out)


def plot(data: dict, table: dict, path: Path) -> Path:
    """Left: sequential-forward ratio per row and base at each depth (batch 1). Right, at depth 4: the
    forward ratio, the CPU time ratio and the expected GPU gain (cached block) per row for each base."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bases = data["meta"]["bases"]
    rows = [r for r in table if any(table[r].get(b, {}).get("depths") for b in bases)]
    colors = plt.get_cmap("tab10").colors
    fig, (left, right) = plt.subplots(1, 2, figsize=(max(11, 1.1 * len(rows) + 6), 5))
    width = 0.8 / max(len(bases), 1)
    markers = {d: m for d, m in zip(data["meta"]["depths"], "o^sDv")}
    for j, base in enumerate(bases):
        for i, row in enumerate(rows):
            cell = table[row].get(base)
            if not cell or not cell["depths"]:
                continue
            x = i + (j - (len(bases) - 1) / 2) * width
            for depth, info in cell["depths"].items():
                left.plot([x], [info["forward_ratio"]], markers[int(depth)], color=colors[j % 10], ms=5)
            four = cell["depths"].get("4") or next(iter(cell["depths"].values()))
            right.bar([x], [four["forward_ratio"]], width * 0.9, color=colors[j % 10], alpha=0.35)
            if "cpu_time_ratio" in four:
                t = four["cpu_time_ratio"]
                right.errorbar([x], [t["median"]], yerr=[[t["median"] - t["min"]], [t["max"] - t["median"]]], fmt="x",
                               color=colors[j % 10], capsize=2)
            right.plot([x], [four["gpu_gain"]["cached"]], "*", color=colors[j % 10], ms=8)
    for j, base in enumerate(bases):
        left.plot([], [], "s", color=colors[j % 10], label=base)
    for depth, m in markers.items():
        left.plot([], [], m, color="0.3", label=f"depth {depth}")
    right.plot([], [], "s", color="0.6", alpha=0.5, label="sequential forwards (bar)")
    right.plot([], [], "x", color="0.3", label="CPU wall time (1 thread)")
    right.plot([], [], "*", color="0.3", label="expected GPU time (LLaDA-8B, cached)")
    for ax, title in ((left, "base forwards / lossless forwards (batch 1)"),
                      (right, "depth 4: base / lossless (> 1: lossless is cheaper)")):
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xticks(range(len(rows)))
        ax.set_xticklabels(rows, rotation=30, ha="right", fontsize=8)
        ax.set_title(title, fontsize=10)
        ax.set_yscale("log", base=2)
    left.axhline(2.0, color="k", lw=0.6, ls=":")
    left.legend(fontsize=7, ncol=2)
    right.legend(fontsize=7)
    fig.suptitle("Lossless draft-and-verify: the same tokens as the base, fewer sequential forwards", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


def write(out: Path, data: dict) -> str:
    table = summarize(data)
    text = markdown(data, table)
    (out / "lossless.json").write_text(json.dumps(data, indent=1))
    (out / "lossless.md").write_text(text + "\n")
    plot(data, table, out / "lossless.png")
    return text


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="runs/bench-lossless")
    ap.add_argument("--beds", default=None, help=f"comma-separated, of {', '.join(BEDS)} (default: all; with "
                    "--smoke: tiny-dlm, oracles, llada-replica)")
    ap.add_argument("--bases", default=",".join(BASES))
    ap.add_argument("--depths", default=",".join(map(str, DEPTHS)))
    ap.add_argument("--limit", type=int, default=8, help="test prompts per task (tiny-dlm suites, chains)")
    ap.add_argument("--batch-size", type=int, default=16, help="rows per batched call")
    ap.add_argument("--time-prompts", type=int, default=8, help="prompts per row whose wall time is measured")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per setting, interleaved")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--smoke", action="store_true", help="tiny sizes (the tests): one prompt per task, two bases")
    ap.add_argument("--report", metavar="DIR", help="rewrite the tables and plot from DIR/lossless.json")
    ap.add_argument("--merge", metavar="DIR", action="append", default=[],
                    help="with --report: first add the rows of DIR/lossless.json (a run split into processes over "
                         "disjoint --beds, same bases, depths and sizes); its rows replace DIR's rows of the same name")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)
    if args.merge and not args.report:
        print("error: --merge needs --report", file=sys.stderr)
        return 2
    if args.report:
        out = Path(args.report)
        data = json.loads((out / "lossless.json").read_text())
        for other in args.merge:
            extra = json.loads((Path(other) / "lossless.json").read_text())
            same = ("bases", "depths", "limit", "batch_size", "time_prompts", "repeats", "threads")
            if any(extra["meta"][k] != data["meta"][k] for k in same):
                print(f"error: {other} ran with other settings ({', '.join(same)} must match)", file=sys.stderr)
                return 2
            data["rows"].update(extra["rows"])
            data["meta"]["seconds"] = data["meta"].get("seconds", 0) + extra["meta"].get("seconds", 0)
            data["meta"].setdefault("merged", []).append(extra["meta"]["command"])
            data["partial"] = bool(data.get("partial") or extra.get("partial"))
        print(write(out, data))
        return 0
    try:
        depths = [int(d) for d in args.depths.split(",") if d.strip()]
    except ValueError:
        depths = []
    if args.beds is None:
        args.beds = "tiny-dlm,oracles,llada-replica" if args.smoke else ",".join(BEDS)
    beds = [b.strip() for b in args.beds.split(",") if b.strip()]
    bases = [b.strip() for b in args.bases.split(",") if b.strip()]
    problems = [f"unknown bed {b!r} (valid: {', '.join(BEDS)})" for b in beds if b not in BEDS]
    problems += [f"unknown base {b!r} (measured: {', '.join(BASES)})" for b in bases if b not in BASES]
    if not depths or any(d < 2 for d in depths):
        problems.append(f"--depths must be integers >= 2, got {args.depths!r}")
    if min(args.limit, args.batch_size, args.repeats, args.threads) < 1 or args.time_prompts < 0:
        problems.append("--limit, --batch-size, --repeats and --threads must be >= 1, --time-prompts >= 0")
    if problems:
        print("error: " + "; ".join(problems), file=sys.stderr)
        return 2
    if args.smoke:
        bases = [b for b in bases if b in ("confidence", "threshold")] or bases[:1]
        depths = depths[:2]
        args.limit, args.batch_size, args.time_prompts, args.repeats = 1, 2, 1, 2
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    rows = build_rows(beds, args.limit, args.seed, args.smoke)
    data = {"meta": {"bases": bases, "depths": depths, "limit": args.limit, "batch_size": args.batch_size,
                     "time_prompts": args.time_prompts, "repeats": args.repeats, "threads": torch.get_num_threads(),
                     "smoke": args.smoke, "torch": torch.__version__, "python": platform.python_version(),
                     "machine": platform.processor() or platform.machine(), "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
                     "command": "python scripts/bench_lossless.py " + " ".join(sys.argv[1:] if argv is None else argv),
                     "gpu_assumption": GPU, "shapes": SHAPES},
            "gpu_costs": gpu_pass_costs(depths), "rows": {}}

    def save(partial: dict) -> None:  # an interrupted run keeps every finished setting (--report reads it)
        (out / "lossless.json").write_text(json.dumps({**data, "rows": partial, "partial": True}, indent=1))
    data["rows"] = run_rows(rows, bases, depths, args.batch_size, args.time_prompts, args.repeats, not args.quiet, save)
    data["meta"]["seconds"] = time.perf_counter() - started
    text = write(out, data)
    print(text)
    print(f"\nwrote {out / 'lossless.json'}, {out / 'lossless.md'}, {out / 'lossless.png'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
