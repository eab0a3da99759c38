"""Model families: one strategy object per kind of diffusion LM, chosen from the model.

- `MaskedFamily`: a mask token; a step commits masked positions (LLaDA, Dream, LLaDA2, block
  diffusion, tiny-dlm). Runs `dlm.engine.masked.loop.run_masked`.
- `UniformNoiseFamily`: no mask token; canvases of random tokens, a step accepts positions and
  renoises the rest (DiffusionGemma). Runs `dlm.engine.uniform.loop.run_canvases` with transformers'
  rule (exact mode, the model's `DiffusionGemmaGenerationConfig`) or with one of our samplers.

Each strategy says which options it honours (`check`) and how to run one validated
`DecodingConfig`; `dlm.generate` and the HEX ensemble call `run_decoding`, and nothing here calls
back into the ensemble. The next family is a new strategy, not a new branch inside a loop.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from dlm.decoding_config import DecodingConfig
from dlm.outputs import GenerateOutput, StepTrace


class MaskedFamily:
    name = "masked"

    def check(self, config: DecodingConfig) -> None:
        if config.generation_config is not None:
            raise ValueError("generation_config is for uniform-noise models (DiffusionGemma); a masked diffusion LM "
                             "takes gen_length / block_length / steps / sampler instead")

    def run(self, model, input_ids, config: DecodingConfig, *, attention_mask=None, callback=None,
            return_trace: bool = False) -> GenerateOutput:
        from dlm.engine.masked.loop import run_masked

        return run_masked(model, input_ids, config, attention_mask=attention_mask, callback=callback,
                          return_trace=return_trace)


# Options of the masked engine that have no meaning on a uniform-noise model: given explicitly,
# they are refused with the reason (nothing is silently ignored).
_MASKED_ONLY = {
    "mask_token_id": "it has no mask token (a canvas always holds tokens)",
    "cfg_scale": "LLaDA's guidance masks the prompt, which needs a mask token",
    "cache_refresh_every": "its encoder KV cache is exact and never refreshed",
    "cache_across_blocks": "the encoder cache always carries across canvases",
    "cut_trailing_masks": "the decoder only ever sees the current canvas",
    "shift_logits": "its decoder's logits are aligned with the canvas",
    "eos_early_stop": "rows stop at EOS as transformers' generate stops them (always on when an EOS id is set)",
    "window_blocks": "its canvases are decoded one after another",
    "window_open_at": "its canvases are decoded one after another",
}


class UniformNoiseFamily:
    name = "uniform-noise"

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

    def run(self, model, input_ids, config: DecodingConfig, *, attention_mask=None, callback=None,
            return_trace: bool = False) -> GenerateOutput:
        from dlm.engine.uniform.loop import run_uniform

        return run_uniform(model, input_ids, config, attention_mask=attention_mask, callback=callback,
                           return_trace=return_trace)


def family_of(model: Any):
    """The strategy for `model`: uniform noise for DiffusionGemma, masked otherwise."""
    from dlm.engine.uniform.canvas_model import is_uniform_noise_model

    return UniformNoiseFamily() if is_uniform_noise_model(model) else MaskedFamily()


def run_decoding(model, input_ids: torch.Tensor, config: DecodingConfig, *, attention_mask=None,
                 callback: Callable[[StepTrace], None] | None = None, return_trace: bool = False) -> GenerateOutput:
    """Run one non-ensemble decoding: check the options against the model's family, then its loop."""
    family = family_of(model)
    family.check(config)
    return family.run(model, input_ids, config, attention_mask=attention_mask, callback=callback,
                      return_trace=return_trace)


__all__ = ["MaskedFamily", "UniformNoiseFamily", "family_of", "run_decoding"]
