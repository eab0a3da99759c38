"""Fixed-interval feature inheritance: DeepCache for UNets, block inheritance for transformers.

UNet (DeepCache, Ma et al., CVPR 2024, arXiv:2312.00858): the high-level features of a UNet's deep
branch change slowly across steps. Every ``interval`` steps the whole UNet runs and the outputs of the
deep blocks are stored; on the steps in between only the ``shallow`` outermost down and up blocks run
(plus conv_in / conv_out and the time embedding) and the deep blocks -- ``down_blocks[shallow:]``,
``mid_block``, ``up_blocks[:-shallow]`` -- return their stored outputs. The last shallow up block
thus gets the cached deep feature and the fresh skip connections of the shallow down blocks.

``shallow_layers=k`` (with ``shallow=1``) is the paper's finer branch choice (its "cache branch", k =
branch + 1): on the steps in between only the last ``k`` layers (resnet + attention) of the outermost up
block run, and of the outermost down block only the first ``k - 1`` layers, the ones producing the skip
connections those up layers read (the others, and its downsampler, return their stored outputs).
``k = 1`` runs conv_in, one up layer and conv_out: the DeepCache package's default branch 0.

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
    always computed. shallow_layers: with shallow=1, only this many layers of the outermost up block
    run on cached steps (DeepCache's branch + 1; 0 = the whole shallow blocks; UNet motion modules
    of skipped layers still run). first_blocks / last_blocks: transformer blocks always computed.
    warmup_steps: full steps at the start of every call before the interval schedule (0: full at
    steps 0, interval, 2 interval, ..., the DeepCache package's uniform schedule). taylor:
    transformers only, 1 forecasts the middle residual to first order from the last two full steps
    instead of reusing it (TaylorSeer-style, see ``caching.block_cache``)."""

    interval: int = 3
    shallow: int = 1
    first_blocks: int = 1
    last_blocks: int = 1
    warmup_steps: int = 1
    taylor: int = 0
    shallow_layers: int = 0

    def validate(self) -> "DeepCacheConfig":
        if self.interval < 1:
            raise ValueError(f"interval must be >= 1 (1 never skips), got {self.interval}")
        if self.shallow < 1:
            raise ValueError(f"shallow must be >= 1, got {self.shallow}")
        if self.first_blocks < 1 or self.last_blocks < 0:
            raise ValueError("first_blocks must be >= 1 and last_blocks >= 0")
        if self.warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0 (step 0 is always computed), got {self.warmup_steps}")
        if self.shallow_layers < 0:
            raise ValueError(f"shallow_layers must be >= 0 (0 computes the whole shallow blocks), got {self.shallow_layers}")
        if self.shallow_layers and self.shallow != 1:
            raise ValueError(f"shallow_layers picks layers of the outermost blocks; it needs shallow=1, got shallow={self.shallow}")
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
        if config.shallow_layers:
            raise ValueError("shallow_layers picks layers of a UNet's outermost blocks; for a transformer use "
                             "first_blocks / last_blocks")

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
    if config.shallow_layers:
        deep += _unneeded_shallow_layers(model, config.shallow_layers)
    for key, block in deep:
        register(block, DeepBlockHook(tracker, config, key), "deepcache")
    register(model, RootHook(tracker, timestep_reader(model)), "deepcache.root")
    return tracker


def _layers(block) -> list[tuple[torch.nn.Module, ...]]:
    """A UNet block's layers: ``(resnet, attention)`` pairs, or ``(resnet,)`` without attention."""
    attentions = getattr(block, "attentions", None) or [None] * len(block.resnets)
    return [tuple(m for m in pair if m is not None) for pair in zip(block.resnets, attentions)]


def _unneeded_shallow_layers(model, k: int) -> list[tuple[str, torch.nn.Module]]:
    """``(key, module)`` of the outermost blocks' layers that a cached step with ``shallow_layers=k``
    does not run: the up block's first ``n - k`` layers (their output is the stored input of the
    layers that run) and the down block's layers from ``k - 1`` on plus its downsamplers (their skip
    connections go to the cached up layers or the deep blocks)."""
    up, down = model.up_blocks[-1], model.down_blocks[0]
    up_layers, down_layers = _layers(up), _layers(down)
    if not 1 <= k <= len(up_layers):
        raise ValueError(f"shallow_layers must be between 1 and the outermost up block's {len(up_layers)} layers, got {k}")
    skipped = [(f"up_last.{i}.{j}", m) for i, layer in enumerate(up_layers[:len(up_layers) - k])
               for j, m in enumerate(layer)]
    skipped += [(f"down0.{i}.{j}", m) for i, layer in enumerate(down_layers) if i >= k - 1
                for j, m in enumerate(layer)]
    skipped += [(f"down0.sampler{i}", m) for i, m in enumerate(getattr(down, "downsamplers", None) or [])]
    return skipped
