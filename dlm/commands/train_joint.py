"""`dlm train-joint`: train the joint sampler's layer (ADJUST) for a model, on CPU in minutes.

Distils the model's own one-token-per-step decoding into the layer (`dlm.joint_training`) and writes
`<out>.safetensors` + `<out>.json`. For a built-in model or oracle suite, `--out` defaults to the
layer shipped with the package, so re-training after the model changes is one command:

    dlm train-joint --model tiny-dlm
    dlm train-joint --model tiny-dlm --order confidence   # the layer `joint:order=confidence` uses
    dlm train-joint --model oracle-permutation

`--order confidence` trains on the confidence sampler's trajectories and chains (greedy unless
`--temperature` says otherwise) and writes `joint-<model>-confidence.*` by default.
"""
from __future__ import annotations

from dlm.commands._common import positive_int

ORACLES = ("oracle-permutation", "oracle-hmm")


def register(subparsers) -> None:
    p = subparsers.add_parser("train-joint", help="train the joint sampler's layer for a model")
    p.add_argument("--model", default="tiny-dlm",
                   help="built-in model, checkpoint path, or an oracle suite (oracle-permutation, oracle-hmm)")
    p.add_argument("--out", default=None, help="output stem (default for built-ins: the layer shipped with the package)")
    p.add_argument("--steps", type=positive_int, default=None, help="optimiser steps (default: 800 oracles, 150 models)")
    p.add_argument("--batch", type=positive_int, default=None, help="training states per step (default: 64 oracles, 16 models)")
    p.add_argument("--chain", type=positive_int, default=4, help="tokens committed per state, >= 2 (default: 4)")
    p.add_argument("--pool", type=positive_int, default=None, help="samples of the model's own decoding (default: 1024 oracles, 32 models)")
    p.add_argument("--suite", default="all", help="task suite whose train prompts feed a text model (default: all)")
    p.add_argument("--gen-length", type=positive_int, default=64, help="text models: generation length (default: 64)")
    p.add_argument("--block-length", type=positive_int, default=32, help="text models: block length (default: 32)")
    p.add_argument("--features", choices=("auto", "hidden", "logprobs"), default="auto",
                   help="layer input: hidden states when the model has them (auto), or log-probabilities")
    p.add_argument("--order", choices=("random", "confidence"), default="random",
                   help="commit order of the trajectories and chains the layer learns: random (uniform "
                        "positions, temperature 1) or confidence (the confidence sampler's rule, as "
                        "joint:order=confidence decodes) (default: random)")
    p.add_argument("--temperature", type=float, default=None,
                   help="token temperature of the chains (default: 1 for random order, 0 = greedy for "
                        "confidence order, as dlm bench decodes task suites)")
    p.add_argument("--focus", type=float, default=0.0,
                   help="--order confidence: share of each batch drawn in proportion to the doubt of the "
                        "commits a chain makes next, over every state of the pool's runs (0-1; default 0: "
                        "states as they come). Greedy runs spend most steps on near-certain commits, "
                        "where there is nothing to learn")
    p.add_argument("--lr", type=float, default=3e-3, help="learning rate (default: 3e-3)")
    p.add_argument("--width", type=positive_int, default=64, help="layer width (default: 64)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    # torch's threads, one per core: training batches of the layer ran faster on two threads than on one
    # (10 steps on tiny-dlm: 7.6-8.0 s against 8.7-9.3 s for the whole command, shared 2-core machine)
    p.set_defaults(func=run, builtin_threads=0)


def build_source(args):
    """The `TrainingSource` for `--model`: an oracle suite, or a text model with task prompts."""
    import torch
    from dlm.joint_training import TrainingSource

    if args.model in ORACLES:
        from dlm.tasks.oracle_tasks import get_oracle_suite
        suite = get_oracle_suite(args.model)
        oracle = suite.build()
        n = oracle.gen_length
        return TrainingSource(oracle, suite.prompts(oracle, 8), None, n, n, oracle.config.mask_token_id, args.model)
    from dlm.bench.harness import _encode_batch
    from dlm.commands._common import quiet_transformers
    from dlm.loading import load
    from dlm.tasks import get_suite

    if args.gen_length % args.block_length:
        raise ValueError(f"--gen-length ({args.gen_length}) must be a multiple of --block-length ({args.block_length})")
    quiet_transformers()
    loaded = load(args.model)
    texts = [ex.input_text for task in get_suite(args.suite) for ex in task.examples("train", n=64, seed=args.seed)]
    prompts, mask = _encode_batch(loaded.tokenizer, texts, loaded.pad_token_id, torch.device("cpu"))
    return TrainingSource(loaded.model.eval(), prompts, mask, args.gen_length, args.block_length,
                          loaded.mask_token_id, args.model)


def default_out(model: str, order: str = "random"):
    """The shipped layer's stem: `joint-<model>` for random order, `joint-<model>-<order>` otherwise."""
    from dlm.loading import builtin_models
    from samplers.unmasking.joint_layer import CHECKPOINT_DIR

    if model in ORACLES or model in builtin_models():
        return CHECKPOINT_DIR / (f"joint-{model}" if order == "random" else f"joint-{model}-{order}")
    raise ValueError(f"--out is required for a model that is not built in ({model!r})")


def run(args) -> int:
    import sys
    import torch
    from dlm.joint_training import TrainJointConfig, train_joint_layer
    from samplers.unmasking.joint_layer import save_layer

    out = args.out or default_out(args.model, args.order)
    # Defaults sized for CPU minutes: the oracles are nearly free to run, a text model is not.
    oracle = args.model in ORACLES
    steps = args.steps or (800 if oracle else 150)
    batch = args.batch or (64 if oracle else 16)
    pool = args.pool or (1024 if oracle else 32)
    config = TrainJointConfig(steps=steps, batch=batch, chain=args.chain, pool=pool, lr=args.lr,
                              width=args.width, heads=4, features=args.features, seed=args.seed,
                              order=args.order, temperature=args.temperature, focus=args.focus)
    config.validate()
    source = build_source(args)
    layer = train_joint_layer(source, config, log=lambda m: print(m, file=sys.stderr))
    weights, meta = save_layer(layer, out)
    n_params = sum(p.numel() for p in layer.parameters())
    print(f"wrote {weights} and {meta.name}: {n_params} parameters, {layer.meta.features} features, "
          f"model hash {layer.meta.model_fingerprint}, order {layer.meta.order}, final KL per link {layer.meta.training['final_kl_per_link']}")
    return 0
