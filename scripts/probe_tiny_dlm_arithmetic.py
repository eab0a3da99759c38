"""Does a tiny-dlm checkpoint compute the arithmetic steps, or only copy them?

For every step `a op b = c` of the arithmetic task's worked answers (test split), the model sees the
prompt and the answer up to `=` and everything from `c` on masked, and predicts `c`'s digits in one
forward (argmax). No later step is visible, so `c` cannot be copied from the next step, which repeats
it as its first operand. Reports the accuracy per operation and, for two-digit results of `+`, per
digit (tens, ones).

    python scripts/probe_tiny_dlm_arithmetic.py                      # shipped checkpoint, 200 prompts
    python scripts/probe_tiny_dlm_arithmetic.py --model /tmp/stage12 --n 100

Shipped v2.1 (2026-11-23, 200 prompts): `-` 33%, `+` 14%, `*` 30%; two-digit sums: tens 83%, ones 13%. The model has
learned the magnitude of a sum but not its last digit.
"""
from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dlm.tasks import get_suite  # noqa: E402
from dlm.tasks.arithmetic import pad_numbers  # noqa: E402
from dlm.tiny import load_tiny_dlm  # noqa: E402

STEP = re.compile(r"(\d+)([-+*])(\d+)=(\d+)")


@torch.no_grad()
def predict_result(model, prompt_ids: list[int], answer_ids: list[int], start: int, end: int) -> list[int]:
    """Argmax ids at answer positions `[start, end)` with the answer masked from `start` on."""
    x = torch.tensor([prompt_ids + answer_ids])
    x[0, len(prompt_ids) + start:] = model.config.mask_token_id
    logits = model(x).logits[0, len(prompt_ids) + start:len(prompt_ids) + end]
    return logits.argmax(-1).tolist()


def probe(model, tok, n: int, padded: bool = False) -> dict:
    """``padded``: the checkpoint writes its worked steps with two-digit numbers
    (``train_tiny_dlm.py --arithmetic-format padded``); the probe then reads the results in that format."""
    task = get_suite("arithmetic")[0]
    right, total, digit_right, two_digit = Counter(), Counter(), Counter(), 0
    for ex in task.examples("test", n):
        answer = pad_numbers(ex.answer) if padded else ex.answer
        answer_ids = tok.encode(answer) + [model.config.eos_token_id]
        if len(tok.encode(answer)) != len(answer):
            raise ValueError("the probe assumes one token per answer character (digits and symbols)")
        prompt_ids = tok.encode_prompt(ex.prompt)
        for step in STEP.finditer(answer):
            start, end = step.span(4)
            pred = tok.decode(predict_result(model, prompt_ids, answer_ids, start, end))
            op, true = step.group(2), step.group(4)
            total[op] += 1
            right[op] += pred == true
            if op == "+" and len(true.lstrip("0") if padded else true) == 2 and len(pred) == 2:
                two_digit += 1
                digit_right["tens"] += pred[0] == true[0]
                digit_right["ones"] += pred[1] == true[1]
    out = {op: {"right": right[op], "steps": total[op], "accuracy": right[op] / total[op]} for op in sorted(total)}
    if two_digit:
        out["+ two-digit"] = {k: v / two_digit for k, v in digit_right.items()} | {"results": two_digit}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="checkpoint directory (default: the shipped tiny-dlm)")
    ap.add_argument("--n", type=int, default=200, help="test prompts")
    ap.add_argument("--arithmetic-format", choices=("plain", "padded"), default="plain",
                    help="the worked-step format the checkpoint was trained on (train_tiny_dlm.py's option)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    model, tok = load_tiny_dlm(args.model)
    for key, row in probe(model, tok, args.n, args.arithmetic_format == "padded").items():
        print(f"{key:12} " + "  ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
