"""Fixed-interval feature inheritance: DeepCache for UNets, block inheritance for transformers.

UNet (DeepCache, Ma et al., CVPR 2024, arXiv:2312.00858): the high-level features of a UNet's deep
branch change slowly across steps. Every ``interval`` steps the whole UNet runs and the outputs of the
deep blocks are stored; on the steps in between only the ``shallow`` outermost down and up blocks run
(plus conv_in / conv_out and the time embedding) and the deep blocks -- ``down_blocks[shallow:]``,
``mid_block``, ``up_blocks[:-shallow]`` -- return their stored outputs. The last shallow up block
thus gets the cached deep feature and the fresh skip connections of the shallow down blocks.

Transformers (A-SDM-style block inheritance, Zhu et al., arXiv:2312.15516, and DeepCache's
transformer analogue): every ``interval`` steps all blocks run; in between the middle blocks are
skipped and their residual from the last full step is reused; the first ``first_blocks`` and last
``last_blocks`` blocks always run. This is the :mod:`caching.block_cache` mechanism with a fixed
schedule in place of the adaptive probe.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from diffusers.hooks import ModelHook

from ._core import RootHook, StepTracker, register, timestep_reader
from .block_cache import apply_middle_cache, check_taylor


@dataclass(frozen=True)
class DeepCacheConfig:
    """interval: a full step every ``interval`` steps (1 = never skip). shallow: UNet down/up blocks
    always computed (DeepCache's branch + 1). first_blocks / last_blocks: transformer blocks always
    computed. warmup_steps: full steps at the start of every call. taylor: transformers only, 1
    forecasts the middle residual to first order from the last two full steps instead of reusing it
    (TaylorSeer-style, see ``caching.block_cache``)."""

    interval: int = 3
    shallow: int = 1
    first_blocks: int = 1
    last_blocks: int = 1
    warmup_steps: int = 1
    taylor: int = 0

    def validate(self) -> "DeepCacheConfig":
        if self.interval < 1:
            raise ValueError(f"interval must be >= 1 (1 never skips), got {self.interval}")
        if self.shallow < 1:
            raise ValueError(f"shallow must be >= 1, got {self.shallow}")
        if self.first_blocks < 1 or self.last_blocks < 0:
            raise ValueError("first_blocks must be >= 1 and last_blocks >= 0")
        if self.warmup_steps < 1:
            raise ValueError(f"warmup_steps must be >= 1 (step 0 fills the cache), got {self.warmup_steps}")
        check_taylor(self.taylor)
        return self

    def to_dict(self) -> dict:
        return asdict(self)

    def full_step(self, step: int) -> bool:
        return step < self.warmup_steps or (step - self.warmup_steps) % self.interval == 0


class DeepBlockHook(ModelHook):
    """Deep UNet block: compute and store on full steps, return the stored output otherwise."""

    def __init__(self, tracker: StepTracker, config: DeepCacheConfig, key: str) -> None:
        super().__init__()
        self.tracker, self.config, self.key = tracker, config, key

    def new_forward(self, module, *args, **kwargs):
        st = self.tracker.state
        cached = st.get(self.key)
        if cached is not None and not self.config.full_step(self.tracker.step):
            self.tracker.counters["blocks_skipped"] += 1
            return cached
        out = self.fn_ref.original_forward(*args, **kwargs)
        st[self.key] = out
        self.tracker.counters["blocks_computed"] += 1
        return out


def apply_deepcache(model: torch.nn.Module, config: DeepCacheConfig) -> StepTracker:
    """Attach DeepCache (UNet) or fixed-interval block inheritance (transformer); returns the tracker."""
    config.validate()
    if not hasattr(model, "up_blocks"):
        def policy(step, run, d):
            return not config.full_step(step)
        return apply_middle_cache(model, config.first_blocks, config.last_blocks, policy, "deepcache", config.taylor)
    if config.taylor:
        raise ValueError("taylor=1 forecasts a transformer's middle-block residual; for a UNet use taylor=0")
    n_down, n_up = len(model.down_blocks), len(model.up_blocks)
    if config.shallow >= min(n_down, n_up):
        raise ValueError(f"shallow must be below the UNet's {min(n_down, n_up)} down/up blocks, got {config.shallow}")
    tracker = StepTracker()
    deep = [(f"down{i}", model.down_blocks[i]) for i in range(config.shallow, n_down)]
    if getattr(model, "mid_block", None) is not None:
        deep.append(("mid", model.mid_block))
    deep += [(f"up{i}", model.up_blocks[i]) for i in range(n_up - config.shallow)]
    for key, block in deep:
        register(block, DeepBlockHook(tracker, config, key), "deepcache")
    register(model, RootHook(tracker, timestep_reader(model)), "deepcache.root")
    return tracker
