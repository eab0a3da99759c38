"""`diffusers-diffusiongemma` row of `dlm bench`: diffusers' `DiffusionGemmaPipeline` with its
`EntropyBoundScheduler`, on the run's DiffusionGemma model.

The pipeline is called with the shipped generation config of each budget point, mapped as for
`transformers-diffusiongemma` (`dlm.bench.transformers_dgemma.generation_config_for`: the entropy bound
swept, `num_inference_steps = max_denoising_steps`, the scheduler's `t_max` / `t_min`, the call's
`stability_threshold` / `confidence_threshold`), `gen_length = --gen-length`, the pair's generator.

What the pipeline needs and how it gets it:
- a processor with `apply_chat_template(messages, ...)` returning `input_ids` / `attention_mask`:
  `_BatchProcessor` returns the batch the harness already encoded (the same left-padded ids every row
  gets) for the same number of conversations, so no chat template is applied (the tiny model has none);
- transformers 5.24 renamed an argument the pipeline passes (`past_key_values=` -> `cache=`):
  `samplers.unmasking.fix_diffusion_gemma_for_diffusers` (docs/dlm.md) is applied to the model once.

NFE: the pipeline keeps every row in every decoder call until the whole batch has stopped, so each
row's NFE is the number of decoder calls (counted by a hook on the decoder module; the encoder is called
apart and not counted), as for `diffusers-llada2`.
"""
from __future__ import annotations

import time
import warnings

import torch

from dlm.bench.external import CallCounter, ExternalRun
from dlm.bench.transformers_dgemma import DiffusionGemmaRow, all_rows_forward_tokens


class _BatchProcessor:
    """The part of a processor `DiffusionGemmaPipeline` uses, over ids the harness encoded.

    `ids` / `mask` (`[B, P]`) are set before each call; `apply_chat_template` checks that the pipeline
    asks for B conversations and returns them unchanged."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.ids = self.mask = None

    def apply_chat_template(self, messages, **kwargs):
        if len(messages) != self.ids.shape[0]:
            raise ValueError(f"the pipeline asked for {len(messages)} prompts, the batch holds {self.ids.shape[0]}")
        return {"input_ids": self.ids, "attention_mask": self.mask}

    def batch_decode(self, sequences, skip_special_tokens=True, **kwargs):
        return self.tokenizer.batch_decode(sequences, skip_special_tokens=skip_special_tokens)


class DiffusersDiffusionGemmaRow(DiffusionGemmaRow):
    engine = "diffusers"

    def run(self, spec, budget, input_ids, attention_mask, generator) -> ExternalRun:
        from diffusers import DiffusionGemmaPipeline, EntropyBoundScheduler

        from samplers.unmasking import fix_diffusion_gemma_for_diffusers

        gc = self.config(spec, budget)
        fix_diffusion_gemma_for_diffusers(self.model)
        processor = _BatchProcessor(self.tokenizer)
        processor.ids = input_ids
        processor.mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
        scheduler = EntropyBoundScheduler(entropy_bound=float(gc.sampler_config.entropy_bound), t_max=gc.t_max,
                                          t_min=gc.t_min)
        pipe = DiffusionGemmaPipeline(model=self.model, scheduler=scheduler, processor=processor)
        pipe.set_progress_bar_config(disable=True)
        eos = gc.eos_token_id[0] if isinstance(gc.eos_token_id, (list, tuple)) else gc.eos_token_id
        messages = [[{"role": "user", "content": ""}]] * input_ids.shape[0]
        with CallCounter(self.model.model.decoder) as calls, warnings.catch_warnings():
            # the pipeline passes `past_key_values=` to the model's forward, which transformers 5.24 still
            # accepts with a FutureWarning per step
            warnings.simplefilter("ignore", FutureWarning)
            started = time.perf_counter()
            out = pipe(messages=messages, gen_length=self.cfg.gen_length, num_inference_steps=gc.max_denoising_steps,
                       eos_token_id=eos, stability_threshold=gc.stability_threshold,
                       confidence_threshold=gc.confidence_threshold, generator=generator, output_type="seq")
            seconds = time.perf_counter() - started
        generated = out.sequences
        return ExternalRun(generated, [calls.calls] * input_ids.shape[0], calls.calls,
                           all_rows_forward_tokens(input_ids, generated, calls.calls, self.model.config.canvas_length), seconds)
