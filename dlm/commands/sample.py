"""`dlm sample`: answer a prompt with a diffusion LM under a forward-pass budget."""
from __future__ import annotations

import argparse
import json
import sys
import time

from dlm.commands._common import add_decoding_arguments, positive_int, quiet_transformers, seeded_generator, threads_label
from dlm._progress import show_progress

DEFAULT_PROMPT = "sort: tom fay ivy gus bo wes"


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "sample", help="generate a response to a prompt",
        description="Generate a response with a diffusion LM: a masked one (LLaDA, Dream, LLaDA2, tiny-dlm) or a "
                    "uniform-noise one (DiffusionGemma, tiny-dgemma). With no arguments, the built-in tiny model "
                    f"answers {DEFAULT_PROMPT!r}. The answer goes to stdout, a summary line to stderr.")
    p.add_argument("--prompt", default=DEFAULT_PROMPT, help=f"the prompt (default: {DEFAULT_PROMPT!r})")
    p.add_argument("--sampler", default=None,
                   help="step policy, name[:key=value...] e.g. threshold:tau=0.8 (default: threshold on a masked model, "
                        "transformers' own rule from the generation config on DiffusionGemma); `dlm models --samplers` "
                        "lists them")
    p.add_argument("--steps", type=positive_int, default=None,
                   help="forward-pass budget for the whole generation (default: one token per step, gen-length "
                        "forwards, on a masked model; on DiffusionGemma the generation config's max_denoising_steps per "
                        "canvas with its own rule, one token per step with a --sampler)")
    add_decoding_arguments(p)
    p.add_argument("--json", action="store_true",
                   help="print a JSON object (text, tokens, nfe, tpf, seconds of decoding, seconds_total of the whole "
                        "command, threads, and the gen_length, block_length and steps used)")
    p.add_argument("--stream", action="store_true",
                   help="print the answer as it becomes final (the growing prefix of final tokens on a masked model, "
                        "each accepted canvas on DiffusionGemma) with transformers' TextStreamer")
    p.add_argument("--live", action="store_true",
                   help="redraw the whole generation in place at every step on the terminal (stderr): final tokens "
                        "plain, new ones bold, provisional ones dim, masks ·, remasked ×; step, forwards and tokens per "
                        "forward above. Without a terminal on stderr it streams instead (--stream)")
    p.add_argument("--record", metavar="FILE", default=None,
                   help="write every step's frame of the generation (tokens and their status) as JSON lines to FILE "
                        "(replay: dlm.live.read_frames; docs/dlm.md shows one as a GIF)")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress bar over the forward-pass budget on stderr (default: on when stderr is a terminal, "
                        "off when redirected and with --stream or --live, which show the progress themselves)")
    p.set_defaults(func=run, flag_terms=True)  # engine errors name these flags, not the API's keywords


def _check_modes(args) -> None:
    """Mistakes in the output options, before any model loads."""
    watching = [flag for flag, on in (("--stream", args.stream), ("--live", args.live)) if on]
    if watching and args.json:
        verb = "print" if len(watching) > 1 else "prints"
        raise ValueError(f"{' and '.join(watching)} {verb} the answer as it is decoded, --json prints one object at "
                         "the end: use one or the other")
    if args.live and args.progress:
        raise ValueError("--live draws its own status line (step, forwards) where the progress bar would go: drop "
                         "--progress")


def run(args) -> int:
    import torch

    import dlm
    from dlm.decoding_config import DEFAULT_GEN_LENGTH, default_block_length
    from dlm.engine.schedule import validate_lengths
    from samplers import get_sampler

    # Mistakes that need no model are reported before the (slow) load.
    _check_modes(args)
    policy = get_sampler(args.sampler) if args.sampler is not None else None  # one-line errors before the load
    if policy is not None and policy.ensemble and (args.live or args.record):
        raise ValueError(f"--live and --record show one decoding; {policy.name!r} is an ensemble of several (its "
                         "answer is voted at the end): pick another sampler, or use --stream")
    if not args.prompt.strip():
        raise ValueError("--prompt is empty; give some text to respond to")
    if args.record:
        _check_record_path(args.record)
    masked_length = args.gen_length or DEFAULT_GEN_LENGTH
    validate_lengths(masked_length, args.block_length or default_block_length(masked_length), args.steps or masked_length)
    quiet_transformers()
    pipe = dlm.DLMPipeline.from_pretrained(args.model, device=args.device, progress=False if args.progress is False else None)
    from dlm.engine.families import family_of

    uniform = family_of(pipe.model).uniform
    sampler = args.sampler if args.sampler is not None else ("diffusiongemma" if uniform else "threshold")
    generator = seeded_generator(args.seed)
    if uniform and args.sampler is None:
        # transformers' rule draws from the global RNG, as model.generate does: seed that instead
        torch.manual_seed(0 if args.seed is None else args.seed)
        generator = None

    live = args.live and sys.stderr.isatty()
    if args.live and not live:
        print("dlm sample: --live needs a terminal on stderr; streaming the text instead (--stream)", file=sys.stderr)
    stream = args.stream or (args.live and not live)
    watch = _Watch(args, pipe, uniform, policy, sampler, live)
    progress = (show_progress(None) and not (stream or live)) if args.progress is None else args.progress
    extra = {}
    if stream:
        from transformers import TextStreamer
        extra["streamer"] = TextStreamer(pipe.tokenizer, skip_prompt=True, skip_special_tokens=True)
    if watch.sinks:
        extra.update(callback=watch.callback, return_trace=True)
    try:
        with watch:
            out = pipe(args.prompt, num_inference_steps=args.steps, gen_length=args.gen_length,
                       block_length=args.block_length, sampler=args.sampler, temperature=args.temperature,
                       generator=generator, kv_cache=args.kv_cache, progress=progress, **extra)
            watch.finish(out)
    finally:
        watch.close()
    text = out.texts[0]
    total = time.perf_counter() - getattr(args, "started", time.perf_counter())
    if args.json:
        tokens = out.sequences[0, out.prompt_length:].tolist()
        print(json.dumps({"model": args.model, "prompt": args.prompt, "text": text, "tokens": tokens,
                          "sampler": sampler, **watch.lengths, "nfe": out.nfe, "tpf": round(out.tpf, 4),
                          "seconds": round(out.seconds, 4), "seconds_total": round(total, 4),
                          "threads": torch.get_num_threads()}))
    else:
        if not stream:  # the streamer printed it already
            print(text)
        # the forwards beside what one-token-per-step decoding of the same length would take; the
        # decoding loop's time beside the whole command's (most of a first run is importing torch)
        generated = out.sequences.shape[1] - out.prompt_length
        print(f"[{args.model} | {sampler} | nfe {out.nfe} of {generated} at one token per step | "
              f"{out.tpf:.2f} tokens/forward | decoding {out.seconds:.2f} s, {total:.2f} s in all | "
              f"{threads_label()}]", file=sys.stderr)
    return 0


