"""Model families: one strategy object per kind of diffusion LM, chosen from the model.

- `MaskedFamily`: a mask token; a step commits masked positions (LLaDA, Dream, LLaDA2, block
  diffusion, tiny-dlm). Runs `dlm.engine.masked.loop.run_masked`.
- `UniformNoiseFamily`: no mask token; canvases of random tokens, a step accepts positions and
  renoises the rest (DiffusionGemma). Runs `dlm.engine.uniform.loop.run_canvases` with transformers'
  rule (exact mode, the model's `DiffusionGemmaGenerationConfig`) or with one of our samplers.

The family is decided once per call (`family_of`, the one place that looks at the model) and, with
the sampler built once, makes the call's `CallPlan`; every consumer (generate, streaming, the
ensemble, the pipeline, the CLI, the bench) reads the plan or `family_of`. Each strategy says which
options it honours (`check`), which sampler a call runs (`policy`) and how to run one validated
`DecodingConfig` (`run`); nothing here calls back into the ensemble. The next family is a new
strategy, not a new branch inside a loop.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from dlm.decoding_config import DEFAULT_MASKED_SAMPLER, DecodingConfig
from dlm.outputs import GenerateOutput, StepTrace
from samplers import Sampler, get_sampler


class MaskedFamily:
    name = "masked"
    uniform = False

    def check(self, config: DecodingConfig) -> None:
        if config.generation_config is not None:
            raise ValueError("generation_config is for uniform-noise models (DiffusionGemma); a masked diffusion LM "
                             "takes gen_length / block_length / steps / sampler instead")

    def policy(self, config: DecodingConfig) -> Sampler:
        """The sampler the call runs: `config.sampler` (default `threshold`) with `sampler_config`."""
        name = DEFAULT_MASKED_SAMPLER if config.sampler is None else config.sampler
        return get_sampler(name, **(config.sampler_config or {}))

    def run(self, model, input_ids, config: DecodingConfig, policy: Sampler, *, attention_mask=None, callback=None,
            return_trace: bool = False) -> GenerateOutput:
        from dlm.engine.masked.loop import run_masked

        return run_masked(model, input_ids, config, policy, attention_mask=attention_mask, callback=callback,
                          return_trace=return_trace)


# Options of the masked engine that have no meaning on a uniform-noise model: given explicitly,
# they are refused with the reason (nothing is silently ignored).
_MASKED_ONLY = {
    "mask_token_id": "it has no mask token (a canvas always holds tokens)",
    "cfg_scale": "LLaDA's guidance masks the prompt, which needs a mask token",
    "cache_refresh_every": "its encoder KV cache is exact and never refreshed",
    "cache_across_blocks": "the encoder cache always carries across canvases",
    "cache_drift_threshold": "its encoder KV cache is exact and never refreshed",
    "cache_drift_probe": "its encoder KV cache is exact and never refreshed",
    "cut_trailing_masks": "the decoder only ever sees the current canvas",
    "shift_logits": "its decoder's logits are aligned with the canvas",
    "eos_early_stop": "rows stop at EOS as transformers' generate stops them (always on when an EOS id is set)",
    "window_blocks": "its canvases are decoded one after another",
    "window_open_at": "its canvases are decoded one after another",
}


class UniformNoiseFamily:
    name = "uniform-noise"
    uniform = True

    def check(self, config: DecodingConfig) -> None:
        given = config.given()
        for option, why in _MASKED_ONLY.items():
            if option in given:
                raise ValueError(f"{option} does not apply to a uniform-noise model (DiffusionGemma): {why}; drop it")
        if config.kv_cache not in ("none", "auto"):
            raise ValueError(f"kv_cache={config.kv_cache!r} does not apply to a uniform-noise model: its encoder keeps an "
                             "exact KV cache of the prompt and finished canvases by design; drop kv_cache")
        exact = config.sampler is None
        if exact and config.generator is not None:
            raise ValueError("generator is for sampler mode: transformers' DiffusionGemma rule draws from the global torch "
                             "RNG (set torch.manual_seed); pass sampler='entropy_bound' to draw from a generator")
        if exact and (config.steps is not None or config.temperature or config.sampler_config):
            raise ValueError("steps / temperature / sampler_config need sampler=...; transformers' rule takes "
                             "max_denoising_steps, t_max, t_min and sampler_config in generation_config")

    def policy(self, config: DecodingConfig) -> Sampler | None:
        """The sampler the call runs, or None for transformers' own rule (`sampler=None`)."""
        return None if config.sampler is None else get_sampler(config.sampler, **(config.sampler_config or {}))

    def run(self, model, input_ids, config: DecodingConfig, policy: Sampler | None, *, attention_mask=None,
            callback=None, return_trace: bool = False) -> GenerateOutput:
        from dlm.engine.uniform.loop import run_uniform

        return run_uniform(model, input_ids, config, policy, attention_mask=attention_mask, callback=callback,
                           return_trace=return_trace)


UNIFORM_MODEL_TYPES = ("diffusion_gemma",)


def family_of(model: Any) -> MaskedFamily | UniformNoiseFamily:
    """The strategy for `model`, the one place that decides a model's family: uniform noise for a
    transformers `DiffusionGemmaForBlockDiffusion` (a model of that config type with an
    encoder/decoder pair), masked otherwise. `family_of(model).uniform` is the flag to branch on."""
    config = getattr(model, "config", None)
    uniform = (getattr(config, "model_type", None) in UNIFORM_MODEL_TYPES
               and hasattr(getattr(model, "model", None), "encoder"))
    return UniformNoiseFamily() if uniform else MaskedFamily()


@dataclass(frozen=True)
class CallPlan:
    """One call's decisions, made once: the model's `family`, the validated `config` and the
    sampler object `policy` (None only for DiffusionGemma's own rule). An ensemble's policy is the
    ensemble (`hex`); its experts get plans of their own (`dlm.ensemble`)."""

    family: MaskedFamily | UniformNoiseFamily
    config: DecodingConfig
    policy: Sampler | None

    @property
    def ensemble(self) -> bool:
        return self.policy is not None and self.policy.ensemble


def plan_call(model, config: DecodingConfig, policy: Sampler | None = None) -> CallPlan:
    """The call's plan: the family decided from `model`, the sampler built from `config` (or the
    given `policy`, already built)."""
    family = family_of(model)
    return CallPlan(family, config, family.policy(config) if policy is None else policy)


def run_decoding(model, input_ids: torch.Tensor, plan: CallPlan, *, attention_mask=None,
                 callback: Callable[[StepTrace], None] | None = None, return_trace: bool = False) -> GenerateOutput:
    """Run one non-ensemble plan: check the options against the model's family, then its loop."""
    plan.family.check(plan.config)
    return plan.family.run(model, input_ids, plan.config, plan.policy, attention_mask=attention_mask,
                           callback=callback, return_trace=return_trace)


__all__ = ["CallPlan", "MaskedFamily", "UniformNoiseFamily", "family_of", "plan_call", "run_decoding"]
