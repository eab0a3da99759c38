"""Peak decoding memory per row at real vocabularies (issue 40), on CPU: the engine beside the field's code.

    python scripts/bench_decode_memory.py                 # both families, batch 1 and 4
    python scripts/bench_decode_memory.py --family uniform --batches 1 --json out.json

uniform: transformers' `DiffusionGemmaForBlockDiffusion` class with Gemma's real vocabulary (262,144) and
canvas (256), hidden 64, one layer, random weights; one canvas at 4 denoising steps (adaptive stopping off);
`model.generate` vs `dlm.generate` with the same generation config and `torch.manual_seed` (tokens asserted
equal). masked: the LLaDA-8B replica's classes at LLaDA's vocabulary (126,464), hidden 64, one layer; a
32-token block after a 256-token prompt in 8 steps (`confidence`), without a cache and with the prefix
cache (the block's window against the cached prompt). Beside each peak: the size of the largest logits the
model returns in that call (float32), which any engine must hold once.

Method: each measurement runs in a fresh child process with `MALLOC_MMAP_THRESHOLD_=65536` (every tensor over
64 KiB is its own mapping, returned to the OS when freed, so the resident set tracks live tensors); one
warm-up call, then the peak resident set (VmHWM, reset via /proc/self/clear_refs) during one call minus the
resident set before it. One thread.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
GB = 1e9


def _uniform(engine: str, batch: int) -> tuple[float, list, int]:
    import torch
    from transformers import DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion
    from transformers.models.diffusion_gemma.generation_diffusion_gemma import (DiffusionGemmaGenerationConfig,
                                                                               EntropyBoundSamplerConfig)
    from transformers.utils import logging

    import dlm
    from dlm.bench.gpu import ReportContext, peak_extra_bytes

    logging.set_verbosity_error()
    V, C = 262_144, 256
    torch.manual_seed(0)
    text = dict(vocab_size=V, hidden_size=64, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                num_key_value_heads=1, head_dim=32, global_head_dim=32, num_experts=4, top_k_experts=2,
                moe_intermediate_size=32, sliding_window=64, pad_token_id=0, eos_token_id=1, bos_token_id=2,
                max_position_embeddings=2048)
    vision = dict(model_type="gemma4_vision", hidden_size=16, intermediate_size=16, num_hidden_layers=1,
                  num_attention_heads=1, num_key_value_heads=1, head_dim=16)
    model = DiffusionGemmaForBlockDiffusion(DiffusionGemmaConfig(
        text_config=text, vision_config=vision, canvas_length=C, image_token_id=V - 1, boi_token_id=V - 2,
        eoi_token_id=V - 3)).eval()
    gc = DiffusionGemmaGenerationConfig(sampler_config=EntropyBoundSamplerConfig(entropy_bound=0.1), max_new_tokens=C,
                                        max_denoising_steps=4, t_min=0.4, t_max=0.8, stability_threshold=0,
                                        confidence_threshold=None, eos_token_id=[1], pad_token_id=0)
    ids = torch.randint(3, 1000, (batch, 16), generator=torch.Generator().manual_seed(0))

    def call():
        torch.manual_seed(0)
        with torch.no_grad():
            if engine == "transformers":
                return model.generate(ids, generation_config=gc).sequences
            return dlm.generate(model, ids, generation_config=gc).sequences
    call()
    holder = {}
    ctx = ReportContext(torch.device("cpu"), torch.float32, True, 0.0)
    peak = peak_extra_bytes(ctx, lambda: holder.setdefault("out", call()))
    return peak, holder["out"][:, -C:].tolist(), C * V * 4


def _masked(engine: str, batch: int) -> tuple[float, list, int]:
    import torch

    import dlm
    from dlm.bench.gpu import ReportContext, peak_extra_bytes

    V, prompt, block = 126_464, 256, 32
    model = dlm.replica("llada-8b", layers=1, device="cpu", dtype=torch.float32,
                        overrides=dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=4,
                                       intermediate_size=128))
    ids = torch.randint(0, 126_000, (batch, prompt), generator=torch.Generator().manual_seed(0))
    kv = {"dlm-none": "none", "dlm-prefix": "prefix"}[engine]

    def call():
        return dlm.generate(model, ids, gen_length=block, block_length=block, steps=8, sampler="confidence",
                            kv_cache=kv, eos_early_stop=False).sequences
    call()
    holder = {}
    ctx = ReportContext(torch.device("cpu"), torch.float32, True, 0.0)
    peak = peak_extra_bytes(ctx, lambda: holder.setdefault("out", call()))
    # the largest logits of the call: a full forward over prompt + block (every step without a cache,
    # the block's first step with the prefix cache; later cached steps return the block's only)
    return peak, holder["out"][:, -block:].tolist(), (prompt + block) * V * 4


def child(family: str, engine: str, batch: int) -> None:
    import torch

    torch.set_num_threads(1)
    peak, tokens, logits = (_uniform if family == "uniform" else _masked)(engine, batch)
    print(json.dumps({"peak": peak, "tokens": tokens, "logits_bytes_per_row": logits}))


ENGINES = {"uniform": ("transformers", "dlm"), "masked": ("dlm-none", "dlm-prefix")}


def measure(family: str, engine: str, batch: int) -> dict:
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, __file__, "--child", family, engine, str(batch)], capture_output=True,
                          text=True, env=env)
    if done.returncode != 0:
        raise SystemExit(f"child {family}/{engine}/{batch} failed: {done.stderr.strip().splitlines()[-1:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--family", choices=("uniform", "masked", "both"), default="both")
    parser.add_argument("--batches", default="1,4")
    parser.add_argument("--json", help="write the rows here")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.child[0], args.child[1], int(args.child[2]))
        return 0
    families = ("uniform", "masked") if args.family == "both" else (args.family,)
    rows = []
    print("| family | engine | batch | peak extra GB | per row GB | largest logits GB/row | per row / logits | same tokens |")
    print("|---|---|---|---|---|---|---|---|")
    for family in families:
        for batch in [int(b) for b in args.batches.split(",")]:
            results = {engine: measure(family, engine, batch) for engine in ENGINES[family]}
            first = next(iter(results.values()))["tokens"]
            for engine, r in results.items():
                row = {"family": family, "engine": engine, "batch": batch, "peak_gb": r["peak"] / GB,
                       "per_row_gb": r["peak"] / batch / GB, "logits_gb_per_row": r["logits_bytes_per_row"] / GB,
                       "same_tokens": r["tokens"] == first}
                rows.append(row)
                print(f"| {family} | {engine} | {batch} | {row['peak_gb']:.3f} | {row['per_row_gb']:.3f} | "
                      f"{row['logits_gb_per_row']:.3f} | {row['per_row_gb'] / row['logits_gb_per_row']:.2f} | "
                      f"{row['same_tokens']} |", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
