"""`dlm models`: list the built-in models, one per line, name first."""
from __future__ import annotations


def register(subparsers) -> None:
    p = subparsers.add_parser("models", help="list built-in models and samplers")
    p.add_argument("--samplers", action="store_true", help="list the registered samplers instead")
    p.set_defaults(func=run)


def run(args) -> int:
    if args.samplers:
        import sys
        from samplers import SAMPLERS
        for name in sorted(SAMPLERS):
            doc = (sys.modules[SAMPLERS[name].__module__].__doc__ or "").strip()
            print(f"{name}\t{doc.splitlines()[0] if doc else ''}")
        from dlm.bench.diffusers_llada2 import BASELINE_DESCRIPTIONS
        for name, doc in BASELINE_DESCRIPTIONS.items():
            print(f"{name}\t{doc}")
        return 0
    from dlm.tiny import BUILTIN_MODELS  # no torch/transformers import: listing stays instant
    from pathlib import Path
    for name, path in BUILTIN_MODELS.items():
        state = "ready" if (Path(path) / "config.json").is_file() else "missing checkpoint"
        print(f"{name}\t{state}\t{path}")
    return 0
