"""Report section `engine_lossless` (issue 50): `sampler="lossless"` (base `confidence`, depth 4) beside
`confidence` on the LLaDA-8B replica at batch 1, one token per step (LLaDA's reference decode: 128 tokens in
128 steps, blocks of 32), dual cache (a verification pass is then 4 rows of a 32-token block against the
cache: memory-bound, about one forward's weight reads), no early stop.

Per sampler: forward passes (nfe), wall time (median and range of `reps` runs after a warm-up), tokens/s; for
lossless also its branch forwards, verification passes V = (branch - nfe) / (depth - 1), and its acceptance
(base steps per verification pass, from the warm-up call's step trace). Beside them: the nfe and time ratios,
whether the tokens are identical (on a GPU the verification pass runs 4 rows where the base ran 1: kernels
whose rounding depends on the batch shape can flip a near-tie, docs/dlm.md; random weights give many
near-ties), and the gain the replicas' cost model expects from the measured passes (`dlm.replicas.cost`, at
the machine section's copy bandwidth and matmul rate). Random weights: the acceptance is the replica's, not
a trained LLaDA's (scripts/bench_lossless.py measures trained models on CPU).
"""
from __future__ import annotations

import torch

from dlm.bench.gpu import ReportContext, time_call
from dlm.bench.gpu.engine import random_prompt, sizes, target
from dlm.bench.gpu.replica_forward import _build, _release
from dlm.bench.lossless_counts import RoundCounter, acceptance, verification_passes

MIN_START_S = 25.0  # build (16 GB: a few s) + 2 x (a warm-up and 2 timed generates of about 1 s) with margin
DEPTH = 4
GEN = {"full": 128, "smoke": 16}


def budget(ctx: ReportContext, s: dict) -> dict:
    gen = GEN["smoke" if ctx.smoke else "full"]
    return dict(gen_length=gen, block_length=s["block"], steps=gen, kv_cache="dual", eos_early_stop=False)


def run(ctx: ReportContext) -> dict:
    import dlm

    s = sizes(ctx)
    model, note = _build(ctx, "llada-8b")
    info = model.replica_info
    kw = budget(ctx, s)
    ids = random_prompt(ctx, 1, s["prompt"], model.config.mask_token_id)
    out = {"model": "llada-8b", "layers": info.layers, "full_layers": info.full_layers, "budget": dict(kw),
           "prompt": s["prompt"], "depth": DEPTH, "rows": {}, "notes": [] if note is None else [note]}
    samplers = {"confidence": dict(sampler="confidence"),
                "lossless": dict(sampler="lossless", sampler_config={"base": "confidence", "depth": DEPTH})}
    outputs = {}
    for name, choice in samplers.items():
        rounds = RoundCounter()
        dlm.generate(model, ids, callback=rounds, **choice, **kw)  # warm-up, counting its rounds
        t = time_call(ctx, lambda: dlm.generate(model, ids, **choice, **kw), reps=s["reps"], warmup=0, keep_output=True)
        result = t.pop("out")
        outputs[name] = result.sequences
        out["rows"][name] = {"nfe": result.nfe, "branch_forwards": result.branch_forwards,
                             "steps": sum(result.schedule_steps_per_block), "rounds": rounds.rounds, **t,
                             "tokens_per_s": kw["gen_length"] / (t["ms"] * 1e-3)}
        ctx.log(f"engine_lossless: {name}: nfe {result.nfe}, {t['ms']:.0f} ms")
        ctx.save(out)
    out.update(compare(out["rows"], outputs["confidence"], outputs["lossless"], ids.shape[1]))
    out["expected_gain"] = expected_gain(ctx, model, out["rows"], kw, s["prompt"])
    del model
    _release(ctx, collect=True)
    out["targets"] = targets(out)
    return out


