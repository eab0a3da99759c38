"""Report section: the pure model forward of each real-size replica at its decoding shape, beside the
weight-streaming floor.

    from dlm.bench.gpu import ReportContext
    from dlm.bench.gpu import replica_forward
    result = replica_forward.run(ctx)          # plain JSON data
    print(replica_forward.markdown(result))    # the table for report.md

For each replica of `dlm.replicas` (built on the device one at a time, freed before the next) and each
batch of `BATCHES` the memory allows, it times one forward of the decoding shape:
- LLaDA-8B, Dream-7B: a 32-token block after a 256-token prompt, without a cache (`full`: all 288
  positions, what `kv_cache="none"` runs every step when the block is the last one; with more blocks to
  generate the uncached forward also covers their masks) and with the prefix cache (`prefix`: the 32-token
  window against the cached 288 positions, what `kv_cache="prefix"` runs between refreshes);
- LLaDA2.0-mini: the same two, block-causal (`full` is what LLaDA2's own generate runs every step:
  `x[:, :block_end]` under its block mask; `prefix` is exact for this model);
- DiffusionGemma-26B-A4B: one decoder forward over a 256-token canvas with self-conditioning, against an
  encoder cache of a 256-token prompt (`decoder`), through the engine's own decoder call.
Beside each time: the bytes that forward must read (`dlm.replicas.forward_cost`: weights, experts expected
under uniform routing, cached K/V) and the floor `bytes / copy bandwidth`, with the % of the floor reached
(100% = at the floor); the all-experts upper bound for the MoE models; the compute floor `FLOPs / matmul
rate` and the roofline floor (the larger one: batched full forwards are compute-bound, e.g. LLaDA-8B's
288-token forward is 4.4 TFLOP, 6 ms at 700 TFLOP/s, above its 5 ms streaming floor); and the peak memory
above the weights while the forward runs; at batch 1 also the host's enqueue time of the forward (near the
measured time: host-bound). The rates are the machine section's `ctx.facts["copy_gbps"]` and
`ctx.facts["matmul_tflops"]`, or measured here when that section did not run (device-to-device copy, read +
write bytes over time; a square matmul in the run's dtype).

A replica too large for the free memory is built with the deepest `layers=` that fits, and the table states
the depth; a batch that runs out of memory is recorded as such and the larger batches are skipped. In smoke
mode (`ctx.smoke`: CPU, float32) every replica is built at `TINY_OVERRIDES` width and 2 layers, with shorter
sequences, through the same code.
"""
from __future__ import annotations

import gc
import time
import traceback

import torch

from dlm.bench.gpu import ReportContext, enqueue_ms, peak_extra_bytes, time_call

BATCHES = (1, 4, 16)
PROMPT, BLOCK, CANVAS = 256, 32, 256
SMOKE = {"batches": (1, 2), "prompt": 32, "block": 8, "layers": 2, "reps": 2, "warmup": 1}
# A replica is not started with less than this left before the report's deadline.
MIN_SECONDS_PER_REPLICA = 20.0
MIN_START_S = MIN_SECONDS_PER_REPLICA


def measure_copy_gbps(ctx: ReportContext, megabytes: int | None = None) -> float:
    """Device-to-device copy bandwidth in GB/s (1e9 bytes), counting the bytes read and written:
    `2 * size / time` of `dst.copy_(src)`, median of `time_call`'s runs."""
    size = (megabytes or (16 if ctx.smoke else 1024)) << 20
    src = torch.empty(size, dtype=torch.uint8, device=ctx.device)
    dst = torch.empty_like(src)
    timing = time_call(ctx, lambda: dst.copy_(src), reps=3 if ctx.smoke else 20, warmup=1 if ctx.smoke else 3)
    del src, dst
    return 2 * size / (timing["ms"] * 1e-3) / 1e9


def measure_matmul_tflops(ctx: ReportContext, n: int | None = None) -> float:
    """Dense matmul rate in TFLOP/s of `ctx.dtype` square products (`2 n^3 / time`, median of `time_call`)."""
    n = n or (256 if ctx.smoke else 8192)
    a = torch.randn((n, n), device=ctx.device, dtype=ctx.dtype)
    b = torch.randn((n, n), device=ctx.device, dtype=ctx.dtype)
    timing = time_call(ctx, lambda: a @ b, reps=3 if ctx.smoke else 20, warmup=1 if ctx.smoke else 3)
    del a, b
    return 2 * n ** 3 / (timing["ms"] * 1e-3) / 1e12


