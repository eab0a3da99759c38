"""Ensembles over whole generations: HEX, hidden semi-autoregressive experts (Lee et al., 2025,
arXiv:2510.05040).

    from dlm.ensemble import hex_generate
    out = hex_generate(model, input_ids, gen_length=64, steps=64, extract=my_answer_fn)
    out.sequences            # [B, P + gen_length]: per row, the first expert that gave the voted answer
    out.experts.answers      # [B][E] each expert's extracted answer

`dlm.generate(..., sampler="hex", sampler_config={...})` calls `run_hex` (voting on the
generated tokens, since it knows no task); pass `extract` to `hex_generate` to vote on task answers
(the benchmark passes each suite's extractor). The experts run through the family loops
(`dlm.families.run_decoding`); the loops never call back here. The experts' step policy, block lengths and pass budget
come from `samplers.unmasking.hex.HexConfig`.

The experts differ in block length, so their decoding schedules differ step by step: each expert
is one decoding call over all rows (rows batched, experts sequential). Stacking experts as
rows of one call would need per-row block schedules in the driver; it is not done here.

On a uniform-noise model (DiffusionGemma) an expert's block is a sub-block of the canvas (the
canvas is decoded left to right in blocks of that length, `dlm.uniform_noise.AcceptRule`): the
experts vary the semi-autoregressive schedule inside each canvas, as HEX varies it inside the
generation, with the same per-canvas pass budget rule.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Hashable

import torch

from dlm.adapters import DLMAdapter
from dlm.decoding_config import DecodingConfig
from dlm.families import UniformNoiseFamily, family_of, run_decoding
from dlm.outputs import GenerateOutput
from samplers import get_sampler
from samplers.unmasking.hex import HexConfig, HexSampler, majority_vote, plan_experts


@dataclass
class HexExperts:
    """Per-expert results of a HEX run (E experts, B rows).

    Attributes:
        block_lengths / steps / nfe: `[E]` each expert's block length, pass budget and passes used.
        sequences: `[E, B, P + gen_length]` long, every expert's output.
        answers: `[B][E]` extracted answers (None where nothing could be extracted).
        votes: `[B]` the winning answer per row (None when every expert's answer was None).
        winner: `[B]` index of the expert whose sequence is returned (the first expert, smallest
            block, when no answer was extracted).
    """

    block_lengths: list[int]
    steps: list[int]
    nfe: list[int]
    sequences: torch.Tensor
    answers: list[list]
    votes: list
    winner: list[int]


def generated_tokens_answer(eos_token_id: int | None) -> Callable[[int, torch.Tensor], Hashable | None]:
    """Default extractor: the generated ids up to the first EOS, as a tuple (exact-match voting)."""

    def extract(row: int, generated: torch.Tensor) -> Hashable | None:
        ids = generated.tolist()
        if eos_token_id is not None and eos_token_id in ids:
            ids = ids[: ids.index(eos_token_id)]
        return tuple(ids) or None

    return extract


def hex_generate(model, input_ids: torch.Tensor, *, gen_length: int | None = 64, steps: int | None = None,
                 config: HexConfig | None = None, extract: Callable[[int, torch.Tensor], Hashable | None] | None = None,
                 callback=None, return_trace: bool = False, **generate_kwargs) -> GenerateOutput:
    """Run the HEX experts and majority-vote their answers, row by row.

    Args:
        model, input_ids `[B, P]`, gen_length: as in `dlm.generate`.
        steps: forward-pass budget for ALL experts together (default gen_length); see
            `samplers.unmasking.hex.plan_experts` for the split.
        config: `HexConfig` (block lengths, expert sampler, tokens per step).
        extract: `(row, generated ids [gen_length]) -> answer or None`; default: the tokens up to EOS.
        generate_kwargs: every other `dlm.generate` option, for every expert (temperature, generator,
            attention_mask, kv_cache, eos_early_stop, mask/eos ids, ...); not `block_length`,
            `sampler` or `sampler_config`, which the config sets per expert.

    Returns:
        `GenerateOutput`: `.sequences [B, P + gen_length]` (per row, the first expert whose answer
        won), `.nfe` and `.branch_forwards` summed over the experts, `.tpf = gen_length / nfe`,
        `.experts` a `HexExperts`.
    """
    config = config or HexConfig()
    config.validate()
    clash = sorted({"block_length", "sampler", "sampler_config"} & set(generate_kwargs))
    if clash:
        raise ValueError(f"hex_generate sets {clash} per expert; set them in HexConfig instead")
    attention_mask = generate_kwargs.pop("attention_mask", None)
    decoding = DecodingConfig(gen_length=gen_length, steps=steps, **generate_kwargs)
    return _run_experts(model, input_ids, decoding, config, extract, attention_mask, callback, return_trace)


def run_hex(model, input_ids: torch.Tensor, decoding: DecodingConfig, *, attention_mask=None, callback=None,
            return_trace: bool = False) -> GenerateOutput:
    """`dlm.generate(..., sampler="hex")`: the experts of `decoding.sampler`'s HexConfig, voting on
    the generated tokens. `block_length` is not used (documented in `dlm.generate`): each expert's
    block length comes from `sampler_config["block_lengths"]`."""
    policy = get_sampler(decoding.sampler, **(decoding.sampler_config or {}))
    if decoding.cut_trailing_masks:
        raise ValueError("cut_trailing_masks is not supported with an ensemble sampler (hex); drop it")
    base = decoding.replace(sampler=None, sampler_config=None)
    return _run_experts(model, input_ids, base, policy.config, None, attention_mask, callback, return_trace)


def _expert_plan(model, input_ids, decoding: DecodingConfig, config: HexConfig):
    """`(gen_length, [(block_length, steps)])`: the generation length and each expert's schedule."""
    if isinstance(family_of(model), UniformNoiseFamily):
        from dlm.uniform_noise import planned_canvases

        canvas, n = planned_canvases(model, decoding, input_ids.shape[1])
        steps = n * canvas if decoding.steps is None else decoding.steps
        per_canvas = plan_experts(canvas, steps // n, config)  # sub-blocks of a canvas, its share of the budget
        return n * canvas, [(b, s * n) for b, s in per_canvas]
    gen_length = 64 if decoding.gen_length is None else decoding.gen_length
    steps = gen_length if decoding.steps is None else decoding.steps
    return gen_length, plan_experts(gen_length, steps, config)


def _default_extract(model, decoding: DecodingConfig):
    if isinstance(family_of(model), UniformNoiseFamily):
        eos = decoding.eos_token_id
        if eos is None:
            eos = getattr(model.config.text_config, "eos_token_id", None)
        return generated_tokens_answer(eos[0] if isinstance(eos, (list, tuple)) else eos)
    adapter = DLMAdapter.wrap(model, mask_token_id=decoding.mask_token_id, eos_token_id=decoding.eos_token_id)
    return generated_tokens_answer(adapter.eos_token_id)


def _same_length(sequences: list[torch.Tensor]) -> torch.Tensor:
    """Stack `[B, T_e]` outputs; an expert whose rows all ended early (uniform noise stops at whole
    canvases) is extended with each row's last token, the pad/EOS it already ends with."""
    longest = max(s.shape[1] for s in sequences)
    padded = [torch.cat([s, s[:, -1:].expand(-1, longest - s.shape[1])], dim=1) for s in sequences]
    return torch.stack(padded)


def _run_experts(model, input_ids, decoding: DecodingConfig, config: HexConfig, extract, attention_mask, callback,
                 return_trace) -> GenerateOutput:
    gen_length, plan = _expert_plan(model, input_ids, decoding, config)
    if extract is None:
        extract = _default_extract(model, decoding)
    outs = [run_decoding(model, input_ids, decoding.replace(block_length=b, steps=s, sampler=config.expert),
                         attention_mask=attention_mask, callback=callback, return_trace=return_trace)
            for b, s in plan]
    prompt_length = input_ids.shape[1]
    answers = [[extract(r, o.sequences[r, prompt_length:]) for o in outs] for r in range(input_ids.shape[0])]
    winner, votes = [], []
    for row in answers:
        w = majority_vote(row)
        winner.append(0 if w is None else w)
        votes.append(None if w is None else row[w])
    stacked = _same_length([o.sequences for o in outs])
    rows = torch.arange(input_ids.shape[0], device=stacked.device)
    sequences = stacked[torch.tensor(winner, device=stacked.device), rows]
    nfe = sum(o.nfe for o in outs)
    experts = HexExperts(block_lengths=[b for b, _ in plan], steps=[s for _, s in plan], nfe=[o.nfe for o in outs],
                         sequences=stacked, answers=answers, votes=votes, winner=winner)
    return GenerateOutput(
        sequences=sequences, nfe=nfe, tpf=gen_length / max(nfe, 1), seconds=sum(o.seconds for o in outs),
        forward_tokens=sum(o.forward_tokens for o in outs),
        steps_per_block=[n for o in outs for n in o.steps_per_block],
        trace=[r for o in outs for r in o.trace], branch_forwards=sum(o.branch_forwards for o in outs),
        experts=experts)


__all__ = ["HexExperts", "HexSampler", "hex_generate", "run_hex", "generated_tokens_answer"]
