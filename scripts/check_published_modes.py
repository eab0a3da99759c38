"""Each published mode against the transcription of its authors' loop, on many tiny-dlm prompts.

    python scripts/check_published_modes.py                      # 4 prompts per task (48), every setting
    python scripts/check_published_modes.py --per-task 1 --only saber

The tests (tests/samplers/unmasking/test_published_modes.py) run a few of these prompts; this runs
as many as asked, with the same transcriptions (tests/samplers/unmasking/authors_loops.py), greedy,
no cache, no end-of-text stop, one prompt at a time, and prints per setting how many prompts give
other tokens or another forward count. Also prints on how many our other modes give other tokens
(Saber `backtrack="always"`, LoPA's default rules): the departures the published modes remove.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "samplers" / "unmasking"))

GREEDY = dict(temperature=0.0, eos_early_stop=False, kv_cache="none")


def saber_settings(gens):
    for gen in gens:
        yield gen, gen
        yield gen, 16


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--per-task", type=int, default=4)
    ap.add_argument("--gen", default="32,64", help="generation lengths, comma-separated")
    ap.add_argument("--only", choices=("saber", "lopa", "hex"))
    args = ap.parse_args(argv)

    import torch

    import dlm
    from authors_loops import engine_logits, hex_vote, llada_blocks_loop, lopa_loop, saber_loop
    from dlm.ensemble import hex_generate
    from dlm.tasks import get_suite

    torch.set_num_threads(1)
    loaded = dlm.load("tiny-dlm")
    model, tok = loaded.model.eval(), loaded.tokenizer
    mask, eos = model.config.mask_token_id, model.config.eos_token_id
    fn = engine_logits(model, mask)
    gens = [int(g) for g in args.gen.split(",")]
    prompts = [(task, ex, torch.tensor([tok.encode(ex.input_text)]))
               for task in get_suite("all") for ex in task.examples("test", n=args.per_task, seed=0)]
    print(f"{len(prompts)} tiny-dlm prompts ({args.per_task} per task)")

    def differs(out, ref, forwards):
        return not torch.equal(out.sequences, ref) or out.nfe != forwards

    def tokens_differ(out, ref):
        return not torch.equal(out.sequences, ref)

    if args.only in (None, "saber"):
        for gen, block in saber_settings(gens):
            own = {"backtrack": "published", **({"block_length": block} if block != gen else {})}
            bad = other = 0
            for _, _, p in prompts:
                ref, forwards = saber_loop(fn, p, gen, block, mask)
                run = lambda cfg: dlm.generate(model, p, gen_length=gen, block_length=gen, steps=gen, sampler="saber",
                                               sampler_config=cfg, **GREEDY)
                bad += differs(run(own), ref, forwards)
                if block == gen:
                    other += tokens_differ(run({"backtrack": "always"}), ref)
            extra = f"; backtrack='always' gives other tokens on {other}" if block == gen else ""
            print(f"saber gen {gen} reference block {block}: published differs on {bad}{extra}")
    if args.only in (None, "lopa"):
        for gen in gens:
            for block in sorted({gen, 32, 16} & set(range(1, gen + 1))):
                for factor in (2, 3, 4):
                    window = {"window_blocks": 2, "window_open_at": 1.0} if gen > block else {}
                    bad = other = 0
                    for _, _, p in prompts:
                        ref, forwards = lopa_loop(fn, p, gen, block, mask, branching_factor=factor)
                        run = lambda cfg: dlm.generate(model, p, gen_length=gen, block_length=block, steps=gen,
                                                       sampler="lopa", sampler_config={**cfg, "branches": factor + 1},
                                                       **window, **GREEDY)
                        bad += differs(run({"published": True}), ref, forwards)
                        other += tokens_differ(run({}), ref)
                    print(f"lopa gen {gen} block {block} branching factor {factor}: published differs on {bad}; "
                          f"the default gives other tokens on {other}")
    if args.only in (None, "hex"):
        for gen in gens:
            bad = votes = 0
            for task, _, p in prompts:
                def extract(row, generated, task=task):
                    ids = generated.tolist()
                    return task.extract(tok.decode(ids[: ids.index(eos)] if eos in ids else ids, skip_special_tokens=True))

                out = hex_generate(model, p, gen_length=gen, extract=extract, **GREEDY)
                answers = []
                for e, block in enumerate(out.experts.block_lengths):
                    ref, forwards = llada_blocks_loop(fn, p, gen, block, gen // 2, mask)
                    bad += not torch.equal(out.experts.sequences[e], ref) or out.experts.nfe[e] != forwards
                    answers.append(extract(0, ref[0, p.shape[1]:]))
                votes += out.experts.winner[0] != (hex_vote(answers) or 0)
            print(f"hex gen {gen}: experts differ on {bad} (prompt, expert) pairs; the vote on {votes} prompts")
    return 0


if __name__ == "__main__":
    sys.exit(main())