def _release(ctx: ReportContext, collect: bool = False) -> None:
    """Return freed device memory before the next batch, and with `collect` (between replicas) also a model
    held in reference cycles. The collection costs most of a second with transformers loaded, so it runs on
    the GPU only, where the next replica needs the memory."""
    if ctx.device.type == "cuda":
        if collect:
            gc.collect()
        torch.cuda.empty_cache()


def _build(ctx: ReportContext, name: str):
    """(replica on the device, note): at full depth, or the deepest that fits when the whole does not
    (the note is the `ReplicaTooLarge` message, and `replica_info.layers` the depth built). Raises
    `ReplicaTooLarge` when not even one layer fits."""
    from dlm.replicas import TINY_OVERRIDES, ReplicaTooLarge, replica

    kw = dict(layers=SMOKE["layers"], overrides=TINY_OVERRIDES[name]) if ctx.smoke else {}
    try:
        return replica(name, device=ctx.device, dtype=ctx.dtype, **kw), None
    except ReplicaTooLarge as error:
        if error.fit_layers < 1:
            raise
        kw["layers"] = error.fit_layers
        return replica(name, device=ctx.device, dtype=ctx.dtype, **kw), str(error)


def _masked_calls(model, batch: int, prompt: int, block: int, device):
    """{mode: (zero-argument forward, rows, query tokens, cached positions)} for a masked replica: the full
    forward of prompt + block and the block's window against the prefix cache of those positions."""
    vocab, mask_id = model.config.vocab_size, model.config.mask_token_id
    gen = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randint(0, min(vocab, mask_id), (batch, prompt + block), generator=gen).to(device)
    x[:, prompt:] = mask_id
    with torch.no_grad():
        cache = model(x, use_cache=True).past_key_values
    length = prompt + block

    def full():
        with torch.no_grad():
            return model(x).logits

    def window():
        with torch.no_grad():
            return model(x[:, prompt:], past_key_values=cache, cache_window=(prompt, length)).logits

    return {"full": (full, batch, length, 0), "prefix": (window, batch, block, prompt)}


def _dgemma_calls(model, batch: int, prompt: int, device):
    """{"decoder": ...}: one decoder forward over a canvas with self-conditioning logits, against the
    encoder cache of a `prompt`-token prompt, through the engine's own `DiffusionGemmaCanvasModel`."""
    from transformers import DynamicCache

    from dlm.engine.uniform.canvas_model import DiffusionGemmaCanvasModel

    canvas_model = DiffusionGemmaCanvasModel(model)
    C, V = canvas_model.canvas_length, canvas_model.vocab_size
    gen = torch.Generator(device="cpu").manual_seed(0)
    ids = torch.randint(3, V, (batch, prompt), generator=gen).to(device)
    canvas = torch.randint(0, V, (batch, C), generator=gen).to(device)
    mask = torch.ones((batch, prompt), dtype=torch.bool, device=device)
    positions = torch.arange(prompt, dtype=torch.int32, device=device).unsqueeze(0)
    dec_positions = torch.arange(prompt, prompt + C, dtype=torch.int32, device=device).unsqueeze(0)
    with torch.no_grad():
        cache = canvas_model.encode(ids, mask, DynamicCache(config=model.config.get_text_config(decoder=True)),
                                    positions, is_prefill=True)
        masks = canvas_model.decoder_masks(None, cache, canvas)
        # [B, C, V] drawn on the device: at V = 262,144 and batch 16 a host draw and copy would take seconds
        on_device = torch.Generator(device=device).manual_seed(0)
        self_conditioning = torch.randn((batch, C, V), generator=on_device, device=device,
                                        dtype=canvas_model.embed_dtype)

    def decoder():
        # what the engine runs per denoising step besides the rule: the self-conditioning input from the
        # previous logits (softmax over the vocabulary @ the embedding table, `soft_embeddings`) and the
        # decoder forward with its head
        with torch.no_grad():
            soft = canvas_model.soft_embeddings(self_conditioning.view(batch * C, V)).view(batch, C, -1)
            return canvas_model.decode(canvas, soft, masks, cache, dec_positions)

    return {"decoder": (decoder, batch, C, prompt)}


def _is_oom(error: BaseException) -> bool:
    return isinstance(error, torch.cuda.OutOfMemoryError) or "out of memory" in str(error).lower()


