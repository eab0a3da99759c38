"""T-GATE: cross-attention caching after a gate step, with classifier-free guidance dropped.

Zhang et al., "Cross-Attention Makes Inference Cumbersome in Text-to-Image Diffusion Models"
(arXiv:2404.02747), v2 "Faster Diffusion via Temporal Attention Decomposition". Cross-attention
output converges within the first steps (semantics planning); later steps (fidelity improving) barely
use it. So:

- steps ``0 .. gate_step-1``: everything runs; at step ``gate_step-1`` each cross-attention module
  stores its output (after ``to_out``, ``[B, N, C]``), averaged over the two CFG halves;
- from ``gate_step`` on: cross-attention returns the stored output without computing Q/K/V, and
  classifier-free guidance is dropped: the denoiser runs on the conditional half only (batch 2B -> B)
  and returns that prediction twice, so the pipeline's ``uncond + s (cond - uncond)`` is exactly it;
- optional self-attention caching (v2): before the gate, self-attention runs on the first
  ``warmup_steps`` steps and then every ``sp_interval`` steps, otherwise its last output is reused;
  after the gate every ``fi_interval`` steps.

A batch is taken as CFG-batched when its two halves of the latent input (and timesteps) are equal,
which is how pipelines build it (``torch.cat([latents] * 2)``). ``cond_index`` says which half is the
conditional one: 1 for diffusers' pipelines (negative prompt first), 0 for ``DigitsPipeline``.
"""
from __future__ import annotations

import inspect
from dataclasses import asdict, dataclass

import torch
from diffusers.hooks import ModelHook

from ._core import RootHook, StepTracker, register, timestep_reader


@dataclass(frozen=True)
class TGateConfig:
    """gate_step: steps with full cross-attention and CFG. drop_cfg: run only the conditional half
    after the gate. cond_index: position of the conditional half in a CFG batch (diffusers: 1).
    self_attn: also cache self-attention (v2) with warmup_steps / sp_interval / fi_interval."""

    gate_step: int = 10
    drop_cfg: bool = True
    cond_index: int = 1
    self_attn: bool = False
    warmup_steps: int = 2
    sp_interval: int = 5
    fi_interval: int = 1

    def validate(self) -> "TGateConfig":
        if self.gate_step < 1:
            raise ValueError(f"gate_step must be >= 1 (step 0 fills the cache), got {self.gate_step}")
        if self.cond_index not in (0, 1):
            raise ValueError(f"cond_index must be 0 or 1 (which CFG half is conditional), got {self.cond_index}")
        if self.warmup_steps < 1 or self.sp_interval < 1 or self.fi_interval < 1:
            raise ValueError("warmup_steps, sp_interval and fi_interval must be >= 1")
        return self

    def to_dict(self) -> dict:
        return asdict(self)

    def self_attn_computes(self, step: int) -> bool:
        if step < self.gate_step:
            return step < self.warmup_steps or (step - self.warmup_steps) % self.sp_interval == 0
        return step == self.gate_step or (step - self.gate_step) % self.fi_interval == 0


