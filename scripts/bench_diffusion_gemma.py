"""Wall time and peak memory of DiffusionGemma decoding: transformers' `model.generate` vs
`dlm.generate` with the same generation config, on identical tokens (checked every run).

    python scripts/bench_diffusion_gemma.py                       # every model below, batch 1 and 8
    python scripts/bench_diffusion_gemma.py --models random-32k --batches 8 --repeats 5 --json out.json

Models: `tiny-dgemma` (the shipped trained model with its generation_config.json, task prompts;
skipped when its checkpoint is absent), `random-300` and `random-32k` (transformers' real class,
random weights, vocabularies of 300 and 32768: the second shows the per-step vocabulary work that
dominates at Gemma's 262k vocabulary). Random weights never pass the argmax-stability test, so the
random models run with `stability_threshold=0` and a mean-entropy stop at which rows stop at
different steps (the situation a trained model is in); each row of the table says its config.

Method: one warm-up call of each engine, then `--repeats` alternating timed calls from the same
`torch.manual_seed` (the token equality is asserted on every call); the median is reported. Peak
memory is measured apart, each engine in a fresh child process (so neither sees memory the other
left with the allocator): the resident-set high-water mark during one call, after a warm-up call,
minus the resident set before it: what that call's decoding allocates at its peak (Linux `/proc`;
"n/a" elsewhere).
Run on one thread (`torch.set_num_threads(1)`) unless `--threads` says otherwise.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import dlm  # noqa: E402


def _rss_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def peak_mib(call) -> float | None:
    """Peak resident memory a call adds (MiB), or None where /proc cannot reset the peak."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return None
    before = _rss_kib("VmRSS")
    call()
    return (_rss_kib("VmHWM") - before) / 1024


def peak_in_child(engine: str, name: str, batch: int, threads: int) -> float | None:
    """`peak_mib` of one call of `engine` ("transformers" or "dlm"), in a fresh process."""
    import subprocess

    # A fixed mmap threshold: glibc would otherwise raise it after the warm-up frees its tables and
    # keep later vocabulary-sized tensors on the heap, hiding them from the resident-set peak.
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
    done = subprocess.run([sys.executable, __file__, "--peak-of", engine, "--models", name, "--batches", str(batch),
                           "--threads", str(threads)], capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise SystemExit(f"peak-memory child for {engine} {name} failed: {done.stderr.strip().splitlines()[-1:]}")
    value = done.stdout.strip().splitlines()[-1]
    return None if value == "n/a" else float(value)


def random_model(vocab: int):
    sys.path.insert(0, str(ROOT / "tests" / "dlm"))
    from dgemma_models import generation_config, tiny_diffusion_gemma

    model = tiny_diffusion_gemma(1, canvas_length=16, layers=2, sliding_window=64, vocab=vocab, sharpen=8.0)
    confidence = {300: 3.5, 32768: 7.0}[vocab]
    gc = generation_config(max_new_tokens=32, eos_token_id=[1], max_denoising_steps=16, entropy_bound=1.5,
                           stability_threshold=0, confidence_threshold=confidence)
    return model, gc, lambda batch: _random_prompts(batch, vocab)


def _random_prompts(batch: int, vocab: int):
    sys.path.insert(0, str(ROOT / "tests" / "dlm"))
    from dgemma_models import left_padded_prompts

    return left_padded_prompts(batch, 12, 1, vocab=vocab)


def trained_model():
    from dlm.tiny import BUILTIN_MODELS

    if not (Path(BUILTIN_MODELS["tiny-dgemma"]) / "config.json").is_file():
        return None
    loaded = dlm.load("tiny-dgemma")
    model, tokenizer = loaded.model, loaded.tokenizer
    from dlm.tasks import SUITES, get_task

    # held-out prompts, one per task in turn (list edits, arithmetic, puzzles)
    per_task = [get_task(name).examples("test", 2, seed=0) for name in SUITES["all"]]
    prompts = [examples[i].prompt for i in range(2) for examples in per_task]

    def encode(batch):
        rows = [tokenizer.encode_prompt(text) for text in prompts[:batch]]
        width = max(map(len, rows))
        pad = loaded.pad_token_id or 0
        ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows])
        mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
        return ids, mask
    return model, model.generation_config, encode


