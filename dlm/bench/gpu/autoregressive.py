"""Report section `autoregressive`: is a diffusion LM faster than an autoregressive model of the same size
on the same card?

- autoregressive: transformers' `generate` (static cache, greedy; its forward eager, `disable_compile=True`,
  as our engine's is; the compiled run is in `extras`) on a causal Llama of the LLaDA-8B replica's shape:
  the replica's own `LlamaForCausalLM` (`model.lm`, the same weights, 8.0 B parameters) with its attention
  made causal again for the call (`causal`). 256 new tokens after a 256-token prompt, batch 1 and 8.
- ours on the LLaDA-8B replica, the same prompt: the fixed budget (256 tokens in 64 steps, blocks of 32,
  prefix cache, `confidence`: 4 tokens per forward) and `threshold` at Fast-dLLM's setting (tau 0.9, one
  step per token as the budget's upper bound, prefix cache). Random weights never reach tau, so threshold
  runs its floor here, one token per forward (NFE 256): a lower bound of what a trained model gets, where
  each forward costs what it costs here.

Generated tokens per second count each row's tokens up to and including its first EOS, never the prompt
(`tokens_up_to_eos`); both engines stop a row at EOS. Per batch the three rows are parts of their own
(start minimum, error guard, saved when done), and the ratios ours / autoregressive are taken where both
ran.
"""
from __future__ import annotations

import contextlib
import time

import torch

from dlm.bench.gpu import ReportContext, run_part, time_call, tokens_up_to_eos
from dlm.bench.gpu.engine import over_batches, part_line, random_prompt, target
from dlm.bench.gpu.replica_forward import _build, _release

FULL = {"prompt": 256, "gen": 256, "block": 32, "steps": 64, "batches": (1, 8), "reps": 2, "warm_tokens": 16}
SMOKE = {"prompt": 16, "gen": 16, "block": 8, "steps": 8, "batches": (1, 2), "reps": 1, "warm_tokens": 4}
MIN_START_S = 45.0  # build + batch 1: two eager autoregressive runs of 256 tokens (~6 s each) and ours
MIN_BATCH_S = 20.0
MIN_AR_S = 15.0
MIN_OURS_S = 5.0


@contextlib.contextmanager
def causal(lm):
    """`lm` (a transformers causal LM whose layers a masked replica made bidirectional) with causal attention
    for the block; the layers' own setting comes back after it."""
    layers = lm.model.layers
    saved = [layer.self_attn.is_causal for layer in layers]
    for layer in layers:
        layer.self_attn.is_causal = True
    try:
        yield lm
    finally:
        for layer, was in zip(layers, saved):
            layer.self_attn.is_causal = was


def ar_generate(lm, ids: torch.Tensor, new_tokens: int, eos: int, compile_forward: bool = False) -> torch.Tensor:
    """Greedy decoding with transformers' static cache: `[B, prompt + new]` ids (rows that stop at EOS are
    padded with it). `compile_forward`: leave transformers' automatic compilation on (it compiles the forward
    on CUDA with a static cache; off here means eager, like our engine's forward)."""
    return lm.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, do_sample=False,
                       num_beams=1, cache_implementation="static", disable_compile=not compile_forward,
                       eos_token_id=eos, pad_token_id=eos)


def ar_row(ctx: ReportContext, lm, ids, s: dict, eos: int, compile_forward: bool = False) -> dict:
    """transformers' autoregressive decoding, timed: after a warm-up (a short one when eager; the whole
    length when compiling, whose first call is the compilation), `reps` runs of `s["gen"]` new tokens."""
    with causal(lm):
        started = time.perf_counter()
        ar_generate(lm, ids, s["gen"] if compile_forward else s["warm_tokens"], eos, compile_forward)
        ctx.synchronize()
        first_s = time.perf_counter() - started
        t = time_call(ctx, lambda: ar_generate(lm, ids, s["gen"], eos, compile_forward), reps=s["reps"], warmup=0,
                      keep_output=True)
    generated = t.pop("out")[:, ids.shape[1]:]
    tokens = tokens_up_to_eos(generated, eos)
    row = {**t, "compile": compile_forward, "new_tokens_max": int(generated.shape[1]), "tokens_to_eos": tokens,
           "tokens_per_s": tokens / (t["ms"] * 1e-3), "ms_per_token": t["ms"] / max(generated.shape[1], 1),
           "first_call_s": first_s}
    ctx.log(f"autoregressive: batch {ids.shape[0]}{' compiled' if compile_forward else ''}: "
            f"{row['ms_per_token']:.2f} ms/token, {row['tokens_per_s']:.0f} tok/s (to EOS: {tokens} tokens)")
    return row


