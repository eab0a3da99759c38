"""Our engine and samplers as an lm-evaluation-harness model, and the pieces it is made of.

    import dlm.lm_eval          # registers the harness model "dlm" (needs the `eval` extra)
    dlm eval --model_args pretrained=tiny-dlm,sampler=threshold --tasks dlm_tiny_arithmetic

- `dlm.evaluation.args`: `EvalArgs`, the validated `--model_args`;
- `dlm.evaluation.generation`: `generate_until`'s batched decoding, stop sequences and counts;
- `dlm.evaluation.likelihood`: LLaDA's Monte Carlo log-likelihood estimator;
- `dlm.evaluation.counts`: per-request counts and their summary;
- `dlm.evaluation.tiny_tasks`: harness tasks over the built-in model's task prompts (`TASKS_DIR`).
None of these import the harness; `dlm.lm_eval` does. docs/eval.md tells the whole story.
"""
from pathlib import Path

TASKS_DIR = Path(__file__).resolve().parent / "tasks"

__all__ = ["TASKS_DIR"]
