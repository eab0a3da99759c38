"""The decoding engine's measurements on real-size replicas, shared by the report's engine parts
(`engine_masked`, `engine_uniform`, `autoregressive`, `extras`).

- `masked_row`: `dlm.generate` on a masked replica (LLaDA-8B shape): tokens/s, ms per step, the share of
  the step spent outside the model's forward (the engine's overhead: sampler, statistics, bookkeeping and
  host waits), device reads per step, peak memory.
- `uniform_row`: `dlm.generate` on the DiffusionGemma-26B-A4B replica (one canvas, transformers' rule with
  adaptive stopping off, so every step runs): the same figures, with the sampler's share and its transient
  memory per request beside the logits' own size; `transformers_row`: transformers' `generate` on the same
  replica from the same seed (time, peak); `identity`: how far the two engines' tokens agree (the fraction
  of equal tokens, the first denoising step whose argmax canvas differs), beside transformers run against
  itself and ours against ours, so a difference of rounding (on a GPU cuBLAS picks kernels by row count,
  and our soft embedding runs in chunks of positions where transformers runs one product) reads apart
  from a difference of rule. Judged apart from speed.
- `llada2_vs_diffusers`: `dlm.generate` beside diffusers' `LLaDA2Pipeline` on the LLaDA2.0-mini replica.

Model time is measured inside the run: CUDA events around every call of the model's modules (and of the
self-conditioning soft embedding, which transformers computes inside its decoder), summed; the engine's
share is `1 - model / total`. On CPU (smoke) the same with `perf_counter`.
"""
from __future__ import annotations

import contextlib
import copy
import time

import torch

from dlm.bench.gpu import ReportContext, peak_extra_bytes, time_call, tokens_up_to_eos
from dlm.bench.gpu.replica_forward import _build, _is_oom, _release

FULL = {"prompt": 256, "gen": 256, "block": 32, "steps": 64, "masked_batches": (1, 4, 16),
        "uniform_batches": (1, 4, 8, 16), "transformers_max_batch": 8, "identity_batches": (1, 8),
        "denoising_steps": 16, "reps": 3}
SMOKE = {"prompt": 16, "gen": 16, "block": 8, "steps": 8, "masked_batches": (1, 2), "uniform_batches": (1, 2),
         "transformers_max_batch": 2, "identity_batches": (1, 2), "denoising_steps": 4, "reps": 2}
FAST_DLLM_TOKENS_PER_S = 54.4  # LLaDA-8B, GSM8K gen 256, prefix cache + threshold, 1x A100 (ALGORITHMS 1.4)


def sizes(ctx: ReportContext) -> dict:
    return SMOKE if ctx.smoke else FULL


def masked_budget(s: dict) -> dict:
    """Issue 40's fixed budget: 256 tokens in 64 steps, blocks of 32, prefix cache, `confidence` (4 tokens
    per step), no early stop."""
    return dict(gen_length=s["gen"], block_length=s["block"], steps=s["steps"], sampler="confidence",
                kv_cache="prefix", eos_early_stop=False)


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


def over_batches(ctx: ReportContext, batches, measure, notes: list, minimum_s: float = 10.0) -> None:
    """`measure(batch)` for each batch in order, until less than `minimum_s` is left before the deadline or
    `measure` runs out of memory (then the larger batches are skipped); each stop is written in `notes`.
    `measure` records its own rows (and saves them), so a stop keeps every row measured before it."""
    for batch in batches:
        if not ctx.may_start(minimum_s):
            notes.append(f"batch {batch}+: not started, {max(ctx.time_left(), 0):.0f} s left")
            return
        out_of_memory = False
        try:
            measure(batch)
        except (torch.cuda.OutOfMemoryError, RuntimeError) as error:
            if not _is_oom(error):
                raise
            out_of_memory = True  # released below, once the traceback no longer holds the batch's tensors
        if out_of_memory:
            notes.append(f"batch {batch}: out of memory; larger batches skipped")
            _release(ctx, collect=True)
            return
        _release(ctx)


def random_prompt(ctx: ReportContext, batch: int, length: int, high: int, low: int = 0, seed: int | None = None):
    gen = torch.Generator(device="cpu").manual_seed(batch if seed is None else seed)
    return torch.randint(low, high, (batch, length), generator=gen).to(ctx.device)


