"""Per-module forecasting inside every transformer block (TaylorSeer), on a fixed or adaptive schedule.

TaylorSeer (Liu et al., "From Reusing to Forecasting: Accelerating Diffusion Models with
TaylorSeers", ICCV 2025): the outputs of a block's attention and feed-forward modules move smoothly
with the denoising step, so on a *forecast* step each module returns a Taylor expansion built from
its outputs at earlier *computed* steps instead of running. Everything between the modules -- the
adaLN modulation from the current timestep, the norms, the gates, the residual adds -- still runs,
so a forecast step is not a stale copy of an old step the way whole-block residual reuse
(``caching.block_cache``) is. The blocks are a transformer's ``transformer_blocks`` (and Flux's
``single_transformer_blocks``) or, in a UNet, the transformer blocks of its attention layers (SD's
``Transformer2DModel``s): there the resnets, up/down samplers and skip connections still run, so
the saving is the attention layers' share of the compute.

The forecast of one module output ``y`` (any shape) is the Newton polynomial through its values at
the last ``order + 1`` computed steps (``TaylorFactors``): at order 1 exactly TaylorSeer's
``y(s) + d (y(s) - y(s_prev)) / (s - s_prev)`` for a step ``s + d``; at order 2 Newton's form, exact
for quadratic outputs at any step spacing. Until ``k`` earlier computed steps exist, the order is ``k``.

Schedule (which steps are computed):
- ``threshold = 0``: fixed interval, as TaylorSeer and diffusers' ``TaylorSeerCacheConfig``: every
  step before ``warmup_steps``, then every ``interval``-th step from ``warmup_steps + offset``; the
  others are forecast. Diffusers' ``TaylorSeerCacheConfig(disable_cache_before_step=w)`` forecasts the
  step right after its warm-up and computes ``w + 1``, ``w + 1 + interval``, ...: ``offset=1``.
- ``threshold > 0``: adaptive, as DBCache decides whole-block reuse. The first ``first_blocks``
  blocks always run and their residual (output minus input, ``[B, N, C]``) is compared with the one
  of the last computed step, ``d = mean|r - r_ref| / mean|r_ref|``: the rest of the step is
  forecast when ``d < threshold`` and fewer than ``interval - 1`` steps in a row were forecast.
- ``tolerance > 0``: error control, as adaptive ODE solvers choose their step size. At every
  computed step the forecast it replaces costs one extra evaluation, which gives the relative L1
  error ``e = sum|forecast - y| / sum|y|`` over all forecast modules for the gap ``g`` just taken.
  An order-``p`` extrapolation's error grows like ``g^(p+1)``, so the next gap is
  ``g * min(2, 0.9 (tolerance / e)^(1/(p+1)))`` rounded, shorter than ``g`` whenever
  ``e > tolerance``, within ``[1, interval]``. Gaps grow where the features move smoothly and
  shrink where they turn, with no probe block and no per-model threshold for the probe.

The last step (``num_steps``): a step's model output reaches the sample through the scheduler's
update, and the last update damps it most. DDIM's last update is the data prediction
``x0 = (x_t - sqrt(1 - abar_t) eps) / sqrt(abar_t)`` at the smallest timestep, so an error in ``eps``
moves the sample by ``sqrt((1 - abar_t) / abar_t)`` times itself: 0.015 on the digits model at 20
steps (t = 1), against 0.18 one step earlier (t = 51). Computing the last step is therefore the
worst use of a computed step, and computing the one before it among the best: on the digits model,
20 steps, interval 2, computing steps 0-2, 4, ..., 18 gives 40.5 dB against the uncached images,
computing 0-3, 5, ..., 19 (one more step) 36.2 dB; on the random tiny PixArt and SD UNet, at equal
numbers of computed steps, the schedules that forecast step 19 are 4-6 dB closer (docs/caching.md).
A forward-counted schedule ends on the last step or not depending on ``warmup_steps`` and the step
count; with ``num_steps`` it never computes it.

Where the computed steps fall matters as much as how many there are: on the random tiny SD3 at 20
steps, interval 4, the forward count (``warmup_steps=3``) computes 8 steps (0-3, 7, ..., 19) for
66.8 dB, diffusers' TaylorSeer 7 (0-2, 4, 8, 12, 16) for the same 66.8 dB. ``offset`` moves the
fixed schedule's computed steps ``offset`` steps inwards from its anchor: later than the warm-up
(forward count) or earlier than step ``num_steps - 2`` (with ``num_steps``); ``offset=1`` without
``num_steps`` is diffusers' schedule, ``num_steps=20,offset=1`` computes 0-2, 5, 9, 13, 17 (68.1 dB
there, docs/caching.md).

What differs from diffusers' TaylorSeer (docs/caching.md compares both in one run): the feed-forward
modules are forecast too (``ff=1``; diffusers' default hooks attention only), the factors stay in the
model's dtype (diffusers stores them in bfloat16 by default), the two adaptive schedules, and no
``cache_context`` is needed (the step comes from ``caching._core.StepTracker``), so it works inside
any pipeline. Diffusers' TaylorSeer with its default module names skips nothing on PixArt and the
digits model (their attention modules are ``attn1`` / ``attn2``).

``interval=1`` never forecasts (the overhead configuration of the benchmark).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from diffusers.hooks import ModelHook

from ._core import (RootHook, StepTracker, block_inputs, block_return_indices, register, split_output,
                    timestep_reader)
from .block_cache import relative_l1


@dataclass(frozen=True)
class ForecastConfig:
    """TaylorSeer-style forecasting of each block's attention (and feed-forward) outputs.

    interval: computed steps are at most this far apart (fixed schedule: exactly; 1: never forecast).
    order: Taylor order of the forecast (0 reuses the last output, 1 linear, 2 quadratic).
    warmup_steps: steps always computed at the start of every call.
    threshold: 0 for the fixed schedule; > 0 forecasts only while the probe blocks' residual changed
    by less than this (relative L1) since the last computed step.
    first_blocks: blocks always computed (the probe with ``threshold > 0``; >= 1 then).
    ff: 1 forecasts feed-forward modules as well as attention, 0 attention only.
    tolerance: > 0 sets the gaps by error control instead (see the module docstring): the relative L1
    error the forecasts may reach, measured at every computed step; ``interval`` caps the gap.
    num_steps: the pipeline's number of denoising steps, or 0 (unknown). When set, the last step is
    always forecast (after the warm-up) and the fixed schedule is counted back from the step before
    it (computed: ``num_steps - 2``, ``num_steps - 2 - interval``, ...), because the last step's model
    output barely reaches the sample (see "The last step" in the module docstring). A run with more
    steps raises ValueError; with fewer (img2img) the schedule is only misaligned.
    offset: fixed schedule only, ``0 <= offset < interval``: its computed steps after the warm-up move
    ``offset`` steps inwards (forward count: ``warmup_steps + offset``, ``+ interval``, ...; with
    ``num_steps``: ``num_steps - 2 - offset``, ``- interval``, ...). ``offset=1`` without ``num_steps``
    is diffusers' ``TaylorSeerCacheConfig`` schedule (it forecasts the step after the warm-up;
    ``warmup_steps`` = its ``disable_cache_before_step``, 3 in both by default).
    """

    interval: int = 4
    order: int = 1
    warmup_steps: int = 3
    threshold: float = 0.0
    first_blocks: int = 1
    ff: bool = True
    tolerance: float = 0.0
    num_steps: int = 0
    offset: int = 0

    def validate(self) -> "ForecastConfig":
        if self.interval < 1:
            raise ValueError(f"interval must be >= 1 (1 never forecasts), got {self.interval}")
        if self.order not in (0, 1, 2):
            raise ValueError(f"order must be 0, 1 or 2 (Taylor order of the forecast), got {self.order}")
        if self.warmup_steps < 1:
            raise ValueError(f"warmup_steps must be >= 1 (step 0 fills the factors), got {self.warmup_steps}")
        if self.threshold < 0:
            raise ValueError(f"threshold must be >= 0 (0: fixed interval), got {self.threshold}")
        if self.first_blocks < 0:
            raise ValueError(f"first_blocks must be >= 0, got {self.first_blocks}")
        if self.tolerance < 0:
            raise ValueError(f"tolerance must be >= 0 (0: no error control), got {self.tolerance}")
        if self.tolerance > 0 and self.threshold > 0:
            raise ValueError("threshold and tolerance are two different schedules; set one of them")
        if self.threshold > 0 and self.first_blocks < 1:
            raise ValueError("threshold > 0 decides from the first blocks' residual: set first_blocks >= 1")
        if self.num_steps < 0:
            raise ValueError(f"num_steps must be the pipeline's number of steps, or 0 (unknown), got {self.num_steps}")
        if self.offset < 0 or (self.offset > 0 and self.offset >= self.interval):
            raise ValueError(f"offset must be in [0, interval) = [0, {self.interval}) (steps the fixed schedule's "
                             f"computed steps move inwards), got {self.offset}")
        if self.offset > 0 and (self.threshold > 0 or self.tolerance > 0):
            raise ValueError("offset shifts the fixed schedule; threshold and tolerance schedules choose their own "
                             "steps: set offset=0 with them")
        return self

    def to_dict(self) -> dict:
        return asdict(self)

    def fixed_forecast(self, step: int) -> bool:
        """Fixed schedule: is ``step`` forecast?"""
        if self.interval == 1 or step < self.warmup_steps:
            return False
        if self.num_steps:  # counted back from the step before the last (offset steps earlier)
            return step == self.num_steps - 1 or (self.num_steps - 2 - self.offset - step) % self.interval != 0
        return (step - self.warmup_steps - self.offset) % self.interval != 0

    def last_step_forecast(self, step: int) -> bool:
        """Is ``step`` the last one of a run of known length (forecast by every schedule)?"""
        return self.num_steps > 0 and self.interval > 1 and step == self.num_steps - 1 >= self.warmup_steps

    def adaptive_forecast(self, step: int, run: int, d: torch.Tensor) -> bool:
        """Adaptive schedule: forecast ``step`` after ``run`` forecast steps in a row, probe change ``d``?"""
        if self.interval == 1 or step < self.warmup_steps or run >= self.interval - 1:
            return False
        return bool(d < self.threshold)  # host read: the decision is Python control flow


class TaylorFactors:
    """Newton forecast of one module's outputs (a tensor or a tuple of tensors / None).

    Keeps the outputs of the last ``order + 1`` computed steps ``s_0 > s_1 > ...`` (references, no
    copy: diffusers' blocks scale these outputs into new tensors rather than in place, which
    ``test_forecast_steps_extrapolate_the_computed_outputs`` checks on PixArt and SD3) and, on the first forecast after a computed step, their divided differences
    ``f_0 = y(s_0)``, ``f_1 = y[s_0, s_1]``, ``f_2 = y[s_0, s_1, s_2]``; the forecast at ``s`` is
    ``f_0 + f_1 (s - s_0) + f_2 (s - s_0)(s - s_1)``. Order 1 is TaylorSeer's ``f_0 + f_1 d``. At
    order 2 Newton's form is exact for outputs quadratic in the step at any spacing (the adaptive
    schedules' gaps vary), where the paper's ``f_2 d^2 / 2`` with backward differences is not.
    Differences are taken lazily so that computed steps cost nothing beyond keeping the outputs
    (they are most steps when a schedule forecasts little).
    """

    def __init__(self, order: int) -> None:
        self.order = order
        self.steps: list[int] = []  # computed steps, newest first (at most order + 1)
        self.nodes: list[tuple] = []  # their outputs as tuples, same order
        self.is_tuple = False
        self._factors: list[list[torch.Tensor] | None] | None = None

    def update(self, out, step: int) -> None:
        """Record the output computed at ``step`` (later than every recorded step)."""
        outs = out if isinstance(out, tuple) else (out,)
        keep = [(s, n) for s, n in zip(self.steps, self.nodes) if _same_shapes(n, outs)][:self.order]
        self.steps = [step] + [s for s, _ in keep]  # another shape (resolution): older nodes dropped
        self.nodes = [outs] + [n for _, n in keep]
        self.is_tuple, self._factors = isinstance(out, tuple), None

    def factors(self) -> list[list[torch.Tensor] | None]:
        """Per output: ``[f_0, f_1, ...]`` (None for a None output), from the recorded nodes."""
        if self._factors is None:
            self._factors = [None if self.nodes[0][i] is None else
                             _divided_differences([n[i] for n in self.nodes], self.steps)
                             for i in range(len(self.nodes[0]))]
        return self._factors

    def error(self, out, step: int, stride: int = 16):
        """``(sum |forecast - out|, sum |out|)`` at ``step`` over every ``stride``-th element, as float64
        0-d tensors (no host read here: the caller reads the step's total once), before ``out`` is
        recorded; (0, 0) when there is nothing to forecast from (no earlier step, or the shape changed).
        The subsample keeps the check at about 1/``stride`` of a forecast's cost."""
        outs = out if isinstance(out, tuple) else (out,)
        if not self.steps or not _same_shapes(self.nodes[0], outs):
            return 0.0, 0.0
        num = den = 0.0
        for i, y in enumerate(outs):
            if y is None:
                continue
            ys = [n[i].reshape(-1)[::stride] for n in self.nodes]
            pred = _newton_value(_divided_differences(ys, self.steps), self.steps, step)
            y = y.reshape(-1)[::stride]
            num = num + (pred - y).abs().sum().double()
            den = den + y.abs().sum().double()
        return num, den

    def predict(self, step: int):
        outs = [None if fs is None else _newton_value(fs, self.steps, step) for fs in self.factors()]
        return tuple(outs) if self.is_tuple else outs[0]


def _same_shapes(a: tuple, b: tuple) -> bool:
    return len(a) == len(b) and all((x is None) == (y is None) and (x is None or x.shape == y.shape)
                                    for x, y in zip(a, b))


def _newton_value(fs: list[torch.Tensor], steps: list[int], step: int) -> torch.Tensor:
    """``f_0 + f_1 (s - s_0) + f_2 (s - s_0)(s - s_1) + ...`` at ``s = step``.

    Summed in place into the first product (IEEE addition commutes, so the values are those of
    ``f_0 + f_1 b_1 + ...`` bit for bit) to allocate one output-sized tensor fewer per term; not
    ``torch.add(.., alpha=b)``, whose fused multiply-add rounds differently."""
    y, basis = fs[0], 1.0
    for k in range(1, len(fs)):
        basis *= step - steps[k - 1]
        term = fs[k] * basis
        y = term.add_(y) if k == 1 else y.add_(term)
    return y


def _divided_differences(ys: list[torch.Tensor], steps: list[int]) -> list[torch.Tensor]:
    """Newton coefficients ``[y[s_0], y[s_0, s_1], ...]`` of values ``ys`` at ``steps`` (newest first)."""
    table, out = list(ys), [ys[0]]
    for k in range(1, len(ys)):
        table = [torch.sub(table[i], table[i + 1]).div_(steps[i] - steps[i + k]) for i in range(len(table) - 1)]
        out.append(table[0])
    return out


class ModuleForecast:
    """Per-model driver: the step's decision and every module's factors, per CFG branch.

    Branch state (``tracker.state``): ``forecast`` (this step), ``run`` (forecast steps in a row),
    ``h0`` (probe input), ``probe_ref`` (probe residual of the last computed step), ``factors``
    (module key -> :class:`TaylorFactors`).
    """

    def __init__(self, tracker: StepTracker, config: ForecastConfig) -> None:
        self.tracker, self.config = tracker, config

    def begin_step(self) -> None:
        st, cfg, step = self.tracker.state, self.config, self.tracker.step
        if cfg.num_steps and step >= cfg.num_steps:
            raise ValueError(f"ForecastConfig(num_steps={cfg.num_steps}) but this run reached step {step + 1}: set "
                             "num_steps to the denoiser steps a run makes (the pipeline's num_inference_steps for "
                             "schedulers that evaluate each timestep once), or 0 if it varies")
        st.setdefault("factors", {})
        if cfg.tolerance > 0:
            self._plan_next(st, step)
            st["forecast"] = step >= cfg.warmup_steps and step < st["next"] or cfg.last_step_forecast(step)
        else:
            st["forecast"] = cfg.threshold == 0 and cfg.fixed_forecast(step)
        if cfg.threshold == 0:
            self._count(st["forecast"])

    def _plan_next(self, st, step: int) -> None:
        """Error control: after a computed step whose forecasts were checked, choose the next gap.

        The error of an order-p extrapolation over a gap g grows like g^(p+1), so the gap that would
        have met ``tolerance`` is ``g (tolerance / e)^(1 / (p + 1))``, taken with a 0.9 safety factor,
        at most doubled, within [1, interval] (the step-size rule of adaptive ODE solvers).
        """
        num, den = (float(v) for v in st.pop("err", (0.0, 0.0)))  # one host read per computed step
        st.setdefault("next", 0)
        if den == 0 or step != st.get("checked_step", -1) + 1:
            return  # only right after a computed step with a measured error
        cfg, gap = self.config, st["dist"]
        e = max(num / den, 1e-12)
        new = round(gap * min(2.0, 0.9 * (cfg.tolerance / e) ** (1.0 / (cfg.order + 1))))
        if e > cfg.tolerance:
            new = min(new, gap - 1)  # over the tolerance: the gap must shrink
        st["next"] = st["checked_step"] + max(1, min(cfg.interval, new))

    def probe(self, i: int, h_in: torch.Tensor, out, indices) -> None:
        """Block ``i`` (< first_blocks) ran: keep the probe input, or decide the step after the last."""
        st, cfg = self.tracker.state, self.config
        if i == 0:
            st["h0"] = h_in
        if cfg.threshold == 0 or i != cfg.first_blocks - 1:
            return
        r = split_output(out, indices)[0] - st.pop("h0")
        ref = st.get("probe_ref")
        fc = ref is not None and ref.shape == r.shape and (
            cfg.last_step_forecast(self.tracker.step) or
            cfg.adaptive_forecast(self.tracker.step, st.get("run", 0), relative_l1(r, ref)))
        st["forecast"] = fc
        if not fc:
            st["probe_ref"] = r
        self._count(fc)

    def _count(self, forecast: bool) -> None:
        st = self.tracker.state
        st["run"] = st.get("run", 0) + 1 if forecast else 0
        self.tracker.counters["steps_cached" if forecast else "steps_computed"] += 1

    def module(self, key: str, forward, args, kwargs):
        st, step = self.tracker.state, self.tracker.step
        factors = st["factors"]
        if st.get("forecast") and key in factors:  # a module never computed yet (called conditionally) runs
            self.tracker.counters["modules_skipped"] += 1
            return factors[key].predict(step)
        out = forward(*args, **kwargs)
        self.tracker.counters["modules_computed"] += 1
        f = factors.setdefault(key, TaylorFactors(self.config.order))
        if self.config.tolerance > 0 and f.steps:  # how far off would the forecast have been? (next gap)
            num, den = f.error(out, step)
            acc = st.get("err", (0.0, 0.0))
            st["err"], st["checked_step"], st["dist"] = (acc[0] + num, acc[1] + den), step, step - f.steps[0]
        f.update(out, step)
        return out


class ForecastModuleHook(ModelHook):
    def __init__(self, driver: ModuleForecast, key: str) -> None:
        super().__init__()
        self.driver, self.key = driver, key

    def new_forward(self, module, *args, **kwargs):
        return self.driver.module(self.key, self.fn_ref.original_forward, args, kwargs)


class ProbeBlockHook(ModelHook):
    def __init__(self, driver: ModuleForecast, i: int, block: torch.nn.Module) -> None:
        super().__init__()
        self.driver, self.i = driver, i
        self.read_in, self.indices = block_inputs(block), block_return_indices(block)

    def new_forward(self, module, *args, **kwargs):
        h_in = self.read_in(args, kwargs)[0]
        out = self.fn_ref.original_forward(*args, **kwargs)
        self.driver.probe(self.i, h_in, out, self.indices)
        return out


def block_lists(model: torch.nn.Module) -> list[tuple[str, torch.nn.ModuleList]]:
    """``[(name, blocks)]``: a transformer's ``transformer_blocks`` (and Flux's
    ``single_transformer_blocks``), or, in a UNet, every ``transformer_blocks`` list of its attention
    layers, in forward order (down, mid, up)."""
    top = getattr(model, "transformer_blocks", None)
    if isinstance(top, torch.nn.ModuleList) and len(top) > 0:
        lists = [("transformer_blocks", top)]
        single = getattr(model, "single_transformer_blocks", None)
        if isinstance(single, torch.nn.ModuleList):
            lists.append(("single_transformer_blocks", single))
        return lists
    lists = [(name, m) for name, m in model.named_modules()
             if name.endswith(".transformer_blocks") and isinstance(m, torch.nn.ModuleList) and len(m) > 0]
    if not lists:
        raise ValueError(f"{type(model).__name__} has no transformer blocks (attention layers) to forecast")
    return lists


def forecast_targets(model: torch.nn.Module, first_blocks: int, ff: bool) -> dict[str, torch.nn.Module]:
    """``{name: module}`` of the attention (and feed-forward) children of every block after the first
    ``first_blocks`` (counted over all of :func:`block_lists`)."""
    from diffusers.models.attention import AttentionModuleMixin, FeedForward
    from diffusers.models.attention_processor import Attention

    kinds = (Attention, AttentionModuleMixin) + ((FeedForward,) if ff else ())
    blocks = [(f"{name}.{j}", b) for name, lst in block_lists(model) for j, b in enumerate(lst)]
    if first_blocks >= len(blocks):
        raise ValueError(f"first_blocks must leave a block to forecast; the model has {len(blocks)}, "
                         f"got first_blocks={first_blocks}")
    targets = {f"{name}.{child_name}": child for name, block in blocks[first_blocks:]
               for child_name, child in block.named_children() if isinstance(child, kinds)}
    if not targets:
        raise ValueError(f"{type(model).__name__}: no attention or feed-forward modules after the first "
                         f"{first_blocks} blocks to forecast; lower first_blocks")
    return targets


def apply_forecast(model: torch.nn.Module, config: ForecastConfig) -> StepTracker:
    """Attach per-module forecasting to a diffusers transformer or UNet; returns its tracker."""
    config.validate()
    targets = forecast_targets(model, config.first_blocks, config.ff)
    blocks = [b for _, lst in block_lists(model) for b in lst]
    tracker = StepTracker()
    driver = ModuleForecast(tracker, config)
    for key, module in targets.items():
        register(module, ForecastModuleHook(driver, key), f"forecast.{key}")
    for i in range(config.first_blocks):
        register(blocks[i], ProbeBlockHook(driver, i, blocks[i]), "forecast.probe")

    def around(forward, args, kwargs):
        driver.begin_step()
        return forward(*args, **kwargs)

    register(model, RootHook(tracker, timestep_reader(model), around), "forecast.root")
    return tracker
