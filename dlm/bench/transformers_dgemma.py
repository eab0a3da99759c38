"""DiffusionGemma rows of `dlm bench`: transformers' own `generate`, and our engine's exact mode beside it.

`transformers-diffusiongemma` runs `DiffusionGemmaForBlockDiffusion.generate` (transformers' entropy
bound sampler with adaptive stopping) with the model's shipped generation_config. `dlm-exact` runs
`dlm.generate` with the very same generation config (exact mode): token-equal to transformers from
the same seed, so the pair isolates the engine's wall time.

Budget points -> entropy bounds (`generation_config_for`). transformers' rule has no step budget: a
canvas denoises until every row is stable and confident, at most `max_denoising_steps` forwards. What
sets its speed is the entropy bound (nats of uncertainty accepted per step). A `--steps` point `b` is
mapped to `entropy_bound = shipped_bound * gen_length / b`: `b = gen_length` is the shipped config
itself (the reference point of the row: "transformers' default quality"), half the budget doubles the
bound (about twice the tokens accepted per step), and so on. `max_denoising_steps`, `t_max`, `t_min`,
`stability_threshold` and `confidence_threshold` stay the shipped ones unless the entry overrides them
(`transformers-diffusiongemma:max_denoising_steps=8`); `entropy_bound=x` fixes the bound at every
point (no sweep). `max_new_tokens` is `--gen-length`. The measured NFE is what the table reports; the
budget column of these rows is the sweep point, not a cap.

Seeds: transformers draws from torch's global RNG; each batch reseeds it with `seed_from(generator)`,
the pair's generator being seeded from `--seed` as for every entry, so both rows see the same seed for
the same batch.

NFE per row is transformers' own count (decoder forwards a row took part in before it stopped
denoising or its sequence ended; what `tokens_per_forward` divides by): recovered from
`tokens_per_forward` as `valid tokens / tokens_per_forward`; dlm's exact mode returns the same count
as `nfe_per_sequence`. `nfe` (batched calls) counts the decoder calls.
"""
from __future__ import annotations

import time

import torch

from dlm.bench.external import CallCounter, ExternalRow, ExternalRun, seed_from

GENERATION_OPTIONS = ("entropy_bound", "max_denoising_steps", "t_max", "t_min", "stability_threshold",
                      "confidence_threshold")


def generation_config_for(model, budget: int, gen_length: int, options: dict | None = None):
    """The `DiffusionGemmaGenerationConfig` of one budget point (mapping in the module docstring).

    The model's own config is resolved the way `generate` resolves it and copied; the model is untouched."""
    from transformers.models.diffusion_gemma.generation_diffusion_gemma import EntropyBoundSamplerConfig

    from dlm.engine.uniform.plan import resolve_generation_config

    options = dict(options or {})
    gc = resolve_generation_config(model, None)
    shipped = float(gc.sampler_config.entropy_bound)
    bound = float(options.pop("entropy_bound", shipped * gen_length / budget))
    gc.sampler_config = EntropyBoundSamplerConfig(entropy_bound=bound)
    gc.max_new_tokens = gen_length
    for key, value in options.items():
        setattr(gc, key, value)
    gc.validate()
    return gc


def _valid_tokens(generated: torch.Tensor, pad_id) -> torch.Tensor:
    """`[B]` generated tokens that are not pad (transformers' numerator of tokens_per_forward)."""
    if pad_id is None:
        return torch.full((generated.shape[0],), generated.shape[1])
    return (generated != pad_id).sum(dim=-1)


def all_rows_forward_tokens(input_ids: torch.Tensor, generated: torch.Tensor, decoder_calls: int, canvas: int) -> int:
    """Positions processed by an engine that keeps every row in every call: the prompt and each finished
    canvas but the last through the encoder, `canvas` positions per row per decoder call."""
    batch = input_ids.shape[0]
    return input_ids.numel() + batch * max(0, generated.shape[1] - canvas) + decoder_calls * batch * canvas


class DiffusionGemmaRow(ExternalRow):
    family = "uniform-noise"
    options = GENERATION_OPTIONS

    def config(self, spec, budget: int):
        return generation_config_for(self.model, budget, self.cfg.gen_length, spec.option_dict)


class TransformersDiffusionGemmaRow(DiffusionGemmaRow):
    engine = "transformers"

    def run(self, spec, budget, input_ids, attention_mask, generator) -> ExternalRun:
        gc = self.config(spec, budget)
        torch.manual_seed(seed_from(generator))
        with CallCounter(self.model.model.decoder) as calls, torch.no_grad():
            started = time.perf_counter()
            out = self.model.generate(input_ids, attention_mask=attention_mask, generation_config=gc)
            seconds = time.perf_counter() - started
        generated = out.sequences[:, input_ids.shape[1]:]
        valid = _valid_tokens(generated, gc.pad_token_id).double()
        tpf = out.tokens_per_forward.double()
        # forwards = valid / tpf; a row with no valid token (tpf 0) falls back to the batch's calls
        per_row = torch.where(tpf > 0, valid / tpf.clamp_min(1e-12), torch.full_like(tpf, calls.calls))
        return ExternalRun(generated, [int(round(float(x))) for x in per_row], calls.calls,
                           all_rows_forward_tokens(input_ids, generated, calls.calls, self.model.config.canvas_length), seconds)


class DlmExactRow(DiffusionGemmaRow):
    engine = "dlm"

    def run(self, spec, budget, input_ids, attention_mask, generator) -> ExternalRun:
        import dlm

        gc = self.config(spec, budget)
        torch.manual_seed(seed_from(generator))
        started = time.perf_counter()
        out = dlm.generate(self.model, input_ids, generation_config=gc, attention_mask=attention_mask)
        seconds = time.perf_counter() - started
        return ExternalRun(out.sequences[:, input_ids.shape[1]:], out.nfe_per_sequence.tolist(), out.nfe,
                           out.forward_tokens, seconds)
