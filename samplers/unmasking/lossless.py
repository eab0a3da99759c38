"""Lossless draft-and-verify: several of a deterministic sampler's steps per forward pass, with the
same tokens as that sampler (FreeDave, Wu et al. 2025, arXiv:2510.00294; the verification-by-state-
equality of Spiffy, arXiv:2509.18085, and self-speculative decoding, arXiv:2510.04147).

`sampler="lossless", sampler_config={"base": "confidence", "depth": K}` decodes exactly as `base`
would (same tokens, same budget roll-over between blocks), with fewer sequential forward passes:

    round (state x, its logits L, the base's step index s in the block, budget S):
      1. draft:   d_0 = base step of x from L (exactly the base's next state); d_j = base step of
                  d_{j-1} from the same L, as if the logits did not change (j < K)
      2. verify:  ONE batched call of the driver's `ctx.forward` on [d_0 .. d_{K-1}] gives their
                  logits L_j; target t_j = base step of d_j from L_j (exact: the base's step there)
      3. accept:  d_{j+1} is the base's state when t_0 = d_1, ..., t_j = d_{j+1} (state equality);
                  every row of the batch advances by the same count n (the smallest over rows, so
                  all rows keep one step index, as the base's do), the block's budget advances by n
      4. commit d_{n-1}; its logits L_{n-1} (already computed) start the next round: no pass twice

A "base step" is what the driver would do with the base's decision: the sampler's step with the
quota `ceil(masks left / steps left)` of base step s (`samplers.contract.tokens_this_step`), the
step contract (`enforce_step_contract`), and the fill of every mask on the block's last step. Rows
whose output is already fixed (EOS stop: the driver hands the base zero logits for them) get zero
logits here too (`ctx.output_fixed`), so even the rows that finished follow the base's steps, and
the block closes after the same number of base steps. Counting stops at the state where the base
would close the block (no mask left, or every row fixed).

Lossless, exactly, when the model gives a row the same logits in a batch of K candidate rows as in
the base's own call: true of the project's CPU models (a test checks it) and of batch-invariant
kernels; with kernels whose rounding depends on the batch shape, a decision at a near-tie can flip,
as the base's own output can flip between batch sizes. Needs a deterministic, stateless base at
temperature 0 (`Sampler.is_deterministic`): confidence, margin, entropy, position (alg_temp 0),
threshold, eb, hierarchical. Masked models only: on a uniform-noise model every step's input holds
fresh noise and the previous step's logits (self-conditioning), so later states cannot be drafted.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from samplers.base import Sampler, SamplerConfig, StepContext, StepResult
from samplers.contract import enforce_step_contract, tokens_this_step
from samplers.registry import get_sampler, parse_option_value, register


def _options(value: Any) -> dict:
    """`base_options` as a dict: a dict as given, or the command line's `"k=v,k=v"` text."""
    if isinstance(value, dict):
        return dict(value)
    if not isinstance(value, str):
        raise ValueError(f"base_options must be a dict or 'key=value,key=value' text, got {type(value).__name__}")
    out = {}
    for item in filter(None, (part.strip() for part in value.split(","))):
        if "=" not in item:
            raise ValueError(f"base_options item {item!r} must be key=value (e.g. base_options=tau=0.95)")
        key, text = item.split("=", 1)
        out[key.strip()] = parse_option_value(text.strip())
    return out


@dataclass(frozen=True)
class LosslessConfig(SamplerConfig):
    """base: the sampler whose steps are reproduced (a deterministic one, see the module docstring).
    depth: K, the base steps drafted per round, at most K committed per forward pass (>= 2; FreeDave
    uses 4 for LLaDA, 8 for Dream). base_options: the base's own options (a dict, or 'k=v,k=v' on the
    command line, e.g. `lossless:base=threshold:base_options=tau=0.95`)."""

    base: str = "confidence"
    depth: int = 4
    base_options: Any = field(default_factory=dict)

    def validate(self) -> None:
        if not isinstance(self.depth, int) or isinstance(self.depth, bool) or self.depth < 2:
            raise ValueError(f"depth must be an integer >= 2 (base steps drafted per forward), got {self.depth!r}")
        if not isinstance(self.base, str) or self.base == "lossless":
            raise ValueError(f"base must name another sampler (e.g. 'confidence'), got {self.base!r}")
        _options(self.base_options)