def _measure(ctx: ReportContext, model, call, rows: int, query: int, cached: int, rates: dict) -> dict:
    """One forward's time (median and range), peak memory above the weights, and its floors: weight
    streaming (`floor_ms`, the issue's floor), compute (`compute_floor_ms`) and the larger of the two
    (`roofline_floor_ms`), each with the % of it the measured time reaches."""
    from dlm.replicas import forward_cost

    reps, warmup = (SMOKE["reps"], SMOKE["warmup"]) if ctx.smoke else (10, 2)
    timing = time_call(ctx, call, reps=reps, warmup=warmup)
    peak = peak_extra_bytes(ctx, call)
    cost = forward_cost(model, rows=rows, query_tokens=query, cached_positions=cached)
    floor, compute = cost.floor_ms(rates["copy_gbps"]), cost.compute_floor_ms(rates["matmul_tflops"])
    roofline = max(floor, compute)
    return {"tokens": query, "cached": cached, **timing, "floor_ms": floor, "pct_of_floor": 100.0 * floor / timing["ms"],
            "compute_floor_ms": compute, "roofline_floor_ms": roofline,
            "pct_of_roofline": 100.0 * roofline / timing["ms"], "bound": "memory" if floor >= compute else "compute",
            "bytes": cost.bytes, "weight_bytes": cost.weight_bytes,
            "weight_bytes_all_experts": cost.weight_bytes_all_experts, "kv_bytes": cost.kv_bytes,
            "experts_per_layer": cost.experts_per_layer, "flops": cost.flops,
            "floor_ms_all_experts": (cost.weight_bytes_all_experts + cost.kv_bytes) / (rates["copy_gbps"] * 1e9) * 1e3,
            "peak_extra_bytes": peak}


def _replica_rows(ctx: ReportContext, name: str, model, rates: dict) -> tuple[list[dict], list[str]]:
    """Every (batch, mode) measurement of one replica, and notes on what was skipped and why."""
    prompt, block = (SMOKE["prompt"], SMOKE["block"]) if ctx.smoke else (PROMPT, BLOCK)
    rows, notes = [], []
    for batch in SMOKE["batches"] if ctx.smoke else BATCHES:
        if ctx.time_left() <= 0:
            notes.append(f"batch {batch} and larger: skipped, the report's deadline passed")
            break
        out_of_memory = False
        try:
            calls = (_dgemma_calls(model, batch, prompt, ctx.device) if not hasattr(model, "lm")
                     else _masked_calls(model, batch, prompt, block, ctx.device))
            for mode, (call, n_rows, query, cached) in calls.items():
                rows.append({"batch": batch, "mode": mode,
                             **_measure(ctx, model, call, n_rows, query, cached, rates)})
                if batch == 1:
                    # the floor rows: how long the host takes to queue the forward (near the measured time:
                    # host-bound); the CUDA-graph replay of the same forward is in `extras`
                    rows[-1]["enqueue_ms"] = enqueue_ms(ctx, call, SMOKE["reps"] if ctx.smoke else 10)
            del calls
        except (torch.cuda.OutOfMemoryError, RuntimeError) as error:
            if not _is_oom(error):
                raise
            out_of_memory = True  # released below, once the traceback no longer holds the batch's tensors
        if out_of_memory:
            notes.append(f"batch {batch}: out of memory; larger batches skipped")
            _release(ctx, collect=True)
            break
        _release(ctx)
    return rows, notes


def run(ctx: ReportContext, names=None) -> dict:
    """Measure the replicas `names` (default: all of `dlm.replicas.REPLICA_NAMES`; see the module docstring).

    Reads `ctx.facts["copy_gbps"]` and `ctx.facts["matmul_tflops"]` (the machine section's), measuring and
    storing either when absent. Returns {"copy_gbps", "copy_source", "matmul_tflops", "matmul_source",
    "shape": {...}, "replicas": [{name, checkpoint, layers, full_layers, dtype, parameters, parameter_bytes,
    build_seconds, overrides, experts_implementation, fallback_init, note, rows, skipped}] (or {name, error,
    traceback} where a replica failed at real size: the run goes on to the next one)}; each row:
    batch, mode, tokens, cached, ms / min_ms / max_ms / reps, floor_ms and pct_of_floor (weight streaming),
    compute_floor_ms, roofline_floor_ms, pct_of_roofline, bound, bytes, weight_bytes,
    weight_bytes_all_experts, floor_ms_all_experts, kv_bytes, experts_per_layer, flops, peak_extra_bytes."""
    from dlm.replicas import REPLICA_NAMES

    rates, sources = {}, {}
    for key, measure, how in (("copy_gbps", measure_copy_gbps, "device copy, read + write bytes"),
                              ("matmul_tflops", measure_matmul_tflops, f"{ctx.dtype} square matmul")):
        rates[key], sources[key] = ctx.facts.get(key), "machine section"
        if not rates[key]:
            rates[key], sources[key] = measure(ctx), f"measured by this section ({how})"
            ctx.facts[key] = rates[key]
    prompt, block = (SMOKE["prompt"], SMOKE["block"]) if ctx.smoke else (PROMPT, BLOCK)
    out = {"copy_gbps": rates["copy_gbps"], "copy_source": sources["copy_gbps"],
           "matmul_tflops": rates["matmul_tflops"], "matmul_source": sources["matmul_tflops"],
           "shape": {"prompt": prompt, "block": block, "canvas": "the replica's canvas_length",
                     "batches": list(SMOKE["batches"] if ctx.smoke else BATCHES)},
           "replicas": []}
    for name in REPLICA_NAMES if names is None else names:
        if not ctx.smoke and ctx.time_left() < MIN_SECONDS_PER_REPLICA:
            out["replicas"].append({"name": name, "skipped": ["not started: too little time before the deadline"]})
            continue
        try:
            out["replicas"].append(_run_replica(ctx, name, rates))
        except Exception as error:  # noqa: BLE001 - one GPU window: record, free, measure the next replica
            if ctx.smoke:
                raise  # on CPU a failure is a bug the tests must see
            out["replicas"].append({"name": name, "error": f"{type(error).__name__}: {error}"[:500],
                                    "traceback": traceback.format_exc()[-2000:]})
        _release(ctx, collect=True)
    return out


