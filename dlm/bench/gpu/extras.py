"""Report section `extras`, run last: the rows whose code is the riskiest on a first GPU run (compilation,
CUDA-graph capture) or the most expensive, each a part of its own (start minimum, error guard, saved when
done), in this order:

- `compile`: the LLaDA-8B batch-1 fixed-budget row with `compile=True` (the sampler step through
  `torch.compile`, CUDA graphs on the GPU), beside `engine_masked`'s eager row;
- `llada_floor_graph`: the LLaDA-8B batch-1 block step with the prefix cache (`replica_forward`'s floor row)
  replayed from a CUDA graph, beside its eager time and host enqueue time: with the graph's time near the
  floor and the eager time not, the floor miss is the host's dispatch;
- `ar_compiled`: transformers' autoregressive `generate` at batch 1 with its automatic compilation on
  (static cache: the forward compiled with CUDA graphs), beside `autoregressive`'s eager row;
- `dgemma_floor_graph`: the same CUDA-graph replay for DiffusionGemma's batch-1 canvas step;
- `llada2_vs_diffusers`: `dlm.generate` beside diffusers' `LLaDA2Pipeline` on the LLaDA2.0-mini replica
  (builds 32.5 GB, runs 10 generates).
"""
from __future__ import annotations

from dlm.bench.gpu import ReportContext, enqueue_ms, graphed_ms, run_part, time_call
from dlm.bench.gpu.autoregressive import FULL as AR_FULL
from dlm.bench.gpu.autoregressive import SMOKE as AR_SMOKE
from dlm.bench.gpu.autoregressive import ar_row
from dlm.bench.gpu.engine import (llada2_vs_diffusers, masked_budget, masked_markdown_rows, masked_row, part_line,
                                  random_prompt, sizes)
from dlm.bench.gpu.replica_forward import BLOCK, PROMPT, _build, _dgemma_calls, _masked_calls, _release
from dlm.bench.gpu.replica_forward import SMOKE as FORWARD_SMOKE

MIN_START_S = 30.0
MINIMUMS = {"compile": 60.0, "llada_floor_graph": 15.0, "ar_compiled": 120.0, "dgemma_floor_graph": 30.0,
            "llada2_vs_diffusers": 90.0}
GRAPH_REPS = 20


def floor_graph(ctx: ReportContext, call) -> dict:
    """One forward's eager time, host enqueue time and CUDA-graph replay time (GPU only)."""
    if ctx.device.type != "cuda":
        return {"skipped": "CUDA graphs need a GPU"}
    eager = time_call(ctx, call, reps=GRAPH_REPS, warmup=2)
    out = {"eager_ms": eager["ms"], "enqueue_ms": enqueue_ms(ctx, call, GRAPH_REPS)}
    out["graphed_ms"] = graphed_ms(ctx, call, GRAPH_REPS)
    ctx.log(f"extras: eager {out['eager_ms']:.2f} ms, enqueue {out['enqueue_ms']:.2f} ms, "
            f"graph replay {out['graphed_ms']:.2f} ms")
    return out


def run(ctx: ReportContext) -> dict:
    s = sizes(ctx)
    out: dict = {}
    llada_parts = ("compile", "llada_floor_graph", "ar_compiled")
    if any(ctx.may_start(MINIMUMS[name]) for name in llada_parts):
        model, note = _build(ctx, "llada-8b")
        out["llada_note"] = note
        ids = random_prompt(ctx, 1, s["prompt"], model.config.mask_token_id)
        run_part(ctx, "compile", MINIMUMS["compile"],
                 lambda: masked_row(ctx, model, ids, masked_budget(s), s["reps"], compile_step=True), out)
        prompt, block = (FORWARD_SMOKE["prompt"], FORWARD_SMOKE["block"]) if ctx.smoke else (PROMPT, BLOCK)
        run_part(ctx, "llada_floor_graph", MINIMUMS["llada_floor_graph"],
                 lambda: floor_graph(ctx, _masked_calls(model, 1, prompt, block, ctx.device)["prefix"][0]), out)
        a = AR_SMOKE if ctx.smoke else AR_FULL
        run_part(ctx, "ar_compiled", MINIMUMS["ar_compiled"],
                 lambda: ar_row(ctx, model.lm, random_prompt(ctx, 1, a["prompt"], model.config.mask_token_id), a,
                                int(model.config.eos_token_id), compile_forward=True), out)
        del model
        _release(ctx, collect=True)
    else:
        for name in llada_parts:
            run_part(ctx, name, MINIMUMS[name], dict, out)

    def dgemma() -> dict:
        model, note = _build(ctx, "diffusiongemma-26b-a4b")
        try:
            prompt = FORWARD_SMOKE["prompt"] if ctx.smoke else PROMPT
            result = floor_graph(ctx, _dgemma_calls(model, 1, prompt, ctx.device)["decoder"][0])
            return result if note is None else {**result, "note": note}
        finally:
            del model
            _release(ctx, collect=True)
    run_part(ctx, "dgemma_floor_graph", MINIMUMS["dgemma_floor_graph"], dgemma, out)
    run_part(ctx, "llada2_vs_diffusers", MINIMUMS["llada2_vs_diffusers"], lambda: llada2_vs_diffusers(ctx), out)
    return out


def markdown(result: dict) -> str:
    lines = []
    c = result.get("compile", {})
    if "batch" in c:
        lines += ["LLaDA-8B replica, batch 1, fixed budget, `compile=True`:", ""] + masked_markdown_rows([c]) + [""]
    graphs = [(n, result.get(n, {})) for n in ("llada_floor_graph", "dgemma_floor_graph")]
    if any("graphed_ms" in g for _, g in graphs):
        lines += ["Batch-1 floor forwards: eager, host enqueue (close to eager: host-bound) and CUDA-graph replay:", "",
                  "| forward | eager ms | enqueue ms | graph replay ms |", "|---|---|---|---|"]
        lines += [f"| {n} | {g['eager_ms']:.2f} | {g['enqueue_ms']:.2f} | {g['graphed_ms']:.2f} |"
                  for n, g in graphs if "graphed_ms" in g]
        lines.append("")
    a = result.get("ar_compiled", {})
    if "ms" in a:
        lines.append(f"transformers' generate with its automatic compilation (static cache), batch 1: "
                     f"{a['ms_per_token']:.2f} ms/token, {a['tokens_per_s']:.0f} tokens/s (first call, the compilation: "
                     f"{a['first_call_s']:.0f} s)")
    d = result.get("llada2_vs_diffusers", {})
    if "speedup" in d:
        lines.append(f"LLaDA2.0-mini replica: dlm {d['ours_ms']:.0f} ms vs diffusers' LLaDA2Pipeline {d['diffusers_ms']:.0f} ms "
                     f"(x{d['speedup']:.2f}; NFE {d['ours_nfe']} vs {d['diffusers_nfe']}; identical tokens {d['identical_tokens']})")
    for name in MINIMUMS:
        line = part_line(name, result.get(name))
        if line:
            lines.append(line)
    return "\n".join(lines)
