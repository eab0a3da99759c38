"""Our unmasking samplers as diffusers discrete schedulers, for `LLaDA2Pipeline` and `DiffusionGemmaPipeline`.

    from samplers.unmasking import as_diffusers_scheduler
    pipe = LLaDA2Pipeline(model=model, tokenizer=tok, scheduler=as_diffusers_scheduler("threshold", tau=0.95))
    pipe = DiffusionGemmaPipeline(model=dg, processor=proc,
                                  scheduler=as_diffusers_scheduler("entropy_bound", entropy_bound=0.1))

The scheduler is a thin driver around one of our step policies (`samplers.unmasking`): it turns the
pipeline's `step(model_output=logits [B, Lb, V], timestep=step index, sample=block tokens [B, Lb], ...)`
into the policy's `Sampler.step(logits, StepContext)` and reads the decision back into the fields the
pipelines read (`prev_sample`, `transfer_index`, `editing_transfer_index`, `sampled_tokens`,
`sampled_probs`, `pred_logits`, plus `accepted_index` as `EntropyBoundScheduler` has it). The policy
itself is written once, in its own file. The call interface is that of diffusers 0.42's
`BlockRefinementScheduler` / `EntropyBoundScheduler` (read from their code and the two pipelines' loops):
`set_timesteps(num_inference_steps, device=None, block_length=None)`, `step(...)` with the keyword
arguments LLaDA2Pipeline passes, and the loop helpers `check_eos_finished` / `check_block_should_continue`.

The model family is the pipeline's: a `mask_token_id` in `step` is a masked model (LLaDA2: commit masked
positions); `mask_token_id=None` is a uniform-noise canvas (DiffusionGemma: the policy "accepts"
positions, every position not accepted gets a fresh uniformly random token, and the scheduler tracks
what was accepted, resetting at `timestep == 0`, as BlockRefinementScheduler's uniform mode does).

Choices (each documented in docs/dlm.md, "Our samplers as diffusers schedulers"):
- Which wins: LLaDA2Pipeline passes its own `threshold` (0.7) and `editing_threshold` (0.5) to every
  `step` call whether the user set them or not. The scheduler's own config wins: a policy is what the
  scheduler was built with (`as_diffusers_scheduler("threshold", tau=...)`); our policies never edit
  committed tokens, so `editing_threshold` has no effect. A one-time warning names the ignored values.
- Per-step quota: our engine asks a step for `ceil(masks left / steps left)` tokens (never wasted
  passes when a threshold commits extra); diffusers' BlockRefinementScheduler asks for a fixed split of
  `block_length` over the steps. Both are the same when `num_inference_steps == block_length` (one token
  per step) and on steps without extra commits; `quota="fixed"` reproduces diffusers' split exactly.
- `generator` is named in `step`'s signature (DiffusionGemmaPipeline forwards it only to schedulers whose
  `step` names it; with `**kwargs` alone the global RNG would be used silently).
- Not through a pipeline: samplers that need extra model forwards or whole generations (`lopa`, `hex`)
  raise `ValueError` naming the engine call; `joint` needs `scheduler.prepare(pipe.model)` first (its
  trained layer is checked against the model) and refuses a layer that reads hidden states.
- `entropy_bound` (DiffusionGemma's rule) on a masked model, and `quota="fixed"` (BlockRefinement's
  masked quota) on a uniform-noise model, raise `ValueError`.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch
from diffusers.configuration_utils import ConfigMixin, register_to_config
from diffusers.schedulers.scheduling_utils import SchedulerMixin
from diffusers.utils import BaseOutput

from samplers.base import Sampler, StepContext, StepResult
from samplers.contract import enforce_step_contract, tokens_this_step
from samplers.registry import get_sampler
from samplers.unmasking._common import commit, gather_prob
from samplers.unmasking.entropy_bound import (EntropyBoundSampler, categorical_entropy, entropy_bound_accept,
                                              exponential_race)

logger = logging.getLogger(__name__)

QUOTAS = ("adaptive", "fixed")
SAMPLING_METHODS = ("auto", "greedy", "multinomial")
SCHEDULER_KEYS = ("block_length", "num_inference_steps", "quota")
UNACCEPTED = -1  # the "mask" a policy sees on a uniform-noise canvas: a position not accepted yet
# entropy_bound options that are DiffusionGemmaPipeline call arguments, not scheduler settings.
PIPELINE_STOP_OPTIONS = ("stability_threshold", "confidence_threshold")


@dataclass
class UnmaskingSchedulerOutput(BaseOutput):
    """Output of `UnmaskingScheduler.step`; all `[B, Lb]` unless noted.

    prev_sample: long, the block after this step (uniform-noise: positions not accepted renoised).
    transfer_index: bool, positions committed (accepted) in this step.
    editing_transfer_index: bool, committed positions this step changed (a remasking policy such as
        `saber` taking tokens back: they hold the mask id in `prev_sample`); never a token edit.
    sampled_tokens: long, the policy's proposal at every position.
    sampled_probs: float, the probability the policy gave its proposal.
    pred_logits: `[B, Lb, V]`, logits for self-conditioning and the pipeline's stopping rule: the
        temperature-scaled logits for `entropy_bound` (as EntropyBoundScheduler), else the raw ones.
    accepted_index: bool, the positions that hold a committed / accepted token after this step.
    """

    prev_sample: torch.LongTensor
    transfer_index: torch.BoolTensor
    editing_transfer_index: torch.BoolTensor
    sampled_tokens: torch.LongTensor
    sampled_probs: torch.Tensor
    pred_logits: torch.Tensor
    accepted_index: torch.BoolTensor


def engine_call(name: str) -> str:
    return f"dlm.generate(model, input_ids, sampler={name!r}, ...)"


def fixed_quota(block_length: int, steps: int, step_index: int) -> int:
    """BlockRefinementScheduler's per-step count: `block_length` split evenly over `steps`, the first
    `block_length % steps` steps one larger."""
    base, extra = divmod(block_length, steps)
    return base + (1 if min(step_index, steps - 1) < extra else 0)


def adaptive_quota(masks_left: torch.Tensor, steps_left: int) -> torch.Tensor:
    """`[B]` long: `ceil(masks_left / steps_left)`, at least 1 where masks remain (the engine's rule)."""
    return tokens_this_step(masks_left, steps_left)


def driver_guarantees(result: StepResult, x: torch.Tensor, candidates: torch.Tensor, remasks: bool, last: bool,
                      mask_id: int) -> torch.Tensor:
    """The engine's contract on the policy's answer, `[R, Lb]` (`samplers.contract`)."""
    return enforce_step_contract(result, x, candidates, remasks=remasks, last=last, mask_id=mask_id)


class UnmaskingScheduler(SchedulerMixin, ConfigMixin):
    """A registered unmasking policy of ours behind diffusers' discrete-scheduler interface.

    Config (saved by `save_config`, restored by `from_config` / `from_pretrained`):
        sampler: registry name (`threshold`, `confidence`, `entropy_bound`, ...).
        sampler_config: the policy's options (its frozen config's fields), JSON-serialisable.
        block_length: tokens per block (LLaDA2Pipeline reads it when its call gives none).
        num_inference_steps: steps per block until `set_timesteps` says otherwise.
        quota: "adaptive" (default, our engine's `ceil(masks / steps)`) or "fixed" (diffusers' split of
            `block_length` over the steps; masked models only).
    """

    order = 1

    @register_to_config
    def __init__(self, sampler: str = "threshold", sampler_config: dict | None = None, block_length: int = 32,
                 num_inference_steps: int = 32, quota: str = "adaptive"):
        options = dict(sampler_config or {})
        if quota not in QUOTAS:
            raise ValueError(f"quota must be one of {QUOTAS}, got {quota!r}")
        for key, value in (("block_length", block_length), ("num_inference_steps", num_inference_steps)):
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{key} must be a positive integer, got {value!r}")
        if sampler == "entropy_bound":
            passed = sorted(set(options) & set(PIPELINE_STOP_OPTIONS))
            if passed:
                raise ValueError(f"{', '.join(passed)} of entropy_bound are DiffusionGemmaPipeline call arguments "
                                 f"(pipe(..., stability_threshold=..., confidence_threshold=...)), which applies its "
                                 f"own adaptive stopping; a scheduler cannot honour them: drop them here")
        self.policy: Sampler = get_sampler(sampler, **options)
        if self.policy.looks_ahead or self.policy.ensemble:
            what = "extra look-ahead forwards" if self.policy.looks_ahead else "whole generations (an ensemble)"
            raise ValueError(f"sampler {sampler!r} needs {what}, which a pipeline's one-forward-per-step loop cannot "
                             f"give a scheduler; decode with our engine instead: {engine_call(sampler)}")
        self.num_inference_steps = num_inference_steps
        self._block_length = block_length
        self.timesteps = torch.arange(num_inference_steps, dtype=torch.long)
        self._prepared = not hasattr(self.policy, "layer")  # joint: a trained layer to check against the model
        self._reset()

    # ------------------------------------------------------------------ setup
    def _reset(self) -> None:
        self._accepted: torch.Tensor | None = None  # uniform-noise: positions accepted in this canvas
        self._state: dict = {}
        self._warned = False

    def prepare(self, model) -> None:
        """Let the policy check artifacts trained for one model (the `joint` sampler's layer); call
        `pipe.scheduler.prepare(pipe.model)` once before the pipeline for `joint`."""
        self.policy.prepare(model)
        if self.policy.needs_hidden_states:
            raise ValueError(f"sampler {self.policy.name!r} with this layer reads the model's hidden states, which a "
                             f"pipeline never hands its scheduler; use {engine_call(self.policy.name)}")
        self._prepared = True

    def set_timesteps(self, num_inference_steps: int, device: str | torch.device | None = None,
                      block_length: int | None = None) -> None:
        """Steps per block (and, optionally, the block length); `timesteps` are the step indices
        `0..N-1` that the pipelines pass back to `step`. Resets the per-generation state."""
        if not isinstance(num_inference_steps, int) or num_inference_steps <= 0:
            raise ValueError(f"num_inference_steps must be a positive integer, got {num_inference_steps!r}")
        if block_length is not None and (not isinstance(block_length, int) or block_length <= 0):
            raise ValueError(f"block_length must be a positive integer, got {block_length!r}")
        self.num_inference_steps = num_inference_steps
        self._block_length = block_length if block_length is not None else self.config.block_length
        self.timesteps = torch.arange(num_inference_steps, device=device, dtype=torch.long)
        self._reset()

    # ------------------------------------------------------------------ one step
    def step(self, model_output: torch.Tensor, timestep: int | torch.Tensor, sample: torch.LongTensor, *,
             mask_token_id: int | None = None, temperature: float = 0.0, top_p: float | None = None,
             top_k: int | None = None, sampling_method: str = "auto", threshold: float | None = None,
             editing_threshold: float | None = None, minimal_topk: int | None = None,
             prompt_mask: torch.BoolTensor | None = None, generator: torch.Generator | None = None,
             return_dict: bool = True) -> UnmaskingSchedulerOutput | tuple:
        """One step over the block: `model_output [B, Lb, V]` logits, `sample [B, Lb]` tokens.

        `mask_token_id` given: masked model; None: uniform-noise canvas. `temperature` and
        `sampling_method` set the policy's sampling temperature ("greedy" is 0); `top_p`/`top_k` are
        not implemented by our policies (ValueError when set). `threshold`, `editing_threshold`,
        `minimal_topk` and `prompt_mask` are LLaDA2Pipeline's per-call options: the scheduler's config
        wins (see the module docstring). Returns `UnmaskingSchedulerOutput` (or its fields as a tuple
        in BlockRefinementScheduler's order, then `accepted_index`).
        """
        if model_output.dim() != 3 or sample.dim() != 2 or model_output.shape[:2] != sample.shape:
            raise ValueError(f"step needs model_output [B, Lb, V] and sample [B, Lb], got {tuple(model_output.shape)} "
                             f"and {tuple(sample.shape)}")
        if top_k is not None and 0 < top_k < model_output.shape[-1]:
            raise ValueError(f"top_k={top_k}: our samplers do not filter the vocabulary; pass top_k=None")
        if top_p is not None and top_p < 1.0:
            raise ValueError(f"top_p={top_p}: our samplers do not filter the vocabulary; pass top_p=None")
        if sampling_method not in SAMPLING_METHODS:
            raise ValueError(f"sampling_method must be one of {SAMPLING_METHODS}, got {sampling_method!r}")
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {temperature}")
        if not self._prepared:
            raise ValueError(f"sampler {self.policy.name!r} checks its trained layer against the model: call "
                             f"pipe.scheduler.prepare(pipe.model) once first (or use {engine_call(self.policy.name)})")
        self._note_ignored(threshold, editing_threshold)
        step_index = int(timestep.item()) if isinstance(timestep, torch.Tensor) else int(timestep)
        temp = 0.0 if sampling_method == "greedy" else float(temperature)
        if mask_token_id is None:
            out = self._uniform_step(model_output, step_index, sample, temp, generator)
        else:
            out = self._masked_step(model_output, step_index, sample, int(mask_token_id), temp, generator)
        if not return_dict:
            return (out.prev_sample, out.transfer_index, out.editing_transfer_index, out.sampled_tokens,
                    out.sampled_probs, out.pred_logits, out.accepted_index)
        return out

    def _note_ignored(self, threshold, editing_threshold) -> None:
        """Warn once per generation when the pipeline passes thresholds that this scheduler does not use."""
        if self._warned:
            return
        tau = getattr(self.policy.config, "tau", None)
        ignored = []
        if threshold is not None and threshold != tau:
            ignored.append(f"threshold={threshold}")
        if editing_threshold is not None and editing_threshold > 0:
            ignored.append(f"editing_threshold={editing_threshold}")
        if ignored:
            self._warned = True
            used = f" (it uses tau={tau})" if tau is not None else ""
            logger.warning("%s: the pipeline's %s are ignored: the scheduler's config decides%s and our samplers never "
                           "edit committed tokens; set options with as_diffusers_scheduler(%r, ...)",
                           type(self).__name__, ", ".join(ignored), used, self.policy.name)

    def _context(self, x, candidates, step_index, temperature, generator, mask_id, rows) -> StepContext:
        steps = self.num_inference_steps
        steps_left = max(steps - step_index, 1)
        masks_left = candidates.sum(dim=1)
        if self.config.quota == "fixed":
            k = fixed_quota(self._block_length, steps, step_index)
            num_transfer = torch.where(masks_left > 0, torch.clamp(masks_left, max=k).clamp_min(1), masks_left)
        else:
            num_transfer = adaptive_quota(masks_left, steps_left)
        return StepContext(x=x, candidates=candidates, num_transfer=num_transfer, step=min(step_index, steps - 1),
                           steps_in_block=steps, last_step=steps_left <= 1, temperature=temperature,
                           generator=generator, mask_token_id=mask_id, block_start=0, state=self._state, rows=rows)

    def _policy_step(self, logits, x, candidates, step_index, temperature, generator, mask_id):
        """Run the policy on the rows that still have candidates. Returns `(new_x, proposal, confidence)`,
        all `[B, Lb]` (rows without candidates unchanged, their proposal the argmax)."""
        if step_index == 0 or not self._state:
            self._state = self.policy.init_state(x.shape[0], x.shape[1], x.device)
        active = candidates.any(dim=1)
        new_x = x.clone()
        proposal = torch.zeros_like(x)
        confidence = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
        idle = (~active).nonzero().squeeze(1)
        if idle.numel():  # rows with nothing left to commit report the argmax and its probability
            top = torch.softmax(logits[idle].float(), dim=-1).max(dim=-1)
            proposal[idle], confidence[idle] = top.indices, top.values
        rows = active.nonzero().squeeze(1)
        if rows.numel() == 0:
            return new_x, proposal, confidence
        ctx = self._context(x[rows], candidates[rows], step_index, temperature, generator, mask_id, rows)
        result = self.policy.step(logits[rows], ctx)
        new_x[rows] = driver_guarantees(result, x[rows], candidates[rows], self.policy.remasks, ctx.last_step, mask_id)
        proposal[rows], confidence[rows] = result.proposal, result.confidence.float()
        return new_x, proposal, confidence

    def _masked_step(self, logits, step_index, sample, mask_id, temperature, generator) -> UnmaskingSchedulerOutput:
        if isinstance(self.policy, EntropyBoundSampler):
            raise ValueError("sampler 'entropy_bound' is DiffusionGemma's uniform-noise rule (a temperature annealed "
                             "t_max -> t_min, renoising); this pipeline decodes a masked model (it passes a "
                             "mask_token_id): use 'eb', the same entropy bound over masked positions, or "
                             f"{engine_call('entropy_bound')}")
        candidates = sample == mask_id
        new_x, proposal, confidence = self._policy_step(logits, sample, candidates, step_index, temperature, generator,
                                                        mask_id)
        committed = candidates & (new_x != mask_id)
        taken_back = ~candidates & (new_x == mask_id)
        return UnmaskingSchedulerOutput(prev_sample=new_x, transfer_index=committed, editing_transfer_index=taken_back,
                                        sampled_tokens=proposal, sampled_probs=confidence, pred_logits=logits,
                                        accepted_index=new_x != mask_id)

    def _uniform_step(self, logits, step_index, sample, temperature, generator) -> UnmaskingSchedulerOutput:
        if self.config.quota == "fixed":
            raise ValueError("quota='fixed' reproduces BlockRefinementScheduler's masked-model schedule; this pipeline "
                             "decodes a uniform-noise model (mask_token_id=None): use quota='adaptive'")
        if isinstance(self.policy, EntropyBoundSampler):
            return self._entropy_bound_step(logits, step_index, sample, temperature, generator)
        if step_index == 0 or self._accepted is None or self._accepted.shape != sample.shape:
            self._accepted = torch.zeros_like(sample, dtype=torch.bool)
            self._state = {}
        accepted = self._accepted
        x = torch.where(accepted, sample, torch.full_like(sample, UNACCEPTED))
        new_x, proposal, confidence = self._policy_step(logits, x, ~accepted, step_index, temperature, generator,
                                                        UNACCEPTED)
        now = new_x != UNACCEPTED
        noise = torch.randint(0, logits.shape[-1], sample.shape, device=sample.device, generator=generator)
        prev = torch.where(now, new_x, noise)
        self._accepted = now
        return UnmaskingSchedulerOutput(prev_sample=prev, transfer_index=now & ~accepted,
                                        editing_transfer_index=accepted & ~now, sampled_tokens=proposal,
                                        sampled_probs=confidence, pred_logits=logits, accepted_index=now)

    def _entropy_bound_step(self, logits, step_index, sample, temperature, generator) -> UnmaskingSchedulerOutput:
        """DiffusionGemma's rule through the pure core of `samplers.unmasking.entropy_bound`: draw a token
        per position at the annealed temperature, accept by the entropy bound over the whole canvas,
        renoise the rest (no state carried between steps, as in transformers' generate).

        The temperature is formed as diffusers' EntropyBoundScheduler forms it (a Python float,
        `t_min + (t_max - t_min) * (N - step) / N`), so that the scheduler is token-equal to it in its
        pipeline; transformers' generate (and our engine) form it in float32 tensor arithmetic, which
        can differ in the last bit."""
        if temperature != 0:
            raise ValueError(f"temperature={temperature}: entropy_bound anneals its own temperature t_max -> t_min; "
                             "set those with as_diffusers_scheduler('entropy_bound', t_max=..., t_min=...)")
        c = self.policy.config
        steps = self.num_inference_steps
        t = c.t_min + (c.t_max - c.t_min) * ((steps - step_index) / steps)
        scaled = logits / t
        B, L, V = scaled.shape
        probs = torch.softmax(scaled.float().reshape(B * L, V), dim=-1)
        proposal = exponential_race(probs, generator).view(B, L)
        accepted = entropy_bound_accept(categorical_entropy(scaled), c.entropy_bound)
        noise = torch.randint(0, V, sample.shape, device=sample.device, generator=generator)
        prev = commit(noise, proposal, accepted)
        return UnmaskingSchedulerOutput(prev_sample=prev, transfer_index=accepted,
                                        editing_transfer_index=torch.zeros_like(accepted), sampled_tokens=proposal,
                                        sampled_probs=gather_prob(probs.view(B, L, V), proposal), pred_logits=scaled,
                                        accepted_index=accepted)

    # ------------------------------------------------------------------ LLaDA2Pipeline's loop helpers
    @staticmethod
    def check_eos_finished(cur_x: torch.LongTensor, sampled_tokens: torch.LongTensor, final_transfer: torch.BoolTensor,
                           finished: torch.BoolTensor, eos_token_id: int, mask_token_id: int,
                           prompt_length: int) -> torch.BoolTensor:
        """`[B]` finished flags after this step: a row finishes when it committed an EOS this step and
        its first EOS lies in the generated part with no mask before it (rows already finished stay so).

        cur_x: `[B, W]` the window so far; sampled_tokens / final_transfer: `[B, Lb]` this step's."""
        eos_now = ((sampled_tokens == eos_token_id) & final_transfer).any(dim=1)
        is_eos = cur_x == eos_token_id
        first = is_eos.long().argmax(dim=1)
        pos = torch.arange(cur_x.shape[1], device=cur_x.device)
        gap = (pos >= prompt_length) & (pos.unsqueeze(0) < first.unsqueeze(1))
        clean = ~((cur_x == mask_token_id) & gap).any(dim=1)
        done = eos_now & is_eos.any(dim=1) & (first >= prompt_length) & clean
        return finished | done

    def check_block_should_continue(self, step_idx: int, masks_remaining: bool, editing_enabled: bool,
                                    editing_transfer_index: torch.BoolTensor, post_steps: int, max_post_steps: int,
                                    finished: torch.BoolTensor) -> bool:
        """Whether LLaDA2Pipeline's inner loop runs another step on this block: not when every row
        finished, not past the step budget with masks left, and after the masks are gone only while a
        step still changes committed tokens (within `max_post_steps`)."""
        if bool(finished.all()):
            return False
        if masks_remaining:
            return step_idx < self.num_inference_steps
        if not editing_enabled or not bool(editing_transfer_index.any()):
            return False
        return post_steps <= max_post_steps


def as_diffusers_scheduler(name: str, **config: Any) -> UnmaskingScheduler:
    """Our sampler `name` as a diffusers scheduler for `LLaDA2Pipeline` / `DiffusionGemmaPipeline`.

    Keyword arguments are the sampler's options (e.g. `tau` for `threshold`; `entropy_bound`, `t_max`,
    `t_min` for `entropy_bound`) plus the scheduler's own `block_length`, `num_inference_steps` and
    `quota` ("adaptive" | "fixed"). Unknown names or options raise ValueError listing the valid ones.
    """
    scheduler_kw = {k: config.pop(k) for k in SCHEDULER_KEYS if k in config}
    return UnmaskingScheduler(sampler=name, sampler_config=config, **scheduler_kw)


def fix_diffusion_gemma_for_diffusers(model) -> None:
    """Workaround for diffusers 0.42.1's `DiffusionGemmaPipeline` on transformers >= 5.24.

    The pipeline calls `model.model.decoder.create_diffusion_decoder_attention_mask(...,
    past_key_values=cache)`, but transformers 5.24 renamed that argument to `cache=` (its forward
    methods still accept the old name with a deprecation warning; this static method does not), so the
    pipeline raises `TypeError` before its first step. This rebinds the method on this model instance
    only, to one that accepts either name; transformers' class and other instances are untouched. Call
    it once on the model before building the pipeline. A no-op where the method already accepts
    `past_key_values`.
    """
    import inspect

    decoder = model.model.decoder
    original = type(decoder).create_diffusion_decoder_attention_mask
    if "past_key_values" in inspect.signature(original).parameters:
        return

    def create_diffusion_decoder_attention_mask(*args, past_key_values=None, **kwargs):
        if past_key_values is not None:
            kwargs.setdefault("cache", past_key_values)
        return original(*args, **kwargs)

    decoder.create_diffusion_decoder_attention_mask = create_diffusion_decoder_attention_mask
