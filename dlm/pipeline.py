"""A diffusers-style pipeline for masked diffusion LMs.

    pipe = DLMPipeline.from_pretrained("tiny-dlm")
    out = pipe("reverse: ana bo cyd", num_inference_steps=32, gen_length=64, block_length=32,
               sampler="threshold")
    out.texts, out.nfe
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from dlm.generation import generate as run_generation
from dlm.engine.families import family_of
from dlm.loading import LoadedModel, load


@dataclass
class DLMPipelineOutput:
    """Attributes:
        texts: one decoded response per prompt (special tokens removed, cut at the first EOS).
        sequences: `[B, P + gen_length]` token ids, prompts left-padded (a uniform-noise model
            returns whole canvases, fewer when every row ended early, as transformers' generate).
        nfe / tpf / seconds: as in `dlm.GenerateOutput`.
        prompt_length: P, where the generated tokens start in `sequences`.
    """

    texts: list[str]
    sequences: torch.Tensor
    nfe: int
    tpf: float
    seconds: float
    prompt_length: int = 0


class DLMPipeline:
    """Prompt in, text out: tokenisation, left padding, decoding, detokenisation.

    Prompts are formatted the way the model was trained, by the tokenizer: its chat template when
    it has one (`use_chat_template=None` means "if available"), else its own `format_prompt` (the
    built-in tiny model's "text + newline" convention), else the raw text. The CLI and the
    benchmark use the same formatting, so a prompt gives the same answer everywhere.
    """

    def __init__(self, model, tokenizer, *, mask_token_id: int | None = None, eos_token_id: int | None = None,
                 pad_token_id: int | None = None, shift_logits: bool | None = None, name: str = ""):
        self.model, self.tokenizer, self.name = model, tokenizer, name
        self.mask_token_id = mask_token_id if mask_token_id is not None else getattr(tokenizer, "mask_token_id", None)
        self.eos_token_id = eos_token_id if eos_token_id is not None else getattr(tokenizer, "eos_token_id", None)
        pad = pad_token_id if pad_token_id is not None else getattr(tokenizer, "pad_token_id", None)
        if pad is None or pad == self.mask_token_id:
            pad = self.eos_token_id
        self.pad_token_id = pad
        self.shift_logits = shift_logits

    @classmethod
    def from_pretrained(cls, name_or_path: str = "tiny-dlm", **load_kwargs: Any) -> "DLMPipeline":
        loaded: LoadedModel = load(name_or_path, **load_kwargs)
        return cls(loaded.model, loaded.tokenizer, mask_token_id=loaded.mask_token_id,
                   eos_token_id=loaded.eos_token_id, pad_token_id=loaded.pad_token_id,
                   shift_logits=loaded.shift_logits, name=loaded.name)

    @property
    def device(self) -> torch.device:
        params = getattr(self.model, "parameters", None)
        try:
            return next(params()).device if params else torch.device("cpu")
        except StopIteration:
            return torch.device("cpu")

    def format_prompt(self, prompt: str, use_chat_template: bool | None = None) -> str:
        has_template = bool(getattr(self.tokenizer, "chat_template", None))
        if use_chat_template and not has_template:
            raise ValueError("use_chat_template=True but the tokenizer has no chat template")
        if has_template and use_chat_template is not False:
            return self.tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False)
        own_format = getattr(self.tokenizer, "format_prompt", None)
        return own_format(prompt) if callable(own_format) else prompt

    def encode(self, prompts: list[str], use_chat_template: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Left-padded `[B, P]` ids and attention mask."""
        ids = []
        for i, prompt in enumerate(prompts):
            if not isinstance(prompt, str) or not prompt.strip():
                raise ValueError(f"prompt {i} is empty; give some text to respond to")
            ids.append(self.tokenizer.encode(self.format_prompt(prompt, use_chat_template), add_special_tokens=False))
        if len(prompts) > 1 and self.pad_token_id is None:
            raise ValueError("batched prompts need a pad token: pass pad_token_id= (not the mask id)")
        width = max(len(s) for s in ids)
        input_ids = torch.tensor([[self.pad_token_id or 0] * (width - len(s)) + s for s in ids], dtype=torch.long)
        attention = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in ids], dtype=torch.long)
        return input_ids.to(self.device), attention.to(self.device)

    def decode(self, sequences: torch.Tensor, prompt_length: int) -> list[str]:
        texts = []
        for row in sequences[:, prompt_length:].tolist():
            if self.eos_token_id is not None and self.eos_token_id in row:
                row = row[: row.index(self.eos_token_id)]
            texts.append(self.tokenizer.decode(row, skip_special_tokens=True))
        return texts

    def __call__(self, prompt: str | list[str], num_inference_steps: int | None = None, *, gen_length: int | None = None,
                 block_length: int | None = None, sampler=None, temperature: float = 0.0,
                 generator: torch.Generator | None = None, kv_cache: str = "auto", eos_early_stop: bool | None = None,
                 use_chat_template: bool | None = None, progress: bool = False, streamer=None,
                 **generate_kwargs: Any) -> DLMPipelineOutput:
        """Generate a response for each prompt (a string, or a list of strings).

        `num_inference_steps` is the forward-pass budget (default: `gen_length`, one token per
        step); the other arguments are those of `dlm.generate` (same defaults: `gen_length` 64 in
        blocks of 32 on a masked model, the generation config's `max_new_tokens` in canvases on
        DiffusionGemma;
        `eos_early_stop` is on when the model's EOS id is known; `sampler=None` is the model
        family's default, `threshold` on a masked model and transformers' own rule on
        DiffusionGemma, whose generation config then also gives the step budget and the EOS ids).
        `streamer` (one prompt): a transformers streamer such as `TextStreamer(pipe.tokenizer,
        skip_prompt=True)`, fed the formatted prompt's ids and then the tokens as they become final
        (see `dlm.generate`).
        """
        prompts = _prompt_list(prompt)
        input_ids, attention = self.encode(prompts, use_chat_template)
        if family_of(self.model).uniform:
            # ids, lengths and stopping come from the model's generation config; nothing masked-only
            model_ids = {}
        else:
            model_ids = dict(mask_token_id=self.mask_token_id, eos_token_id=self.eos_token_id,
                             shift_logits=self.shift_logits, eos_early_stop=eos_early_stop)
        out = run_generation(
            self.model, input_ids, attention_mask=attention, gen_length=gen_length, block_length=block_length,
            steps=num_inference_steps, sampler=sampler, temperature=temperature, generator=generator,
            kv_cache=kv_cache, progress=progress, streamer=streamer, **model_ids, **generate_kwargs)
        return DLMPipelineOutput(self.decode(out.sequences, input_ids.shape[1]), out.sequences, out.nfe, out.tpf,
                                 out.seconds, input_ids.shape[1])


def _prompt_list(prompt) -> list[str]:
    """`prompt` as a non-empty list of strings; ValueError naming the argument otherwise (None, a
    number or a list of ids would fail deep inside the tokenizer with a bare TypeError)."""
    if isinstance(prompt, str):
        return [prompt]
    if isinstance(prompt, (list, tuple)):
        if not prompt:
            raise ValueError("prompt is an empty list; give at least one prompt")
        for i, item in enumerate(prompt):
            if not isinstance(item, str):
                raise ValueError(f"prompt {i} is {type(item).__name__} {item!r:.40}, not text; pass a string or a "
                                 "list of strings (for token ids, call dlm.generate(model, input_ids))")
        return list(prompt)
    raise ValueError(f"prompt must be a string or a list of strings, got {type(prompt).__name__} {prompt!r:.40}; "
                     "e.g. pipe(\"sort: tom fay ivy\") (for token ids, call dlm.generate(model, input_ids))")
