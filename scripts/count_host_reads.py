"""Device->host reads per `dlm.generate` call, counted on CPU with `dlm.bench.syncs.HostSyncCounter`
(the operations that would stall the host on a GPU, outside the model's own forward).

    python scripts/count_host_reads.py

Models: the built-in tiny-dlm (masked; two prompts, 64 tokens in blocks of 32) and a tiny random
DiffusionGemma of transformers' class (uniform noise; two prompts, two 16-token canvases).
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import dlm  # noqa: E402
from dlm.bench.syncs import HostSyncCounter  # noqa: E402


def rows():
    from tests.dlm.dgemma_models import generation_config, tiny_diffusion_gemma

    model, tok = dlm.load("tiny-dlm")
    ids = torch.tensor([tok.encode_prompt("reverse: ana bo cyd tom")] * 2)
    masked = dict(gen_length=64, block_length=32, steps=32, sampler="confidence")
    yield "masked, confidence, 2 blocks of 32, no EOS stop", lambda: dlm.generate(model, ids, eos_early_stop=False,
                                                                                  kv_cache="none", **masked)
    yield "masked, confidence, EOS stop on", lambda: dlm.generate(model, ids, **masked)
    dg = tiny_diffusion_gemma(1, canvas_length=16, vocab=300)
    gc = generation_config(max_new_tokens=32, max_denoising_steps=16, entropy_bound=1.5, stability_threshold=0,
                           confidence_threshold=3.5, eos_token_id=[1])
    dids = torch.randint(3, 290, (2, 8), generator=torch.Generator().manual_seed(0))

    def exact():
        torch.manual_seed(0)
        return dlm.generate(dg, dids, generation_config=gc)
    yield "uniform, transformers' rule, 2 canvases", exact
    yield "uniform, threshold, 2 canvases", lambda: dlm.generate(dg, dids, generation_config=gc, sampler="threshold",
                                                                  steps=8, generator=torch.Generator().manual_seed(0))


def main() -> int:
    print("| loop, setting | forwards | reads | reads by operation |")
    print("|---|---|---|---|")
    for name, call in rows():
        call()  # warm-up: lazy imports and one-time set-up stay out of the count
        with HostSyncCounter() as syncs:
            out = call()
        ops = ", ".join(f"{k} {v}" for k, v in sorted(syncs.by_name.items()))
        print(f"| {name} | {out.nfe} | {syncs.count} | {ops} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
