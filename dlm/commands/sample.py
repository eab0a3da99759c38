"""`dlm sample`: answer a prompt with a diffusion LM under a forward-pass budget."""
from __future__ import annotations

import json
import sys

from dlm.commands._common import add_decoding_arguments, positive_int, quiet_transformers, seeded_generator
from dlm._progress import show_progress

DEFAULT_PROMPT = "sort: tom fay ivy gus bo wes"


def register(subparsers) -> None:
    p = subparsers.add_parser("sample", help="generate a response to a prompt",
                              description="Generate a response with a masked diffusion LM. With no arguments, "
                                          f"the built-in tiny model answers {DEFAULT_PROMPT!r}.")
    p.add_argument("--prompt", default=DEFAULT_PROMPT, help=f"the prompt (default: {DEFAULT_PROMPT!r})")
    p.add_argument("--sampler", default=None,
                   help="step policy, name[:key=value...] e.g. threshold:tau=0.8 (default: the model's: threshold "
                        "on a masked model, transformers' own rule on DiffusionGemma); `dlm models --samplers` lists them")
    p.add_argument("--steps", type=positive_int, default=None, help="forward-pass budget (default: gen-length, one token per step)")
    add_decoding_arguments(p)
    p.add_argument("--json", action="store_true", help="print a JSON object (text, tokens, nfe, tpf, seconds)")
    p.add_argument("--progress", action="store_true", help="show the progress bar even when stderr is not a terminal")
    p.set_defaults(func=run)


def run(args) -> int:
    import dlm
    from dlm.schedule import validate_lengths
    from samplers import get_sampler

    # Mistakes that need no model are reported before the (slow) load.
    if args.sampler is not None:
        get_sampler(args.sampler)  # name[:key=value...]; one-line errors before the slow load
    if not args.prompt.strip():
        raise ValueError("--prompt is empty; give some text to respond to")
    block_length = args.block_length or args.gen_length
    validate_lengths(args.gen_length, block_length, args.steps or args.gen_length)
    quiet_transformers()
    pipe = dlm.DLMPipeline.from_pretrained(args.model, device=args.device)
    from dlm.uniform_noise import is_uniform_noise_model

    uniform = is_uniform_noise_model(pipe.model)
    sampler = args.sampler if args.sampler is not None else ("diffusiongemma" if uniform else "threshold")
    generator = seeded_generator(args.seed)
    if uniform and args.sampler is None:
        # transformers' rule draws from the global RNG, as model.generate does: seed that instead
        import torch
        torch.manual_seed(0 if args.seed is None else args.seed)
        generator = None
    out = pipe(args.prompt, num_inference_steps=args.steps, gen_length=args.gen_length, block_length=args.block_length,
               sampler=args.sampler, temperature=args.temperature, generator=generator,
               kv_cache=args.kv_cache, progress=show_progress(args.progress or None))
    text = out.texts[0]
    if args.json:
        tokens = out.sequences[0, out.prompt_length:].tolist()
        print(json.dumps({"model": args.model, "prompt": args.prompt, "text": text, "tokens": tokens,
                          "sampler": sampler, "nfe": out.nfe, "tpf": round(out.tpf, 4),
                          "seconds": round(out.seconds, 4)}))
    else:
        print(text)
        # the forwards beside what one-token-per-step decoding of the same length would take
        generated = out.sequences.shape[1] - out.prompt_length
        print(f"[{args.model} | {sampler} | nfe {out.nfe} of {generated} at one token per step | "
              f"{out.tpf:.2f} tokens/forward | {out.seconds:.2f} s]", file=sys.stderr)
    return 0