def _run_replica(ctx: ReportContext, name: str, rates: dict) -> dict:
    """Build one replica, measure it, free it; its entry of `run`'s "replicas"."""
    from dlm.replicas import ReplicaTooLarge

    ctx.log(f"replica_forward: building {name}")
    started = time.perf_counter()
    try:
        model, note = _build(ctx, name)
    except ReplicaTooLarge as error:
        return {"name": name, "skipped": [str(error)]}
    info = model.replica_info
    ctx.log(f"replica_forward: {name} built in {time.perf_counter() - started:.1f} s "
            f"({info.parameter_bytes / 1e9:.1f} GB, {info.layers}/{info.full_layers} layers)")
    rows, skipped = _replica_rows(ctx, name, model, rates)
    return {"name": name, "checkpoint": info.checkpoint, "layers": info.layers, "full_layers": info.full_layers,
            "dtype": info.dtype, "parameters": info.parameters, "parameter_bytes": info.parameter_bytes,
            "build_seconds": info.build_seconds, "overrides": info.overrides,
            "experts_implementation": info.experts_implementation, "fallback_init": list(info.fallback_init),
            "note": note, "rows": rows, "skipped": skipped}


def markdown(result: dict) -> str:
    """The section's table: one line per (replica, batch, forward)."""
    lines = [f"Copy bandwidth {result['copy_gbps']:.0f} GB/s ({result['copy_source']}); matmul "
             f"{result['matmul_tflops']:.1f} TFLOP/s ({result['matmul_source']}); prompt {result['shape']['prompt']}, "
             f"block {result['shape']['block']}. Floors: weight streaming = bytes read / copy bandwidth (MoE: experts "
             "expected under uniform routing; all experts in brackets); compute = FLOPs / matmul rate; "
             "% = floor / measured time.", "",
             "| replica | layers | batch | forward | ms (min-max) | streaming floor ms | % of it | compute floor ms "
             "| bound | % of roofline | GB read | peak extra GB | host enqueue ms |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for rep in result["replicas"]:
        for row in rep.get("rows", []):
            mode = {"full": f"full {row['tokens']} tok", "prefix": f"{row['tokens']} tok + cache {row['cached']}",
                    "decoder": f"canvas {row['tokens']}, prompt {row['cached']}"}[row["mode"]]
            peak = row["peak_extra_bytes"]
            streaming = f"{row['floor_ms']:.2f}"
            if row["experts_per_layer"] is not None:
                streaming += f" ({row['floor_ms_all_experts']:.2f})"
            lines.append(
                f"| {rep['name']} | {rep['layers']}/{rep['full_layers']} | {row['batch']} | {mode} | "
                f"{row['ms']:.2f} ({row['min_ms']:.2f}-{row['max_ms']:.2f}) | {streaming} | {row['pct_of_floor']:.0f}% | "
                f"{row['compute_floor_ms']:.2f} | {row['bound']} | {row['pct_of_roofline']:.0f}% | "
                f"{row['bytes'] / 1e9:.2f} | {'n/a' if peak is None else f'{peak / 1e9:.2f}'} | "
                f"{'-' if 'enqueue_ms' not in row else format(row['enqueue_ms'], '.2f')} |")
        for note in ([rep["note"]] if rep.get("note") else []) + rep.get("skipped", []) + (
                [f"error: {rep['error']}"] if rep.get("error") else []):
            lines.append(f"| {rep['name']} | | | {note} | | | | | | | | | |")
    return "\n".join(lines)
