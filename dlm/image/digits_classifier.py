"""Small classifiers for scikit-learn's 8x8 digits, used as a metric and as a noise-search verifier.

Two architectures are shipped so that a search steered by one can be scored by the other
(verifier hacking shows up as a gap between them):

- ``"cnn"`` (the default, the verifier and the feature space of the Frechet distance):
  three 3x3 convolutions, a 64-wide penultimate layer, 10 logits.
- ``"mlp"`` (held out): a two-hidden-layer MLP trained with a different seed.

Images are ``[N, 1, 8, 8]`` floats in ``[-1, 1]`` (raw pixels 0..16 mapped linearly).
Weights are trained by ``scripts/train_digits_classifier.py`` on a fixed split (``digits_split``).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

CHECKPOINT_DIR = Path(__file__).resolve().parent / "checkpoints"
SPLIT_SEED = 0
TEST_FRACTION = 0.2
FEATURE_DIM = 64


def pixels_to_unit(images: np.ndarray | torch.Tensor) -> torch.Tensor:
    """Raw digits pixels (0..16, shape [N, 8, 8]) -> float32 ``[N, 1, 8, 8]`` in [-1, 1]."""
    x = torch.as_tensor(np.asarray(images), dtype=torch.float32)
    if x.ndim == 3:
        x = x[:, None]
    return x / 8.0 - 1.0


@dataclass(frozen=True)
class DigitsSplit:
    """The fixed train/test split every digits model and metric uses.

    ``train_images``/``test_images``: ``[N, 1, 8, 8]`` in [-1, 1]; ``*_labels``: int64 ``[N]``.
    """

    train_images: torch.Tensor
    train_labels: torch.Tensor
    test_images: torch.Tensor
    test_labels: torch.Tensor


def digits_split() -> DigitsSplit:
    """Stratified 80/20 split of the 1797 sklearn digits with a fixed seed (1437 train, 360 test)."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    data = load_digits()
    idx = np.arange(len(data.target))
    tr, te = train_test_split(idx, test_size=TEST_FRACTION, random_state=SPLIT_SEED, stratify=data.target)
    x = pixels_to_unit(data.images)
    y = torch.as_tensor(data.target, dtype=torch.long)
    return DigitsSplit(x[tr], y[tr], x[te], y[te])


class DigitsCNN(nn.Module):
    """3x3 conv stack: 8x8 -> 4x4, then a 64-d feature layer and 10 logits."""

    def __init__(self, width: int = 32, feature_dim: int = FEATURE_DIM):
        super().__init__()
        self.conv1 = nn.Conv2d(1, width, 3, padding=1)
        self.conv2 = nn.Conv2d(width, 2 * width, 3, padding=1)
        self.conv3 = nn.Conv2d(2 * width, 2 * width, 3, padding=1)
        self.fc = nn.Linear(2 * width * 16, feature_dim)
        self.head = nn.Linear(feature_dim, 10)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        h = F.gelu(self.conv1(x))
        h = F.max_pool2d(F.gelu(self.conv2(h)), 2)
        h = F.gelu(self.conv3(h))
        return F.gelu(self.fc(h.flatten(1)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


class DigitsMLP(nn.Module):
    """64 -> 256 -> 64 -> 10; the held-out classifier."""

    def __init__(self, hidden: int = 256, feature_dim: int = FEATURE_DIM):
        super().__init__()
        self.fc1 = nn.Linear(64, hidden)
        self.fc2 = nn.Linear(hidden, feature_dim)
        self.head = nn.Linear(feature_dim, 10)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.fc2(F.gelu(self.fc1(x.flatten(1)))))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


ARCHITECTURES = {"cnn": DigitsCNN, "mlp": DigitsMLP}


class DigitsClassifier:
    """A trained digits classifier in eval mode.

    ``logits(images)`` -> ``[N, 10]``; ``features(images)`` -> ``[N, 64]`` (penultimate layer);
    ``predict(images)`` -> int64 ``[N]``. ``images``: ``[N, 1, 8, 8]`` floats in [-1, 1].
    """

    def __init__(self, net: nn.Module, name: str, meta: dict | None = None):
        self.net = net.eval()
        self.name = name
        self.meta = dict(meta or {})

    @staticmethod
    def _check(images: torch.Tensor) -> torch.Tensor:
        if not isinstance(images, torch.Tensor) or images.ndim != 4 or tuple(images.shape[1:]) != (1, 8, 8):
            shape = tuple(images.shape) if isinstance(images, torch.Tensor) else type(images).__name__
            raise ValueError(f"digits classifier expects images [N, 1, 8, 8] in [-1, 1], got {shape}")
        return images.float()

    @torch.no_grad()
    def logits(self, images: torch.Tensor) -> torch.Tensor:
        x = self._check(images)
        return self.net(x.to(next(self.net.parameters()).device)).float()

    @torch.no_grad()
    def features(self, images: torch.Tensor) -> torch.Tensor:
        x = self._check(images)
        return self.net.features(x.to(next(self.net.parameters()).device)).float()

    def predict(self, images: torch.Tensor) -> torch.Tensor:
        return self.logits(images).argmax(-1)

    __call__ = logits


def checkpoint_path(name: str = "cnn") -> Path:
    return CHECKPOINT_DIR / f"digits_classifier_{name}.safetensors"


def load_digits_classifier(name: str = "cnn", path: str | Path | None = None) -> DigitsClassifier:
    """Load a shipped classifier: ``"cnn"`` (verifier, Frechet features) or ``"mlp"`` (held out)."""
    from safetensors.torch import load_file, safe_open

    if name not in ARCHITECTURES:
        raise ValueError(f"unknown digits classifier {name!r}; choose from {sorted(ARCHITECTURES)}")
    path = Path(path) if path is not None else checkpoint_path(name)
    if not path.exists():
        raise FileNotFoundError(f"{path} not found; train it with scripts/train_digits_classifier.py --arch {name}")
    with safe_open(str(path), "pt") as f:
        meta = dict(f.metadata() or {})
    net = ARCHITECTURES[name]()
    net.load_state_dict(load_file(str(path)))
    return DigitsClassifier(net, name, {k: json.loads(v) for k, v in meta.items()})


def digits_verifier(target, classifier: str = "cnn"):
    """Noise-search verifier: log-probability of digit ``target`` under a shipped digits classifier.

    ``classifier`` is ``"cnn"`` or ``"mlp"``. Samples are ``[N, 1, 8, 8]`` images in [-1, 1]. It
    lives beside the classifier so that ``samplers.search`` never imports a model package.
    """
    from samplers.search.verifiers import ClassifierVerifier

    clf = load_digits_classifier(classifier)
    return ClassifierVerifier(clf.logits, target, name=f"digits-{classifier}", sample_shape=(1, 8, 8))
