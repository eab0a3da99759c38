"""`dlm.generate`: the front door of the decoding engine.

It validates the options into one `DecodingConfig`, hands an ensemble (`hex`) to `dlm.ensemble`
(which calls the loops, never this module), and otherwise runs the loop of the model's family
(`dlm.engine.families`: masked diffusion in `dlm.engine.masked.loop`, uniform noise in `dlm.engine.uniform`).
"""
from __future__ import annotations

from typing import Callable

import torch

from dlm.decoding_config import KV_CACHE_MODES, DecodingConfig
from dlm.engine.families import CallPlan, plan_call, run_decoding
from dlm.inputs import check_generate_inputs
from dlm.outputs import GenerateOutput, NonFiniteLogitsError, StepTrace
from samplers import Sampler

__all__ = ["DecodingConfig", "GenerateOutput", "KV_CACHE_MODES", "NonFiniteLogitsError", "StepTrace", "generate"]


@torch.no_grad()
def generate(
    model,
    input_ids: torch.Tensor,
    *,
    gen_length: int | None = None,
    block_length: int | None = None,
    steps: int | None = None,
    sampler: str | Sampler | None = None,
    temperature: float = 0.0,
    mask_token_id: int | None = None,
    eos_token_id: int | None = None,
    attention_mask: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    kv_cache: str = "auto",
    cache_refresh_every: int = 0,
    cfg_scale: float = 0.0,
    cache_across_blocks: bool = False,
    cache_drift_threshold: float = 0.999,
    cache_drift_probe: int = 4,
    cut_trailing_masks: bool = False,
    eos_early_stop: bool | None = None,
    shift_logits: bool | None = None,
    callback: Callable[[StepTrace], None] | None = None,
    return_trace: bool = False,
    progress: bool = False,
    sampler_config: dict | None = None,
    generation_config=None,
    window_blocks: int = 1,
    window_open_at: float = 0.1,
    compile: bool = False,
    streamer=None,
) -> GenerateOutput:
    """Generate after each prompt with a diffusion LM: masked (LLaDA, Dream, LLaDA2, tiny-dlm) or
    uniform-noise (transformers' DiffusionGemma).

    The keywords build one validated `DecodingConfig` (a bad value raises ValueError naming it);
    the model's family (`dlm.engine.families`) says which options apply and runs its loop. On a
    DiffusionGemma model, with `sampler=None` (the default there) the engine runs transformers' own
    rule from `generation_config` (the model's own when omitted) and returns the tokens
    `model.generate(input_ids, generation_config=gc)` returns from the same `torch.manual_seed`,
    with less work (rows that stopped denoising leave the decoder batch); with a sampler name it
    runs that sampler in uniform-noise mode ("commit" reads "accept", the rest is renoised), drawing
    only from `generator`. Masked-only options (mask_token_id, KV-cache modes, guidance, ...) are
    refused there.

    Args:
        model: callable `model(input_ids, attention_mask=None, **kw)` returning logits `[B, L, V]`
            or an object with `.logits`; or a `DLMAdapter`.
        input_ids: `[B, P]` integer prompts (any integer dtype; cast to long), left-padded when lengths differ (give `attention_mask`;
            without it, a leading run of the pad id is taken as padding, see `check_prompt_ids`).
            Encode text with the tokenizer's prompt convention (`tokenizer.encode_prompt(text)` for
            the built-in tiny model, or `DLMPipeline`, which does it for you).
        gen_length: tokens to generate; a multiple of `block_length` (default 64). On a uniform-noise
            model: `max_new_tokens` (default: the generation config's), rounded up to whole canvases.
        block_length: semi-autoregressive block size (default: 32 where it divides `gen_length`, else
            one block; `dlm.decoding_config.default_block_length`).
        steps: budget of forward passes for the whole generation (default: `gen_length`, one token
            per step). Blocks get `ceil(steps_left / blocks_left)` passes each, unused passes roll
            over, and within a block each step commits `ceil(masks_left / steps_left)` tokens, so
            the budget is never exceeded and every step commits at least one token.
            Lookahead calls of a sampler that searches (`ctx.forward`, see `samplers.base`) count
            against the same budget, one pass per batched call; the driver offers `ctx.forward`
            only while the block has a pass to spare, so the budget holds for them too.
        sampler: registry name or `Sampler` object; `sampler_config` overrides its config by name.
            Default (None): `threshold` on a masked model (within 1 point of one token per step on the built-in model, docs/dlm.md "Defaults"), transformers' rule on a uniform-noise one.
        generation_config: a `DiffusionGemmaGenerationConfig` (uniform-noise models only): lengths,
            EOS/pad ids, `max_denoising_steps`, the entropy bound, temperatures, adaptive stopping.
            An ensemble (`"hex"`) runs its experts through `dlm.ensemble` and ignores `block_length`.
        temperature: 0 is greedy; > 0 samples with Gumbel-max in float64 using `generator`.
        mask_token_id / eos_token_id: taken from the model config when not given.
        attention_mask: `[B, P]`, 1 for real prompt tokens, 0 for left padding (other values, and a row
            of zeros, are refused: `dlm.inputs`).
        kv_cache: "none", "prefix" or "dual" (Fast-dLLM), or "prompt"; needs a model with
            `supports_dlm_kv_cache`. The cache is rebuilt by a full forward at every block start and
            every `cache_refresh_every` steps inside a block (0: block starts only; 1: every step,
            which reproduces the no-cache output exactly). "prompt" keeps only the prompt's K/V, from
            one full forward for the whole generation (and every `cache_refresh_every` steps), and
            recomputes the whole response (up to the block end with `cut_trailing_masks`) at every
            step: exact for a model whose prompt does not attend to the response (the tiny model's
            `prompt_attends_response=False`), the prefix cache's approximation, confined to the
            prompt, otherwise. "auto": "prompt" where that is exact (the model declares a prompt
            blind to the response, see `DLMAdapter.prompt_ignores_response`), "none" elsewhere;
            always the uncached engine's tokens. The default. "elastic" (after Elastic-Cache): the
            cache is kept across blocks and refreshed by a full forward only when a drift test says it
            is stale: each step recomputes the block and the `cache_drift_probe` cached positions before
            it, and refreshes at the next step when any layer's smallest key cosine similarity on those
            probes falls below `cache_drift_threshold` (> 1: every step, the uncached tokens); see
            `dlm.engine.masked.elastic`.
        cache_drift_threshold / cache_drift_probe: the elastic cache's drift test (0.999 on the
            probes' K/V cosine similarity; 4 positions; see `dlm.decoding_config.DEFAULT_DRIFT_THRESHOLD`).
        cache_across_blocks: with a KV cache, start each block after the first by extending the
            previous block's cache instead of a full forward: only the previous block (now decoded)
            and what follows it are recomputed, the prompt's and earlier blocks' K/V are reused.
            An approximation like the cache itself (those K/V were computed while later positions
            were masks); with one block, or `kv_cache="none"`, it changes nothing.
        cut_trailing_masks: feed the model only up to the current block's end (`x[:, :block_end]`)
            even when it does not declare itself block-causal. The masked blocks after the current
            one are then never computed (fewer forward tokens); for a bidirectional model (LLaDA,
            Dream, the built-in tiny model) this changes the logits, since its positions attended to
            those masks: an approximation, off by default. Block-causal models are cut anyway
            (exactly). Not available for ensemble samplers (`hex`).
        cfg_scale: LLaDA classifier-free guidance weight (0 is off).
        eos_early_stop: once a finished block holds EOS, fill the rest of that row with EOS and stop
            decoding it (dInfer); the other rows go on. None (default): on when the EOS id is known
            (the same default in `DLMPipeline`, the CLI and `dlm bench`); False decodes every block.
            With a sampler that does not remask, a row also leaves the model's batch inside a block
            as soon as it holds an EOS with no mask before it (its output is then fixed), and leaves
            a lookahead sampler's `ctx.forward` calls once all its candidates are so finished (LoPA:
            once its anchor is); the sampler still sees it, with zero logits, so its random draws
            and the other rows' outputs are the same as without this skip.
        shift_logits: True for Dream-style models (`logits[:, i-1]` predicts token i); inferred from
            the config when None.
        window_blocks / window_open_at: a D2F-style multi-block window (Wang et al., 2025, Discrete
            Diffusion Forcing; the setting of LoPA's published numbers), off by default (1). With
            `window_blocks=W >= 2` up to W blocks decode at once: per row, the next block opens (its
            masks become candidates) once the last open block is `window_open_at` decoded (D2F: 0.1
            for math, 0.3 for code), and no block opens past a committed EOS (with EOS stop). The
            sampler sees the open blocks as one block (a lookahead sampler's branches span them); the
            budget stays exact: the first unfinished block gets its usual share of `steps`, and its
            last pass fills it. Needs a sampler that does not remask, and kv_cache 'none' or 'prompt'
            ('auto' picks one of them; 'prefix'/'dual' raise ValueError). See `dlm.engine.masked.window`.
        callback / return_trace: observe each step as a `StepTrace`. When rows finish inside a step
            of a lookahead sampler (they leave its lookahead call), that step gives one record for
            its own pass and one per lookahead call, each over the rows it ran, so summing `forwards`
            over a row's records counts the passes that row took part in.
        progress: show a progress bar over the budget on stderr.
        compile: run the step's scoring (the sampler's `step`; DiffusionGemma's per-chunk statistics)
            through `torch.compile` with static shapes, CUDA graphs on CUDA for greedy steps
            (`dlm.compiled`); the same tokens as the eager step. The first call pays the compilation.
            ValueError where torch.compile cannot run (no C++ compiler on CPU, unsupported device).
        streamer: any object with transformers' `BaseStreamer` interface (`put(token_ids)`, `end()`),
            e.g. `transformers.TextStreamer(tokenizer, skip_prompt=True)` or `TextIteratorStreamer`;
            one prompt (batch 1). It gets the prompt, then the tokens as they become final: on a
            masked model the growing prefix of final tokens (ending with the first EOS), on a
            uniform-noise model each accepted canvas, as transformers' DiffusionGemma `generate`
            streams them (with drafts to a `put_draft` streamer in its own rule); `end()` comes last,
            also when generation raises. See `dlm.streaming`.

    Returns:
        `GenerateOutput` with `.sequences [B, P + gen_length]`, `.nfe`, `.branch_forwards`, `.tpf`,
        `.seconds`.
    """
    input_ids, attention_mask = check_generate_inputs(model, input_ids, attention_mask)
    config = DecodingConfig(
        gen_length=gen_length, block_length=block_length, steps=steps, sampler=sampler, sampler_config=sampler_config,
        temperature=temperature, mask_token_id=mask_token_id, eos_token_id=eos_token_id, generator=generator,
        kv_cache=kv_cache, cache_refresh_every=cache_refresh_every, cfg_scale=cfg_scale,
        cache_across_blocks=cache_across_blocks, cache_drift_threshold=cache_drift_threshold,
        cache_drift_probe=cache_drift_probe, cut_trailing_masks=cut_trailing_masks, eos_early_stop=eos_early_stop,
        shift_logits=shift_logits, generation_config=generation_config, progress=progress,
        window_blocks=window_blocks, window_open_at=window_open_at, compile=compile)
    plan = plan_call(model, config)  # the family decided and the sampler built, once
    if streamer is None:
        return _run(model, input_ids, plan, attention_mask, callback, return_trace)
    from dlm.streaming import TokenStream

    stream = TokenStream.start(streamer, model, input_ids, plan)
    try:
        # the stream reads each step's tokens from the trace records; the trace itself is dropped
        # unless the caller asked for it
        out = _run(model, input_ids, plan, attention_mask, stream.chain(callback), return_trace or stream.per_step)
    except BaseException:
        stream.abort()
        raise
    stream.finish(out)
    if not return_trace:
        out.trace = []
    return out


def _run(model, input_ids, plan: CallPlan, attention_mask, callback, return_trace) -> GenerateOutput:
    if plan.ensemble:
        from dlm.ensemble import run_hex

        # the options must suit the family as the experts will run them
        plan.family.check(plan.config.replace(sampler=plan.policy.config.expert, sampler_config=None))
        return run_hex(model, input_ids, plan, attention_mask=attention_mask, callback=callback,
                       return_trace=return_trace)
    return run_decoding(model, input_ids, plan, attention_mask=attention_mask, callback=callback,
                        return_trace=return_trace)
