"""Per-task and per-suite accuracy of tiny DLM checkpoints on the test (default) or validation split.

Decodes with `dlm.generate` (confidence sampler, greedy) and scores each output with its task's
verifier. `--steps` takes a list of forward-pass budgets, so one run gives the quality curve over
tokens per forward (64 steps at gen 64 = a budget of one token per step; an adaptive sampler such as
`threshold` may use fewer forwards, so the table gives the measured tokens per forward beside each
accuracy), and `--model` takes a list, so checkpoints are compared on the same examples in the same run.

    python scripts/eval_tiny_dlm.py                       # shipped checkpoint, 50 per task, 64 steps
    python scripts/eval_tiny_dlm.py --steps 64,32,16,8 --eos-stop --n 24 \
        --model tiny-dlm,/tmp/tiny_dlm_run --json /tmp/eval.json
    # choosing between checkpoints: the validation split, never the test split
    python scripts/eval_tiny_dlm.py --split val --n 50 --model /tmp/run_a,/tmp/run_b

Splits (`dlm.tasks.subset_of`): "test" is one prompt in ten; "val" is one in ten of the rest, left out of
training by scripts/train_tiny_dlm.py. `--exclude SEED:N` drops the prompts of an earlier draw (the first
N per task at SEED) and draws others in their place: a report on test prompts that took no part in
choosing a checkpoint that was chosen on test prompts (the shipped tiny-dlm: seed 0, up to 200 per task,
and the training runs' own evaluation, seed 123).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dlm.decoding_config import KV_CACHE_MODES  # noqa: E402
from dlm.tasks import SUITES, get_suite  # noqa: E402
from dlm.tiny import BUILTIN_MODELS, load_tiny_dlm  # noqa: E402


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
        from dlm.generation import generate
        out = generate(model, ids, attention_mask=att, gen_length=args.gen_length,
                       block_length=args.block_length, steps=args.steps, sampler=args.sampler,
                       mask_token_id=tok.mask_token_id, eos_token_id=tok.eos_token_id,
                       kv_cache=args.kv_cache, eos_early_stop=args.eos_stop)
        seqs, nfe = out.sequences, out.nfe
    else:
        seqs = simple_decode(model, ids, att, args.gen_length, args.block_length, args.steps,
                             tok.mask_token_id)
        nfe = args.steps
    return tok.batch_decode(seqs[:, P:]), nfe


def parse_steps(text: str) -> list[int]:
    """'64,32,16,8' -> [64, 32, 16, 8]; ValueError naming --steps otherwise."""
    try:
        steps = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        steps = []
    if not steps or any(k < 1 for k in steps):
        raise ValueError(f"--steps: expected positive integers separated by commas, got {text!r}")
    return steps


def resolve_model(name: str | None) -> str | None:
    """A built-in name ('tiny-dlm', ...) -> its checkpoint dir; anything else is a path."""
    if name is None:
        return None
    return BUILTIN_MODELS.get(name, name)


def parse_exclude(text: str) -> list[tuple[int, int]]:
    """'0:200,123:16' -> [(0, 200), (123, 16)] (seed, examples per task); '' -> []."""
    out = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        seed, sep, n = item.partition(":")
        if not sep or not seed.strip().lstrip("-").isdigit() or not n.strip().isdigit():
            raise ValueError(f"--exclude: expected SEED:N entries separated by commas, got {item!r}")
        out.append((int(seed), int(n)))
    return out


def draw_examples(task, split: str, n: int, seed: int, exclude: list[tuple[int, int]]) -> list:
    """`n` distinct examples of `split` at `seed`, none of them among the first N per task drawn at an
    excluded (SEED, N). Deterministic: the draw at `seed` with the excluded prompts skipped."""
    banned = {ex.prompt for s, k in exclude for ex in task.examples(split, k, seed=s)}
    if not banned:
        return task.examples(split, n, seed=seed)
    pool = task.examples(split, n + len(banned), seed=seed)
    kept = [ex for ex in pool if ex.prompt not in banned][:n]
    if len(kept) < n:
        raise ValueError(f"task {task.name!r}: fewer than {n} {split} prompts outside the excluded draws")
    return kept


def evaluate(model, tok, tasks, steps: int, args) -> dict:
    """Accuracy of one model at one step budget: {task: {"accuracy", "n", "nfe", "samples"}}."""
    run = argparse.Namespace(**{**vars(args), "steps": steps})
    results = {}
    for task in tasks:
        exs = draw_examples(task, args.split, args.n, args.seed, args.exclude)
        outs, nfe, batches = [], 0, 0
        for i in range(0, len(exs), args.batch_size):
            chunk = exs[i:i + args.batch_size]
            texts = [e.prompt if args.no_sep else e.input_text for e in chunk]
            o, k = decode(model, tok, texts, run)
            outs += o
            nfe += k
            batches += 1
        scores = [task.score(e, o) for e, o in zip(exs, outs)]
        # nfe: forwards of the batched calls, summed over batches (a batched call counts once)
        results[task.name] = {"accuracy": sum(scores) / len(scores), "n": len(exs), "nfe": nfe, "batches": batches,
                              "tpf": args.gen_length * batches / max(nfe, 1),
                              "samples": [{"prompt": e.prompt, "answer": e.answer, "output": o,
                                           "score": s} for e, o, s in list(zip(exs, outs, scores))[:5]]}
        if args.show:
            print(f"  {task.name:16s} {results[task.name]['accuracy']:6.3f}  (n={len(exs)}, steps={steps})",
                  flush=True)
            for e, o, s in list(zip(exs, outs, scores))[:args.show]:
                print(f"      {e.prompt!r} -> {o.split(chr(10))[0]!r} [{s:.0f}]", flush=True)
    return results


def suite_means(task_results: dict) -> dict[str, float]:
    """Mean task accuracy per suite present in the results, plus "mean" over all tasks."""
    out = {}
    for suite, names in SUITES.items():
        accs = [task_results[t]["accuracy"] for t in names if t in task_results]
        if suite != "all" and accs:
            out[suite] = sum(accs) / len(accs)
    out["mean"] = sum(r["accuracy"] for r in task_results.values()) / len(task_results)
    return out


def measured_tpf(task_results: dict) -> dict[str, float]:
    """Tokens per forward as measured, per suite present and "mean": generated tokens over the
    forwards the batched calls took (`tpf` of each task, weighted by its forwards)."""
    def tpf(names):
        rows = [task_results[t] for t in names if t in task_results]
        return sum(r["tpf"] * r["nfe"] for r in rows) / max(sum(r["nfe"] for r in rows), 1e-9) if rows else None
    out = {suite: tpf(names) for suite, names in SUITES.items() if suite != "all"}
    out = {k: v for k, v in out.items() if v is not None}
    out["mean"] = tpf(list(task_results))
    return out


def curve_table(results: dict, gen_length: int) -> str:
    """Markdown table: one row per (model, suite), one column per step budget; each cell is the
    accuracy (%) and, in brackets, the tokens per forward measured (an adaptive sampler, or EOS stop,
    takes fewer forwards than the budget: the budget's own is gen_length / steps, in the header)."""
    lines = []
    for model_name, by_steps in results.items():
        steps = list(by_steps)
        if not lines:
            head = " | ".join(f"{k} steps (budget {gen_length / k:g} tok/fwd): acc % (measured tok/fwd)" for k in steps)
            lines += [f"| model | suite | {head} |", "|---|---|" + "---:|" * len(steps)]
        means = {k: suite_means(by_steps[k]) for k in steps}
        speeds = {k: measured_tpf(by_steps[k]) for k in steps}
        for suite in means[steps[0]]:
            cells = " | ".join(f"{100 * means[k][suite]:.1f} ({speeds[k][suite]:.1f})" for k in steps)
            lines.append(f"| {model_name} | {suite} | {cells} |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="tiny-dlm",
                    help="checkpoint dir or built-in name; several, comma-separated, are compared")
    ap.add_argument("--suite", default="all")
    ap.add_argument("--n", type=int, default=50, help="examples per task")
    ap.add_argument("--split", choices=("test", "val"), default="test",
                    help="test: report; val: choose checkpoints and settings (never on test)")
    ap.add_argument("--exclude", default="",
                    help="SEED:N[,SEED:N...]: leave out the prompts of these earlier draws (first N per task at SEED)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--gen-length", type=int, default=64)
    ap.add_argument("--block-length", type=int, default=32)
    ap.add_argument("--steps", default="64",
                    help="forward-pass budget(s), comma-separated, e.g. 64,32,16,8 (budgets of 1, 2, 4, 8 tokens "
                         "per forward at gen 64)")
    ap.add_argument("--sampler", default="confidence")
    ap.add_argument("--kv-cache", default="none", choices=list(KV_CACHE_MODES))
    ap.add_argument("--eos-stop", action="store_true",
                    help="stop decoding a row once a finished block holds EOS (eos_early_stop)")
    ap.add_argument("--loop", default="generate", choices=["generate", "simple"],
                    help="dlm.generate (default) or the script's own reference loop")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--no-sep", action="store_true",
                    help="feed the raw prompt without the trailing newline separator")
    ap.add_argument("--show", type=int, default=1, help="print this many outputs per task")
    ap.add_argument("--json", default=None, help="write results here")
    args = ap.parse_args(argv)
    try:
        steps_list = parse_steps(args.steps)
        tasks = get_suite(args.suite)
        args.exclude = parse_exclude(args.exclude)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.n < 1:
        print("error: --n must be at least 1", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)

    results: dict[str, dict[int, dict]] = {}
    t_start = time.time()
    for name in filter(None, (m.strip() for m in args.model.split(","))):
        try:
            model, tok = load_tiny_dlm(resolve_model(name))
        except (FileNotFoundError, OSError) as err:
            print(f"error: --model {name!r}: {err}", file=sys.stderr)
            return 2
        results[name] = {}
        for steps in steps_list:
            print(f"{name}: steps={steps} (a budget of {args.gen_length / steps:g} tokens per forward)", flush=True)
            results[name][steps] = evaluate(model, tok, tasks, steps, args)
    print(f"split {args.split}, {args.n} per task, seed {args.seed}"
          + (f", excluding the draws {', '.join(f'{s}:{k}' for s, k in args.exclude)}" if args.exclude else ""))
    print(curve_table(results, args.gen_length))
    print(f"({time.time() - t_start:.0f}s)")
    if args.json:
        payload = {"settings": {k: v for k, v in vars(args).items() if k != "json"},
                   "models": {name: {str(k): {"suites": suite_means(r), "tasks": r}
                                     for k, r in by_steps.items()}
                              for name, by_steps in results.items()}}
        Path(args.json).write_text(json.dumps(payload, indent=2))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
