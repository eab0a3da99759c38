"""Report section `engine_uniform`: `dlm.generate` on the DiffusionGemma-26B-A4B replica, one 256-token canvas
at 16 denoising steps (transformers' rule, adaptive stopping off) at batch 1, 4, 8, 16, beside transformers'
`generate` from the same seed up to batch 8, and the two engines' agreement at batch 1 and 8.

Per batch, three parts, each guarded on its own and saved when done: our row (an out-of-memory here skips
the larger batches), transformers' row (its failure or out-of-memory marks only itself: our larger batches
still run) and the identity check (`engine.identity`: fraction of equal tokens, first differing step, beside
transformers against itself). Speed and identity are separate targets.
"""
from __future__ import annotations

from dlm.bench.gpu import ReportContext, run_part
from dlm.bench.gpu.engine import (identity, over_batches, random_prompt, sizes, target, transformers_row,
                                  uniform_config, uniform_row)
from dlm.bench.gpu.replica_forward import _build, _release

MIN_START_S = 60.0  # build (50 GB) + batch 1 with transformers' row and the identity check, with margin
MIN_BATCH_S = 12.0
MIN_TRANSFORMERS_S = 8.0
MIN_IDENTITY_S = 10.0


def run(ctx: ReportContext) -> dict:
    s = sizes(ctx)
    model, note = _build(ctx, "diffusiongemma-26b-a4b")
    info = model.replica_info
    C, V = int(model.config.canvas_length), int(model.config.text_config.vocab_size)
    gc = uniform_config(model, s["denoising_steps"], C)
    out = {"model": "diffusiongemma-26b-a4b", "layers": info.layers, "full_layers": info.full_layers,
           "canvas": C, "vocab": V, "denoising_steps": s["denoising_steps"], "prompt": s["prompt"],
           "rows": [], "notes": [] if note is None else [note]}

    def measure(batch: int) -> None:
        ids = random_prompt(ctx, batch, s["prompt"], V, low=3)
        row = uniform_row(ctx, model, gc, ids, s["reps"], C, V)
        out["rows"].append(row)
        ctx.save(out)
        parts: dict = {}
        if batch <= s["transformers_max_batch"]:
            run_part(ctx, "transformers", MIN_TRANSFORMERS_S,
                     lambda: transformers_row(ctx, model, gc, ids, s["reps"], C, row["ms"]), parts, root=out)
        if batch in s["identity_batches"]:
            run_part(ctx, "identity", MIN_IDENTITY_S, lambda: identity(ctx, model, gc, ids), parts, root=out)
        for name, part in parts.items():
            if "error" in part or set(part) == {"skipped"}:
                row[f"{name}_status"] = part
            elif name == "transformers":
                row.update(part)
            else:
                row["identity"] = part
        ctx.save(out)
        _release(ctx)
    over_batches(ctx, s["uniform_batches"], measure, out["notes"], MIN_BATCH_S)
    del model
    _release(ctx, collect=True)
    out["targets"] = targets(out)
    return out


def targets(out: dict) -> dict:
    """Issue 40's DiffusionGemma targets (None: not measured in this run)."""
    uniform = {r["batch"]: r for r in out.get("rows", [])}
    u1, u8 = uniform.get(1), uniform.get(8)
    t = {"dgemma_sampler_share": target("DiffusionGemma batch 1: sampler + statistics <= 3% of the step",
                                        u1 and u1["sampler_pct"], u1 and u1["sampler_pct"] <= 3)}
    transient = u1 and u1["transient_beyond_logits_per_request_bytes"]
    if transient is not None and transient < 0:
        # the peak fell below the logits' own size: the measurement does not see the tables (CPU without
        # MALLOC_MMAP_THRESHOLD_), so it judges nothing
        t["dgemma_transient"] = target("DiffusionGemma: sampler transient <= 0.6 GB per request", transient / 1e9, None,
                                       "peak below the logits' own size: the memory measurement missed them")
    else:
        t["dgemma_transient"] = target("DiffusionGemma: sampler transient <= 0.6 GB per request",
                                       transient and transient / 1e9, None if transient is None else transient <= 0.6e9)
    growth = u1 and u8 and u8["tokens_per_s"] / u1["tokens_per_s"]
    t["dgemma_batch_growth"] = target("DiffusionGemma: batch 8 runs and tokens/s grows >= 4x from batch 1",
                                      growth, None if growth is None else growth >= 4)
    speed = u8 and u8.get("speedup_vs_transformers")
    t["dgemma_vs_transformers"] = target("DiffusionGemma batch 8: >= 1.5x faster than transformers' generate",
                                         speed, None if speed is None else speed >= 1.5)
    same = u8 and u8.get("identity")
    note = None
    if same:
        selfsame = same["transformers_vs_transformers"]
        note = (f"first differing step {same['ours_vs_transformers']['first_differing_step']}; transformers vs "
                f"itself {selfsame['equal_fraction']:.4f} equal (first differing step {selfsame['first_differing_step']})")
    t["dgemma_identical"] = target("DiffusionGemma batch 8: the tokens of transformers' generate (fraction equal)",
                                   same and same["ours_vs_transformers"]["equal_fraction"],
                                   None if not same else same["identical"], note)
    return t


def markdown(result: dict) -> str:
    lines = [f"DiffusionGemma replica ({result['layers']}/{result['full_layers']} layers), prompt {result['prompt']}, "
             f"one canvas of {result['canvas']} at {result['denoising_steps']} steps:", "",
             "| batch | ms/step | model ms/step | sampler share | tokens/s | transformers tokens/s | speed-up | "
             "equal tokens (first diff step) | transformers vs itself | reads/step | peak GB/request | logits GB/request |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        tf = r.get("transformers_tokens_per_s")
        peak = r["peak_per_request_bytes"]
        ident, selfsame = "-", "-"
        if "identity" in r:
            o, t = r["identity"]["ours_vs_transformers"], r["identity"]["transformers_vs_transformers"]
            ident = f"{o['equal_fraction']:.4f} ({o['first_differing_step']})"
            selfsame = f"{t['equal_fraction']:.4f} ({t['first_differing_step']})"
        for name in ("transformers", "identity"):
            status = r.get(f"{name}_status")
            if status:
                text = status.get("error") or status.get("skipped")
                if name == "transformers":
                    tf = None
                else:
                    ident = f"n/a: {text}"
        tf_text = "-" if tf is None else f"{tf:.0f}"
        if r.get("transformers_status"):
            s = r["transformers_status"]
            tf_text = f"n/a: {s.get('error') or s.get('skipped')}"
        lines.append(f"| {r['batch']} | {r['step_ms']:.2f} | {r['model_ms_per_step']:.2f} | {r['sampler_pct']:.1f}% | "
                     f"{r['tokens_per_s']:.0f} | {tf_text} | "
                     f"{'-' if tf is None else '%.2fx' % r['speedup_vs_transformers']} | {ident} | {selfsame} | "
                     f"{r['syncs_per_step']:.2f} | {'n/a' if peak is None else f'{peak / 1e9:.2f}'} | "
                     f"{r['logits_bytes_per_request'] / 1e9:.2f} |")
    lines += [f"- {note}" for note in result.get("notes", [])]
    return "\n".join(lines)