def masked_row(ctx: ReportContext, model, ids, kw: dict, reps: int, compile_step: bool = False) -> dict:
    """One `dlm.generate` setting on a masked replica, measured (see the module docstring)."""
    import dlm

    def call():
        return dlm.generate(model, ids, compile=compile_step, **kw)
    started = time.perf_counter()
    first = call()  # warm-up (and, with compile_step, the compilation)
    warm_s = time.perf_counter() - started
    clock = ModelClock(ctx, modules=[model])
    t = _timed_runs(ctx, clock, call, reps)
    out = t.pop("out")
    batch, nfe = ids.shape[0], out.nfe
    generated = out.sequences[:, ids.shape[1]:]
    tokens = tokens_up_to_eos(generated, model.config.eos_token_id)
    row = {"batch": batch, "sampler": kw["sampler"], "steps": kw["steps"], "compile": compile_step, "nfe": nfe,
           **t, "step_ms": t["ms"] / nfe, "forward_ms_per_step": t["model_ms"] / nfe,
           "overhead_pct": 100.0 * (1 - t["model_ms"] / t["ms"]),
           "tokens_per_s": batch * kw["gen_length"] / (t["ms"] * 1e-3), "tokens_to_eos": tokens,
           "tokens_to_eos_per_s": tokens / (t["ms"] * 1e-3), "first_call_s": warm_s,
           "same_tokens_as_first_call": bool(torch.equal(first.sequences, out.sequences)),
           "syncs_per_step": _syncs_per_step(call, nfe), "peak_extra_bytes": peak_extra_bytes(ctx, call)}
    ctx.log(f"engine: {kw['sampler']} batch {batch}{' compiled' if compile_step else ''}: {row['step_ms']:.2f} ms/step "
            f"(forward {row['forward_ms_per_step']:.2f}, overhead {row['overhead_pct']:.1f}%), NFE {nfe}, "
            f"{row['tokens_per_s']:.0f} tok/s, {row['syncs_per_step']:.2f} reads/step")
    return row


def uniform_config(model, steps: int, canvas: int):
    """transformers' rule on one canvas at `steps` denoising steps, adaptive stopping off: every step runs,
    in both engines."""
    gc = copy.deepcopy(model.generation_config)
    gc.max_new_tokens, gc.max_denoising_steps = canvas, steps
    gc.confidence_threshold = None
    return gc


def uniform_row(ctx: ReportContext, model, gc, ids, reps: int, C: int, V: int) -> dict:
    """`dlm.generate` on the DiffusionGemma replica, measured (see the module docstring)."""
    import dlm
    from dlm.engine.uniform.canvas_model import DiffusionGemmaCanvasModel

    def ours():
        torch.manual_seed(0)
        return dlm.generate(model, ids, generation_config=gc)

    clock = ModelClock(ctx, modules=[model.model.decoder, model.model.encoder, model.lm_head],
                       methods=[(DiffusionGemmaCanvasModel, "soft_embeddings")])
    ours()
    t = _timed_runs(ctx, clock, ours, reps)
    out = t.pop("out")
    batch, steps = ids.shape[0], out.nfe
    logits_bytes = C * V * 4
    peak = peak_extra_bytes(ctx, ours)
    row = {"batch": batch, "nfe": steps, **t, "step_ms": t["ms"] / steps, "model_ms_per_step": t["model_ms"] / steps,
           "sampler_pct": 100.0 * (1 - t["model_ms"] / t["ms"]),
           "tokens_per_s": batch * C / (t["ms"] * 1e-3), "syncs_per_step": _syncs_per_step(ours, steps),
           "peak_extra_bytes": peak, "peak_per_request_bytes": None if peak is None else peak / batch,
           "logits_bytes_per_request": logits_bytes,
           "transient_beyond_logits_per_request_bytes": None if peak is None else peak / batch - logits_bytes}
    ctx.log(f"engine: dgemma batch {batch}: {row['step_ms']:.2f} ms/step (model {row['model_ms_per_step']:.2f}, "
            f"sampler {row['sampler_pct']:.1f}%), {row['tokens_per_s']:.0f} tok/s")
    return row


