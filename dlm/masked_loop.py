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
from dlm.block_window import BlockWindow, fit_logits
from dlm.decoding_config import DEFAULT_GEN_LENGTH, DecodingConfig, default_block_length
from dlm.outputs import GenerateOutput, StepTrace, nonfinite_positions, raise_nonfinite
from dlm.schedule import block_budget, tokens_this_step, validate_lengths
from samplers import StepContext, get_sampler
from samplers.contract import enforce_step_contract

# The masked default: the fastest setting within 1 point of one-token-per-step decoding on the built-in
# model's held-out suites (docs/dlm.md, "Defaults"), with kv_cache="auto".
DEFAULT_MASKED_SAMPLER = "threshold"



def _check_input_ids(input_ids, attention_mask) -> None:
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 or input_ids.dtype != torch.long:
        raise ValueError("input_ids must be a [batch, prompt_length] torch.long tensor")
    if input_ids.shape[1] == 0:
        raise ValueError("input_ids is empty: give a prompt of at least one token")
    if attention_mask is not None and (not isinstance(attention_mask, torch.Tensor) or attention_mask.shape != input_ids.shape):
        shape = tuple(attention_mask.shape) if isinstance(attention_mask, torch.Tensor) else type(attention_mask).__name__
        raise ValueError(f"attention_mask shape {shape} must equal input_ids shape {tuple(input_ids.shape)}")


def resolve_kv_cache(kv_cache: str, adapter: DLMAdapter, *, cfg_scale: float = 0.0,
                     needs_hidden_states: bool = False) -> str:
    """The cache mode a call runs with: `kv_cache` itself, except "auto", which is the fastest exact
    setting: "prompt" for a model that declares a prompt blind to the response (exact there), else
    "none". Never an approximation, so "auto" gives the uncached engine's tokens on every model."""
    if kv_cache != "auto":
        return kv_cache
    exact_prompt_cache = adapter.prompt_ignores_response and adapter.supports_kv_cache
    return "prompt" if exact_prompt_cache and cfg_scale == 0 and not needs_hidden_states else "none"