MODELS = {"tiny-dgemma": trained_model, "random-300": lambda: random_model(300), "random-32k": lambda: random_model(32768)}


def engines(model, gc, encode, batch: int):
    """The two calls compared: transformers' generate and ours, same config and seed."""
    ids, mask = encode(batch)
    kw = {"attention_mask": mask} if batch > 1 else {}

    def theirs():
        torch.manual_seed(0)
        return model.generate(ids, generation_config=gc, **kw)

    def ours():
        torch.manual_seed(0)
        return dlm.generate(model, ids, generation_config=gc, **kw)
    return theirs, ours


def bench(name: str, model, gc, encode, batch: int, repeats: int, threads: int) -> dict:
    theirs, ours = engines(model, gc, encode, batch)

    reference, candidate = theirs(), ours()  # warm-up, and the equality every timed call repeats
    times = {"transformers": [], "dlm": []}
    for _ in range(repeats):
        for label, call in (("transformers", theirs), ("dlm", ours)):
            start = time.perf_counter()
            out = call()
            times[label].append(time.perf_counter() - start)
            if not torch.equal(out.sequences, reference.sequences):
                raise SystemExit(f"{name} batch {batch}: {label} gave other tokens than the warm-up call")
    if not torch.equal(candidate.sequences, reference.sequences):
        raise SystemExit(f"{name} batch {batch}: dlm's tokens differ from transformers'")
    t, d = statistics.median(times["transformers"]), statistics.median(times["dlm"])
    return {
        "model": name, "batch": batch, "vocab": int(model.config.text_config.vocab_size),
        "canvas": int(model.config.canvas_length), "max_new_tokens": gc.max_new_tokens,
        "max_denoising_steps": gc.max_denoising_steps, "stability_threshold": gc.stability_threshold,
        "confidence_threshold": gc.confidence_threshold, "identical_tokens": True,
        "decoder_forwards_per_row": candidate.nfe_per_sequence.tolist(),
        "transformers_s": round(t, 4), "dlm_s": round(d, 4), "speedup": round(t / d, 3),
        "transformers_peak_mib": peak_in_child("transformers", name, batch, threads),
        "dlm_peak_mib": peak_in_child("dlm", name, batch, threads),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, from {list(MODELS)}")
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", default=None, help="write the rows as JSON here")
    parser.add_argument("--peak-of", choices=("transformers", "dlm"), default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    from transformers.utils import logging
    logging.set_verbosity_error()
    if args.peak_of:  # child process of peak_in_child: one model, one batch, one call
        theirs, ours = engines(*MODELS[args.models](), int(args.batches))
        call = theirs if args.peak_of == "transformers" else ours
        call()  # warm-up: one-time allocations (imports, mask functions) are not decoding memory
        peak = peak_mib(call)
        print("n/a" if peak is None else f"{peak:.2f}")
        return 0
    rows = []
    for name in args.models.split(","):
        if name not in MODELS:
            raise SystemExit(f"unknown model {name!r}; choose from {list(MODELS)}")
        built = MODELS[name]()
        if built is None:
            print(f"{name}: no checkpoint, skipped", file=sys.stderr)
            continue
        for batch in (int(b) for b in args.batches.split(",")):
            row = bench(name, *built, batch, args.repeats, args.threads)
            rows.append(row)
            print(json.dumps(row), file=sys.stderr)
    print("| model | vocab | batch | stop rule | transformers s | dlm s | speedup | peak MiB transformers / dlm |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        stop = f"stability {r['stability_threshold']}, entropy < {r['confidence_threshold']}"
        peaks = (f"{r['transformers_peak_mib']:.1f} / {r['dlm_peak_mib']:.1f}"
                 if r["transformers_peak_mib"] is not None else "n/a")
        print(f"| {r['model']} | {r['vocab']} | {r['batch']} | {stop} | {r['transformers_s']:.3f} | {r['dlm_s']:.3f} "
              f"| {r['speedup']:.2f}x | {peaks} |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