def resolved_lengths(args, pipe, uniform: bool) -> dict:
    """{"gen_length", "block_length", "steps"} this run decodes with, the defaults filled in as
    `dlm.generate` fills them (a uniform-noise model: whole canvases; with its own rule, `steps` is the
    generation config's `max_denoising_steps` per canvas times the canvases, at most)."""
    from dlm.decoding_config import DEFAULT_GEN_LENGTH, DecodingConfig, default_block_length

    if not uniform:
        gen = args.gen_length or DEFAULT_GEN_LENGTH
        return {"gen_length": gen, "block_length": args.block_length or default_block_length(gen),
                "steps": args.steps or gen}
    from dlm.engine.uniform.plan import planned_canvases, resolve_generation_config

    prompt_length = len(pipe.encode([args.prompt])[0][0])
    canvas, canvases = planned_canvases(pipe.model, DecodingConfig(gen_length=args.gen_length), prompt_length)
    if args.sampler is None:
        steps = resolve_generation_config(pipe.model, None).max_denoising_steps * canvases
    else:
        steps = args.steps or canvas * canvases
    return {"gen_length": canvas * canvases, "block_length": args.block_length or canvas, "steps": steps}


def _check_record_path(path: str) -> None:
    from pathlib import Path

    target = Path(path)
    if target.is_dir():
        raise ValueError(f"--record {path}: is a folder; give a file path")
    if not target.parent.is_dir():
        raise ValueError(f"--record {path}: the folder {target.parent} does not exist; create it or choose another path")


class _Watch:
    """The per-step sinks of one `dlm sample` run: the live view and the recorder, fed by one
    `dlm.live.CanvasFrames` through `callback`."""

    def __init__(self, args, pipe, uniform: bool, policy, sampler: str, live: bool):
        from dlm.live import CanvasFrames, FrameRecorder, LiveView, frames_callback, token_pieces

        self.sinks, self.view, self.recorder = [], None, None
        self.lengths = resolved_lengths(args, pipe, uniform)
        if not (live or args.record):
            return
        remasks = bool(policy is not None and policy.remasks)
        if uniform:
            canvas = int(pipe.model.config.canvas_length)
            self.frames = CanvasFrames(token_pieces(pipe.tokenizer), block_length=canvas,
                                       final_unit=self.lengths["block_length"], remasks=remasks)
        else:
            self.frames = CanvasFrames(token_pieces(pipe.tokenizer), block_length=self.lengths["block_length"],
                                       mask_id=pipe.mask_token_id, remasks=remasks, length=self.lengths["gen_length"])
        if args.record:
            # the values this run decodes with, defaults resolved: a replay needs no knowledge of them
            self.recorder = FrameRecorder(args.record, {
                "model": args.model, "prompt": args.prompt, "sampler": sampler,
                "family": "uniform-noise" if uniform else "masked", **self.lengths, "seed": args.seed})
            self.sinks.append(self.recorder)
        if live:
            self.view = LiveView(title=f"{args.model} | {sampler}")
            self.sinks.append(self.view)
        self.callback = frames_callback(self.frames, self.sinks)

    def __enter__(self):
        if self.view is not None:
            self.view.__enter__()
        return self

    def finish(self, out) -> None:
        if self.sinks:
            frame = self.frames.finish(out.sequences[0, out.prompt_length:].tolist(), out.nfe)
            for sink in self.sinks:
                sink(frame)

    def __exit__(self, *exc):
        if self.view is not None:
            self.view.__exit__(*exc)
        return False

    def close(self) -> None:
        if self.recorder is not None:
            self.recorder.close()
