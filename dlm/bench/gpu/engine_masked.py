"""Report section `engine_masked`: `dlm.generate` on the LLaDA-8B replica at issue 40's fixed budget (256
tokens in 64 steps, blocks of 32, prefix cache, `confidence`, no early stop) at batch 1, 4, 16, eager.

Every batch's row is saved as soon as it is measured; a batch that runs out of memory skips the larger
ones; a batch is not started with less than `MIN_BATCH_S` left. The compiled batch-1 row is in `extras`
(the compile and its CUDA graphs run after the safer sections). Measurements: `engine.masked_row`.
"""
from __future__ import annotations

from dlm.bench.gpu import ReportContext
from dlm.bench.gpu.engine import (FAST_DLLM_TOKENS_PER_S, masked_budget, masked_markdown_rows, masked_row,
                                  over_batches, random_prompt, sizes, target)
from dlm.bench.gpu.replica_forward import _build, _release

MIN_START_S = 40.0  # build (16 GB) + batch 1 (6 generates of ~0.5 s) with margin
MIN_BATCH_S = 12.0


def run(ctx: ReportContext) -> dict:
    s = sizes(ctx)
    model, note = _build(ctx, "llada-8b")
    info = model.replica_info
    kw = masked_budget(s)
    out = {"model": "llada-8b", "layers": info.layers, "full_layers": info.full_layers, "budget": dict(kw),
           "prompt": s["prompt"], "rows": [], "notes": [] if note is None else [note]}

    def measure(batch: int) -> None:
        ids = random_prompt(ctx, batch, s["prompt"], model.config.mask_token_id)
        out["rows"].append(masked_row(ctx, model, ids, kw, s["reps"]))
        ctx.save(out)
    over_batches(ctx, s["masked_batches"], measure, out["notes"], MIN_BATCH_S)
    del model
    _release(ctx, collect=True)
    out["targets"] = targets(out)
    return out


def targets(out: dict) -> dict:
    """Issue 40's LLaDA targets from the batch-1 row (None: not measured in this run)."""
    m1 = next((r for r in out.get("rows", []) if r["batch"] == 1), None)
    return {"llada_overhead": target("LLaDA-8B batch 1: engine overhead <= 5% of the step",
                                     m1 and m1["overhead_pct"], m1 and m1["overhead_pct"] <= 5),
            "llada_tokens_per_s": target(f"LLaDA-8B batch 1 tokens/s beside Fast-dLLM's {FAST_DLLM_TOKENS_PER_S} (A100)",
                                         m1 and m1["tokens_per_s"], None)}


def markdown(result: dict) -> str:
    b = result["budget"]
    lines = [f"LLaDA-8B replica ({result['layers']}/{result['full_layers']} layers), prompt {result['prompt']}, "
             f"{b['gen_length']} tokens in {b['steps']} steps, blocks of {b['block_length']}, prefix cache:", ""]
    lines += masked_markdown_rows(result["rows"])
    lines += [f"- {note}" for note in result.get("notes", [])]
    return "\n".join(lines)
