"""The field's reference pipeline, run on our models: diffusers' `LLaDA2Pipeline` + `BlockRefinementScheduler`.

What the pipeline expects (read from diffusers 0.42 `pipelines/llada2/pipeline_llada2.py`):
- `model(block_x, attention_mask=[B, W] 0/1, position_ids=[B, W]).logits` with aligned logits
  `[B, W, V]`; `W` is the window `x[:, :block_end]`, which grows block by block. Blocks are aligned
  to ABSOLUTE positions (the prompt fills the first blocks), positions past the end of the window
  are simply not in the input: a block never sees the masked blocks after it ("block-causal"), and
  every step recomputes the whole prefix (no KV cache).
- `position_ids` are `arange(W)` whatever the padding; the 2-D mask has zeros over left padding and
  over the block-aligned tail past `prompt + gen_length` (tail positions hold mask tokens that the
  scheduler still fills; they are cut from the output).
- A tokenizer with `eos_token_id`, `mask_token_id`, `batch_decode(..., skip_special_tokens=True)` and,
  for string prompts, `__call__(prompt, return_tensors="pt", padding=...)` returning `input_ids` and
  `attention_mask`; `apply_chat_template` only when the tokenizer has a `chat_template`.
- It discovers its device from `nn.Module` components' `.device`, so the model wrapper is an
  `nn.Module` with a `device` property.

`DiffusersModelWrapper` adapts a model following this project's contract (`dlm.tiny` or any model
taking `input_ids, attention_mask, position_ids`) without modifying it: it computes position ids
from the 2-D mask (`cumsum - 1`, as transformers does for left-padded batches) so a left-padded row
sees the same positions as when run alone, sets the mask token's logit to -inf, and counts forward
passes (a batched call is one NFE).
`DiffusersTokenizerWrapper` gives the char tokenizer the call signature the pipeline uses.

Budget mapping (`run_llada2`): the pipeline's `num_inference_steps` is a per-block step count over
`block_length` tokens; we set it to `steps // (gen_length // block_length)`, the share our engine
gives each block, so both commit the same number of tokens per forward pass. Because diffusers'
blocks start at absolute multiples of `block_length`, a prompt whose length is not a multiple of
`block_length` makes it touch one more (partial) block than our engine; the measured NFE is reported,
never the nominal budget.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from types import SimpleNamespace

import torch

# Named baselines selectable in `dlm bench --samplers`, with their pipeline keyword defaults.
# threshold > 1 turns the confidence threshold off, so every step commits exactly the schedule's
# `block_length / num_inference_steps` most confident tokens (LLaDA's low-confidence remasking);
# the "-thr" variant keeps the pipeline's own defaults (threshold 0.7, editing 0.5, 16 post steps).
BASELINE_DESCRIPTIONS = {
    "diffusers-llada2": "diffusers' LLaDA2Pipeline, its default fixed schedule (dlm bench only; needs diffusers)",
    "diffusers-llada2-thr": "diffusers' LLaDA2Pipeline with threshold 0.7 and token editing (dlm bench only)",
}
BASELINES: dict[str, dict] = {
    "diffusers-llada2": {"threshold": 1.01, "editing_threshold": None, "max_post_steps": 0},
    "diffusers-llada2-thr": {"threshold": 0.7, "editing_threshold": 0.5, "max_post_steps": 16},
}
PIPELINE_OPTIONS = ("threshold", "editing_threshold", "max_post_steps", "minimal_topk", "eos_early_stop")


class DiffusersModelWrapper(torch.nn.Module):
    """Makes a project model callable the way `LLaDA2Pipeline` calls it, and counts its forwards.

    Attributes:
        nfe: forward calls since `reset()` (a batched call counts once).
        forward_tokens: query positions processed since `reset()` (rows x window length).
        windows: lengths `W` of the inputs seen, in call order (to check the block-causal window).
    """

    def __init__(self, model: torch.nn.Module, positions_from_mask: bool = True):
        super().__init__()
        self.model = model
        self.config = getattr(model, "config", None)
        self.positions_from_mask = positions_from_mask
        self._takes_positions = _accepts(model, "position_ids")
        self.reset()

    @property
    def device(self) -> torch.device:
        # diffusers finds the pipeline's device through `module.device` (as on PreTrainedModel).
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    def reset(self) -> None:
        self.nfe = 0
        self.forward_tokens = 0
        self.windows: list[int] = []

    def forward(self, input_ids, attention_mask=None, position_ids=None, **kwargs):
        self.nfe += 1
        self.forward_tokens += input_ids.numel()
        self.windows.append(int(input_ids.shape[1]))
        if attention_mask is not None and attention_mask.dim() != 2:
            raise ValueError(f"expected a 2-D attention mask from LLaDA2Pipeline, got shape {tuple(attention_mask.shape)}")
        own_positions = getattr(self.model, "dlm_position_ids", None)
        if own_positions is not None:
            # The pipeline's window always starts at position 0, so the model's own scheme applies.
            position_ids = own_positions(input_ids, attention_mask)
        elif attention_mask is not None and self.positions_from_mask:
            position_ids = (attention_mask.long().cumsum(dim=1) - 1).clamp_min(0)
        if attention_mask is not None and bool(attention_mask.all()):
            attention_mask = None  # the model was trained without a mask; all-ones adds nothing
        kw = {"position_ids": position_ids} if self._takes_positions and position_ids is not None else {}
        out = self.model(input_ids, attention_mask=attention_mask, **kw)
        logits = out if isinstance(out, torch.Tensor) else out.logits
        mask_id = getattr(self.config, "mask_token_id", None)
        if mask_id is not None:
            # The scheduler has no notion of a forbidden token: an argmax on the mask id would "commit"
            # a mask and stall the block until its step cap. Our samplers' driver guards against
            # that; here the wrapper does (a trained model never ranks the mask id first anyway).
            logits = logits.clone()
            logits[..., mask_id] = float("-inf")
        return SimpleNamespace(logits=logits)


def _accepts(model, name: str) -> bool:
    import inspect
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError, AttributeError):
        return True
    return name in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


class DiffusersTokenizerWrapper:
    """The subset of a Hugging Face tokenizer that `LLaDA2Pipeline` calls, over a project tokenizer
    with `encode`, `decode`, `pad_token_id`, `mask_token_id`, `eos_token_id` (left padding)."""

    chat_template = None  # the tiny model has no chat format: the pipeline then encodes the raw prompt

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.eos_token_id = getattr(tokenizer, "eos_token_id", None)
        self.mask_token_id = getattr(tokenizer, "mask_token_id", None)
        self.pad_token_id = getattr(tokenizer, "pad_token_id", None)

    def __call__(self, text, return_tensors=None, padding=False, **kwargs):
        texts = [text] if isinstance(text, str) else list(text)
        ids = [self.tokenizer.encode(t) for t in texts]
        if len({len(i) for i in ids}) > 1 and not padding:
            raise ValueError("prompts of different lengths need padding=True")
        n = max(len(i) for i in ids)
        input_ids = [[self.pad_token_id] * (n - len(i)) + i for i in ids]
        mask = [[0] * (n - len(i)) + [1] * len(i) for i in ids]
        if return_tensors == "pt":
            return {"input_ids": torch.tensor(input_ids, dtype=torch.long),
                    "attention_mask": torch.tensor(mask, dtype=torch.long)}
        return {"input_ids": input_ids, "attention_mask": mask}

    def batch_decode(self, sequences, skip_special_tokens=True, **kwargs):
        return [self.tokenizer.decode(s, skip_special_tokens=skip_special_tokens) for s in sequences]

    def decode(self, ids, skip_special_tokens=True, **kwargs):
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)


def steps_per_block(steps: int, gen_length: int, block_length: int) -> int:
    """The per-block `num_inference_steps` matching a whole-generation budget of `steps`."""
    if gen_length % block_length:
        raise ValueError(f"gen_length ({gen_length}) must be a multiple of block_length ({block_length})")
    return max(1, steps // (gen_length // block_length))


def build_pipeline(model, tokenizer, positions_from_mask: bool = True):
    """`(LLaDA2Pipeline, DiffusersModelWrapper)` around our model and tokenizer (progress bars off)."""
    from diffusers import BlockRefinementScheduler, LLaDA2Pipeline

    wrapper = DiffusersModelWrapper(model, positions_from_mask=positions_from_mask).eval()
    pipe = LLaDA2Pipeline(model=wrapper, scheduler=BlockRefinementScheduler(), tokenizer=DiffusersTokenizerWrapper(tokenizer))
    pipe.set_progress_bar_config(disable=True)
    return pipe, wrapper


@dataclass
class LLaDA2RunOutput:
    """One batched call of the diffusers pipeline.

    Attributes:
        sequences: `[B, gen_length]` long, the generated tokens only (as the pipeline returns them).
        nfe: model forward calls (the whole batch in one call counts once; every row is in every call).
        seconds: wall time of the call. forward_tokens: query positions processed (rows x window).
        num_inference_steps: the per-block step count the budget was mapped to.
    """

    sequences: torch.Tensor
    nfe: int
    seconds: float
    forward_tokens: int
    num_inference_steps: int
    windows: list[int] = field(default_factory=list)


def run_llada2(pipe, wrapper: DiffusersModelWrapper, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, *,
               gen_length: int, block_length: int, steps: int, temperature: float = 0.0,
               generator: torch.Generator | None = None, options: dict | None = None,
               mask_token_id: int | None = None, eos_token_id: int | None = None) -> LLaDA2RunOutput:
    """Run the pipeline on token ids (the same ids our engine gets) with a mapped step budget."""
    opts = dict(BASELINES["diffusers-llada2"])
    opts.update(options or {})
    unknown = sorted(set(opts) - set(PIPELINE_OPTIONS))
    if unknown:
        raise ValueError(f"unknown diffusers-llada2 options {unknown}; valid: {', '.join(PIPELINE_OPTIONS)}")
    n_steps = steps_per_block(steps, gen_length, block_length)
    wrapper.reset()
    started = time.perf_counter()
    out = pipe(
        input_ids=input_ids, attention_mask=attention_mask, use_chat_template=False,
        gen_length=gen_length, block_length=block_length, num_inference_steps=n_steps,
        temperature=temperature, sampling_method="auto", generator=generator, output_type="seq",
        mask_token_id=mask_token_id, eos_token_id=eos_token_id,
        eos_early_stop=bool(opts.pop("eos_early_stop", True)), **opts)
    seconds = time.perf_counter() - started
    return LLaDA2RunOutput(sequences=out.sequences, nfe=wrapper.nfe, seconds=seconds,
                           forward_tokens=wrapper.forward_tokens, num_inference_steps=n_steps,
                           windows=list(wrapper.windows))


# ----------------------------------------------------------------------------- the bench row
from dlm.bench.external import ExternalRow, ExternalRun  # noqa: E402


class LLaDA2Row(ExternalRow):
    """`dlm bench` row: `LLaDA2Pipeline` on the run's masked model. The budget maps to the pipeline's
    per-block steps (`steps_per_block`); every row of the batch is in every call (per-row NFE = calls)."""

    engine = "diffusers"
    options = PIPELINE_OPTIONS
    takes_block = True
    family = "masked"

    def run(self, spec, budget, input_ids, attention_mask, generator) -> ExternalRun:
        if getattr(self, "_pipe", None) is None:
            self._pipe = build_pipeline(self.model, self.tokenizer)
        pipe, wrapper = self._pipe
        opts = dict(BASELINES[self.name])
        opts.setdefault("eos_early_stop", self.cfg.eos_early_stop)
        opts.update(spec.option_dict)
        out = run_llada2(pipe, wrapper, input_ids, attention_mask, gen_length=self.cfg.gen_length,
                         block_length=spec.block_for(self.cfg), steps=budget, temperature=self.cfg.temperature,
                         generator=generator, options=opts, mask_token_id=self.mask_id, eos_token_id=self.eos_id)
        return ExternalRun(out.sequences, [out.nfe] * input_ids.shape[0], out.nfe, out.forward_tokens, out.seconds)
