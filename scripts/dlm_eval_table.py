"""The standard dLLM table (Fast-dLLM / d3LLM style) through lm-evaluation-harness, one command away.

Every run (a set of `--model_args` of the harness model `dlm`) at every generation length on every task:
accuracy (the harness's), generated tokens per second, tokens per forward and the speed-up against the
first run (the one-token-per-step baseline), written as table.md, table.json and accuracy_vs_tpf.png.

    # here, on the built-in model and its local tasks (what the tests run):
    python scripts/dlm_eval_table.py --model tiny-dlm --tasks dlm_tiny_arithmetic:0,dlm_tiny_reverse:0 \\
        --run sampler=confidence,steps=gen --run sampler=threshold,steps=gen \\
        --gen-lengths 64 --block-length 32 --limit 16 --out runs/eval-table
    # on a GPU with real weights: docs/eval.md, "The standard table" (GSM8K 5-shot, MATH 4-shot, HumanEval,
    # MBPP 3-shot at 256 and 512 tokens, blocks of 32)

`--run` takes the harness's model_args syntax; `steps=gen` (the default) sets the budget to the
generation length: one token per step for a fixed-rate sampler (the baseline), and a cap an adaptive
sampler (threshold, Fast-dLLM's rule) stays under by committing several tokens per step. Our `steps` is
a hard budget, unlike Fast-dLLM's (where steps = gen / block only has to divide the blocks): a budget of
gen / block forces one-shot blocks. `gen_length`, `block_length` and `seed` come from the script's options. `--tasks`
entries are `name:shots`. Accuracy is the task's first metric (after the first filter that has one,
`strict-match` first); tokens per second count generated tokens up to EOS over the wall time of the
decoding calls (warm-up excluded), TPF generated tokens per forward (`dlm.evaluation.counts`).
"""
from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def parse_run(text: str) -> dict:
    """`key=value,...` in the harness's own parsing (numbers and true/false typed)."""
    from lm_eval.utils import simple_parse_args_string

    args = simple_parse_args_string(text)
    if not args:
        raise ValueError(f"--run {text!r}: give model_args such as sampler=threshold,steps=gen")
    for key in ("pretrained", "gen_length", "block_length"):
        if key in args:
            raise ValueError(f"--run {text!r}: {key} comes from the script's options (--model, --gen-lengths, "
                             "--block-length), not from a run")
    return args


def parse_tasks(text: str) -> list[tuple[str, int | None]]:
    out = []
    for entry in [t.strip() for t in text.split(",") if t.strip()]:
        name, _, shots = entry.partition(":")
        if shots and not shots.isdigit():
            raise ValueError(f"--tasks entry {entry!r}: the shots after ':' must be a whole number")
        out.append((name, int(shots) if shots else None))
    if not out:
        raise ValueError("--tasks is empty; give e.g. gsm8k:5")
    return out


def resolve_steps(value, gen_length: int):
    """`gen` -> gen_length (one token per step at most), else the number given."""
    return gen_length if value == "gen" else value


def headline_metric(task_results: dict) -> tuple[str, float]:
    """The task's accuracy: its first metric, `strict-match` filter first, then any other filter."""
    keys = [k for k, v in task_results.items() if "," in k and "_stderr" not in k and isinstance(v, (int, float))]
    if not keys:
        raise ValueError(f"no metric in the harness's results {sorted(task_results)}")
    keys.sort(key=lambda k: (not k.endswith(",strict-match"), not k.endswith(",none")))
    return keys[0], float(task_results[keys[0]])


def run_table(args) -> dict:
    import lm_eval
    from lm_eval.tasks import TaskManager

    import dlm
    from dlm.evaluation import TASKS_DIR
    from dlm.evaluation.counts import summarize
    from dlm.lm_eval import DLMEvalLM

    runs = [parse_run(r) for r in args.run]
    tasks = parse_tasks(args.tasks)
    include = [str(TASKS_DIR)] + ([args.include_path] if args.include_path else [])
    manager = TaskManager(include_path=include, include_defaults=not args.local_tasks_only)
    loaded = dlm.load(args.model, device=args.device, dtype=None if args.dtype == "auto" else getattr(__import__("torch"), args.dtype))
    rows = []
    for gen_length in args.gen_lengths:
        for r, run in enumerate(runs):
            model_args = {**run, "gen_length": gen_length, "block_length": args.block_length, "seed": args.seed,
                          "steps": resolve_steps(run.get("steps", "gen"), gen_length)}
            for task, shots in tasks:
                lm = DLMEvalLM(pretrained=loaded, batch_size=args.batch_size, device=args.device, **model_args)
                results = lm_eval.simple_evaluate(
                    model=lm, tasks=[task], num_fewshot=shots, limit=args.limit, task_manager=manager,
                    apply_chat_template=args.apply_chat_template, confirm_run_unsafe_code=args.confirm_run_unsafe_code,
                    random_seed=args.seed, numpy_random_seed=args.seed, torch_random_seed=args.seed,
                    fewshot_random_seed=args.seed, log_samples=False)
                metric, value = headline_metric(results["results"][task])
                gen = summarize(lm.records).get("generate_until")
                if gen is None:
                    raise ValueError(f"task {task!r} made no generate_until requests: the table reports generation "
                                     "speed, so give generation tasks (gsm8k, humaneval, ...)")
                rows.append({"task": task, "shots": shots, "gen_length": gen_length, "run": args.run[r],
                             "model_args": model_args, "metric": metric, "accuracy": 100.0 * value,
                             "tokens_per_s": gen["tokens_per_s"], "tpf": gen["tpf"],
                             "forwards_per_request": gen["forwards"] / gen["requests"], "requests": gen["requests"],
                             "generated_tokens": gen["generated_tokens"], "seconds": gen["seconds"]})
    for row in rows:  # speed-up against the first run on the same task and length
        base = next(b for b in rows if b["task"] == row["task"] and b["gen_length"] == row["gen_length"]
                    and b["run"] == args.run[0])
        row["speedup"] = row["tokens_per_s"] / base["tokens_per_s"] if base["tokens_per_s"] else None
        row["tpf_ratio"] = row["tpf"] / base["tpf"] if base["tpf"] else None
    return {"model": args.model, "block_length": args.block_length, "limit": args.limit, "seed": args.seed,
            "command": args.command, "rows": rows}