def transformers_row(ctx: ReportContext, model, gc, ids, reps: int, C: int, ours_ms: float) -> dict:
    """transformers' `generate` on the same replica and seed: time, tokens/s, speed-up of ours, peak."""
    def theirs():
        torch.manual_seed(0)
        return model.generate(ids, generation_config=gc)
    theirs()
    ref = time_call(ctx, theirs, reps=max(1, reps - 1), warmup=0)
    batch = ids.shape[0]
    row = {"transformers_ms": ref["ms"], "transformers_range_ms": [ref["min_ms"], ref["max_ms"]],
           "transformers_tokens_per_s": batch * C / (ref["ms"] * 1e-3), "speedup_vs_transformers": ref["ms"] / ours_ms,
           "transformers_peak_extra_bytes": peak_extra_bytes(ctx, theirs)}
    ctx.log(f"engine: dgemma batch {batch}: transformers {row['transformers_tokens_per_s']:.0f} tok/s, "
            f"ours x{row['speedup_vs_transformers']:.2f}")
    return row


def _drafts_streamer():
    """A transformers streamer that keeps the argmax canvas after every denoising step (`put_draft`)."""
    from transformers.generation.streamers import BaseStreamer

    class Drafts(BaseStreamer):
        def __init__(self):
            self.steps: list[torch.Tensor] = []

        def put(self, value):
            pass

        def put_draft(self, value=None, **kwargs):
            self.steps.append(value)

        def end(self):
            pass
    return Drafts()


def agreement(a_sequences, b_sequences, a_steps: list, b_steps: list, prompt: int) -> dict:
    """How far two runs agree: `equal_fraction` of the generated tokens (`[B, N]` after `prompt`, compared
    over the shorter length) and `first_differing_step`, the first step whose argmax canvas (`[B, C]` per
    step, in order) differs in any row (None: every compared step equal; steps past the shorter list are not
    compared, `steps_compared` says how many were)."""
    a, b = a_sequences[:, prompt:].cpu(), b_sequences[:, prompt:].cpu()
    n = min(a.shape[1], b.shape[1])
    equal = int((a[:, :n] == b[:, :n]).sum()) / (a.shape[0] * n) if n else 1.0
    if a.shape[1] != b.shape[1]:
        equal *= n / max(a.shape[1], b.shape[1])
    first = None
    for i, (x, y) in enumerate(zip(a_steps, b_steps)):
        if not torch.equal(x.cpu(), y.cpu()):
            first = i
            break
    return {"equal_fraction": equal, "first_differing_step": first, "steps_compared": min(len(a_steps), len(b_steps))}


def _our_steps(out, batch: int, canvas: int) -> list[torch.Tensor]:
    """The argmax canvas `[B, C]` after each denoising step of one canvas, from `return_trace=True`."""
    steps, current = [], None
    for record in out.trace:
        if current is None:
            current = torch.zeros((batch, canvas), dtype=torch.long)
        current = current.clone()
        current[record.rows.cpu()] = record.tokens.cpu()
        steps.append(current)
    return steps


def identity(ctx: ReportContext, model, gc, ids) -> dict:
    """ours vs transformers, transformers vs itself and ours vs ours, from the same seed (`agreement`)."""
    import dlm

    prompt = ids.shape[1]

    def ours():
        torch.manual_seed(0)
        out = dlm.generate(model, ids, generation_config=gc, return_trace=True)
        return out.sequences, _our_steps(out, ids.shape[0], gc.max_new_tokens)

    def theirs():
        streamer = _drafts_streamer()
        torch.manual_seed(0)
        sequences = model.generate(ids, generation_config=gc, streamer=streamer)
        sequences = getattr(sequences, "sequences", sequences)
        return sequences, streamer.steps

    (a, a_steps), (b, b_steps) = ours(), theirs()
    (a2, a2_steps), (b2, b2_steps) = ours(), theirs()
    res = {"ours_vs_transformers": agreement(a, b, a_steps, b_steps, prompt),
           "transformers_vs_transformers": agreement(b, b2, b_steps, b2_steps, prompt),
           "ours_vs_ours": agreement(a, a2, a_steps, a2_steps, prompt)}
    o = res["ours_vs_transformers"]
    res["identical"] = o["equal_fraction"] == 1.0 and o["first_differing_step"] is None
    ctx.log(f"engine: dgemma batch {ids.shape[0]} identity: {o['equal_fraction']:.4f} of tokens equal, first "
            f"differing step {o['first_differing_step']}; transformers vs itself "
            f"{res['transformers_vs_transformers']['equal_fraction']:.4f}")
    return res


