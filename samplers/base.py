"""The step-policy contract for masked diffusion language models.

A sampler decides, at one decoding step, which masked positions of the current block to commit
(and, for samplers that backtrack, which committed ones to mask again). It never calls the model
itself: the driver (`dlm.generate`) runs the forward pass and hands the logits over. A sampler that
searches over candidate blocks (`looks_ahead = True`, e.g. LoPA) gets `ctx.forward`, a callable the
driver owns: it scores k candidate blocks per row in one batched call on the block's KV cache,
counts it against the step budget, and may hand its logits back for the next step
(`StepResult.next_logits`) so no pass is spent twice.

Shapes: B batch rows, L = prompt + generation length, V vocabulary.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

import torch


@dataclass(frozen=True)
class SamplerConfig:
    """Base of every sampler config: frozen, validated, JSON round-trippable.

    Neutral values mean "off". Subclasses add fields and extend `validate`.
    """

    def validate(self) -> None:
        """Raise ValueError naming the field and the fix when values contradict each other."""

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "SamplerConfig":
        data = json.loads(text)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"{cls.__name__}: unknown config keys {unknown}; valid keys are {sorted(known)}")
        return cls(**data)


@dataclass
class StepContext:
    """What the driver knows at one step, for the rows still being decoded.

    Everything is restricted to the current block: `Lb` is the block length, and position j here
    is absolute position `block_start + j` of the sequence. Committed positions of the block are
    included, so a remasking sampler can look at them.

    Attributes:
        x: `[B, Lb]` long, current tokens of the block; `mask_token_id` where still masked.
        candidates: `[B, Lb]` bool, masked positions of the block (may be committed now); all
            False for a row that has already finished this block.
        num_transfer: `[B]` long, tokens the schedule asks this step to commit per row
            (`ceil(masks left in block / steps left in block)`, at least 1 where candidates remain).
        step: index of this step inside the block (0-based).
        steps_in_block: the block's share of the forward-pass budget.
        last_step: True when no step is left for this block after this one: every candidate
            must be committed now (the driver fills any a sampler leaves with its proposal).
        temperature: sampling temperature, 0 means greedy (argmax).
        generator: `torch.Generator` for every random draw, or None.
        mask_token_id: id of the mask token.
        state: per-generation scratch space owned by the sampler (history such as last-step
            confidences or credit tensors); created by `Sampler.init_state`, keyed by the sampler.
        block_start: absolute position of the block's first token.
        rows: `[B]` long, indices of these rows in the caller's full batch (rows that finished are
            not passed), so a stateful sampler can index its per-row state.
        hidden: `[B, Lb, H]` float, the model's last hidden states at the block's positions from
            this step's forward, aligned like the logits; only for a sampler whose
            `needs_hidden_states` is True (None otherwise, or when the model gives none).
        forward: for samplers with `looks_ahead`, a callable `candidates [B, k, Lb] long ->
            logits [B, k, Lb, V]` (aligned with `x`, float, the mask token at -inf): one batched
            model call over the k candidate blocks of every row, reusing the block's KV cache.
            Each call costs one forward pass of the step budget (and k branch forwards per row).
            None when the block has no pass left after this step's (the sampler must then take
            its plain path) and for samplers that do not look ahead.
        forwards_left: how many times `forward` may still be called in this step (0 when None).
        output_fixed: with the driver's EOS stop, a callable `blocks [N, Lb] long -> [N] bool`: the
            rows whose output can no longer change in that state (an EOS with no mask before it);
            the driver hands such rows zero logits at a step that starts in that state (and a
            lookahead call gives zeros for a row whose every candidate is so). None without EOS stop.
    """

    x: torch.Tensor
    candidates: torch.Tensor
    num_transfer: torch.Tensor
    step: int
    steps_in_block: int
    last_step: bool
    temperature: float
    generator: torch.Generator | None
    mask_token_id: int
    block_start: int = 0
    state: dict = field(default_factory=dict)
    rows: torch.Tensor | None = None
    hidden: torch.Tensor | None = None
    forward: Callable[[torch.Tensor], torch.Tensor] | None = None
    forwards_left: int = 0
    output_fixed: Callable[[torch.Tensor], torch.Tensor] | None = None


@dataclass
class StepResult:
    """A sampler's decision for one step.

    Attributes:
        x: `[B, Lb]` long, the block's new tokens (committed positions filled, remasked ones set to
            the mask id).
        proposal: `[B, Lb]` long, the token the sampler would put at each position (x0).
        confidence: `[B, Lb]` float, the probability of `proposal` under the step's distribution.
        next_logits: optional `[B, Lb, V]`, logits that this step's `ctx.forward` call computed for
            exactly the returned `x`. The driver then skips the next step's forward pass and hands
            these over instead (if it had to change `x`, e.g. to force progress, it discards them).
        schedule_steps: optional 0-d long tensor, the steps of the block's schedule this decision
            took (a lossless draft-and-verify sampler commits several of its base's steps per
            forward); the driver rolls the budget over between blocks by these instead of by the
            forward passes spent. None: the forward passes this step cost.
    """

    x: torch.Tensor
    proposal: torch.Tensor
    confidence: torch.Tensor
    next_logits: torch.Tensor | None = None
    schedule_steps: torch.Tensor | None = None


class Sampler:
    """Base class: one subclass per algorithm, one file per subclass.

    Class attributes:
        name: registry name.
        Config: the frozen config dataclass.
        remasks: True if the sampler may turn committed tokens back into masks.
        adaptive: True if the sampler may commit more than `num_transfer` tokens in a step
            (it then finishes blocks with fewer forward passes than the budget).
        needs_hidden_states: True if the driver must fill `StepContext.hidden` (it then runs every
            forward as a full one with `output_hidden_states=True`); may be set per instance
            by `prepare`.
        looks_ahead: True if the sampler evaluates candidate blocks through `ctx.forward`.
        ensemble: True if the "sampler" combines whole generations (HEX) instead of deciding
            steps; `dlm.generate` hands such a name to `dlm.ensemble`.
        deterministic: True if, at temperature 0 (and alg_temp 0 where the config has it), `step`
            decides from its inputs alone: no random draw and no state between steps (see
            `is_deterministic`); what a lossless draft-and-verify sampler needs of its base.
        drafts_and_verifies: True for a sampler that reproduces another's steps exactly through
            `ctx.forward` (`lossless`): the driver refuses the settings it cannot reproduce
            (temperature > 0, a block window, a mid-block cache refresh).
    """

    name: ClassVar[str] = ""
    Config: ClassVar[type[SamplerConfig]] = SamplerConfig
    remasks: ClassVar[bool] = False
    adaptive: ClassVar[bool] = False
    needs_hidden_states: bool = False
    looks_ahead: ClassVar[bool] = False
    ensemble: ClassVar[bool] = False
    deterministic: ClassVar[bool] = False
    drafts_and_verifies: ClassVar[bool] = False

    def __init__(self, config: SamplerConfig | None = None, **overrides: Any):
        known = {f.name for f in dataclasses.fields(self.Config)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise ValueError(f"sampler '{self.name}' has no option(s) {unknown}; valid options are {sorted(known)}")
        if config is None:
            config = self.Config(**overrides)
        elif overrides:
            config = dataclasses.replace(config, **overrides)
        if not isinstance(config, self.Config):
            raise ValueError(f"sampler '{self.name}' needs a {self.Config.__name__}, got {type(config).__name__}")
        config.validate()
        self.config = config

    def prepare(self, model) -> None:
        """Called once by the driver with the model before any forward pass; samplers that carry
        artifacts trained for one model (the joint sampler's layer) check them here."""

    def init_state(self, batch_size: int, seq_len: int, device: torch.device) -> dict:
        """Fresh per-generation state; stateless samplers return an empty dict."""
        return {}

    def is_deterministic(self) -> bool:
        """Whether this configured sampler decides from its inputs alone at temperature 0."""
        return self.deterministic and not getattr(self.config, "alg_temp", 0.0)

    def step(self, logits: torch.Tensor, ctx: StepContext) -> StepResult:
        """Decide the block's next state. `logits` is `[B, Lb, V]`, aligned with `ctx.x`."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.config})"