def markdown(table: dict) -> str:
    lines = [f"Model `{table['model']}`, blocks of {table['block_length']}, limit {table['limit']}, seed {table['seed']}. "
             f"Made by:", "", "```bash", table["command"], "```", "",
             "|task|gen|run|accuracy|tokens/s|TPF|forwards/request|speed-up|TPF ratio|",
             "|---|--:|---|--:|--:|--:|--:|--:|--:|"]
    for r in table["rows"]:
        speed = f"{r['speedup']:.2f}x" if r["speedup"] is not None else "-"
        ratio = f"{r['tpf_ratio']:.2f}x" if r["tpf_ratio"] is not None else "-"
        lines.append(f"|{r['task']}|{r['gen_length']}|`{r['run']}`|{r['accuracy']:.1f}|{r['tokens_per_s']:.1f}|"
                     f"{r['tpf']:.2f}|{r['forwards_per_request']:.1f}|{speed}|{ratio}|")
    lines += ["", "accuracy: the harness's metric in percent (`metric` in table.json); tokens/s: generated tokens "
              "before EOS over the wall time of the decoding calls; TPF: generated tokens per forward; speed-up and "
              "TPF ratio: tokens/s and TPF against the first run on the same task and length."]
    return "\n".join(lines) + "\n"


def plot(table: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = list(dict.fromkeys(r["task"] for r in table["rows"]))
    fig, axes = plt.subplots(1, len(tasks), figsize=(4.5 * len(tasks), 3.8), squeeze=False)
    for ax, task in zip(axes.flat, tasks):
        for gen in dict.fromkeys(r["gen_length"] for r in table["rows"]):
            pts = [r for r in table["rows"] if r["task"] == task and r["gen_length"] == gen]
            ax.plot([r["tpf"] for r in pts], [r["accuracy"] for r in pts], "o-", label=f"gen {gen}")
            for r in pts:
                ax.annotate(r["run"], (r["tpf"], r["accuracy"]), fontsize=6, xytext=(3, 3), textcoords="offset points")
        ax.set_title(task)
        ax.set_xlabel("tokens per forward")
        ax.set_ylabel("accuracy (%)")
        ax.set_ylim(-3, 103)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="tiny-dlm", help="built-in name, checkpoint folder or hub id (dlm.load)")
    p.add_argument("--tasks", required=True, help="comma-separated name:shots, e.g. gsm8k:5,humaneval:0")
    p.add_argument("--run", action="append", required=True,
                   help="model_args of one run (repeat the flag); the first is the baseline of the speed-up")
    p.add_argument("--gen-lengths", type=lambda s: [int(v) for v in s.split(",")], default=[256])
    p.add_argument("--block-length", type=int, default=32)
    p.add_argument("--limit", type=int, default=None, help="documents per task (default: all)")
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    p.add_argument("--include-path", default=None, help="another folder of task YAML files")
    p.add_argument("--local-tasks-only", action="store_true",
                   help="index only our task folder and --include-path, not the harness's (much faster start)")
    p.add_argument("--apply-chat-template", action="store_true", help="the harness's --apply_chat_template")
    p.add_argument("--confirm-run-unsafe-code", action="store_true",
                   help="the harness's flag for tasks that execute generated code (humaneval, mbpp)")
    p.add_argument("--out", default="runs/eval-table")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    args.command = "python scripts/dlm_eval_table.py " + " ".join(shlex.quote(a) for a in argv)
    if args.device is None:
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        table = run_table(args)
    except ValueError as err:
        print(f"dlm_eval_table: error: {err}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "table.json").write_text(json.dumps(table, indent=2) + "\n")
    (out / "table.md").write_text(markdown(table))
    plot(table, out / "accuracy_vs_tpf.png")
    print(markdown(table))
    print(f"wrote {out / 'table.md'}, {out / 'table.json'}, {out / 'accuracy_vs_tpf.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
