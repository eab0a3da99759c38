"""Per-task accuracy of a tiny DLM checkpoint on the TEST split of the task suites.

Decodes with `dlm.generate` (confidence sampler, greedy; by default one token per step:
steps = gen_length = 64) and scores each output with its task's verifier.

    python scripts/eval_tiny_dlm.py                       # shipped checkpoint, 50 per task
    python scripts/eval_tiny_dlm.py --model /tmp/tiny_dlm_run --n 100 --json /tmp/eval.json
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dlm.tasks import get_suite  # noqa: E402
from dlm.tiny import load_tiny_dlm  # noqa: E402


@torch.no_grad()
def simple_decode(model, input_ids, attention_mask, gen_length, block_length, steps, mask_id):
    """Fallback loop (one forward per step, commit the most confident masked positions of the
    current block, argmax) for when `dlm.generate` is unavailable."""
    B, P = input_ids.shape
    x = torch.cat([input_ids, torch.full((B, gen_length), mask_id, dtype=torch.long)], 1)
    att = torch.cat([attention_mask, torch.ones(B, gen_length, dtype=torch.long)], 1)
    nblocks = gen_length // block_length
    per_block = steps // nblocks
    for b in range(nblocks):
        s, e = P + b * block_length, P + (b + 1) * block_length
        for k in range(per_block):
            masked = x[:, s:e] == mask_id
            if not masked.any():
                break
            left = masked.sum(1)
            n = (left + (per_block - k) - 1) // (per_block - k)  # ceil
            logits = model(x, attention_mask=att).logits[:, s:e]
            logits[..., mask_id] = -float("inf")
            p, tok = logits.softmax(-1).max(-1)
            p = torch.where(masked, p, torch.full_like(p, -1.0))
            order = p.argsort(1, descending=True).argsort(1)  # rank of each position
            sel = masked & (order < n[:, None])
            x[:, s:e] = torch.where(sel, tok, x[:, s:e])
    return x


def decode(model, tok, prompts, args):
    enc = [tok.encode(p) for p in prompts]
    ids, att = tok.pad_batch(enc)
    ids, att = torch.tensor(ids), torch.tensor(att)
    P = ids.shape[1]
    if args.loop == "generate":
        from dlm.generate import generate
        out = generate(model, ids, attention_mask=att, gen_length=args.gen_length,
                       block_length=args.block_length, steps=args.steps, sampler=args.sampler,
                       mask_token_id=tok.mask_token_id, eos_token_id=tok.eos_token_id,
                       kv_cache=args.kv_cache)
        seqs, nfe = out.sequences, out.nfe
    else:
        seqs = simple_decode(model, ids, att, args.gen_length, args.block_length, args.steps,
                             tok.mask_token_id)
        nfe = args.steps
    return tok.batch_decode(seqs[:, P:]), nfe


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="checkpoint dir (default: shipped tiny-dlm)")
    ap.add_argument("--suite", default="all")
    ap.add_argument("--n", type=int, default=50, help="test examples per task")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--gen-length", type=int, default=64)
    ap.add_argument("--block-length", type=int, default=32)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--sampler", default="confidence")
    ap.add_argument("--kv-cache", default="none", choices=["none", "prefix", "dual"])
    ap.add_argument("--loop", default="generate", choices=["generate", "simple"],
                    help="dlm.generate (default) or the script's own reference loop")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--no-sep", action="store_true",
                    help="feed the raw prompt without the trailing newline separator")
    ap.add_argument("--show", type=int, default=1, help="print this many outputs per task")
    ap.add_argument("--json", default=None, help="write results here")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)

    model, tok = load_tiny_dlm(args.model)
    results = {}
    t_start = time.time()
    for task in get_suite(args.suite):
        exs = task.examples("test", args.n, seed=args.seed)
        outs, nfe = [], 0
        for i in range(0, len(exs), args.batch_size):
            chunk = exs[i:i + args.batch_size]
            texts = [e.prompt if args.no_sep else e.input_text for e in chunk]
            o, k = decode(model, tok, texts, args)
            outs += o
            nfe += k
        scores = [task.score(e, o) for e, o in zip(exs, outs)]
        acc = sum(scores) / len(scores)
        results[task.name] = {"accuracy": acc, "n": len(exs), "nfe": nfe,
                              "samples": [{"prompt": e.prompt, "answer": e.answer, "output": o,
                                           "score": s} for e, o, s in list(zip(exs, outs, scores))[:5]]}
        print(f"{task.name:16s} {acc:6.3f}  (n={len(exs)})", flush=True)
        for e, o, s in list(zip(exs, outs, scores))[:args.show]:
            print(f"    {e.prompt!r} -> {o.split(chr(10))[0]!r} [{s:.0f}]", flush=True)
    mean = sum(r["accuracy"] for r in results.values()) / len(results)
    print(f"{'mean':16s} {mean:6.3f}   ({time.time() - t_start:.0f}s)")
    if args.json:
        payload = {"settings": {k: v for k, v in vars(args).items() if k != "json"},
                   "mean_accuracy": mean, "tasks": results}
        Path(args.json).write_text(json.dumps(payload, indent=2))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
