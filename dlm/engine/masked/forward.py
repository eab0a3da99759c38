"""The masked loop's model call for one block: the forward that owns the block's KV cache
(none / prefix / dual / prompt modes of Fast-dLLM, the cross-block extension, the elastic cache of
`dlm.engine.masked.elastic`), aligned logits, subsets of rows still in the model and lookahead branches."""
from __future__ import annotations

import torch

from dlm.adapters import DLMAdapter
from dlm.engine.driver import same_rows
from dlm.engine.masked.elastic import DriftTest
from dlm.engine.masked.kv_cache import index_cache, repeat_cache_rows, slice_cache


def resolve_kv_cache(kv_cache: str, adapter: DLMAdapter, *, cfg_scale: float = 0.0,
                     needs_hidden_states: bool = False) -> str:
    """The cache mode a call runs with: `kv_cache` itself, except "auto", which is the fastest exact
    setting: "prompt" for a model that declares a prompt blind to the response (exact there), else
    "none". Never an approximation, so "auto" gives the uncached engine's tokens on every model."""
    if kv_cache != "auto":
        return kv_cache
    exact_prompt_cache = adapter.prompt_ignores_response and adapter.supports_kv_cache
    return "prompt" if exact_prompt_cache and cfg_scale == 0 and not needs_hidden_states else "none"


