"""Adaptive residual caching of a transformer's middle blocks (DBCache-style).

Idea (first-block cache of ParaAttention / diffusers, generalised by cache-dit's DBCache, "Dual Block
Cache"): the first ``first_blocks`` blocks always run. Their residual ``r = h_F - h_0`` ([B, N, C])
is a cheap probe of how much this step differs from the last fully computed one:
``d = mean|r - r_ref| / mean|r_ref|``. When ``d < threshold`` the middle blocks are skipped and
their cached residual (output minus input of the middle range, saved at the last full step) is added
instead; the last ``last_blocks`` blocks (none by default) always run, which corrects part of the
approximation error at their cost.
No skipping during the first ``warmup_steps`` steps and never more than ``max_cached_steps`` skipped
steps in a row. ``r_ref`` is the probe of the last *computed* step, so drift accumulates in ``d``
and eventually forces a recomputation.

Blocks that return ``(encoder_hidden_states, hidden_states)`` (SD3's joint blocks) carry both
streams: both get a cached residual.

``threshold=0`` never skips (the overhead configuration of the benchmark).

``taylor=1`` forecasts instead of reusing (TaylorSeer, Liu et al., "From Reusing to Forecasting:
Accelerating Diffusion Models with TaylorSeers", ICCV 2025; cache-dit pairs it with DBCache): the
middle residuals of the last two computed steps ``s1 > s0`` give a first-order forecast at a skipped
step ``s``, ``r(s) = r1 + (r1 - r0) * (s - s1) / (s1 - s0)`` (finite difference in the step index).
Until two computed steps exist it reuses ``r1`` as ``taylor=0`` does.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from diffusers.hooks import ModelHook

from ._core import (RootHook, StepTracker, block_inputs, block_return_indices, find_blocks, join_output,
                    register, split_output, timestep_reader)


@dataclass(frozen=True)
class BlockCacheConfig:
    """Adaptive middle-block caching for diffusers transformers (PixArt, SD3, DiT, ...).

    first_blocks: blocks always computed at the start (the probe). last_blocks: always computed at the
    end (0 by default, as cache-dit's DBCache and diffusers' FirstBlockCache: on every model of
    docs/caching.md's sweep it bought more speed than fidelity, e.g. PixArt 20 steps 2.07x at 65.8 dB
    with 0 vs 1.66x at 66.5 dB with 1). threshold: relative L1 change of the probe residual under
    which the middle is reused (0: never skip). warmup_steps: steps always computed first. max_cached_steps: longest run of skipped steps.
    taylor: 0 reuses the cached middle residual, 1 forecasts it to first order from the last two
    computed steps (TaylorSeer-style).
    """

    first_blocks: int = 1
    last_blocks: int = 0
    threshold: float = 0.08
    warmup_steps: int = 2
    max_cached_steps: int = 3
    taylor: int = 0

    def validate(self) -> "BlockCacheConfig":
        if self.first_blocks < 1:
            raise ValueError(f"first_blocks must be >= 1 (the probe), got {self.first_blocks}")
        if self.last_blocks < 0:
            raise ValueError(f"last_blocks must be >= 0, got {self.last_blocks}")
        if self.threshold < 0:
            raise ValueError(f"threshold must be >= 0 (0 never skips), got {self.threshold}")
        if self.warmup_steps < 1:
            raise ValueError(f"warmup_steps must be >= 1 (step 0 fills the cache), got {self.warmup_steps}")
        if self.max_cached_steps < 1:
            raise ValueError(f"max_cached_steps must be >= 1, got {self.max_cached_steps}")
        check_taylor(self.taylor)
        return self

    def to_dict(self) -> dict:
        return asdict(self)

    def skip(self, step: int, run: int, d: torch.Tensor) -> bool:
        """Skip the middle at ``step`` after ``run`` skipped steps in a row, probe change ``d``?"""
        if self.threshold == 0 or step < self.warmup_steps or run >= self.max_cached_steps:
            return False
        return bool(d < self.threshold)  # host read: the skip is Python control flow


def check_taylor(order: int) -> None:
    if order not in (0, 1):
        raise ValueError(f"taylor must be 0 (reuse the cached residual) or 1 (first-order forecast), got {order}")


def forecast(r1: torch.Tensor, r0: torch.Tensor | None, s: int, s1: int, s0: int | None) -> torch.Tensor:
    """First-order forecast at step ``s`` of a residual computed as ``r0`` at step ``s0`` and ``r1`` at
    ``s1 > s0`` (any shape); ``r1`` itself when there is no earlier residual."""
    if r0 is None or s0 is None or s1 == s0:
        return r1
    return r1 + (r1 - r0) * ((s - s1) / (s1 - s0))


def relative_l1(r: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """``mean|r - ref| / mean|ref|`` in float32 (a 0-d tensor)."""
    r, ref = r.float(), ref.float()
    return (r - ref).abs().mean() / ref.abs().mean().clamp_min(1e-12)


class MiddleCache:
    """Per-model driver of the probe / skip / residual logic, shared by the block hooks.

    ``policy(step, run, d) -> bool`` decides skipping once per step after the probe blocks.
    State per CFG branch (``tracker.state``): ``h0``/``e0`` probe input, ``probe_ref``, ``skip``,
    ``run``, ``mid_in``, ``res_h``/``res_e`` middle residuals computed at step ``res_step``, and with
    ``taylor=1`` the previous computed step's ``prev_h``/``prev_e``/``prev_step``.
    """

    def __init__(self, tracker: StepTracker, n_blocks: int, first: int, last: int, policy, taylor: int = 0) -> None:
        if first + last >= n_blocks:
            raise ValueError(f"first_blocks + last_blocks must leave a middle block to cache; the model has "
                             f"{n_blocks} blocks, got first_blocks={first}, last_blocks={last}")
        self.tracker, self.n, self.first, self.last, self.policy = tracker, n_blocks, first, last, policy
        self.taylor = taylor
        self.mid_end = n_blocks - last  # middle = [first, mid_end)

    def forward(self, i: int, block, forward, read_in, indices, args, kwargs):
        st, tr = self.tracker.state, self.tracker
        h, e = read_in(args, kwargs)
        if i == 0:
            st["h0"] = h
        if i < self.first or i >= self.mid_end:
            out = forward(*args, **kwargs)
            if i == self.first - 1:
                self._decide(st, out, indices)
            return out
        if st.get("skip"):
            tr.counters["blocks_skipped"] += 1
            if i == self.first:  # the cached (or forecast) residual stands in for the whole middle range
                res_h, res_e = self._residuals(st)
                h = h + res_h
                e = e + res_e if res_e is not None else e
            return join_output(h, e, indices)
        if i == self.first:
            st["mid_in"] = (h, e)
        out = forward(*args, **kwargs)
        tr.counters["blocks_computed"] += 1
        if i == self.mid_end - 1:
            ho, eo = split_output(out, indices)
            hi, ei = st.pop("mid_in")
            if self.taylor and "res_h" in st:
                st["prev_h"], st["prev_e"], st["prev_step"] = st["res_h"], st["res_e"], st["res_step"]
            st["res_h"] = ho - hi
            st["res_e"] = eo - ei if (eo is not None and ei is not None) else None
            st["res_step"] = self.tracker.step
        return out

    def _residuals(self, st) -> tuple:
        """The middle residuals to add at this skipped step: cached, or forecast when ``taylor=1``."""
        if not self.taylor:
            return st["res_h"], st.get("res_e")
        s, s1, s0 = self.tracker.step, st["res_step"], st.get("prev_step")
        h = forecast(st["res_h"], st.get("prev_h"), s, s1, s0)
        e = st.get("res_e")
        if e is not None:
            e = forecast(e, st.get("prev_e"), s, s1, s0)
        return h, e

    def _decide(self, st, out, indices) -> None:
        probe = split_output(out, indices)[0] - st.pop("h0")
        ref = st.get("probe_ref")
        skip = False
        if ref is not None and "res_h" in st and ref.shape == probe.shape:
            skip = self.policy(self.tracker.step, st.get("run", 0), relative_l1(probe, ref))
        st["skip"] = skip
        if skip:
            st["run"] = st.get("run", 0) + 1
            self.tracker.counters["steps_cached"] += 1
        else:
            st["run"] = 0
            st["probe_ref"] = probe
            self.tracker.counters["steps_computed"] += 1


class BlockHook(ModelHook):
    """Hook on block ``i`` of the list; all the logic lives in the shared :class:`MiddleCache`."""

    def __init__(self, cache: MiddleCache, i: int, block: torch.nn.Module) -> None:
        super().__init__()
        self.cache, self.i = cache, i
        self.read_in, self.indices = block_inputs(block), block_return_indices(block)

    def new_forward(self, module, *args, **kwargs):
        return self.cache.forward(self.i, module, self.fn_ref.original_forward, self.read_in, self.indices,
                                  args, kwargs)


def apply_middle_cache(model: torch.nn.Module, first: int, last: int, policy, name: str,
                       taylor: int = 0) -> StepTracker:
    """Register a root hook and one hook per block implementing :class:`MiddleCache` with ``policy``."""
    blocks = find_blocks(model)
    tracker = StepTracker()
    cache = MiddleCache(tracker, len(blocks), first, last, policy, taylor)
    read_t = timestep_reader(model)
    for i, block in enumerate(blocks):
        register(block, BlockHook(cache, i, block), name)
    register(model, RootHook(tracker, read_t), f"{name}.root")
    return tracker


def apply_block_cache(model: torch.nn.Module, config: BlockCacheConfig) -> StepTracker:
    """Attach adaptive middle-block caching to a diffusers transformer; returns its tracker."""
    config.validate()
    return apply_middle_cache(model, config.first_blocks, config.last_blocks, config.skip, "block_cache",
                              config.taylor)
