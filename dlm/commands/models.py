"""`dlm models`: list the built-in models, one per line, name first."""
from __future__ import annotations


def register(subparsers) -> None:
    p = subparsers.add_parser("models", help="list built-in models and samplers")
    p.add_argument("--samplers", action="store_true", help="list the registered samplers instead")
    p.set_defaults(func=run, computes=False)  # no --threads: listing loads no model


def run(args) -> int:
    if args.samplers:
        import sys
        from samplers import SAMPLERS
        for name in sorted(SAMPLERS):
            print(f"{name}\t{first_sentence(sys.modules[SAMPLERS[name].__module__].__doc__ or '')}")
        from dlm.bench.diffusers_llada2 import BASELINE_DESCRIPTIONS
        for name, doc in BASELINE_DESCRIPTIONS.items():
            print(f"{name}\t{doc}")
        return 0
    from dlm.tiny import BUILTIN_MODELS  # no torch/transformers import: listing stays instant
    from pathlib import Path
    import json
    for name, path in BUILTIN_MODELS.items():
        config = Path(path) / "config.json"
        state = "ready" if config.is_file() else "missing checkpoint"
        model_type = json.loads(config.read_text()).get("model_type") if config.is_file() else None
        family = "uniform-noise (DiffusionGemma)" if model_type == "diffusion_gemma" else "masked diffusion"
        print(f"{name}\t{state}\t{family}\t{path}")
    print("any folder or hub id of: LLaDA, Dream, LLaDA2 (masked diffusion), DiffusionGemma (uniform noise): "
          "dlm sample --model DIR")
    return 0


def first_sentence(doc: str) -> str:
    """The first sentence of a docstring's first paragraph, on one line: up to the first period that
    ends a sentence (followed by a space or the end, outside parentheses, so "et al., 2025" and
    "(... Models)." stay whole)."""
    paragraph = " ".join(doc.strip().split("\n\n")[0].split())
    depth = 0
    for i, char in enumerate(paragraph):
        depth += (char == "(") - (char == ")")
        if char == "." and depth == 0 and (i + 1 == len(paragraph) or paragraph[i + 1] == " "):
            return paragraph[:i + 1]
    return paragraph