def _is_cfg_batch(x: torch.Tensor, t) -> bool:
    if x.shape[0] % 2:
        return False
    h = x.shape[0] // 2
    tt = torch.as_tensor(t).reshape(-1)
    same_t = tt.numel() < 2 or torch.equal(tt[: tt.numel() // 2], tt[tt.numel() // 2:])
    return same_t and torch.equal(x[:h], x[h:])


def _take_half(obj, full: int, index: int):
    """Slice every tensor with batch ``full`` (recursing into dicts, lists, tuples) to CFG half ``index``."""
    if isinstance(obj, torch.Tensor):
        if obj.ndim and obj.shape[0] == full:
            h = full // 2
            return obj[index * h:(index + 1) * h]
        return obj
    if isinstance(obj, dict):
        return {k: _take_half(v, full, index) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_take_half(v, full, index) for v in obj)
    return obj


def _double(out):
    """Duplicate the prediction along the batch so the pipeline's guidance combination is a no-op."""
    if isinstance(out, tuple):
        return (torch.cat([out[0], out[0]]),) + out[1:]
    out.sample = torch.cat([out.sample, out.sample])
    return out


class CFGDropper:
    """``around`` function of the root hook: marks CFG batches and halves them after the gate."""

    def __init__(self, tracker: StepTracker, config: TGateConfig, model: torch.nn.Module) -> None:
        self.tracker, self.config = tracker, config
        names = list(inspect.signature(model.forward).parameters)
        self.sample_pos, self.t_pos = 0, names.index("timestep")
        self.sample_name = names[0]

    def __call__(self, forward, args, kwargs):
        x = kwargs[self.sample_name] if self.sample_name in kwargs else args[self.sample_pos]
        t = kwargs["timestep"] if "timestep" in kwargs else args[self.t_pos]
        tr = self.tracker
        tr.cfg = _is_cfg_batch(x, t)
        if not (tr.cfg and self.config.drop_cfg and tr.step >= self.config.gate_step):
            return forward(*args, **kwargs)
        tr.counters["calls_halved"] += 1
        full, i = x.shape[0], self.config.cond_index
        return _double(forward(*_take_half(args, full, i), **_take_half(kwargs, full, i)))


class _AttnHook(ModelHook):
    """An attention hook with the tracker, the config and its own key in the per-branch state."""

    def __init__(self, tracker: StepTracker, config: TGateConfig, key: str) -> None:
        super().__init__()
        self.tracker, self.config, self.key = tracker, config, key


class CrossAttnHook(_AttnHook):
    """Cross-attention: compute before the gate, store at the gate step, return the store after."""

    def new_forward(self, module, *args, **kwargs):
        tr, st = self.tracker, self.tracker.state
        cached = st.get(self.key)
        if tr.step >= self.config.gate_step and cached is not None:
            tr.counters["xattn_cached"] += 1
            return _fit_batch(cached, args[0] if args else kwargs["hidden_states"])
        out = self.fn_ref.original_forward(*args, **kwargs)
        tr.counters["xattn_computed"] += 1
        if tr.step == self.config.gate_step - 1:
            # average the CFG halves: after the gate both halves (or the one left) share it
            st[self.key] = out.view(2, -1, *out.shape[1:]).mean(0) if tr.cfg else out
        return out


def _fit_batch(cached: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
    """Stored ``[b, N, C]`` -> the current batch (equal, or twice when CFG was kept)."""
    if hidden.shape[0] == cached.shape[0]:
        return cached
    if hidden.shape[0] == 2 * cached.shape[0]:
        return torch.cat([cached, cached])
    raise ValueError(f"T-GATE cache holds batch {cached.shape[0]} but the model now runs batch {hidden.shape[0]}; "
                     "call caching.reset(model) between runs of different batch sizes")


class SelfAttnHook(_AttnHook):
    """Self-attention (v2): recompute on the schedule of ``TGateConfig.self_attn_computes``."""

    def new_forward(self, module, *args, **kwargs):
        tr, st = self.tracker, self.tracker.state
        cached = st.get(self.key)
        hidden = args[0] if args else kwargs["hidden_states"]
        if (cached is not None and cached.shape[0] == hidden.shape[0]
                and not self.config.self_attn_computes(tr.step)):
            tr.counters["sattn_cached"] += 1
            return cached
        out = self.fn_ref.original_forward(*args, **kwargs)
        tr.counters["sattn_computed"] += 1
        st[self.key] = out
        return out


def apply_tgate(model: torch.nn.Module, config: TGateConfig) -> StepTracker:
    """Attach T-GATE to a UNet or transformer with cross-attention; returns its tracker."""
    from diffusers.models.attention_processor import Attention

    config.validate()
    attns = [(n, m) for n, m in model.named_modules() if isinstance(m, Attention)]
    cross = [(n, m) for n, m in attns if m.is_cross_attention]
    if not cross:
        raise ValueError(f"{type(model).__name__} has no cross-attention for T-GATE to cache (joint-attention "
                         "models such as SD3 mix text and image tokens); use BlockCacheConfig or DeepCacheConfig")
    tracker = StepTracker()
    tracker.cfg = False
    for n, m in cross:
        register(m, CrossAttnHook(tracker, config, n), "tgate")
    if config.self_attn:
        for n, m in attns:
            if not m.is_cross_attention and getattr(m, "added_kv_proj_dim", None) is None:
                register(m, SelfAttnHook(tracker, config, n), "tgate")
    register(model, RootHook(tracker, timestep_reader(model), CFGDropper(tracker, config, model)), "tgate.root")
    return tracker