class KVCachedForward:
    """Produces aligned block logits for one block, owning the KV cache of that block.

    It never feeds the model what cannot change the block's logits:
    - a block-causal model (`DLMAdapter.block_causal`) gets only `x[:, :end]`: its positions before
      `end` never attend past `end`, so the masked blocks after the current one are not computed;
    - `in_model` (an index into the block's rows, see `rows_needing_model`) drops rows whose answer is
      already fixed; their logits come back as zeros, which the driver's EOS fill overwrites.
    """

    def __init__(self, adapter: DLMAdapter, mode: str, refresh_every: int, cfg_scale: float,
                 prompt_length: int, attention_mask, position_ids, cut: bool = False, want_hidden: bool = False,
                 carried=None, drift: DriftTest | None = None, refresh_due: bool = False):
        self.adapter, self.mode, self.refresh_every = adapter, mode, refresh_every
        # Feed `x[:, :end]` only: exact for a block-causal model, an opt-in approximation otherwise.
        self.cut = adapter.block_causal or cut
        self.cfg_scale, self.prompt_length = cfg_scale, prompt_length
        self.attention_mask, self.position_ids = attention_mask, position_ids
        self.cache = None
        self.cache_rows = None  # `[Rc]` sorted block-row indices the cache holds (None: all rows)
        self.forward_tokens = 0
        # Hidden-state hook (joint sampler): when on, full forwards ask for the last hidden state.
        self.want_hidden, self.hidden = want_hidden, None
        self.carried = carried  # (cache of the previous block for these rows, that block's start) or None
        self._repeated = None  # (k, cache with each row repeated k times) for lookahead calls
        # Elastic cache (`drift`): the last call's drift test (0-d bool, read by the driver with its
        # step's one host read) and, once read, whether the next call must refresh with a full forward.
        # A threshold above 1 keeps every step a full forward (`DriftTest.always_refresh`).
        self.drift, self.stale = drift, None
        self.refresh_due = refresh_due or self._always_refresh

    def __call__(self, x: torch.Tensor, step: int, start: int, end: int,
                 in_model: torch.Tensor | None = None) -> tuple[torch.Tensor, bool]:
        """Logits `[R, end-start, V]` for the block, and whether a full forward ran.

        `x` is `[R, L]`; with `in_model` (`[R']` sorted row indices) only those rows are forwarded and the
        other rows' logits are zeros."""
        a = self.adapter
        self._adopt_prompt_cache()
        refresh = (bool(self.refresh_every) and step % self.refresh_every == 0) or self.refresh_due
        full = self.mode == "none" or refresh or (step == 0 and self.cache is None)
        x_in, mask, pos = self._inputs(x, end, in_model)
        if full and step == 0 and self.carried is not None and self.mode != "prompt" and not self.refresh_due:
            raw, lo = self._extend(x_in, mask, pos)
            logits = a.align(raw, lo, start, end)
        elif full:
            raw = self._full(x_in, mask, pos, in_model=in_model)
            logits = a.align(raw, 0, start, end)
            if self.hidden is not None:  # hidden-state hook: aligned like the logits
                self.hidden = a.align(self.hidden, 0, start, end)
        elif self.drift is not None:
            raw, lo = self._elastic_window(x_in, start, end, mask, pos, in_model)
            logits = a.align(raw, lo, start, end)
        else:
            lo, hi = self._window(x_in.shape[1], start, end)
            raw = a.window(x_in, self._cache_for(in_model), lo, hi, mask, pos)
            self.forward_tokens += x_in.shape[0] * (hi - lo)
            logits = a.align(raw, lo, start, end)
        if in_model is None:
            return logits, full
        out = logits.new_zeros((x.shape[0], *logits.shape[1:]))
        out[in_model] = logits
        if self.hidden is not None and self.hidden.shape[0] != x.shape[0]:
            hidden = self.hidden.new_zeros((x.shape[0], *self.hidden.shape[1:]))
            hidden[in_model] = self.hidden
            self.hidden = hidden
        return out, full

    @property
    def _always_refresh(self) -> bool:
        return self.drift is not None and self.drift.always_refresh

    def _adopt_prompt_cache(self) -> None:
        if self.mode == "prompt" and self.carried is not None and self.cache is None:
            # the prompt's K/V came with the block: every step is a window over the response
            self.cache, self.cache_rows = self.carried[0], None

    def _window(self, length: int, start: int, end: int) -> tuple[int, int]:
        """Positions `(lo, hi)` a cached step recomputes, for an input of `length` positions: the
        block for "dual", the block to the end for "prefix", the whole response for "prompt", the
        block and the probes before it for "elastic"."""
        if self.mode == "prompt":
            return self._response_start(), length
        shift = 1 if self.adapter.shift_logits else 0
        if self.drift is not None:
            return self.drift.probe_start(start - shift, self._first_probe()), end
        return start - shift, (length if self.mode == "prefix" else end)

    def _elastic_window(self, x, start: int, end: int, mask, pos, in_model) -> tuple[torch.Tensor, int]:
        """A cached step of the elastic cache: the block and its probes recomputed against the cache,
        the probes' keys tested for drift, the fresh K/V kept (`dlm.engine.masked.elastic`)."""
        lo, hi = self._window(x.shape[1], start, end)
        cached = self._cache_for(in_model)
        raw, fresh = self.adapter.window(x, cached, lo, hi, mask, pos, use_cache=True)
        if fresh is None:
            raise RuntimeError("the model returned no past_key_values although it declares KV-cache support")
        self.stale = self.drift.stale(cached, fresh, lo, start - (1 if self.adapter.shift_logits else 0))
        self.cache, self.cache_rows, self._repeated = fresh, in_model, None
        self.forward_tokens += x.shape[0] * (hi - lo)
        return raw, lo

    def _first_probe(self) -> int:
        """The first position the elastic cache may probe: any, for a model whose prompt attends to the
        response (its prompt's K/V drift as the response is decoded, the first block's included); the
        response's first, for a prompt blind to the response (its K/V never drift, and a windowed
        query there would wrongly see the response)."""
        return self._response_start() if self.adapter.prompt_ignores_response else 0

    def _response_start(self) -> int:
        """First position whose logits the response needs (one earlier for shifted models): where
        the prompt cache ends."""
        return self.prompt_length - (1 if self.adapter.shift_logits else 0)

    def _inputs(self, x, end, in_model):
        """The model's input: `x`, its attention mask and positions, cut to `:end` for a
        block-causal model and to the `in_model` rows."""
        return _select(x, self.attention_mask, self.position_ids, end if self.cut else None, in_model)

    def _cache_for(self, in_model):
        """The cache restricted to the `in_model` rows. Rows only ever leave within a block, so the
        rows the cache holds (`cache_rows`, None for all) are a superset of `in_model`."""
        held = self.cache_rows
        if in_model is None or (held is not None and held.numel() == in_model.numel()):
            return self.cache
        return index_cache(self.cache, in_model if held is None else torch.searchsorted(held, in_model))

    def _extend(self, x, mask, pos) -> tuple[torch.Tensor, int]:
        """Block start without a full forward: recompute only from the previous block's start (that
        block is now decoded) to the end, against the prompt and earlier blocks' cached K/V.

        Approximation (documented in `generate`): those cached K/V were computed when the later
        positions still held masks; a full forward would recompute them with the decoded tokens."""
        cache, lo = self.carried
        block_lo = lo
        if self.drift is not None:  # the elastic cache also recomputes and tests its probes
            lo = self.drift.probe_start(lo, self._first_probe())
        raw, new_cache = self.adapter.extend(x, cache, lo, mask, pos)
        if new_cache is None:
            raise RuntimeError("the model returned no past_key_values although it declares KV-cache support")
        if self.drift is not None:
            self.stale = self.drift.stale(cache, new_cache, lo, block_lo)
        self.cache, self.cache_rows = new_cache, None
        self.forward_tokens += x.shape[0] * (x.shape[1] - lo)
        return raw, lo

    def branches(self, x: torch.Tensor, k: int, start: int, end: int, in_model: torch.Tensor | None = None) -> torch.Tensor:
        """Aligned block logits `[R'*k, end-start, V]` for `x [R'*k, L]`: each of R' block rows
        repeated k times (row-major), differing only inside the block. `in_model` (`[R']` sorted indices
        into the block's rows, None for all) names the rows `x` holds: rows whose output is already
        fixed leave lookahead calls too.

        Reuses the block's KV cache when there is one (the prefix, and for "dual" also the suffix,
        are identical for all k candidates of a row, so the cached K/V are repeated, not
        recomputed); without a cache, or with a refresh at every step, it is one full forward over
        all R'*k rows."""
        a = self.adapter
        self._adopt_prompt_cache()  # a block's first step may reuse logits and look ahead before any forward
        mask, pos = (None if t is None else (t if in_model is None else t[in_model]).repeat_interleave(k, dim=0)
                     for t in (self.attention_mask, self.position_ids))
        x, mask, pos = _select(x, mask, pos, end if self.cut else None, None)
        # With a refresh at every step the next step (which may reuse these logits instead of its own
        # forward) promises a full forward, so the candidates get one too: exact, as without a cache.
        if self.mode == "none" or self.cache is None or self.refresh_every == 1:
            return a.align(self._full(x, mask, pos, keep_cache=False), 0, start, end)
        held = self._repeated
        if held is None or held[0] != k or not same_rows(held[1], in_model):
            self._repeated = held = (k, in_model, repeat_cache_rows(self._cache_for(in_model), k))
        lo, hi = self._window(x.shape[1], start, end)
        raw = a.window(x, held[2], lo, hi, mask, pos)
        self.forward_tokens += x.shape[0] * (hi - lo)
        return a.align(raw, lo, start, end)

    def _full(self, x: torch.Tensor, attention_mask, position_ids, keep_cache: bool = True, in_model=None) -> torch.Tensor:
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
                cache = slice_cache(cache, self._response_start())
            self.cache, self._repeated, self.cache_rows = cache, None, in_model
            self.refresh_due, self.stale = self._always_refresh, None  # every position's K/V are fresh now
        return raw


def _select(x, mask, pos, end, in_model):
    """`x [R, L]` with its attention mask and positions (either may be None), cut to `:end` when
    `end` is given (block-causal model) and to the `in_model` rows `[R']` when given."""
    if end is not None:
        x = x[:, :end]
        mask = None if mask is None else mask[:, :end]
        pos = None if pos is None else pos[:, :end]
    if in_model is not None:
        x = x[in_model]
        mask = None if mask is None else mask[in_model]
        pos = None if pos is None else pos[in_model]
    return x, mask, pos
