"""Why HEX's vote does or does not beat its best expert on a task suite: per prompt, which experts are right.

    python scripts/hex_disagreement.py --model tiny-dlm --suite all --limit 8

For every prompt (greedy, the published ensemble, the task's answer vote) it records how many experts
answer right and whether the best-on-average expert and the vote do, and counts the prompts where
the best expert is right but the vote is not (a wrong majority) and the reverse (the vote repairs
it), by task. The vote can beat the best expert only on prompts where that expert fails and a
majority of the others is right.
"""
from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="tiny-dlm")
    ap.add_argument("--suite", default="all")
    ap.add_argument("--limit", type=int, default=8, help="prompts per task")
    ap.add_argument("--gen-length", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    import torch

    import dlm
    from dlm.ensemble import hex_generate
    from dlm.tasks import get_suite

    torch.set_num_threads(1)
    loaded = dlm.load(args.model)
    model, tok = loaded.model, loaded.tokenizer
    eos = model.config.eos_token_id
    rows = []
    for task in get_suite(args.suite):
        for ex in task.examples("test", n=args.limit, seed=args.seed):
            prompt = torch.tensor([tok.encode(ex.input_text)])
            start = prompt.shape[1]

            def text(generated):
                ids = generated.tolist()
                return tok.decode(ids[: ids.index(eos)] if eos in ids else ids, skip_special_tokens=True)

            out = hex_generate(model, prompt, gen_length=args.gen_length, temperature=0.0, kv_cache="none",
                               extract=lambda r, g: task.extract(text(g)))
            right = [bool(task.score(ex, text(out.experts.sequences[e, 0, start:])))
                     for e in range(len(out.experts.block_lengths))]
            rows.append((task.name, right, bool(task.score(ex, text(out.sequences[0, start:])))))
            blocks = out.experts.block_lengths
    best = max(range(len(blocks)), key=lambda e: sum(r[1][e] for r in rows))
    right_count = collections.Counter(sum(r[1]) for r in rows)
    lost = collections.Counter(t for t, r, v in rows if r[best] and not v)
    won = collections.Counter(t for t, r, v in rows if v and not r[best])
    print(f"{len(rows)} prompts; experts (blocks) {blocks}; best expert: block {blocks[best]} "
          f"({sum(r[1][best] for r in rows)} right), vote {sum(v for *_, v in rows)} right")
    print("prompts by number of right experts:", dict(sorted(right_count.items())))
    print(f"best expert right, vote wrong: {sum(lost.values())} {dict(lost)}")
    print(f"vote right, best expert wrong: {sum(won.values())} {dict(won)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
