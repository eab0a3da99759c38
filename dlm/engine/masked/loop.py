"""The masked-diffusion decoding loop: semi-autoregressive blocks, step budget, KV cache, EOS handling.

Follows LLaDA's reference `generate` (Nie et al., 2025) with the prefix and dual KV caches of
Fast-dLLM (Wu et al., 2025) and dInfer's EOS early stop. The step policy is a `samplers.Sampler`.
"""
from __future__ import annotations

import time
from typing import Callable

import torch
from tqdm.auto import tqdm

from dlm.adapters import DLMAdapter
from dlm.decoding_config import DecodingConfig
from dlm.engine.driver import _enforce_contract, _host_index, _same_rows
from dlm.engine.masked.eos import _rows_needing_model, _stop_at_eos
from dlm.engine.masked.forward import _BlockForward, resolve_kv_cache
from dlm.engine.masked.inputs import _check_input_ids, _check_special_ids, _full_attention, check_prompt_ids
from dlm.engine.masked.kv_cache import _carry_cache
from dlm.engine.masked.lookahead import _LookaheadForward
from dlm.engine.masked.window import BlockWindow, fit_logits
from dlm.engine.schedule import block_budget, tokens_this_step, validate_lengths
from dlm.outputs import GenerateOutput, StepTrace, nonfinite_positions, raise_nonfinite
from samplers import StepContext, get_sampler

# The masked default: the fastest setting within 1 point of one-token-per-step decoding on the built-in
# model's held-out suites (docs/dlm.md, "Defaults"), with kv_cache="auto".
DEFAULT_MASKED_SAMPLER = "threshold"

