"""External engine rows of `dlm bench`: the field's own decoding code, run beside our samplers.

An external row is a `--samplers` entry whose name is listed in `dlm.bench.external_rows`
(`diffusers-llada2`, `transformers-diffusiongemma`, ...). The harness treats every row the same way: it hands the row the
batch it hands our samplers (the same left-padded `input_ids [B, P]`, `attention_mask [B, P]`, the
same budget point, a generator seeded as for every other entry) and scores what comes back with the
suite's verifiers. Each row lives in its own small module and implements `ExternalRow.run`.

    class MyRow(ExternalRow):            # in its own module, then one line in dlm/bench/external_rows.py
        engine = "transformers"
        def run(self, spec, budget, input_ids, attention_mask, generator) -> ExternalRun: ...

Entry options (`name:key=value`) are the row's `options`; the engine flags of our own engine
(`kv=`, `xblock=`, `refresh=`, `cut=`, and `block=` unless `takes_block`) are refused at parse time.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

@dataclass
class ExternalRun:
    """One batched call of an external engine.

    sequences: `[B, G]` long, the generated ids only (G <= gen_length when every row ended early, or
    whole canvases past it); nfe_per_row: forward passes per row, counted the engine's own way (see the
    row's module); nfe: batched forward calls; forward_tokens: query positions processed; seconds: wall
    time of the call (the engine's work only, not the harness's encoding or scoring).
    """

    sequences: torch.Tensor
    nfe_per_row: list
    nfe: int
    forward_tokens: int
    seconds: float


class ExternalRow:
    """Base of an external row, built once per run: `model`, `tokenizer`, the run's `BenchConfig`
    `cfg`, and the resolved ids `mask_id`, `eos_id`, `pad_id` (None where the model has none).

    Class attributes: `engine` (the `PairResult.engine` label; anything but "dlm" is a baseline in
    the equal-quality comparisons and drawn dashed), `options` (accepted `key=value` keys),
    `takes_block` (whether `block=N` applies), `family` ("masked" or "uniform-noise": the models it runs).
    """

    engine = "external"
    options: tuple = ()
    takes_block = False
    family = "masked"

    def __init__(self, name: str, model, tokenizer, cfg, mask_id, eos_id, pad_id):
        self.name, self.model, self.tokenizer, self.cfg = name, model, tokenizer, cfg
        self.mask_id, self.eos_id, self.pad_id = mask_id, eos_id, pad_id

    @classmethod
    def check_entry(cls, spec) -> None:
        """ValueError (one line) for an option this row does not take; called when `--samplers` is parsed."""
        entry, name = spec.label, spec.name
        if spec.kv_cache not in (None, "none"):
            raise ValueError(f"{entry!r}: {name} has no KV cache option (kv= is for our engine); drop kv=")
        if spec.cache_refresh_every:
            raise ValueError(f"{entry!r}: refresh= rebuilds our engine's KV cache; {name} has none, drop it")
        if spec.cache_across_blocks:
            raise ValueError(f"{entry!r}: xblock=1 extends our engine's KV cache; {name} has none, drop it")
        if spec.cut_trailing_masks:
            raise ValueError(f"{entry!r}: cut=1 is an option of our engine; {name} has its own windowing, drop it")
        if spec.block_length is not None and not cls.takes_block:
            raise ValueError(f"{entry!r}: {name} decodes whole canvases of the model (no block=); drop it")
        unknown = sorted(set(spec.option_dict) - set(cls.options))
        if unknown:
            raise ValueError(f"{entry!r}: unknown {name} option(s) {', '.join(unknown)}; valid: "
                             f"{', '.join(cls.options) or 'none'}")

    def check_model(self, uniform_noise: bool) -> None:
        """ValueError when the run's model is of the other family (e.g. a LLaDA pipeline on DiffusionGemma)."""
        model_family = "uniform-noise" if uniform_noise else "masked"
        if model_family != self.family:
            raise ValueError(f"{self.name} runs on a {self.family} model; --model {self.cfg.model!r} is a "
                             f"{model_family} model: drop {self.name} from --samplers")

    def run(self, spec, budget: int, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
            generator: torch.Generator) -> ExternalRun:
        raise NotImplementedError


def seed_from(generator: torch.Generator) -> int:
    """A seed for an engine that draws from torch's global RNG (transformers' `generate`), taken from
    the pair's generator: every such row gets the same seed for the same batch of the same run."""
    return int(torch.randint(0, 2**62, (1,), generator=generator))


class CallCounter:
    """Counts the calls of `module` (through `module(...)`, so its hooks run) during a `with` block; the
    hook is removed on exit. Count a submodule the engine calls through `__call__` (transformers'
    `generate` calls the top-level `forward` directly, which runs no hook)."""

    def __init__(self, module: torch.nn.Module):
        self.module, self.calls = module, 0

    def _hook(self, module, args):
        self.calls += 1

    def __enter__(self):
        self._handle = self.module.register_forward_pre_hook(self._hook)
        return self

    def __exit__(self, *exc):
        self._handle.remove()
        return False