class _BlockForward:
    """Produces aligned block logits for one block, owning the KV cache of that block.

    It never feeds the model what cannot change the block's logits:
    - a block-causal model (`DLMAdapter.block_causal`) gets only `x[:, :end]`: its positions before
      `end` never attend past `end`, so the masked blocks after the current one are not computed;
    - `live` (an index into the block's rows, see `_rows_needing_model`) drops rows whose answer is
      already fixed; their logits come back as zeros, which the driver's EOS fill overwrites.
    """

    def __init__(self, adapter: DLMAdapter, mode: str, refresh_every: int, cfg_scale: float,
                 prompt_length: int, attention_mask, position_ids, cut: bool = False):
        self.adapter, self.mode, self.refresh_every = adapter, mode, refresh_every
        # Feed `x[:, :end]` only: exact for a block-causal model, an opt-in approximation otherwise.
        self.cut = adapter.block_causal or cut
        self.cfg_scale, self.prompt_length = cfg_scale, prompt_length
        self.attention_mask, self.position_ids = attention_mask, position_ids
        self.cache = None
        self.cache_rows = None  # `[Rc]` sorted block-row indices the cache holds (None: all rows)
        self.forward_tokens = 0
        # Hidden-state hook (joint sampler): when on, full forwards ask for the last hidden state.
        self.want_hidden, self.hidden = False, None
        self.carried = None  # (cache of the previous block for these rows, that block's start)
        self._repeated = None  # (k, cache with each row repeated k times) for lookahead calls

    def __call__(self, x: torch.Tensor, step: int, start: int, end: int,
                 live: torch.Tensor | None = None) -> tuple[torch.Tensor, bool]:
        """Logits `[R, end-start, V]` for the block, and whether a full forward ran.

        `x` is `[R, L]`; with `live` (`[R']` sorted row indices) only those rows are forwarded and the
        other rows' logits are zeros."""
        a = self.adapter
        self._adopt_prompt_cache()
        refresh = bool(self.refresh_every) and step % self.refresh_every == 0
        full = self.mode == "none" or refresh or (step == 0 and self.cache is None)
        x_in, mask, pos = self._inputs(x, end, live)
        if full and step == 0 and self.carried is not None and self.mode != "prompt":
            raw, lo = self._extend(x_in, mask, pos)
            logits = a.align(raw, lo, start, end)
        elif full:
            raw = self._full(x_in, mask, pos, live=live)
            logits = a.align(raw, 0, start, end)
            if self.hidden is not None:  # hidden-state hook: aligned like the logits
                self.hidden = a.align(self.hidden, 0, start, end)
        else:
            lo, hi = self._window(x_in.shape[1], start, end)
            raw = a.window(x_in, self._cache_for(live), lo, hi, mask, pos)
            self.forward_tokens += x_in.shape[0] * (hi - lo)
            logits = a.align(raw, lo, start, end)
        if live is None:
            return logits, full
        out = logits.new_zeros((x.shape[0], *logits.shape[1:]))
        out[live] = logits
        if self.hidden is not None and self.hidden.shape[0] != x.shape[0]:
            hidden = self.hidden.new_zeros((x.shape[0], *self.hidden.shape[1:]))
            hidden[live] = self.hidden
            self.hidden = hidden
        return out, full

    def _adopt_prompt_cache(self) -> None:
        if self.mode == "prompt" and self.carried is not None and self.cache is None:
            # the prompt's K/V came with the block: every step is a window over the response
            self.cache, self.cache_rows = self.carried[0], None

    def _window(self, length: int, start: int, end: int) -> tuple[int, int]:
        """Positions `(lo, hi)` a cached step recomputes, for an input of `length` positions: the
        block for "dual", the block to the end for "prefix", the whole response for "prompt"."""
        if self.mode == "prompt":
            return self._response_start(), length
        shift = 1 if self.adapter.shift_logits else 0
        return start - shift, (length if self.mode == "prefix" else end)

    def _response_start(self) -> int:
        """First position whose logits the response needs (one earlier for shifted models): where
        the prompt cache ends."""
        return self.prompt_length - (1 if self.adapter.shift_logits else 0)

    def _inputs(self, x, end, live):
        """The model's input: `x`, its attention mask and positions, cut to `:end` for a
        block-causal model and to the `live` rows."""
        return _select(x, self.attention_mask, self.position_ids, end if self.cut else None, live)

    def _cache_for(self, live):
        """The cache restricted to the `live` rows. Rows only ever leave within a block, so the
        rows the cache holds (`cache_rows`, None for all) are a superset of `live`."""
        held = self.cache_rows
        if live is None or (held is not None and held.numel() == live.numel()):
            return self.cache
        return _index_cache(self.cache, live if held is None else torch.searchsorted(held, live))

    def _extend(self, x, mask, pos) -> tuple[torch.Tensor, int]:
        """Block start without a full forward: recompute only from the previous block's start (that
        block is now decoded) to the end, against the prompt and earlier blocks' cached K/V.

        Approximation (documented in `generate`): those cached K/V were computed when the later
        positions still held masks; a full forward would recompute them with the decoded tokens."""
        cache, lo = self.carried
        raw, new_cache = self.adapter.extend(x, cache, lo, mask, pos)
        if new_cache is None:
            raise RuntimeError("the model returned no past_key_values although it declares KV-cache support")
        self.cache, self.cache_rows = new_cache, None
        self.forward_tokens += x.shape[0] * (x.shape[1] - lo)
        return raw, lo

    def branches(self, x: torch.Tensor, k: int, start: int, end: int, live: torch.Tensor | None = None) -> torch.Tensor:
        """Aligned block logits `[R'*k, end-start, V]` for `x [R'*k, L]`: each of R' block rows
        repeated k times (row-major), differing only inside the block. `live` (`[R']` sorted indices
        into the block's rows, None for all) names the rows `x` holds: rows whose output is already
        fixed leave lookahead calls too.

        Reuses the block's KV cache when there is one (the prefix, and for "dual" also the suffix,
        are identical for all k candidates of a row, so the cached K/V are repeated, not
        recomputed); without a cache, or with a refresh at every step, it is one full forward over
        all R'*k rows."""
        a = self.adapter
        self._adopt_prompt_cache()  # a block's first step may reuse logits and look ahead before any forward
        mask, pos = (None if t is None else (t if live is None else t[live]).repeat_interleave(k, dim=0)
                     for t in (self.attention_mask, self.position_ids))
        x, mask, pos = _select(x, mask, pos, end if self.cut else None, None)
        # With a refresh at every step the next step (which may reuse these logits instead of its own
        # forward) promises a full forward, so the candidates get one too: exact, as without a cache.
        if self.mode == "none" or self.cache is None or self.refresh_every == 1:
            return a.align(self._full(x, mask, pos, keep_cache=False), 0, start, end)
        held = self._repeated
        if held is None or held[0] != k or not _same_rows(held[1], live):
            self._repeated = held = (k, live, _repeat_cache_rows(self._cache_for(live), k))
        lo, hi = self._window(x.shape[1], start, end)
        raw = a.window(x, held[2], lo, hi, mask, pos)
        self.forward_tokens += x.shape[0] * (hi - lo)
        return a.align(raw, lo, start, end)

    def _full(self, x: torch.Tensor, attention_mask, position_ids, keep_cache: bool = True, live=None) -> torch.Tensor:
        """One full forward of `x` (already cut to the model's input, see `_select`)."""
        a = self.adapter
        self.forward_tokens += x.numel()
        if self.cfg_scale > 0:
            # LLaDA's CFG: the unconditional input masks the prompt; one batched call.
            uncond = x.clone()
            uncond[:, : self.prompt_length] = a.mask_token_id
            both_mask = None if attention_mask is None else attention_mask.repeat(2, 1)
            both_pos = None if position_ids is None else position_ids.repeat(2, 1)
            logits, _ = a.full(torch.cat([x, uncond]), both_mask, both_pos)
            self.forward_tokens += x.numel()
            cond, un = logits.chunk(2)
            # A token either pass rules out (-inf) keeps the conditional logit: the formula would give
            # NaN (-inf - -inf) or +inf there, and a NaN is a silent wrong answer downstream.
            ruled_out = torch.isneginf(cond) | torch.isneginf(un)
            return torch.where(ruled_out, cond, un + (self.cfg_scale + 1) * (cond - un))
        if self.want_hidden:  # kv_cache is "none" here (checked in generate)
            raw, self.hidden = a.full_with_hidden(x, attention_mask, position_ids)
            return raw
        use_cache = keep_cache and self.mode != "none"
        raw, cache = a.full(x, attention_mask, position_ids, use_cache=use_cache)
        if use_cache:
            if cache is None:
                raise RuntimeError("the model returned no past_key_values although it declares KV-cache support")
            if self.mode == "prompt":  # only the prompt's K/V are kept: they never go stale
                cache = _slice_cache(cache, self._response_start())
            self.cache, self._repeated, self.cache_rows = cache, None, live
        return raw