@register
class LosslessSampler(Sampler):
    """Draft-and-verify over `config.base` (module docstring); reports its base steps per round in
    `StepResult.schedule_steps`, so the driver rolls the budget over as the base would."""

    name = "lossless"
    Config = LosslessConfig
    adaptive = True
    looks_ahead = True
    drafts_and_verifies = True

    def __init__(self, config: LosslessConfig | None = None, **overrides: Any):
        super().__init__(config, **overrides)
        self.base = get_sampler(self.config.base, **_options(self.config.base_options))
        if not self.base.is_deterministic():
            raise ValueError(
                f"lossless needs a base that decides from the logits alone (no random draw, no state "
                f"between steps, alg_temp 0): {self.base.name!r} is not; use confidence, margin, entropy, "
                "position, threshold, eb or hierarchical")

    def prepare(self, model) -> None:
        self.base.prepare(model)

    def init_state(self, batch_size: int, seq_len: int, device: torch.device) -> dict:
        return {"lossless_step": torch.zeros((), dtype=torch.long, device=device)}

    def step(self, logits: torch.Tensor, ctx: StepContext) -> StepResult:
        if ctx.temperature > 0:
            raise ValueError("lossless reproduces a greedy decode: pass temperature=0")
        if ctx.step == 0:  # a new block: the base starts its own count
            ctx.state["lossless_step"] = torch.zeros((), dtype=torch.long, device=logits.device)
        s = ctx.state["lossless_step"]
        logits = _zero_fixed(logits, ctx.x, ctx)
        drafts, first = self._drafts(logits, ctx, s)  # [R, K, Lb], d_0's StepResult
        one_step = ctx.forward is None or ctx.forwards_left < 1
        if one_step or bool(self._closes(drafts[:, :1], ctx)[0]):
            # No pass left to verify with, or d_0 already closes the block (the base's next forward
            # would not run): one base step, as the base takes it, and no verification pass. The
            # check reads one flag from the device, the round's only read besides the driver's.
            ctx.state["lossless_step"] = s + 1
            return StepResult(drafts[:, 0], first.proposal, first.confidence, schedule_steps=torch.ones_like(s))
        verified = ctx.forward(drafts)  # [R, K, Lb, V]: one forward pass, K rows per row
        n, next_logits = self._accepted(drafts, verified, ctx, s)
        ctx.state["lossless_step"] = s + n
        x = drafts.index_select(1, n - 1).squeeze(1)
        return StepResult(x, first.proposal, first.confidence, next_logits=next_logits, schedule_steps=n)

    # --------------------------------------------------------------------------------------------
    def _base_step(self, x: torch.Tensor, logits: torch.Tensor, ctx: StepContext, s: torch.Tensor,
                   offset: torch.Tensor | int) -> tuple[torch.Tensor, StepResult]:
        """The state after base step `s + offset` (`[N]` or scalar) of blocks `x [N, Lb]` with
        `logits [N, Lb, V]`: the base's decision, the contract, and the last step's fill."""
        candidates = x == ctx.mask_token_id
        at = s + offset
        steps_left = (ctx.steps_in_block - at).clamp_min(1)
        quota = tokens_this_step(candidates.sum(dim=1), steps_left)
        sub = StepContext(x=x, candidates=candidates, num_transfer=quota, step=ctx.step,
                          steps_in_block=ctx.steps_in_block, last_step=False, temperature=0.0, generator=None,
                          mask_token_id=ctx.mask_token_id, block_start=ctx.block_start, state={}, rows=None)
        result = self.base.step(logits, sub)
        new = enforce_step_contract(result, x, candidates, remasks=False, last=False, mask_id=ctx.mask_token_id)
        last = (at + 1 >= ctx.steps_in_block) & candidates.any(dim=1)
        fill = (new == ctx.mask_token_id) & torch.as_tensor(last, device=x.device).view(-1, 1)
        return torch.where(fill, result.proposal, new), result

    def _drafts(self, logits: torch.Tensor, ctx: StepContext, s: torch.Tensor):
        """`[R, K, Lb]` drafts of the next K base steps from one table of logits."""
        states, x, first = [], ctx.x, None
        for j in range(self.config.depth):
            x, result = self._base_step(x, _zero_fixed(logits, x, ctx) if j else logits, ctx, s, j)
            first = result if first is None else first
            states.append(x)
        return torch.stack(states, dim=1), first

    def _accepted(self, drafts: torch.Tensor, verified: torch.Tensor, ctx: StepContext, s: torch.Tensor):
        """`(n, logits of d_{n-1})`: the base steps every row verified (0-d long, >= 1), capped where
        the base would close the block, and the verified logits `[R, Lb, V]` to start from."""
        R, K, Lb = drafts.shape
        flat = drafts[:, :-1].reshape(R * (K - 1), Lb)
        logits = _zero_fixed(verified.reshape(R * K, Lb, -1), drafts.reshape(R * K, Lb), ctx).view(R, K, Lb, -1)
        offsets = torch.arange(1, K, device=drafts.device).repeat(R)
        targets, _ = self._base_step(flat, logits[:, :-1].reshape(R * (K - 1), Lb, -1), ctx, s, offsets)
        agree = (targets.view(R, K - 1, Lb) == drafts[:, 1:]).all(dim=2)  # [R, K-1]: t_j == d_{j+1}
        verified_steps = 1 + agree.long().cumprod(dim=1).sum(dim=1)  # [R]
        n = torch.minimum(verified_steps.min(), self._steps_to_close(drafts, ctx))
        return n, logits.index_select(1, n - 1).squeeze(1)

    @staticmethod
    def _closes(drafts: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        """`[K]` bool: whether the driver would close the block at each draft (no mask in any row, or
        every row's output fixed)."""
        R, K, Lb = drafts.shape
        closes = ~(drafts == ctx.mask_token_id).any(dim=2).any(dim=0)
        if ctx.output_fixed is not None:
            closes = closes | ctx.output_fixed(drafts.reshape(R * K, Lb)).view(R, K).all(dim=0)
        return closes

    def _steps_to_close(self, drafts: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        """Base steps until the first draft at which the driver would close the block; K when none does."""
        K = drafts.shape[1]
        index = torch.arange(1, K + 1, device=drafts.device)
        return torch.where(self._closes(drafts, ctx), index, K).min()


def _zero_fixed(logits: torch.Tensor, x: torch.Tensor, ctx: StepContext) -> torch.Tensor:
    """`logits [N, Lb, V]` with the rows whose output is fixed in state `x [N, Lb]` replaced by what
    the driver gives the base for them: zeros, the mask token at -inf."""
    if ctx.output_fixed is None:
        return logits
    fixed = ctx.output_fixed(x).view(-1, 1, 1)
    zero = torch.zeros_like(logits[:1])
    zero[..., ctx.mask_token_id] = float("-inf")
    return torch.where(fixed, zero, logits)
