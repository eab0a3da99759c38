"""Report section: the decoding engine on real-size replicas, beside the model's own forward time and the
field's code on the same replica in the same run.

- LLaDA-8B shape (masked): `dlm.generate` at the fixed budget of issue 40 (256 tokens in 64 steps, blocks of
  32, prefix KV cache, `confidence`: 4 tokens per step, no early stop) at batch 1, 4, 16: tokens/s, ms per
  step, the share of the step spent outside the model's forward (the engine's overhead: sampler,
  statistics, bookkeeping and host waits), device reads per step, peak memory; batch 1 again with
  `compile=True`.
- DiffusionGemma-26B-A4B shape (uniform noise): one 256-token canvas at 16 denoising steps (transformers'
  rule with adaptive stopping off, so both engines run every step) at batch 1, 4, 8 (16 for ours):
  `dlm.generate` and transformers' `generate` from the same seed, tokens asserted identical (recorded, the
  run goes on), tokens/s of each, the share of the step outside the model (sampler + statistics), device
  reads per step, and the peak memory per request beside the logits' own size (the sampler's transient).
- LLaDA2.0-mini shape: `dlm.generate` beside diffusers' `LLaDA2Pipeline` at the same budget (needs
  diffusers on the machine; recorded as skipped otherwise).

Model time is measured inside the run: CUDA events around every call of the model's modules (and of the
self-conditioning soft embedding, which transformers computes inside its decoder), summed; the engine's
share is `1 - model / total`. On CPU (smoke) the same with `perf_counter`.
"""
from __future__ import annotations

import contextlib
import copy
import time

import torch

from dlm.bench.gpu import ReportContext, peak_extra_bytes, time_call
from dlm.bench.gpu.replica_forward import _build, _is_oom, _release

FULL = {"prompt": 256, "gen": 256, "block": 32, "steps": 64, "masked_batches": (1, 4, 16),
        "uniform_batches": (1, 4, 8, 16), "transformers_max_batch": 8, "denoising_steps": 16, "reps": 3}
SMOKE = {"prompt": 16, "gen": 16, "block": 8, "steps": 8, "masked_batches": (1, 2), "uniform_batches": (1, 2),
         "transformers_max_batch": 2, "denoising_steps": 4, "reps": 2}
FAST_DLLM_TOKENS_PER_S = 54.4  # LLaDA-8B, GSM8K gen 256, prefix cache + threshold, 1x A100 (ALGORITHMS 1.4)


class ModelClock:
    """Time spent inside `modules`' forwards and `methods` ((owner, name) pairs) while active, in ms."""

    def __init__(self, ctx: ReportContext, modules=(), methods=()):
        self.ctx, self.modules, self.methods = ctx, list(modules), list(methods)
        self.spans: list = []

    def _start(self):
        if self.ctx.device.type == "cuda":
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def _stop(self, start):
        if self.ctx.device.type == "cuda":
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.spans.append((start, event))
        else:
            self.spans.append((start, time.perf_counter()))

    def ms(self) -> float:
        self.ctx.synchronize()
        if self.ctx.device.type == "cuda":
            return sum(a.elapsed_time(b) for a, b in self.spans)
        return sum(b - a for a, b in self.spans) * 1e3

    @contextlib.contextmanager
    def active(self):
        self.spans.clear()
        starts: dict = {}
        hooks = []
        for module in self.modules:
            hooks.append(module.register_forward_pre_hook(lambda m, a: starts.__setitem__(id(m), self._start())))
            hooks.append(module.register_forward_hook(lambda m, a, o: self._stop(starts.pop(id(m)))))
        saved = []
        for owner, name in self.methods:
            original = getattr(owner, name)
            saved.append((owner, name, original))

            def timed(*args, _original=original, **kwargs):
                start = self._start()
                out = _original(*args, **kwargs)
                self._stop(start)
                return out
            setattr(owner, name, timed)
        try:
            yield self
        finally:
            for hook in hooks:
                hook.remove()
            for owner, name, original in saved:
                setattr(owner, name, original)