def _same_rows(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    """Whether two row selections (None: every row) are the same."""
    if a is None or b is None:
        return a is None and b is None
    return a.shape == b.shape and torch.equal(a, b)


def _repeat_cache_rows(cache, k: int):
    """Each batch row of a KV cache repeated k times (row-major), as new tensors.

    Handles caches made of nested tuples/lists of `[B, ...]` tensors (the windowed-cache models of
    this project); anything else cannot be shared by lookahead candidates."""
    if isinstance(cache, torch.Tensor):
        return cache.repeat_interleave(k, dim=0)
    if isinstance(cache, (tuple, list)):
        return type(cache)(_repeat_cache_rows(c, k) for c in cache)
    raise ValueError(
        f"a lookahead sampler cannot share a {type(cache).__name__} KV cache between its candidates "
        f"(needs nested tuples of tensors); use kv_cache='none' with this model")


def _slice_cache(cache, length: int):
    """The first `length` positions of a KV cache of nested tuples/lists of `[B, H, L, D]` tensors
    (the windowed-cache contract of `dlm.tiny.TinyDLMModel`)."""
    if isinstance(cache, torch.Tensor):
        return cache[:, :, :length]
    if isinstance(cache, (tuple, list)):
        return type(cache)(_slice_cache(c, length) for c in cache)
    raise ValueError(f"kv_cache='prompt' cannot slice a {type(cache).__name__} cache; use 'prefix' or 'dual'")


def _select(x, mask, pos, end, live):
    """`x [R, L]` with its attention mask and positions (either may be None), cut to `:end` when
    `end` is given (block-causal model) and to the `live` rows `[R']` when given."""
    if end is not None:
        x = x[:, :end]
        mask = None if mask is None else mask[:, :end]
        pos = None if pos is None else pos[:, :end]
    if live is not None:
        x = x[live]
        mask = None if mask is None else mask[live]
        pos = None if pos is None else pos[live]
    return x, mask, pos


def _carry_cache(forward: _BlockForward, rows: torch.Tensor, start: int, next_rows: torch.Tensor):
    """The cache a finished block hands to the next one, or None when it has none.

    `rows` `[R]` are the finished block's batch rows and `next_rows` `[R']` the next block's: rows
    only leave, and a row the cache dropped inside the block had finished, so `next_rows` is a subset
    of the rows the cache holds. Returns `(cache for next_rows, start)`."""
    if forward.cache is None:
        return None
    held = rows if forward.cache_rows is None else rows[forward.cache_rows]
    idx = torch.searchsorted(held, next_rows)
    cache = forward.cache if idx.numel() == held.numel() else _index_cache(forward.cache, idx)
    return cache, start


def _index_cache(cache, rows: torch.Tensor):
    """Select batch rows of a legacy cache (nested tuples/lists of `[B, ...]` tensors)."""
    if isinstance(cache, torch.Tensor):
        return cache[rows]
    if isinstance(cache, (tuple, list)):
        return type(cache)(_index_cache(c, rows) for c in cache)
    raise RuntimeError(f"cannot select rows of a {type(cache).__name__} cache; pass eos_early_stop=False")


def _rows_needing_model(block_x: torch.Tensor, eos_id: int, mask_id: int) -> torch.Tensor:
    """`[R]` bool: rows whose output can still change (dInfer's EOS stop, applied at every step).

    `block_x` `[R, Lb]` is the current block of rows still decoded (their earlier blocks are fully
    committed and hold no EOS). A row is finished once the block holds an EOS with no mask before
    it: the tokens before that EOS are committed and stay (the sampler does not remask) and
    `_stop_at_eos` overwrites everything after it at the block's end, so another forward of that
    row cannot change the output.
    """
    is_mask = (block_x == mask_id).long()
    masks_before = is_mask.cumsum(dim=1) - is_mask  # masks strictly before each position
    return ~((block_x == eos_id) & (masks_before == 0)).any(dim=1)


def _candidates_needing_model(candidates: torch.Tensor, eos_id: int, mask_id: int) -> torch.Tensor:
    """`[R]` bool: rows of a lookahead call whose output still depends on the call's logits.

    `candidates` `[R, k, Lb]`. A row does not, when every one of its k candidates is finished (an
    EOS with no mask before it, see `_rows_needing_model`) and all k agree up to that EOS: whichever
    candidate the sampler keeps, the row's output is then the same (`_stop_at_eos` overwrites what
    follows the EOS). LoPA's branches of a finished anchor are such rows: each fills one mask, and
    the anchor has none before its EOS."""
    R, k, Lb = candidates.shape
    finished = ~_rows_needing_model(candidates.reshape(R * k, Lb), eos_id, mask_id).view(R, k).any(dim=1)
    first = candidates[:, 0]
    index = torch.arange(Lb, device=candidates.device)
    eos_at = torch.where(first == eos_id, index, Lb).min(dim=1).values  # [R]
    upto = index.unsqueeze(0) <= eos_at.unsqueeze(1)  # [R, Lb]
    agree = ((candidates == first.unsqueeze(1)) | ~upto.unsqueeze(1)).all(dim=2).all(dim=1)
    return ~(finished & agree)


class _LookaheadForward:
    """`ctx.forward` of one step: logits of k candidate blocks per row, one batched model call each.

    Counted by the driver: each call is one NFE and `k` branch forwards per row; calls stop at the
    block's remaining share of the step budget (a further call raises). With `eos_id` (per-row EOS
    stop on), rows whose output no candidate can change (`_candidates_needing_model`) leave the
    call: their logits come back as zeros, and a call that leaves no row runs no model and costs
    nothing (`free_calls`). `row_sets` records, per call that ran, the block rows it ran (None: all)."""

    def __init__(self, forward: _BlockForward, x_rows: torch.Tensor, start: int, end: int, mask_id: int, allowance: int,
                 eos_id: int | None = None, like: torch.Tensor | None = None):
        self.forward, self.x_rows, self.start, self.end = forward, x_rows, start, end
        self.mask_id, self.allowance, self.eos_id, self.like = mask_id, allowance, eos_id, like
        self.calls, self.branches, self.free_calls = 0, 0, 0
        self.row_sets: list[tuple[torch.Tensor | None, int]] = []

    @property
    def left(self) -> int:
        return self.allowance - self.calls

    def __call__(self, candidates: torch.Tensor) -> torch.Tensor:
        """candidates: `[R, k, Lb]` long block tokens. Returns aligned logits `[R, k, Lb, V]`."""
        R, Lb = self.x_rows.shape[0], self.end - self.start
        check_lookahead_call(candidates, R, Lb, self.left, "block")
        k = candidates.shape[1]
        live = None
        if self.eos_id is not None:
            live = _live_index(_candidates_needing_model(candidates, self.eos_id, self.mask_id))
        if live is not None and live.numel() == 0:
            self.free_calls += 1  # every row is finished: no model call, nothing to count
            out = self.like.new_zeros((R * k, Lb, self.like.shape[-1]))
        else:
            sub = candidates if live is None else candidates[live]
            x = (self.x_rows if live is None else self.x_rows[live]).repeat_interleave(k, dim=0)
            x[:, self.start:self.end] = sub.reshape(-1, Lb)
            logits = self.forward.branches(x, k, self.start, self.end, live)
            if live is None:
                out = logits
            else:
                out = logits.new_zeros((R, k, *logits.shape[1:]))
                out[live] = logits.view(live.numel(), k, *logits.shape[1:])
            self.calls += 1
            self.branches += k
            self.row_sets.append((live, k))
        out[..., self.mask_id] = float("-inf")  # as for the driver's own logits
        return out.reshape(R, k, Lb, -1)


def check_lookahead_call(candidates: torch.Tensor, rows: int, block_length: int, left: int, unit: str) -> None:
    """What every driver's `ctx.forward` refuses: candidates not `[rows, k, block_length]` long, or a
    call past the `unit`'s step budget."""
    shape_ok = candidates.dim() == 3 and candidates.shape[0] == rows and candidates.shape[2] == block_length
    if not shape_ok or candidates.dtype != torch.long:
        raise ValueError(f"ctx.forward needs candidates of shape [{rows}, k, {block_length}] (torch.long), got "
                         f"{tuple(candidates.shape)} {candidates.dtype}")
    if left <= 0:
        raise RuntimeError(f"ctx.forward: the {unit}'s step budget is spent; check ctx.forwards_left before calling")


def _full_attention(attention_mask, gen_length):
    """Extend a prompt attention mask over the generation; None when nothing is padded.

    LLaDA was trained without an attention mask, so an all-ones mask is dropped rather than passed
    (passing it could change results on some remote-code models)."""
    if attention_mask is None or bool(attention_mask.all()):
        return None, None
    mask = torch.cat([attention_mask.long(), attention_mask.new_ones(attention_mask.shape[0], gen_length).long()], dim=1)
    positions = (mask.cumsum(dim=1) - 1).clamp_min(0)
    return mask, positions


def _live_index(needs: torch.Tensor) -> torch.Tensor | None:
    """Sorted indices of the rows to forward, or None when every row needs the model (no copy)."""
    if bool(needs.all()):
        return None
    return needs.nonzero().squeeze(1)


def _host_index(flags: list, device) -> torch.Tensor | None:
    """`_live_index` from flags already on the host (no device read): None when all are set."""
    if all(flags):
        return None
    return torch.tensor([i for i, on in enumerate(flags) if on], dtype=torch.long, device=device)


def _stop_at_eos(x: torch.Tensor, rows: torch.Tensor, prompt_length: int, block_end: int, eos_id: int) -> torch.Tensor:
    """Fill everything after the first EOS of finished rows with EOS. Returns `[R]` bool: row finished."""
    generated = x[rows, prompt_length:block_end]
    has_eos = (generated == eos_id).any(dim=1)
    # no `if has_eos.any()`: the fill is a few small tensor ops, a device read would stall the host
    length = x.shape[1] - prompt_length
    first = torch.where(generated == eos_id, torch.arange(generated.shape[1], device=x.device), generated.shape[1]).min(dim=1).values
    after = torch.arange(length, device=x.device).unsqueeze(0) > first.unsqueeze(1)
    tail = x[rows, prompt_length:]
    x[rows, prompt_length:] = torch.where(after & has_eos.unsqueeze(1), torch.full_like(tail, eos_id), tail)
    return has_eos

@torch.no_grad()
def run_masked(model, input_ids: torch.Tensor, config: DecodingConfig, *, attention_mask: torch.Tensor | None = None,
               callback: Callable[[StepTrace], None] | None = None, return_trace: bool = False) -> GenerateOutput:
    """The masked-diffusion loop (LLaDA's blocks and budget, Fast-dLLM's caches, dInfer's EOS stop)
    for one validated `DecodingConfig`; `dlm.generate` documents every option. Phases: prepare;
    per block: cache set-up; per step: forward, score (the sampler), commit/remask (the contract),
    EOS stop; finalize."""
    gen_length = DEFAULT_GEN_LENGTH if config.gen_length is None else config.gen_length
    steps = gen_length if config.steps is None else config.steps
    policy = get_sampler(DEFAULT_MASKED_SAMPLER if config.sampler is None else config.sampler, **(config.sampler_config or {}))
    if policy.ensemble:
        raise ValueError(f"sampler {policy.name!r} is an ensemble: call dlm.generate, which runs its experts")
    block_length, temperature, generator = config.block_length, config.temperature, config.generator
    mask_token_id, eos_token_id, kv_cache = config.mask_token_id, config.eos_token_id, config.kv_cache
    cache_refresh_every, cfg_scale = config.cache_refresh_every, config.cfg_scale
    cache_across_blocks, cut_trailing_masks = config.cache_across_blocks, config.cut_trailing_masks
    eos_early_stop, shift_logits, progress = config.eos_early_stop, config.shift_logits, config.progress
    block_length = default_block_length(gen_length) if block_length is None else block_length
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


def _check_special_ids(adapter: DLMAdapter) -> None:
    """The mask and EOS ids must be tokens of the model: a mask id past the vocabulary would fail
    deep in the embedding lookup of the first forward."""
    vocab = adapter.vocab_size
    if vocab is None:
        return
    for name, value in (("mask_token_id", adapter.mask_token_id), ("eos_token_id", adapter.eos_token_id)):
        if value is not None and not 0 <= value < vocab:
            raise ValueError(f"{name}={value} is outside the model's vocabulary (0..{vocab - 1}); pass the model's "
                             f"own {name} or leave it to the config")


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


def check_prompt_ids(adapter: DLMAdapter, input_ids: torch.Tensor, attention_mask: torch.Tensor | None):
    """Refuse prompts the model would silently get wrong; returns the attention mask to use.

    - ids outside the vocabulary (the embedding lookup would fail deep inside the model);
    - the mask id inside a real prompt token (the model would treat it as a blank to fill);
    - a model whose config names a prompt separator (`position_restart_token_id`, the tiny model's
      newline) needs every prompt to end with it;
    - left padding without `attention_mask`: rows starting with the pad id get a mask that hides
      that leading run (the documented convention); when the pad id is also the EOS or mask id the
      padding cannot be told apart, so we refuse and ask for `attention_mask`.
    Shapes: input_ids `[B, P]`, attention_mask `[B, P]` or None.
    """
    vocab = adapter.vocab_size
    low, high = int(input_ids.min()), int(input_ids.max())
    if low < 0 or (vocab is not None and high >= vocab):
        bad = low if low < 0 else high
        raise ValueError(f"input_ids contains token id {bad}, outside the model's vocabulary (0..{(vocab or 0) - 1}); "
                         "encode the prompt with the model's tokenizer")
    pad = adapter.pad_token_id
    if attention_mask is None and pad is not None and bool((input_ids[:, 0] == pad).any()):
        if pad in (adapter.eos_token_id, adapter.mask_token_id):
            raise ValueError(f"input_ids rows start with token {pad}, which is the pad id and also the EOS or mask id, "
                             "so left padding cannot be detected; pass attention_mask (0 on padding, 1 on prompt tokens)")
        attention_mask = ((input_ids != pad).long().cummax(dim=1).values)
        if not bool(attention_mask[:, -1].all()):
            raise ValueError(f"a row of input_ids is all padding (pad id {pad}); give every row a prompt")
    real = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
    hit = (input_ids == adapter.mask_token_id) & real
    if bool(hit.any()):
        row, col = (int(v) for v in hit.nonzero()[0])
        raise ValueError(f"the prompt contains the mask token id {adapter.mask_token_id} (row {row}, position {col}); "
                         "a prompt must not contain masks: remove it, or pass the right mask_token_id")
    separator = adapter.prompt_separator_id
    if separator is not None and not bool((input_ids[:, -1] == separator).all()):
        row = int((input_ids[:, -1] != separator).nonzero()[0])
        raise ValueError(f"prompt row {row} does not end with the model's prompt separator (token {separator}); "
                         "encode prompts with tokenizer.encode_prompt(text) or use DLMPipeline")
    return attention_mask


def _enforce_contract(result, block_x, candidates, masks_left, remasks: bool, last: bool, mask_id: int,
                      fillable: torch.Tensor | None = None) -> torch.Tensor:
    """The driver's guarantees (`samplers.contract.enforce_step_contract`), `[R, Lb]`; `fillable`
    (the window's candidates) keeps them off masks that are not candidates."""
    return enforce_step_contract(result, block_x, candidates, remasks=remasks, last=last, mask_id=mask_id,
                                 fillable=fillable)