class _IdsTokenizer:
    """What the diffusers pipeline needs of a tokenizer when given token ids: the special ids."""

    def __init__(self, config):
        self.eos_token_id, self.mask_token_id = config.eos_token_id, config.mask_token_id
        self.pad_token_id = getattr(config, "pad_token_id", None) or config.eos_token_id

    def encode(self, text):
        raise ValueError("the replica has no tokenizer: pass token ids")

    def decode(self, ids, skip_special_tokens=True):
        return ""


def llada2_vs_diffusers(ctx: ReportContext) -> dict:
    """`dlm.generate` beside diffusers' `LLaDA2Pipeline` on the LLaDA2.0-mini replica, same budget."""
    try:
        import diffusers  # noqa: F401
    except ImportError:
        return {"skipped": "diffusers is not installed on this machine (carry its wheel to compare LLaDA2Pipeline)"}
    import dlm
    from dlm.bench.diffusers_llada2 import build_pipeline, run_llada2

    s = sizes(ctx)
    model, note = _build(ctx, "llada2-mini")
    cfg = model.config
    ids = random_prompt(ctx, 1, s["prompt"], cfg.mask_token_id, seed=0)
    kw = dict(gen_length=s["gen"], block_length=s["block"], steps=s["steps"])
    pipe, wrapper = build_pipeline(model, _IdsTokenizer(cfg))

    def ours():
        return dlm.generate(model, ids, sampler="confidence", kv_cache="prefix", eos_early_stop=False, **kw)

    def theirs():
        return run_llada2(pipe, wrapper, ids, None, mask_token_id=cfg.mask_token_id, eos_token_id=cfg.eos_token_id,
                          options={"eos_early_stop": False}, **kw)
    ours(), theirs()
    a = time_call(ctx, ours, reps=s["reps"], warmup=0, keep_output=True)
    b = time_call(ctx, theirs, reps=s["reps"], warmup=0, keep_output=True)
    mine, ref = a.pop("out"), b.pop("out")
    n = min(mine.sequences.shape[1], ref.sequences.shape[1])
    out = {"model": "llada2-mini", "layers": model.replica_info.layers, "budget": kw, "ours_ms": a["ms"],
           "ours_range_ms": [a["min_ms"], a["max_ms"]], "diffusers_ms": b["ms"], "diffusers_range_ms": [b["min_ms"], b["max_ms"]],
           "speedup": b["ms"] / a["ms"], "ours_nfe": mine.nfe, "diffusers_nfe": ref.nfe,
           "identical_tokens": bool(torch.equal(mine.sequences[:, :n].cpu(), ref.sequences[:, :n].cpu())), "note": note}
    del model, pipe, wrapper
    _release(ctx, collect=True)
    ctx.log(f"engine: llada2-mini ours {a['ms']:.0f} ms vs diffusers {b['ms']:.0f} ms (x{out['speedup']:.2f})")
    return out


def target(text: str, value, met, note: str | None = None) -> dict:
    t = {"target": text, "value": value, "met": met}
    if note:
        t["note"] = note
    return t


def masked_markdown_rows(rows: list[dict]) -> list[str]:
    lines = ["| batch | sampler | compile | NFE | ms/step [range of runs] | forward ms/step | overhead | tokens/s | "
             "reads/step | peak extra GB | first call s |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        peak = "n/a" if r["peak_extra_bytes"] is None else f"{r['peak_extra_bytes'] / 1e9:.2f}"
        lines.append(f"| {r['batch']} | {r['sampler']} | {r['compile']} | {r['nfe']} | {r['step_ms']:.2f} "
                     f"[{r['min_ms'] / r['nfe']:.2f}-{r['max_ms'] / r['nfe']:.2f}] | {r['forward_ms_per_step']:.2f} | "
                     f"{r['overhead_pct']:.1f}% | {r['tokens_per_s']:.0f} | {r['syncs_per_step']:.2f} | {peak} | "
                     f"{r['first_call_s']:.1f} |")
    return lines


def part_line(name: str, part) -> str | None:
    """One line for a part that did not give rows: skipped or failed."""
    if not isinstance(part, dict):
        return None
    if "error" in part:
        return f"- {name}: **failed**: `{part['error']}`"
    if set(part) == {"skipped"}:
        return f"- {name}: skipped: {part['skipped']}"
    return None