@torch.no_grad()
def run_masked(model, input_ids: torch.Tensor, config: DecodingConfig, *, attention_mask: torch.Tensor | None = None,
               callback: Callable[[StepTrace], None] | None = None, return_trace: bool = False) -> GenerateOutput:
    """The masked-diffusion loop (LLaDA's blocks and budget, Fast-dLLM's caches, dInfer's EOS stop)
    for one validated `DecodingConfig`; `dlm.generate` documents every option. Phases: prepare;
    per block: cache set-up; per step: forward, score (the sampler), commit/remask (the contract),
    EOS stop; finalize."""
    gen_length = 64 if config.gen_length is None else config.gen_length
    steps = gen_length if config.steps is None else config.steps
    policy = get_sampler(DEFAULT_MASKED_SAMPLER if config.sampler is None else config.sampler, **(config.sampler_config or {}))
    if policy.ensemble:
        raise ValueError(f"sampler {policy.name!r} is an ensemble: call dlm.generate, which runs its experts")
    block_length, temperature, generator = config.block_length, config.temperature, config.generator
    mask_token_id, eos_token_id, kv_cache = config.mask_token_id, config.eos_token_id, config.kv_cache
    cache_refresh_every, cfg_scale = config.cache_refresh_every, config.cfg_scale
    cache_across_blocks, cut_trailing_masks = config.cache_across_blocks, config.cut_trailing_masks
    eos_early_stop, shift_logits, progress = config.eos_early_stop, config.shift_logits, config.progress
    block_length = gen_length if block_length is None else block_length
    num_blocks = validate_lengths(gen_length, block_length, steps)
    _check_input_ids(input_ids, attention_mask)
    adapter = DLMAdapter.wrap(model, mask_token_id=mask_token_id, eos_token_id=eos_token_id, shift_logits=shift_logits)
    kv_cache = resolve_kv_cache(kv_cache, adapter, cfg_scale=cfg_scale, needs_hidden_states=policy.needs_hidden_states)
    if kv_cache != "none" and not adapter.supports_kv_cache:
        raise ValueError(f"kv_cache={kv_cache!r} needs a model with KV-cache support (supports_dlm_kv_cache); use kv_cache='none'")
    if eos_early_stop is None:
        eos_early_stop = adapter.eos_token_id is not None
    elif eos_early_stop and adapter.eos_token_id is None:
        raise ValueError("eos_early_stop=True needs eos_token_id (pass it or use a model whose config has it)")
    _check_special_ids(adapter)
    attention_mask = check_prompt_ids(adapter, input_ids, attention_mask)
    batch, prompt_length = input_ids.shape
    total_length = prompt_length + gen_length
    if adapter.max_length is not None and total_length > adapter.max_length:
        raise ValueError(
            f"prompt ({prompt_length} tokens) + gen_length ({gen_length}) = {total_length} exceeds the "
            f"model's context of {adapter.max_length} tokens; shorten the prompt or gen_length")
    # Hidden-state hook (joint sampler): the policy checks its trained layer against the model.
    policy.prepare(adapter.model)
    if policy.needs_hidden_states and (kv_cache != "none" or cfg_scale > 0):
        raise ValueError(f"sampler {policy.name!r} reads the model's hidden states, which need kv_cache='none' "
                         f"and cfg_scale=0")

    mask_id = adapter.mask_token_id
    device = input_ids.device
    if config.compile:
        from dlm.compiled import compiled_sampler_step

        sampler_step = compiled_sampler_step(policy, device, temperature)
    else:
        sampler_step = policy.step
    x = torch.cat([input_ids, torch.full((batch, gen_length), mask_id, dtype=torch.long, device=device)], dim=1)
    full_mask, positions = _full_attention(attention_mask, gen_length)
    model_positions = getattr(adapter.model, "dlm_position_ids", None)
    if model_positions is not None:
        # The model defines its own position scheme; computed once, since the prompt never changes.
        positions = model_positions(x, full_mask)
    active = [True] * batch  # rows still decoded, on the host (updated from one read per block)
    # Per-step EOS stop needs committed tokens to stay (a remasking sampler can reopen them). A
    # lookahead sampler's calls drop finished rows too (`_LookaheadForward`).
    skip_finished = eos_early_stop and not policy.remasks
    eos_for_skip = adapter.eos_token_id if skip_finished else None
    window = None
    if config.window_blocks > 1 and num_blocks > 1:
        if policy.remasks:
            raise ValueError(f"window_blocks > 1 needs a sampler that does not remask ({policy.name!r} does): "
                             "its window commits across blocks; use window_blocks=1")
        window = BlockWindow(size=config.window_blocks, open_at=config.window_open_at, num_blocks=num_blocks,
                             block_length=block_length, prompt_length=prompt_length, batch=batch, device=device,
                             mask_id=mask_id, eos_id=adapter.eos_token_id if eos_early_stop else None)
    previous = None  # (forward, rows, start) of the last block, whose cache the next block extends
    carried = None  # window only: (logits, rows, start) a lookahead left for the next head's first step
    state = policy.init_state(batch, total_length, device)
    trace: list[StepTrace] = []
    steps_per_block: list[int] = []
    nfe, forward_tokens, branch_forwards, steps_left = 0, 0, 0, steps
    bar = tqdm(total=steps, desc=f"dlm {policy.name}", unit="nfe", disable=not progress, leave=False)
    started = time.perf_counter()

    for block in range(num_blocks):
        start = prompt_length + block * block_length
        end = start + block_length
        budget = block_budget(steps_left, num_blocks - block)
        if not any(active):
            break
        row_list = [r for r, on in enumerate(active) if on]
        rows = torch.tensor(row_list, dtype=torch.long, device=device)
        sub_mask = None if full_mask is None else full_mask[rows]
        sub_pos = None if positions is None else positions[rows]
        forward = _BlockForward(adapter, kv_cache, cache_refresh_every, cfg_scale, prompt_length, sub_mask, sub_pos,
                                cut=cut_trailing_masks)
        forward.want_hidden = policy.needs_hidden_states
        if previous is not None:
            forward.carried = _carry_cache(*previous, rows)
        used, step, reuse = 0, 0, carried
        carried = None
        nonfinite = None  # `[]` long: positions with a NaN/inf logit in the last forward
        while True:
            x_rows = x[rows]
            span_end, eligible = end, None
            if window is not None:
                window.advance(x_rows, rows, block)
                span_end = window.span_end(rows, block)
                eligible = window.eligible(rows, block, span_end - start)
            block_x = x_rows[:, start:span_end]
            candidates = block_x == mask_id
            if eligible is not None:
                candidates &= eligible
            head_left = (block_x[:, :block_length] == mask_id).sum(dim=1)
            needs = _rows_needing_model(block_x, adapter.eos_token_id, mask_id) if skip_finished else None
            # One host read per step: whether the block is done, the previous forward's non-finite
            # count and which rows still need the model, in one transfer.
            is_open, needs = _block_open(head_left, nonfinite, block, step - 1, needs)
            if not is_open:
                break
            live = None
            if needs is not None:
                if not any(needs):
                    break  # every row is finished: the EOS fill below completes the block
                live = _host_index(needs, device)
            if reuse is not None:
                # The sampler's lookahead call already ran the model on exactly this block state.
                logits, was_full, forwards = reuse, False, 0
                if window is not None:
                    logits = fit_logits(*reuse, rows, start, span_end - start, mask_id)
            else:
                if used >= budget:  # unreachable: the step that spent the budget filled every mask
                    raise RuntimeError("internal error: block has masks left but no forward passes")
                logits, was_full = forward(x_rows, step, start, span_end, live)
                nonfinite = nonfinite_positions(logits)
                # The mask token is never a valid answer; an untrained or off-distribution model may
                # still rank it first, which would "commit" a mask.
                logits[..., mask_id] = float("-inf")
                used, forwards = used + 1, 1
            last = used >= budget
            if last and window is not None:
                candidates[:, block_length:] = False  # the head's last pass: fill the head only
            masks_left = candidates.sum(dim=1)
            # The head's quota (at least one token wherever a row has candidates).
            quota = torch.maximum(tokens_this_step(head_left, budget - used + 1), (masks_left > 0).long())
            lookahead = None
            if policy.looks_ahead and not last:
                lookahead = _LookaheadForward(forward, x_rows, start, span_end, mask_id, budget - used,
                                              eos_id=eos_for_skip, like=logits)
            ctx = StepContext(
                x=block_x, candidates=candidates, num_transfer=quota,
                step=step, steps_in_block=budget, last_step=last, temperature=temperature,
                generator=generator, mask_token_id=mask_id, block_start=start, state=state, rows=rows,
                forward=lookahead, forwards_left=0 if lookahead is None else lookahead.left,
                hidden=forward.hidden)
            result = sampler_step(logits, ctx)
            new_block = _enforce_contract(result, block_x, candidates, masks_left, policy.remasks, last, mask_id,
                                          fillable=None if window is None else candidates)
            branches = forwards
            if lookahead is not None:
                used += lookahead.calls
                forwards += lookahead.calls
                branches += lookahead.branches
            reuse = _reusable_logits(result, new_block, lookahead)
            if reuse is None and used >= budget:
                # The sampler spent the last pass on a lookahead whose logits cannot serve the next
                # step: nothing is left to run, so its proposal fills the block (the head) now.
                fill = new_block == mask_id
                if window is not None:
                    fill &= candidates & (torch.arange(fill.shape[1], device=device) < block_length)
                new_block = torch.where(fill, result.proposal, new_block)
            if reuse is not None and window is not None:
                reuse = (reuse, rows, start)
            x[rows, start:span_end] = new_block
            nfe += forwards
            branch_forwards += branches
            bar.update(forwards)
            if callback is not None or return_trace:
                for record in _step_records(block, step, nfe, rows, live, block_x, new_block, mask_id, was_full,
                                            forwards, branches, lookahead, return_trace):
                    if callback is not None:
                        callback(record)
                    if return_trace:
                        trace.append(record)
            # drop this step's vocabulary-sized logits (and what refers to them) before the next
            # forward makes new ones: two [rows, L, V] tables at the peak otherwise
            del logits, ctx, result, lookahead
            step += 1
        if window is not None:
            carried = reuse  # the next head starts from these logits when the lookahead left some
        forward_tokens += forward.forward_tokens
        if kv_cache == "prompt" or (cache_across_blocks and not forward.cut):  # a cut forward's cache ends at `end`
            previous = (forward, rows, start)
        steps_per_block.append(used)
        steps_left -= used
        if eos_early_stop:
            finished = _stop_at_eos(x, rows, prompt_length, end, adapter.eos_token_id).tolist()  # once per block
            for row, done in zip(row_list, finished):
                if done:
                    active[row] = False
    bar.close()
    seconds = time.perf_counter() - started
    return GenerateOutput(
        sequences=x, nfe=nfe, tpf=gen_length / max(nfe, 1), seconds=seconds,
        forward_tokens=forward_tokens, steps_per_block=steps_per_block, trace=trace, branch_forwards=branch_forwards)


