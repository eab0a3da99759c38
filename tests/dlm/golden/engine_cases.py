"""The engine's golden fixture: every registered sampler under every loop option, recorded once.

Issue 49 moves the decoding loops into one plan, one shared driver and phase functions without
changing what they do. This module runs a grid of `dlm.generate` calls and turns each result into a
plain record (sequences, nfe, branch forwards, forward tokens, steps per block, per-sequence nfe,
the full step trace with tokens, or the refusal's type and message); `record_all()` is stored once
at the commit before the move (`engine_golden.pt`) and `tests/dlm/test_engine_golden.py` asserts
exact equality against it after every commit.

Grid (masked, built-in `tiny-dlm`, a left-padded batch of three prompts, 16 tokens in blocks of 8 with
8 forward passes): every registered sampler x kv_cache none/prefix/dual/prompt/auto x window 1/2 x
EOS stop on/off x CFG 0/1 x temperature 0 / 0.7 (seeded generator); plus the cache refresh, the
cross-block cache and the cut of trailing masks on a smaller grid; uniform noise (a tiny random
DiffusionGemma, left-padded): transformers' rule and every sampler in accept/renoise mode.

Regenerate (only at a commit whose behaviour is the reference):
    python -m tests.dlm.golden.engine_cases
"""
from __future__ import annotations

import itertools
from pathlib import Path

import torch

GOLDEN = Path(__file__).with_name("engine_golden.pt")
KV_MODES = ("none", "prefix", "dual", "prompt", "auto")
PROMPTS = ("reverse: ana bo cyd tom", "copy: dex jo", "sort: tom fay ivy gus")
# The samplers registered at the reference commit (a sampler added later has tests of its own).
SAMPLERS = ("confidence", "credit", "eb", "entropy", "entropy_bound", "hex", "hierarchical", "joint", "lopa",
            "margin", "position", "random", "saber", "threshold")


def _masked_inputs(tokenizer):
    ids = [tokenizer.encode_prompt(p) for p in PROMPTS]
    width = max(len(s) for s in ids)
    pad = tokenizer.pad_token_id
    input_ids = torch.tensor([[pad] * (width - len(s)) + s for s in ids], dtype=torch.long)
    mask = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in ids], dtype=torch.long)
    return input_ids, mask


def _to_record(out) -> dict:
    """A plain, comparable record of one `GenerateOutput`."""
    trace = []
    for t in out.trace:
        trace.append((t.block, t.step, t.nfe, t.rows.tolist(), t.committed.tolist(), t.masks_left.tolist(),
                      bool(t.full_forward), t.forwards, t.branch_forwards,
                      None if t.tokens is None else t.tokens.tolist(),
                      None if t.accepted is None else t.accepted.tolist()))
    per_seq = None if out.nfe_per_sequence is None else out.nfe_per_sequence.tolist()
    experts = None
    if out.experts is not None:
        e = out.experts
        experts = (list(e.block_lengths), list(e.steps), list(e.nfe), e.sequences.tolist(), e.winner, e.token_winner)
    return {"sequences": out.sequences.tolist(), "nfe": out.nfe, "branch_forwards": out.branch_forwards,
            "forward_tokens": out.forward_tokens, "steps_per_block": list(out.steps_per_block),
            "nfe_per_sequence": per_seq, "trace": trace, "experts": experts}


def _run(call) -> dict:
    try:
        return _to_record(call())
    except (ValueError, RuntimeError) as error:
        return {"error": type(error).__name__, "message": str(error)}


def masked_cases():
    """`(key, call)` pairs of the masked grid; `call()` runs one `dlm.generate`."""
    import dlm

    model, tokenizer = dlm.load("tiny-dlm")
    input_ids, mask = _masked_inputs(tokenizer)
    base = dict(gen_length=16, block_length=8, steps=8, return_trace=True, attention_mask=mask)
    for name, kv, window, eos, cfg, temp in itertools.product(
            SAMPLERS, KV_MODES, (1, 2), (True, False), (0.0, 1.0), (0.0, 0.7)):
        if cfg and kv not in ("none", "auto") and not (name == "confidence" and window == 1):
            continue  # guidance is refused with a cache (one refusal per mode is kept)
        kw = dict(base, sampler=name, kv_cache=kv, eos_early_stop=eos, cfg_scale=cfg, temperature=temp)
        if name == "hex":  # three experts (blocks 2, 4, 8) sharing 24 passes
            kw.update(steps=24, sampler_config={"budget": "split"})
        if window > 1:
            kw["window_blocks"] = window
        key = f"masked/{name}/kv={kv}/w={window}/eos={eos}/cfg={cfg}/t={temp}"

        def call(kw=kw):
            return dlm.generate(model, input_ids, generator=torch.Generator().manual_seed(0), **kw)
        yield key, call
    # the cache options, on a smaller grid
    for name, kv, extra in itertools.product(
            ("confidence", "threshold", "lopa", "saber"), ("prefix", "dual", "prompt"),
            ({"cache_refresh_every": 2}, {"cache_refresh_every": 1}, {"cache_across_blocks": True},
             {"cut_trailing_masks": True})):
        kw = dict(base, sampler=name, kv_cache=kv, **extra)
        key = f"masked/{name}/kv={kv}/" + ",".join(f"{k}={v}" for k, v in extra.items())

        def call(kw=kw):
            return dlm.generate(model, input_ids, generator=torch.Generator().manual_seed(0), **kw)
        yield key, call


def uniform_cases():
    """`(key, call)` pairs on a tiny random DiffusionGemma: transformers' rule and sampler mode."""
    import dlm
    from tests.dlm.dgemma_models import generation_config, left_padded_prompts, tiny_diffusion_gemma

    model = tiny_diffusion_gemma(seed=0)
    input_ids, mask = left_padded_prompts(3, 6, seed=1)
    gc = generation_config(max_new_tokens=32, max_denoising_steps=8)

    def exact():
        torch.manual_seed(0)
        return dlm.generate(model, input_ids, attention_mask=mask, generation_config=gc, return_trace=True)
    yield "uniform/transformers-rule", exact
    for name, temp, block in itertools.product(SAMPLERS, (0.0, 0.7), (None, 8)):
        kw = dict(sampler=name, temperature=temp, steps=12, generation_config=gc, return_trace=True,
                  attention_mask=mask)
        if name == "hex":
            kw.update(steps=48, sampler_config={"budget": "split"})
        if block is not None:
            kw["block_length"] = block
        key = f"uniform/{name}/t={temp}/block={block}"

        def call(kw=kw):
            return dlm.generate(model, input_ids, generator=torch.Generator().manual_seed(0), **kw)
        yield key, call


def all_cases():
    yield from masked_cases()
    yield from uniform_cases()


def record_all(progress: bool = True) -> dict:
    from tqdm.auto import tqdm

    cases = list(all_cases())
    return {key: _run(call) for key, call in tqdm(cases, disable=not progress, desc="golden")}


if __name__ == "__main__":
    torch.set_num_threads(1)
    records = record_all()
    torch.save(records, GOLDEN)
    errors = sum("error" in r for r in records.values())
    print(f"{len(records)} cases ({errors} refusals) -> {GOLDEN}")