def ours_row(ctx: ReportContext, model, ids, kw: dict, reps: int) -> dict:
    """`dlm.generate` with `kw`, timed after a warm-up: tokens to EOS per second, NFE, ms per forward."""
    import dlm

    def call():
        return dlm.generate(model, ids, **kw)
    call()
    t = time_call(ctx, call, reps=reps, warmup=0, keep_output=True)
    out = t.pop("out")
    tokens = tokens_up_to_eos(out.sequences[:, ids.shape[1]:], model.config.eos_token_id)
    row = {**t, "sampler": kw["sampler"], "steps": kw["steps"], "nfe": out.nfe, "tokens_to_eos": tokens,
           "tokens_per_s": tokens / (t["ms"] * 1e-3), "ms_per_forward": t["ms"] / max(out.nfe, 1)}
    ctx.log(f"autoregressive: ours {kw['sampler']} batch {ids.shape[0]}: NFE {out.nfe}, "
            f"{row['ms_per_forward']:.2f} ms/forward, {row['tokens_per_s']:.0f} tok/s")
    return row


def settings(s: dict) -> dict:
    """Our two settings: the fixed budget and Fast-dLLM's threshold (see the module docstring)."""
    base = dict(gen_length=s["gen"], block_length=s["block"], kv_cache="prefix", eos_early_stop=True)
    return {"fixed_budget": dict(base, steps=s["steps"], sampler="confidence"),
            "threshold": dict(base, steps=s["gen"], sampler="threshold")}


def run(ctx: ReportContext) -> dict:
    s = SMOKE if ctx.smoke else FULL
    model, note = _build(ctx, "llada-8b")
    eos = int(model.config.eos_token_id)
    info = model.replica_info
    ours = settings(s)
    out = {"model": "llada-8b", "layers": info.layers, "full_layers": info.full_layers, "prompt": s["prompt"],
           "new_tokens": s["gen"], "ours": ours, "batches": [], "notes": [] if note is None else [note]}

    def measure(batch: int) -> None:
        ids = random_prompt(ctx, batch, s["prompt"], model.config.mask_token_id)
        entry = {"batch": batch}
        out["batches"].append(entry)
        run_part(ctx, "autoregressive", MIN_AR_S, lambda: ar_row(ctx, model.lm, ids, s, eos), entry, root=out)
        for name, kw in ours.items():
            run_part(ctx, name, MIN_OURS_S, lambda kw=kw: ours_row(ctx, model, ids, kw, s["reps"]), entry, root=out)
        entry["ratios"] = ratios(entry)
        ctx.save(out)
    over_batches(ctx, s["batches"], measure, out["notes"], MIN_BATCH_S)
    del model
    _release(ctx, collect=True)
    out["targets"] = targets(out)
    return out


def ratios(entry: dict) -> dict:
    """ours tokens/s over the autoregressive tokens/s, per setting, where both were measured."""
    ar = entry.get("autoregressive", {}).get("tokens_per_s")
    return {name: entry[name]["tokens_per_s"] / ar for name in ("fixed_budget", "threshold")
            if ar and "tokens_per_s" in entry.get(name, {})}


def targets(out: dict) -> dict:
    """The row's headline (not judged: the issue sets no bar), batch 1."""
    b1 = next((b for b in out.get("batches", []) if b["batch"] == 1), {})
    r = b1.get("ratios", {}).get("fixed_budget")
    return {"dllm_vs_autoregressive": target("LLaDA-8B batch 1: tokens/s of our fixed budget over transformers' "
                                             "autoregressive generate (static cache, eager) on the same shape", r, None)}


def markdown(result: dict) -> str:
    lines = [f"Causal Llama of the LLaDA-8B replica's shape ({result['layers']}/{result['full_layers']} layers, the "
             f"replica's weights) vs our engine on the replica; prompt {result['prompt']}, {result['new_tokens']} new "
             "tokens; tokens/s count tokens up to EOS:", "",
             "| batch | engine | forwards | ms [range] | ms per forward | tokens to EOS | tokens/s | x autoregressive |",
             "|---|---|---|---|---|---|---|---|"]
    fixed = result["ours"]["fixed_budget"]
    labels = {"autoregressive": "transformers generate (static cache, greedy, eager)",
              "fixed_budget": f"dlm, fixed budget (confidence, {fixed['steps']} steps, prefix cache)",
              "threshold": "dlm, threshold 0.9 (prefix cache)"}
    extra = []
    for b in result["batches"]:
        for name, label in labels.items():
            r = b.get(name, {})
            if "ms" not in r:
                line = part_line(f"batch {b['batch']} {name}", r)
                if line:
                    extra.append(line)
                continue
            per = r.get("ms_per_forward", r.get("ms_per_token"))
            count = r.get("nfe", r.get("new_tokens_max"))
            ratio = b.get("ratios", {}).get(name)
            lines.append(f"| {b['batch']} | {label} | {count} | {r['ms']:.0f} [{r['min_ms']:.0f}-{r['max_ms']:.0f}] | "
                         f"{per:.2f} | {r['tokens_to_eos']} | {r['tokens_per_s']:.0f} | "
                         f"{'-' if ratio is None else f'{ratio:.2f}x'} |")
    lines += extra + [f"- {note}" for note in result.get("notes", [])]
    return "\n".join(lines)