def _step_records(block: int, step: int, nfe: int, rows: torch.Tensor, live, block_x: torch.Tensor,
                  new_block: torch.Tensor, mask_id: int, was_full: bool, forwards: int, branches: int, lookahead,
                  keep_tokens: bool) -> list[StepTrace]:
    """The `StepTrace` records of one step: one record, unless a lookahead call ran on fewer rows than
    the step's own forward (rows that finished inside the step leave the call). Then the first record
    holds the step's own pass (`forwards` 0 or 1) and each call adds a record of its rows
    (`forwards` 1, `branch_forwards` k, nothing committed), so summing a row's records gives the
    passes that row took part in, and all records together still sum to `nfe`."""
    before = (block_x == mask_id).sum(dim=1)
    left = (new_block == mask_id).sum(dim=1)
    seen = slice(None) if live is None else live
    tokens = new_block[seen].clone() if keep_tokens else None
    calls = [] if lookahead is None else lookahead.row_sets
    if all(_same_rows(r, live) for r, _ in calls):
        return [StepTrace(block, step, nfe, rows[seen], (before - left)[seen], left[seen], was_full, forwards, branches,
                          tokens)]
    own = forwards - len(calls)  # the step's own forward pass: 0 when it reused lookahead logits
    records = [StepTrace(block, step, nfe, rows[seen], (before - left)[seen], left[seen], was_full, own, own, tokens)]
    for r, k in calls:
        sel = slice(None) if r is None else r
        records.append(StepTrace(block, step, nfe, rows[sel], torch.zeros_like(left[sel]), left[sel], False, 1, k, None))
    return records