def compare(rows: dict, base_sequences: torch.Tensor, sequences: torch.Tensor, prompt: int) -> dict:
    """Ratios, lossless's verification passes and acceptance, and the identity of the two outputs."""
    base, mine = rows["confidence"], rows["lossless"]
    passes = verification_passes(mine["nfe"], mine["branch_forwards"], DEPTH)
    mine.update(verification_passes=passes, plain_passes=mine["nfe"] - passes,
                acceptance=acceptance(mine["steps"], mine["rounds"], passes))
    differs = (base_sequences[0, prompt:] != sequences[0, prompt:]).nonzero()
    return {"nfe_ratio": base["nfe"] / mine["nfe"], "time_ratio": base["ms"] / mine["ms"],
            "identical_tokens": differs.numel() == 0,
            "first_differing_position": None if differs.numel() == 0 else int(differs[0, 0])}


def expected_gain(ctx: ReportContext, model, rows: dict, kw: dict, prompt: int) -> dict:
    """The cost model's time ratio for the measured passes: a base step and a plain pass cost one 1-row
    forward of the block against the dual cache, a verification pass one `DEPTH`-row forward."""
    from dlm.bench.gpu.replica_forward import measure_copy_gbps, measure_matmul_tflops
    from dlm.replicas.cost import forward_cost

    copy = ctx.facts.get("copy_gbps") or measure_copy_gbps(ctx)
    matmul = ctx.facts.get("matmul_tflops") or measure_matmul_tflops(ctx)
    block, cached = kw["block_length"], prompt + kw["gen_length"] - kw["block_length"]

    def floor_ms(r: int) -> float:
        c = forward_cost(model, rows=r, query_tokens=block, cached_positions=cached)
        return max(c.floor_ms(copy), c.compute_floor_ms(matmul))

    one, many = floor_ms(1), floor_ms(DEPTH)
    mine = rows["lossless"]
    gain = rows["confidence"]["nfe"] * one / (mine["plain_passes"] * one + mine["verification_passes"] * many)
    return {"one_row_ms": one, "depth_rows_ms": many, "gain": gain, "copy_gbps": copy, "matmul_tflops": matmul}


def targets(out: dict) -> dict:
    ratio = out.get("time_ratio")
    return {"lossless_time_ratio": target(
                "LLaDA-8B batch 1: lossless:base=confidence (depth 4) time ratio vs confidence (no bar: the answer)",
                ratio, None, None if ratio is None else f"nfe ratio {out['nfe_ratio']:.2f}, cost model "
                                                        f"{out['expected_gain']['gain']:.2f}"),
            "lossless_identical": target(
                "LLaDA-8B batch 1: lossless gives confidence's tokens (batched verification rows round as one row)",
                out.get("identical_tokens"), out.get("identical_tokens"),
                None if out.get("identical_tokens", True) else
                f"first differing position {out['first_differing_position']}")}


def markdown(result: dict) -> str:
    b = result["budget"]
    lines = [f"LLaDA-8B replica ({result['layers']}/{result['full_layers']} layers), batch 1, prompt {result['prompt']}, "
             f"{b['gen_length']} tokens in {b['steps']} steps (one per step), blocks of {b['block_length']}, "
             f"{b['kv_cache']} cache, depth {result['depth']}:", "",
             "| sampler | NFE | branch forwards | acceptance | ms [range of runs] | tokens/s |", "|---|---|---|---|---|---|"]
    for name, r in result["rows"].items():
        acc = r.get("acceptance")
        lines.append(f"| {name} | {r['nfe']} | {r['branch_forwards']} | {'-' if acc is None else f'{acc:.2f}'} | "
                     f"{r['ms']:.0f} [{r['min_ms']:.0f}-{r['max_ms']:.0f}] | {r['tokens_per_s']:.0f} |")
    if "nfe_ratio" in result:
        g = result["expected_gain"]
        lines += ["", f"NFE ratio {result['nfe_ratio']:.2f}, time ratio {result['time_ratio']:.2f}, cost model "
                  f"{g['gain']:.2f} (one row {g['one_row_ms']:.2f} ms, {result['depth']} rows {g['depth_rows_ms']:.2f} ms); "
                  f"identical tokens: {result['identical_tokens']}"
                  + ("" if result["identical_tokens"] else f" (first differing position {result['first_differing_position']})")]
    lines += [f"- {note}" for note in result.get("notes", [])]
    return "\n".join(lines)
