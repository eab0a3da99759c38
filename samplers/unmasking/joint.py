"""Approximate joint sampling (ADJUST): k tokens per full forward drawn one after another.

Committing k tokens from one forward samples them from the product of their marginals, which breaks
every dependence between them (ALGORITHMS 1.9-1.10 in the project's algorithm notes; on the
permutation language it repeats symbols). ADJUST (approximate joint sampling with a lightweight
layer) keeps the single full forward and draws the k tokens sequentially: the first from the model's
marginal, each next one from the model's logits corrected by a small trained layer
(`samplers.unmasking.joint_layer.JointLayer`) that sees the tokens unmasked so far in the step.
The layer is trained (`dlm train-joint`) to match the frozen model's own one-token-per-step
unmasking, so k cheap passes approximate k full forwards.

Per step and row: `k = num_transfer` tokens; for m = 0..k-1: choose a position among the remaining
candidates (uniformly at random, the order under which one-token-per-step sampling is exact; or by
the confidence of the current distribution), draw its token from the current distribution, commit
it, and, unless it was the last, run the layer once to update the distributions of the rest.
The layer runs k-1 times; the NFE (full-model forwards) is the same as any sampler's at the same
budget.

A layer learns the conditionals along one commit order (`JointLayerMeta.order`, set by
`dlm train-joint --order`): with `layer="auto"` the sampler takes the shipped layer trained for its
own order (`joint-<model>.*` for random, `joint-<model>-confidence.*` for confidence) and warns when
only a layer trained for the other order exists; an explicit layer of the other order also warns.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch

from samplers.base import Sampler, SamplerConfig, StepContext, StepResult
from samplers.registry import register
from samplers.unmasking._common import gather_prob, gumbel_max, token_probs, top_k_mask
from samplers.unmasking.joint_layer import ORDERS, JointLayer, find_layer_for, load_layer, model_fingerprint


@dataclass(frozen=True)
class JointConfig(SamplerConfig):
    """layer: path of a trained layer (`<stem>.safetensors` + `<stem>.json`, or the stem), or
    "auto": the layer shipped with the package for exactly the model being decoded, trained for
    `order` when one is shipped.
    order: "random" (positions in uniform random order) or "confidence" (the most probable
    proposal of the current, corrected distribution first)."""

    layer: str = "auto"
    order: str = "random"

    def validate(self) -> None:
        if not isinstance(self.layer, str) or not self.layer:
            raise ValueError("layer must be a path to a trained joint layer or 'auto'")
        if self.order not in ORDERS:
            raise ValueError(f"order must be one of {ORDERS}, got {self.order!r}")


@register
class JointSampler(Sampler):
    name = "joint"
    Config = JointConfig

    def __init__(self, config: JointConfig | None = None, **overrides):
        super().__init__(config, **overrides)
        # An explicit path is loaded now, so a missing or broken file fails at construction.
        self.layer: JointLayer | None = None if self.config.layer == "auto" else load_layer(self.config.layer)
        self._model_fingerprint: str | None = None
        # Declared before `prepare` finds the layer, because the driver resolves kv_cache="auto" (the
        # default) from it first: until the layer says it reads log-probabilities, assume hidden
        # states, so that "auto" picks the uncached forward they need instead of a refusal.
        self.needs_hidden_states = self.layer is None or self.layer.meta.features == "hidden"

    def prepare(self, model) -> None:
        """Find (auto) or check (explicit path) the layer for `model`; ValueError names the fix."""
        if self.config.layer == "auto":
            layer = find_layer_for(model, self.config.order)
            if layer is None:
                name = getattr(getattr(model, "config", None), "model_type", type(model).__name__)
                raise ValueError(
                    f"sampler 'joint' has no trained layer for this model ({name}, checkpoint hash "
                    f"{model_fingerprint(model)}); train one with `dlm train-joint --model ... --out PATH` "
                    f"and pass layer=PATH (get_sampler('joint', layer=PATH), or `dlm bench --samplers joint:layer=PATH`)")
            self.layer = layer
        else:
            self.layer.meta.check_model(model, source=f"joint layer {self.config.layer}")
        self._check_order()
        self.needs_hidden_states = self.layer.meta.features == "hidden"
        self._model_fingerprint = self.layer.meta.model_fingerprint

    def _check_order(self) -> None:
        """Warn when the layer learned another commit order than the one it is used with: its
        corrections were fitted to other states and other committed tokens."""
        trained = self.layer.meta.order
        if trained != self.config.order:
            where = "the shipped layer" if self.config.layer == "auto" else f"joint layer {self.config.layer}"
            warnings.warn(
                f"{where} for {self.layer.meta.model_name or 'this model'} was trained for order={trained}, "
                f"used with order={self.config.order}; train one for this order with "
                f"`dlm train-joint --model ... --order {self.config.order}` and pass layer=PATH",
                UserWarning, stacklevel=3)

    @torch.no_grad()
    def step(self, logits: torch.Tensor, ctx: StepContext) -> StepResult:
        if self.layer is None or self._model_fingerprint is None:
            raise ValueError("the joint sampler must be prepared with the model first: decode through "
                             "dlm.generate, or call sampler.prepare(model)")
        layer = self.layer.to(logits.device)
        base = logits.float()
        features = layer.features(base, ctx.hidden)
        x, remaining = ctx.x.clone(), ctx.candidates.clone()
        new = torch.zeros_like(remaining)
        k = torch.where(remaining.any(dim=1), ctx.num_transfer, torch.zeros_like(ctx.num_transfer))
        current = base
        rounds = int(k.max()) if k.numel() else 0  # one host sync per step: the number of cheap passes
        proposal, confidence = gumbel_max(current, ctx.temperature, ctx.generator), None
        for m in range(rounds):
            if m > 0:
                proposal = gumbel_max(current, ctx.temperature, ctx.generator)
            confidence = gather_prob(token_probs(current), proposal)
            if self.config.order == "random":
                score = torch.rand(remaining.shape, generator=ctx.generator, device=remaining.device)
            else:
                score = confidence
            pick = top_k_mask(score, remaining, (k > m).long())
            x = torch.where(pick, proposal, x)
            new, remaining = new | pick, remaining & ~pick
            if m < rounds - 1:
                current = base + layer(features, x, new)
        if confidence is None:
            confidence = gather_prob(token_probs(current), proposal)
        return StepResult(x, proposal, confidence)