def _timed_runs(ctx: ReportContext, clock: ModelClock, call, reps: int) -> dict:
    """Median total and model ms over `reps` runs of `call` (after one warm-up run outside)."""
    totals, models = [], []
    for _ in range(reps):
        with clock.active():
            ctx.synchronize()
            start = time.perf_counter()
            out = call()
            ctx.synchronize()
            totals.append((time.perf_counter() - start) * 1e3)
            models.append(clock.ms())
    order = sorted(range(reps), key=lambda i: totals[i])
    mid = order[reps // 2]
    return {"ms": totals[mid], "min_ms": min(totals), "max_ms": max(totals), "model_ms": models[mid], "out": out}


def _syncs_per_step(call, steps: int) -> float:
    from dlm.bench.syncs import HostSyncCounter

    with HostSyncCounter() as syncs:
        call()
    return syncs.count / max(steps, 1)


def _over_batches(ctx: ReportContext, batches, measure, rows: list, notes: list) -> None:
    """`rows += measure(batch)` for each batch in order, until the deadline or an out-of-memory error
    (then the larger batches are skipped); each stop is written in `notes`."""
    for batch in batches:
        if ctx.time_left() <= 0:
            notes.append(f"batch {batch}+: deadline")
            return
        try:
            rows.extend(measure(batch))
        except (torch.cuda.OutOfMemoryError, RuntimeError) as error:
            if not _is_oom(error):
                raise
            notes.append(f"batch {batch}: out of memory; larger batches skipped")
            return
        finally:
            _release(ctx)


def _masked(ctx: ReportContext, s: dict) -> dict:
    import dlm

    model, note = _build(ctx, "llada-8b")
    info = model.replica_info
    rows, notes = [], [] if note is None else [note]
    kw = dict(gen_length=s["gen"], block_length=s["block"], steps=s["steps"], sampler="confidence",
              kv_cache="prefix", eos_early_stop=False)

    def measure(batch: int) -> list[dict]:
        gen = torch.Generator(device="cpu").manual_seed(batch)
        ids = torch.randint(0, model.config.mask_token_id, (batch, s["prompt"]), generator=gen).to(ctx.device)
        out = [_masked_row(ctx, model, ids, kw, s, compile_step=False)]
        if batch == 1 and (ctx.smoke or ctx.time_left() > 90):
            out.append(_masked_row(ctx, model, ids, kw, s, compile_step=True))
        return out
    _over_batches(ctx, s["masked_batches"], measure, rows, notes)
    del model
    _release(ctx, collect=True)
    return {"model": "llada-8b", "layers": info.layers, "full_layers": info.full_layers, "budget": dict(kw),
            "prompt": s["prompt"], "rows": rows, "notes": notes}


def _masked_row(ctx, model, ids, kw, s, compile_step: bool) -> dict:
    import dlm

    def call():
        return dlm.generate(model, ids, compile=compile_step, **kw)
    started = time.perf_counter()
    first = call()  # warm-up (and, with compile_step, the compilation)
    warm_s = time.perf_counter() - started
    clock = ModelClock(ctx, modules=[model])
    t = _timed_runs(ctx, clock, call, s["reps"])
    out = t.pop("out")
    batch, nfe = ids.shape[0], out.nfe
    row = {"batch": batch, "compile": compile_step, "nfe": nfe, **t, "step_ms": t["ms"] / nfe,
           "forward_ms_per_step": t["model_ms"] / nfe, "overhead_pct": 100.0 * (1 - t["model_ms"] / t["ms"]),
           "tokens_per_s": batch * kw["gen_length"] / (t["ms"] * 1e-3), "first_call_s": warm_s,
           "same_tokens_as_first_call": bool(torch.equal(first.sequences, out.sequences)),
           "syncs_per_step": _syncs_per_step(call, nfe), "peak_extra_bytes": peak_extra_bytes(ctx, call)}
    ctx.log(f"engine: llada-8b batch {batch}{' compiled' if compile_step else ''}: {row['step_ms']:.2f} ms/step "
            f"(forward {row['forward_ms_per_step']:.2f}, overhead {row['overhead_pct']:.1f}%), "
            f"{row['tokens_per_s']:.0f} tok/s, {row['syncs_per_step']:.2f} reads/step")
    return row


def _uniform_config(model, steps: int, canvas: int):
    gc = copy.deepcopy(model.generation_config)
    gc.max_new_tokens, gc.max_denoising_steps = canvas, steps
    gc.confidence_threshold = None  # adaptive stopping off: every step runs, in both engines
    return gc


def _uniform(ctx: ReportContext, s: dict) -> dict:
    model, note = _build(ctx, "diffusiongemma-26b-a4b")
    info = model.replica_info
    C, V = int(model.config.canvas_length), int(model.config.text_config.vocab_size)
    gc = _uniform_config(model, s["denoising_steps"], C)
    rows, notes = [], [] if note is None else [note]
    _over_batches(ctx, s["uniform_batches"], lambda batch: [_uniform_row(ctx, model, gc, batch, s, C, V)], rows, notes)
    del model
    _release(ctx, collect=True)
    return {"model": "diffusiongemma-26b-a4b", "layers": info.layers, "full_layers": info.full_layers,
            "canvas": C, "vocab": V, "denoising_steps": s["denoising_steps"], "prompt": s["prompt"],
            "rows": rows, "notes": notes}


def _uniform_row(ctx, model, gc, batch, s, C, V) -> dict:
    import dlm
    from dlm.engine.uniform.canvas_model import DiffusionGemmaCanvasModel

    gen = torch.Generator(device="cpu").manual_seed(batch)
    ids = torch.randint(3, V, (batch, s["prompt"]), generator=gen).to(ctx.device)

    def ours():
        torch.manual_seed(0)
        return dlm.generate(model, ids, generation_config=gc)

    def theirs():
        torch.manual_seed(0)
        return model.generate(ids, generation_config=gc)

    decoder, encoder = model.model.decoder, model.model.encoder
    clock = ModelClock(ctx, modules=[decoder, encoder, model.lm_head],
                       methods=[(DiffusionGemmaCanvasModel, "soft_embeddings")])
    ours()
    t = _timed_runs(ctx, clock, ours, s["reps"])
    out = t.pop("out")
    steps = out.nfe
    logits_bytes = C * V * 4
    peak = peak_extra_bytes(ctx, ours)
    row = {"batch": batch, "nfe": steps, **t, "step_ms": t["ms"] / steps, "model_ms_per_step": t["model_ms"] / steps,
           "sampler_pct": 100.0 * (1 - t["model_ms"] / t["ms"]),
           "tokens_per_s": batch * C / (t["ms"] * 1e-3), "syncs_per_step": _syncs_per_step(ours, steps),
           "peak_extra_bytes": peak, "peak_per_request_bytes": None if peak is None else peak / batch,
           "logits_bytes_per_request": logits_bytes,
           "transient_beyond_logits_per_request_bytes": None if peak is None else peak / batch - logits_bytes}
    if batch <= s["transformers_max_batch"] and ctx.time_left() > 0:
        theirs()
        ref = time_call(ctx, theirs, reps=max(1, s["reps"] - 1), warmup=0)
        reference = theirs()
        row.update(transformers_ms=ref["ms"], transformers_range_ms=[ref["min_ms"], ref["max_ms"]],
                   transformers_tokens_per_s=batch * C / (ref["ms"] * 1e-3), speedup_vs_transformers=ref["ms"] / t["ms"],
                   identical_tokens=bool(torch.equal(reference.sequences, out.sequences)),
                   transformers_peak_extra_bytes=peak_extra_bytes(ctx, theirs))
    ctx.log(f"engine: dgemma batch {batch}: {row['step_ms']:.2f} ms/step (model {row['model_ms_per_step']:.2f}, "
            f"sampler {row['sampler_pct']:.1f}%), {row['tokens_per_s']:.0f} tok/s, "
            f"x{row.get('speedup_vs_transformers', float('nan')):.2f} vs transformers, "
            f"identical {row.get('identical_tokens')}")
    return row


class _IdsTokenizer:
    """What the diffusers pipeline needs of a tokenizer when given token ids: the special ids."""

    def __init__(self, config):
        self.eos_token_id, self.mask_token_id = config.eos_token_id, config.mask_token_id
        self.pad_token_id = getattr(config, "pad_token_id", None) or config.eos_token_id

    def encode(self, text):
        raise ValueError("the replica has no tokenizer: pass token ids")

    def decode(self, ids, skip_special_tokens=True):
        return ""


def _llada2_vs_diffusers(ctx: ReportContext, s: dict) -> dict:
    try:
        import diffusers  # noqa: F401
    except ImportError:
        return {"skipped": "diffusers is not installed on this machine (carry its wheel to compare LLaDA2Pipeline)"}
    import dlm
    from dlm.bench.diffusers_llada2 import build_pipeline, run_llada2

    model, note = _build(ctx, "llada2-mini")
    cfg = model.config
    gen = torch.Generator(device="cpu").manual_seed(0)
    ids = torch.randint(0, cfg.mask_token_id, (1, s["prompt"]), generator=gen).to(ctx.device)
    kw = dict(gen_length=s["gen"], block_length=s["block"], steps=s["steps"])
    pipe, wrapper = build_pipeline(model, _IdsTokenizer(cfg))

    def ours():
        return dlm.generate(model, ids, sampler="confidence", kv_cache="prefix", eos_early_stop=False, **kw)

    def theirs():
        return run_llada2(pipe, wrapper, ids, None, mask_token_id=cfg.mask_token_id, eos_token_id=cfg.eos_token_id,
                          options={"eos_early_stop": False}, **kw)
    ours(), theirs()
    a = time_call(ctx, ours, reps=s["reps"], warmup=0)
    b = time_call(ctx, theirs, reps=s["reps"], warmup=0)
    mine, ref = ours(), theirs()
    n = min(mine.sequences.shape[1], ref.sequences.shape[1])
    out = {"model": "llada2-mini", "layers": model.replica_info.layers, "budget": kw, "ours_ms": a["ms"],
           "ours_range_ms": [a["min_ms"], a["max_ms"]], "diffusers_ms": b["ms"], "diffusers_range_ms": [b["min_ms"], b["max_ms"]],
           "speedup": b["ms"] / a["ms"], "ours_nfe": mine.nfe, "diffusers_nfe": ref.nfe,
           "identical_tokens": bool(torch.equal(mine.sequences[:, :n].cpu(), ref.sequences[:, :n].cpu())), "note": note}
    del model, pipe, wrapper
    _release(ctx, collect=True)
    ctx.log(f"engine: llada2-mini ours {a['ms']:.0f} ms vs diffusers {b['ms']:.0f} ms (x{out['speedup']:.2f})")
    return out


def _guarded(ctx: ReportContext, fn, s) -> dict:
    try:
        return fn(ctx, s)
    except Exception as error:  # noqa: BLE001 - one GPU window: record and go on
        if ctx.smoke:
            raise
        import traceback

        return {"error": f"{type(error).__name__}: {error}"[:500], "traceback": traceback.format_exc()[-2000:]}


def run(ctx: ReportContext) -> dict:
    s = SMOKE if ctx.smoke else FULL
    out = {"masked": _guarded(ctx, _masked, s), "uniform": _guarded(ctx, _uniform, s)}
    out["llada2_vs_diffusers"] = (_guarded(ctx, _llada2_vs_diffusers, s) if ctx.time_left() > 0
                                  else {"skipped": "deadline"})
    out["targets"] = targets(out)
    return out


def _target(text: str, value, met) -> dict:
    return {"target": text, "value": value, "met": met}


def targets(out: dict) -> dict:
    """Issue 40's engine targets from this section's rows (None: not measured in this run)."""
    masked = {(r["batch"], r["compile"]): r for r in out.get("masked", {}).get("rows", [])}
    uniform = {r["batch"]: r for r in out.get("uniform", {}).get("rows", [])}
    m1, u1, u8 = masked.get((1, False)), uniform.get(1), uniform.get(8)
    t = {}
    t["llada_overhead"] = _target("LLaDA-8B batch 1: engine overhead <= 5% of the step",
                                  m1 and m1["overhead_pct"], m1 and m1["overhead_pct"] <= 5)
    t["llada_tokens_per_s"] = _target(f"LLaDA-8B batch 1 tokens/s beside Fast-dLLM's {FAST_DLLM_TOKENS_PER_S} (A100)",
                                      m1 and m1["tokens_per_s"], None)
    t["dgemma_sampler_share"] = _target("DiffusionGemma batch 1: sampler + statistics <= 3% of the step",
                                        u1 and u1["sampler_pct"], u1 and u1["sampler_pct"] <= 3)
    transient = u1 and u1["transient_beyond_logits_per_request_bytes"]
    t["dgemma_transient"] = _target("DiffusionGemma: sampler transient <= 0.6 GB per request",
                                    transient and transient / 1e9, transient is not None and transient <= 0.6e9)
    growth = u1 and u8 and u8["tokens_per_s"] / u1["tokens_per_s"]
    t["dgemma_batch_growth"] = _target("DiffusionGemma: batch 8 runs and tokens/s grows >= 4x from batch 1",
                                       growth, None if growth is None else growth >= 4)
    speed = u8 and u8.get("speedup_vs_transformers")
    same = u8 and u8.get("identical_tokens")
    t["dgemma_vs_transformers"] = _target("DiffusionGemma batch 8: >= 1.5x faster than transformers' generate, "
                                          "identical tokens", speed, None if speed is None else speed >= 1.5 and bool(same))
    return t


def markdown(result: dict) -> str:
    lines = []
    m = result.get("masked", {})
    if "rows" in m:
        lines += [f"LLaDA-8B replica ({m['layers']}/{m['full_layers']} layers), prompt {m['prompt']}, "
                  f"{m['budget']['gen_length']} tokens in {m['budget']['steps']} steps, blocks of "
                  f"{m['budget']['block_length']}, prefix cache:", "",
                  "| batch | compile | ms/step [range of runs] | forward ms/step | overhead | tokens/s | reads/step | peak extra GB |",
                  "|---|---|---|---|---|---|---|---|"]
        for r in m["rows"]:
            peak = "n/a" if r["peak_extra_bytes"] is None else f"{r['peak_extra_bytes'] / 1e9:.2f}"
            lines.append(f"| {r['batch']} | {r['compile']} | {r['step_ms']:.2f} [{r['min_ms'] / r['nfe']:.2f}-"
                         f"{r['max_ms'] / r['nfe']:.2f}] | {r['forward_ms_per_step']:.2f} | {r['overhead_pct']:.1f}% | "
                         f"{r['tokens_per_s']:.0f} | {r['syncs_per_step']:.2f} | {peak} |")
        lines.append("")
    elif m:
        lines += [f"LLaDA-8B engine: {m.get('error') or m}", ""]
    u = result.get("uniform", {})
    if "rows" in u:
        lines += [f"DiffusionGemma replica ({u['layers']}/{u['full_layers']} layers), prompt {u['prompt']}, one canvas of "
                  f"{u['canvas']} at {u['denoising_steps']} steps:", "",
                  "| batch | ms/step | model ms/step | sampler share | tokens/s | transformers tokens/s | speed-up | identical | reads/step | peak GB/request | logits GB/request |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in u["rows"]:
            tf = r.get("transformers_tokens_per_s")
            peak = r["peak_per_request_bytes"]
            lines.append(f"| {r['batch']} | {r['step_ms']:.2f} | {r['model_ms_per_step']:.2f} | {r['sampler_pct']:.1f}% | "
                         f"{r['tokens_per_s']:.0f} | {'-' if tf is None else f'{tf:.0f}'} | "
                         f"{'-' if tf is None else '%.2fx' % r['speedup_vs_transformers']} | {r.get('identical_tokens', '-')} | "
                         f"{r['syncs_per_step']:.2f} | {'n/a' if peak is None else f'{peak / 1e9:.2f}'} | "
                         f"{r['logits_bytes_per_request'] / 1e9:.2f} |")
        lines.append("")
    elif u:
        lines += [f"DiffusionGemma engine: {u.get('error') or u}", ""]
    d = result.get("llada2_vs_diffusers", {})
    if "speedup" in d:
        lines.append(f"LLaDA2.0-mini replica: dlm {d['ours_ms']:.0f} ms vs diffusers' LLaDA2Pipeline {d['diffusers_ms']:.0f} ms "
                     f"(x{d['speedup']:.2f}; NFE {d['ours_nfe']} vs {d['diffusers_nfe']}; identical tokens {d['identical_tokens']})")
    elif d:
        lines.append(f"LLaDA2.0-mini vs diffusers: {d.get('skipped') or d.get('error')}")
    return "\n".join(lines)