def _block_open(masks_left: torch.Tensor, nonfinite: torch.Tensor | None, block: int, step: int,
                needs: torch.Tensor | None = None) -> tuple[bool, list | None]:
    """Whether the block has masks (and, given `needs [R]` bool, its host copy); raises
    `NonFiniteLogitsError` if the last forward (block `block`, step `step`) produced non-finite
    logits. One host read for all three."""
    parts = [masks_left.sum().view(1)]
    if nonfinite is not None:
        parts.append(nonfinite.to(masks_left.dtype).view(1))
    if needs is not None:
        parts.append(needs.to(masks_left.dtype))
    values = torch.cat(parts).tolist()
    left = values[0]
    if nonfinite is not None and values[1]:
        raise_nonfinite(int(values[1]), block=block, step=step)
    host_needs = None if needs is None else [bool(v) for v in values[1 + (nonfinite is not None):]]
    return left > 0, host_needs


def _reusable_logits(result, new_block: torch.Tensor, lookahead) -> torch.Tensor | None:
    """The logits a sampler returned for its new block (`StepResult.next_logits`, `[R, Lb, V]`),
    when the next step may use them instead of a forward pass: only logits from this step's own
    `ctx.forward` calls, and only if the driver kept the block exactly as the sampler returned it."""
    nxt = getattr(result, "next_logits", None)
    if nxt is None:
        return None
    if lookahead is None or lookahead.calls + lookahead.free_calls == 0:
        raise RuntimeError("StepResult.next_logits must come from this step's ctx.forward call; "
                           "return next_logits=None otherwise")
    if nxt.shape[:2] != new_block.shape:
        raise RuntimeError(f"StepResult.next_logits has shape {tuple(nxt.shape)}, expected "
                           f"{tuple(new_block.shape)} + (vocab,)")
    return nxt if torch.equal(new_block, result.x) else None
