"""Step Rehash: adaptive reuse of a UNet's deep-branch output from the previous step.

Zhan et al., "Streamlined Inference: Low-Latency, Memory-Efficient Video Diffusion" (ECCV 2024),
Step Rehash: the features coming out of the deep up-blocks (after their temporal layers, in a video
UNet) barely change between adjacent denoising steps, so on a *rehash* step the deep branch --
``down_blocks[shallow:]``, ``mid_block``, ``up_blocks[:-shallow]`` -- is not run and its outputs from
the last computed step are returned instead. The ``shallow`` outermost down and up blocks (plus
conv_in / conv_out and the time embedding) always run, so the last shallow up block combines the
reused deep feature with fresh skip connections.

When to rehash (adaptive, unlike DeepCache's fixed interval): the output ``p`` of the last shallow
down block ``down_blocks[shallow-1]`` -- exactly the input of the deep branch, so the cheapest signal
of how much the deep branch's input moved -- is compared with the same probe at the last *computed*
step, ``d = mean|p - p_ref| / mean|p_ref|`` (``caching.block_cache.relative_l1``). The step is
rehashed when ``d < threshold``, it is past the ``warmup_steps`` and fewer than ``max_reuse`` steps in
a row were rehashed. ``p_ref`` stays at the last computed step, so drift accumulates in ``d`` and
forces a recomputation. ``threshold=0`` never rehashes (the model's output is bit-identical).

Works on diffusers UNets with ``down_blocks`` / ``mid_block`` / ``up_blocks``: ``UNet2DConditionModel``,
``UNetMotionModel`` (AnimateDiff) and ``UNetSpatioTemporalConditionModel`` (Stable Video Diffusion).
Each classifier-free-guidance branch called separately keeps its own probe and cache (StepTracker).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from diffusers.hooks import ModelHook

from ._core import RootHook, StepTracker, register, timestep_reader
from .block_cache import relative_l1

SUPPORTED = ("UNet2DConditionModel", "UNetMotionModel", "UNetSpatioTemporalConditionModel")


@dataclass(frozen=True)
class StepRehashConfig:
    """threshold: relative L1 change of the probe (last shallow down block's output) under which the
    deep branch is reused (0: never). shallow: outermost down/up blocks always computed.
    warmup_steps: steps always computed at the start of every call. max_reuse: longest run of
    rehashed steps in a row."""

    threshold: float = 0.05
    shallow: int = 1
    warmup_steps: int = 2
    max_reuse: int = 2

    def validate(self) -> "StepRehashConfig":
        if self.threshold < 0:
            raise ValueError(f"threshold must be >= 0 (0 never rehashes), got {self.threshold}")
        if self.shallow < 1:
            raise ValueError(f"shallow must be >= 1 (the probe is a shallow down block), got {self.shallow}")
        if self.warmup_steps < 1:
            raise ValueError(f"warmup_steps must be >= 1 (step 0 fills the cache), got {self.warmup_steps}")
        if self.max_reuse < 1:
            raise ValueError(f"max_reuse must be >= 1, got {self.max_reuse}")
        return self

    def to_dict(self) -> dict:
        return asdict(self)

    def rehash(self, step: int, run: int, d: torch.Tensor) -> bool:
        """Reuse the deep branch at ``step`` after ``run`` rehashed steps in a row, probe change ``d``?"""
        if self.threshold == 0 or step < self.warmup_steps or run >= self.max_reuse:
            return False
        return bool(d < self.threshold)  # host read: the skip is Python control flow


class ProbeHook(ModelHook):
    """On ``down_blocks[shallow-1]``: run it, then decide for this step whether the deep branch is reused.

    State per CFG branch (``tracker.state``): ``probe_ref`` (probe of the last computed step),
    ``rehash`` (this step's decision), ``run`` (rehashed steps in a row), one output per deep block.
    """

    def __init__(self, tracker: StepTracker, config: StepRehashConfig, n_deep: int) -> None:
        super().__init__()
        self.tracker, self.config, self.n_deep = tracker, config, n_deep

    def new_forward(self, module, *args, **kwargs):
        out = self.fn_ref.original_forward(*args, **kwargs)
        probe = out[0] if isinstance(out, tuple) else out  # down blocks return (hidden, res_samples)
        st, tr = self.tracker.state, self.tracker
        ref = st.get("probe_ref")
        # reuse needs every deep output of a previous step of this branch, at the same shape
        ready = ref is not None and ref.shape == probe.shape and sum(k.startswith("deep.") for k in st) == self.n_deep
        rehash = ready and self.config.rehash(tr.step, st.get("run", 0), relative_l1(probe, ref))
        st["rehash"] = rehash
        if rehash:
            st["run"] = st.get("run", 0) + 1
            tr.counters["steps_rehashed"] += 1
        else:
            st["run"] = 0
            st["probe_ref"] = probe
            tr.counters["steps_computed"] += 1
        return out


class DeepBlockHook(ModelHook):
    """On a deep block: return the stored output on rehash steps, else compute and store it."""

    def __init__(self, tracker: StepTracker, key: str) -> None:
        super().__init__()
        self.tracker, self.key = tracker, f"deep.{key}"

    def new_forward(self, module, *args, **kwargs):
        st = self.tracker.state
        if st.get("rehash"):
            self.tracker.counters["blocks_skipped"] += 1
            return st[self.key]
        out = self.fn_ref.original_forward(*args, **kwargs)
        st[self.key] = out
        self.tracker.counters["blocks_computed"] += 1
        return out


def deep_blocks(model: torch.nn.Module, shallow: int) -> list[tuple[str, torch.nn.Module]]:
    """``[(key, block)]`` of the deep branch: down_blocks[shallow:], mid_block, up_blocks[:-shallow].

    Raises ValueError for models without that UNet structure or a ``shallow`` that leaves no deep block.
    """
    downs, ups = getattr(model, "down_blocks", None), getattr(model, "up_blocks", None)
    if not isinstance(downs, torch.nn.ModuleList) or not isinstance(ups, torch.nn.ModuleList):
        raise ValueError(f"Step Rehash needs a UNet with down_blocks / up_blocks ({', '.join(SUPPORTED)}); "
                         f"got {type(model).__name__} (for transformers use BlockCacheConfig)")
    n_down, n_up = len(downs), len(ups)
    if shallow >= min(n_down, n_up):
        raise ValueError(f"shallow must be below the UNet's {min(n_down, n_up)} down/up blocks, got {shallow}")
    deep = [(f"down{i}", downs[i]) for i in range(shallow, n_down)]
    if getattr(model, "mid_block", None) is not None:
        deep.append(("mid", model.mid_block))
    return deep + [(f"up{i}", ups[i]) for i in range(n_up - shallow)]


def apply_step_rehash(model: torch.nn.Module, config: StepRehashConfig) -> StepTracker:
    """Attach Step Rehash to a diffusers UNet; returns the tracker (``counters``: steps_rehashed,
    steps_computed, blocks_skipped, blocks_computed)."""
    config.validate()
    deep = deep_blocks(model, config.shallow)
    read_t = timestep_reader(model)
    tracker = StepTracker()
    register(model.down_blocks[config.shallow - 1], ProbeHook(tracker, config, len(deep)), "step_rehash.probe")
    for key, block in deep:
        register(block, DeepBlockHook(tracker, key), "step_rehash")
    register(model, RootHook(tracker, read_t), "step_rehash.root")
    return tracker
