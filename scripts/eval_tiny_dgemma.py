"""Evaluate tiny-dgemma with transformers' own `DiffusionGemmaForBlockDiffusion.generate`.

Accuracy per task and per suite (the suites' own verifiers) on held-out prompts, with the
checkpoint's generation_config.json (the shipped defaults) and, optionally, a quality-over-forwards
curve: the same prompts decoded under a sweep of `entropy_bound` and `max_denoising_steps`, each point
reported with generate's own `tokens_per_forward` (generated tokens up to EOS / decoder forwards,
averaged over sequences).

    # floors on the test split with the shipped config
    python scripts/eval_tiny_dgemma.py --split test --n 100
    # the curve (test split)
    python scripts/eval_tiny_dgemma.py --split test --n 50 --curve "0.02:32,0.1:16,0.5:8,2:4,8:2"
    # tuning generation_config.json: a grid on the validation split (never the test split)
    python scripts/eval_tiny_dgemma.py --split val --n 40 --grid

Splits: "test" is `dlm.tasks.split_of(prompt) == "test"`; "val" is the train-split subset that
training never sees (`dlm.tiny.dgemma.is_validation`).
"""
from __future__ import annotations

import argparse
import itertools
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dlm.tasks import SUITES, get_suite, split_of  # noqa: E402
from dlm.tiny.dgemma import generate_texts, generation_config, is_validation  # noqa: E402


def validation_examples(n_per_task: int, seed: int = 0, tasks=None) -> list:
    """`n_per_task` distinct validation examples per task (train split, `is_validation`)."""
    out = []
    for task in tasks or get_suite("all"):
        rng = random.Random(f"{task.name}|val|{seed}")
        seen: set[str] = set()
        tries = 0
        while len(seen) < n_per_task:
            tries += 1
            if tries > 20000 * max(n_per_task, 1):
                raise ValueError(f"task {task.name!r}: not enough validation prompts")
            ex = task._make(rng)
            if split_of(ex.prompt) == "train" and is_validation(ex.prompt) and ex.prompt not in seen:
                seen.add(ex.prompt)
                out.append((task, ex))
    return out


def test_examples(n_per_task: int, seed: int = 0, tasks=None) -> list:
    return [(t, ex) for t in tasks or get_suite("all") for ex in t.examples("test", n_per_task, seed=seed)]


def evaluate_prompts(model, tok, examples, generation: dict | None = None, seed: int = 0,
                     batch_size: int = 64) -> dict:
    """Decode `examples` ((task, Example) pairs) with `model.generate` and score them.

    generation: fields of `dlm.tiny.dgemma.generation_config`, or None for the model's own
    generation_config. Returns {"tasks": {name: acc}, "suites": {suite: mean of its tasks' acc},
    "tpf": mean tokens per forward, "seconds": wall time, "outputs": [...]}.
    """
    import torch

    torch.manual_seed(seed)   # generate samples (initial canvas, re-noising, multinomial)
    kwargs = {} if generation is None else {"generation_config": generation_config(**generation)}
    t0 = time.time()
    texts, tpf = [], []
    by_task: dict[str, list] = {}
    for task, ex in examples:
        by_task.setdefault(task.name, []).append((task, ex))
    scores: dict[str, list[float]] = {}
    outputs = []
    for name, group in by_task.items():   # one task per batch: prompts of similar length
        t, p = generate_texts(model, tok, [ex.prompt for _, ex in group], batch_size=batch_size, **kwargs)
        texts += t
        tpf += p
        for (task, ex), text in zip(group, t):
            scores.setdefault(name, []).append(task.score(ex, text))
            outputs.append({"task": name, "prompt": ex.prompt, "output": text})
    task_acc = {k: sum(v) / len(v) for k, v in scores.items()}
    suites = {}
    for suite in ("list_edits", "arithmetic", "puzzles"):
        accs = [task_acc[n] for n in SUITES[suite] if n in task_acc]
        if accs:
            suites[suite] = sum(accs) / len(accs)
    return {"tasks": task_acc, "suites": suites, "tpf": sum(tpf) / max(1, len(tpf)),
            "seconds": time.time() - t0, "outputs": outputs}


def _parse_curve(text: str) -> list[dict]:
    """"eb:steps[:t_max:t_min],..." -> generation overrides, one dict per point."""
    pts = []
    for item in filter(None, text.split(",")):
        parts = item.split(":")
        if len(parts) not in (2, 4):
            raise SystemExit(f"--curve: bad point {item!r}; use entropy_bound:steps or entropy_bound:steps:t_max:t_min")
        pt = {"entropy_bound": float(parts[0]), "max_denoising_steps": int(parts[1])}
        if len(parts) == 4:
            pt.update(t_max=float(parts[2]), t_min=float(parts[3]))
        pts.append(pt)
    return pts


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="checkpoint folder (default: the shipped tiny-dgemma)")
    ap.add_argument("--split", choices=("test", "val"), default="test")
    ap.add_argument("--n", type=int, default=50, help="prompts per task")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--curve", default="",
                    help="points entropy_bound:max_denoising_steps[:t_max:t_min], comma-separated")
    ap.add_argument("--grid", action="store_true", help="sweep entropy_bound, t_max/t_min, steps (tuning)")
    ap.add_argument("--grid-steps", type=int, default=32, help="max_denoising_steps in the --grid")
    ap.add_argument("--json", default=None, help="write all results here")
    args = ap.parse_args(argv)

    import torch

    from dlm.tiny.dgemma import load_tiny_dgemma

    torch.set_num_threads(args.threads)
    model, tok = load_tiny_dgemma(args.model)
    examples = (test_examples if args.split == "test" else validation_examples)(args.n, args.seed)
    shipped = model.generation_config
    base = dict(max_new_tokens=shipped.max_new_tokens, max_denoising_steps=shipped.max_denoising_steps,
                t_min=shipped.t_min, t_max=shipped.t_max, entropy_bound=shipped.sampler_config.entropy_bound,
                stability_threshold=shipped.stability_threshold, confidence_threshold=shipped.confidence_threshold)
    results = []

    def run(label, generation):
        r = evaluate_prompts(model, tok, examples, generation, seed=args.seed)
        s = r["suites"]
        print(f"{label:<42} list_edits {100 * s['list_edits']:5.1f}  arithmetic {100 * s['arithmetic']:5.1f}  "
              f"puzzles {100 * s['puzzles']:5.1f}  TPF {r['tpf']:5.2f}  {r['seconds']:5.0f}s", flush=True)
        results.append({"label": label, "generation": generation, "tasks": r["tasks"], "suites": s,
                        "tpf": r["tpf"], "seconds": r["seconds"]})
        return r

    print(f"split {args.split}, n {args.n} per task, seed {args.seed}; shipped config {base}")
    r = run("shipped generation_config", None)
    print("per task: " + ", ".join(f"{k} {100 * v:.0f}" for k, v in r["tasks"].items()))
    for pt in _parse_curve(args.curve):
        run(" ".join(f"{k} {v}" for k, v in pt.items()).replace("entropy_bound", "eb")
            .replace("max_denoising_steps", "steps"), dict(base, **pt))
    if args.grid:
        for eb, steps, (t_max, t_min) in itertools.product(
                (0.03, 0.1, 0.3, 1.0), (args.grid_steps,), ((0.8, 0.4), (0.4, 0.1), (0.2, 0.05))):
            run(f"eb {eb} steps {steps} t_max {t_max} t_min {t_min}",
                dict(base, entropy_bound=eb, max_denoising_steps=steps, t_max=t_max, t_min=t_min))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
