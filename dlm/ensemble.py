"""Ensembles over whole generations: HEX, hidden semi-autoregressive experts (Lee et al., 2025,
arXiv:2510.05040).

    from dlm.ensemble import hex_generate
    out = hex_generate(model, input_ids, gen_length=64, extract=my_answer_fn)   # the published setting
    out.sequences            # [B, P + gen_length]: per row, the first expert that gave the voted answer
    out.experts.answers      # [B][E] each expert's extracted answer
    out.nfe                  # the ensemble's TOTAL forward passes (5 experts x 32 = 160 at gen 64)

`dlm.generate(..., sampler="hex", sampler_config={...})` calls `run_hex` (voting on the
generated tokens, since it knows no task); pass `extract` to `hex_generate` to vote on task answers
(the benchmark passes each suite's extractor). The experts run through the family loops
(`dlm.engine.families.run_decoding`); the loops never call back here. The experts' step policy, block
lengths and passes come from `samplers.unmasking.hex.HexConfig` (`plan_experts`).

Budget: by default (`HexConfig.budget="published"`) every expert decodes with
`ceil(gen_length / tokens_per_step)` passes (gen/2 as published) and `steps` is the cap on the
ensemble's TOTAL, which must cover `experts * ceil(gen_length / tokens_per_step)` (None: exactly
that). `budget="split"` shares a smaller `steps` among the experts instead. Every count the result
reports (`nfe`, `branch_forwards`, `forward_tokens`, `seconds`, `tpf`) is the ensemble's total, the
cost of the answer, not one expert's; each expert's own count is in `out.experts.nfe`.

Vote only where a task has ONE right answer: on tasks with many valid answers (random list edits,
open text) the experts rarely agree and the vote means nothing (see `samplers.unmasking.hex`).

The experts differ in block length, so their decoding schedules differ step by step: each expert
is one decoding call over all rows (rows batched, experts sequential). Stacking experts as
rows of one call would need per-row block schedules in the driver; it is not done here.

On a uniform-noise model (DiffusionGemma) an expert's block is a sub-block of the canvas (the
canvas is decoded left to right in blocks of that length, `dlm.engine.uniform.rules.AcceptRule`): the
experts vary the semi-autoregressive schedule inside each canvas, as HEX varies it inside the
generation, with the same pass rule per canvas (the total is summed over canvases and experts).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Hashable

import torch

from dlm.adapters import DLMAdapter
from dlm.decoding_config import DEFAULT_GEN_LENGTH, DecodingConfig
from dlm.engine.families import CallPlan, family_of, run_decoding
from dlm.outputs import GenerateOutput
from samplers import get_sampler
from samplers.unmasking.hex import HexConfig, HexSampler, majority_vote, plan_experts


@dataclass
class HexExperts:
    """Per-expert results of a HEX run (E experts, B rows).

    Attributes:
        block_lengths / steps / nfe: `[E]` each expert's block length, pass budget and passes used
            (the ensemble's total, `GenerateOutput.nfe`, is `sum(nfe)`).
        sequences: `[E, B, P + gen_length]` long, every expert's output.
        answers: `[B][E]` extracted answers (None where nothing could be extracted): the task's
            parsed answers when `hex_generate` got `extract`, else the generated tokens.
        votes: `[B]` the winning answer per row (None when every expert's answer was None).
        winner: `[B]` index of the expert whose sequence is returned (the first expert, smallest
            block, when no answer was extracted).
        token_answers / token_votes / token_winner: the same vote on the generated tokens up to the
            first EOS (`generated_tokens_answer`), kept beside a task's vote so both can be scored;
            equal to answers / votes / winner when no `extract` was given.
    """

    block_lengths: list[int]
    steps: list[int]
    nfe: list[int]
    sequences: torch.Tensor
    answers: list[list]
    votes: list
    winner: list[int]
    token_answers: list[list] | None = None
    token_votes: list | None = None
    token_winner: list[int] | None = None


def generated_tokens_answer(eos_token_id: int | None) -> Callable[[int, torch.Tensor], Hashable | None]:
    """Default extractor: the generated ids up to the first EOS, as a tuple (exact-match voting on
    the whole generation, so experts agree only when they produce the same tokens; an empty
    generation is None and does not vote)."""

    def extract(row: int, generated: torch.Tensor) -> Hashable | None:
        ids = generated.tolist()
        if eos_token_id is not None and eos_token_id in ids:
            ids = ids[: ids.index(eos_token_id)]
        return tuple(ids) or None

    return extract


def hex_generate(model, input_ids: torch.Tensor, *, gen_length: int | None = DEFAULT_GEN_LENGTH, steps: int | None = None,
                 config: HexConfig | None = None, extract: Callable[[int, torch.Tensor], Hashable | None] | None = None,
                 callback=None, return_trace: bool = False, **generate_kwargs) -> GenerateOutput:
    """Run the HEX experts and majority-vote their answers, row by row.

    Args:
        model, input_ids `[B, P]`, gen_length: as in `dlm.generate`.
        steps: the ensemble's TOTAL forward-pass budget (a cap, as for every sampler). With
            `config.budget="published"` (default) each expert gets `ceil(gen_length /
            tokens_per_step)` passes and `steps` must be None (= experts x that) or at least that
            total, else ValueError; with `budget="split"` it is shared evenly (default gen_length).
            See `samplers.unmasking.hex.plan_experts`.
        config: `HexConfig` (block lengths, expert sampler, tokens per step, budget rule).
        extract: `(row, generated ids [gen_length]) -> hashable answer or None`, the task's answer
            extractor. Without it the vote is on the generated token ids up to the first EOS
            (`generated_tokens_answer`): experts agree only on identical generations, which suits
            tasks with one right output and is meaningless where many outputs are right.
        generate_kwargs: every other `dlm.generate` option, for every expert (temperature, generator,
            attention_mask, kv_cache, eos_early_stop, mask/eos ids, ...); not `block_length`,
            `sampler` or `sampler_config`, which the config sets per expert.

    Returns:
        `GenerateOutput`: `.sequences [B, P + gen_length]` (per row, the first expert whose answer
        won); `.nfe`, `.branch_forwards`, `.forward_tokens` and `.seconds` are the ensemble's TOTALS
        (summed over the experts), `.tpf = gen_length / nfe` (tokens of the one returned answer per
        forward of the whole ensemble), `.nfe_per_sequence` summed likewise where the experts report
        it (uniform noise); `.experts` a `HexExperts` with each expert's own counts.
    """
    config = config or HexConfig()
    config.validate()
    clash = sorted({"block_length", "sampler", "sampler_config"} & set(generate_kwargs))
    if clash:
        raise ValueError(f"hex_generate sets {clash} per expert; set them in HexConfig instead")
    from dlm.inputs import check_generate_inputs

    input_ids, attention_mask = check_generate_inputs(model, input_ids, generate_kwargs.pop("attention_mask", None))
    decoding = DecodingConfig(gen_length=gen_length, steps=steps, **generate_kwargs)
    return _run_experts(model, family_of(model), input_ids, decoding, config, extract, attention_mask, callback,
                        return_trace)


def run_hex(model, input_ids: torch.Tensor, plan: CallPlan, *, attention_mask=None, callback=None,
            return_trace: bool = False) -> GenerateOutput:
    """`dlm.generate(..., sampler="hex")`: the experts of the plan's HexConfig, voting on the
    generated tokens. `block_length` is not used (documented in `dlm.generate`): each expert's
    block length comes from `sampler_config["block_lengths"]`."""
    if plan.config.cut_trailing_masks:
        raise ValueError("cut_trailing_masks is not supported with an ensemble sampler (hex); drop it")
    base = plan.config.replace(sampler=None, sampler_config=None)
    return _run_experts(model, plan.family, input_ids, base, plan.policy.config, None, attention_mask, callback,
                        return_trace)


def _expert_plan(family, model, input_ids, decoding: DecodingConfig, config: HexConfig):
    """`(gen_length, [(block_length, steps)])`: the generation length and each expert's schedule;
    `decoding.steps` is the ensemble's total (None: the default of `config.budget`)."""
    if family.uniform:
        from dlm.engine.uniform.plan import planned_canvases

        canvas, n = planned_canvases(model, decoding, input_ids.shape[1])
        # Sub-blocks of one canvas, the rule applied canvas by canvas; steps stays the total.
        return n * canvas, plan_experts(canvas, decoding.steps, config, canvases=n)
    gen_length = DEFAULT_GEN_LENGTH if decoding.gen_length is None else decoding.gen_length
    return gen_length, plan_experts(gen_length, decoding.steps, config)


def _default_extract(family, model, decoding: DecodingConfig):
    if family.uniform:
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


def _vote(answers: list[list]) -> tuple[list[int], list]:
    """`(winner [B], votes [B])` of `majority_vote` per row (the authors' rule: None answers do not
    vote, ties go to the first expert, the smallest block); winner 0 where no expert answered."""
    winner, votes = [], []
    for row in answers:
        w = majority_vote(row)
        winner.append(0 if w is None else w)
        votes.append(None if w is None else row[w])
    return winner, votes


def _run_experts(model, family, input_ids, decoding: DecodingConfig, config: HexConfig, extract, attention_mask,
                 callback, return_trace) -> GenerateOutput:
    gen_length, plan = _expert_plan(family, model, input_ids, decoding, config)
    token_extract = _default_extract(family, model, decoding)
    expert = get_sampler(config.expert)  # one sampler object for every expert (state is per call)
    outs = [run_decoding(model, input_ids, CallPlan(family, decoding.replace(block_length=b, steps=s,
                                                                             sampler=config.expert), expert),
                         attention_mask=attention_mask, callback=callback, return_trace=return_trace)
            for b, s in plan]
    prompt_length = input_ids.shape[1]
    row_ids = range(input_ids.shape[0])
    token_answers = [[token_extract(r, o.sequences[r, prompt_length:]) for o in outs] for r in row_ids]
    answers = token_answers if extract is None else [[extract(r, o.sequences[r, prompt_length:]) for o in outs]
                                                     for r in row_ids]
    winner, votes = _vote(answers)
    token_winner, token_votes = (winner, votes) if extract is None else _vote(token_answers)
    stacked = _same_length([o.sequences for o in outs])
    rows = torch.arange(input_ids.shape[0], device=stacked.device)
    sequences = stacked[torch.tensor(winner, device=stacked.device), rows]
    nfe = sum(o.nfe for o in outs)  # the ensemble's total: every expert's passes are paid for
    per_sequence = [o.nfe_per_sequence for o in outs]
    experts = HexExperts(block_lengths=[b for b, _ in plan], steps=[s for _, s in plan], nfe=[o.nfe for o in outs],
                         sequences=stacked, answers=answers, votes=votes, winner=winner,
                         token_answers=token_answers, token_votes=token_votes, token_winner=token_winner)
    return GenerateOutput(
        sequences=sequences, nfe=nfe, tpf=gen_length / max(nfe, 1), seconds=sum(o.seconds for o in outs),
        forward_tokens=sum(o.forward_tokens for o in outs),
        steps_per_block=[n for o in outs for n in o.steps_per_block],
        trace=[r for o in outs for r in o.trace], branch_forwards=sum(o.branch_forwards for o in outs),
        experts=experts,
        nfe_per_sequence=None if any(p is None for p in per_sequence) else torch.stack(per_sequence).sum(0))


__all__ = ["HexExperts", "HexSampler", "hex_generate", "run_hex", "generated_tokens_answer"]
