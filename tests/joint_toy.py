"""A joint-sampler layer made for `toy_models.ToyDLM`, so driver and contract tests can run `joint`.

The layer is untrained but not neutral: its output head gets seeded random weights (a trained
layer's head starts at zero, which would make `joint` equal marginal sampling), so the cheap passes
really change the distributions the sampler draws from.
"""
from __future__ import annotations

import tempfile
from pathlib import Path

import torch

from samplers.unmasking.joint import JointSampler
from samplers.unmasking.joint_layer import JointLayer, JointLayerMeta, model_fingerprint, save_layer

_DIR = Path(tempfile.mkdtemp(prefix="joint-toy-"))


def toy_joint_layer(model, seed: int = 0, max_block: int = 16) -> JointLayer:
    vocab = int(model.config.vocab_size)
    meta = JointLayerMeta(vocab_size=vocab, feature_size=vocab, features="logprobs",
                          model_fingerprint=model_fingerprint(model), model_name="toy", width=16,
                          heads=2, max_block=max_block)
    torch.manual_seed(seed)
    layer = JointLayer(meta)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        layer.head.weight.copy_(torch.randn(layer.head.weight.shape, generator=g))
    return layer.eval()


def toy_joint_path(model, seed: int = 0) -> Path:
    """Stem of a saved toy layer for `model` (written once per model hash and seed)."""
    stem = _DIR / f"toy-{model_fingerprint(model)}-{seed}"
    if not stem.with_suffix(".json").is_file():
        save_layer(toy_joint_layer(model, seed), stem)
    return stem


def toy_joint_sampler(model, seed: int = 0, **config) -> JointSampler:
    return JointSampler(layer=str(toy_joint_path(model, seed)), **config)
