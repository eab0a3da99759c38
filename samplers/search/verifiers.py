"""Verifiers for noise search: ``verifier(samples [N, ...]) -> scores [N]``, higher is better.

A verifier scores final samples (images or latents). Every verifier here is validated on the way
in and out: samples must be a floating tensor ``[N, *sample_shape]`` (when the verifier declares
a shape) and the scores a finite-or-``-inf`` floating tensor of shape ``[N]``; anything else
raises ``ValueError`` naming the verifier, so a mis-wired search fails loudly instead of ranking
garbage.

Built-ins:
- ``ClassifierVerifier``: log-probability of a requested class under a classifier's logits (the
  "supervised verifier" of Ma et al. 2025, *Inference-time scaling for diffusion models beyond
  scaling denoising steps*); ``dlm.image.digits_classifier.digits_verifier(d)`` wires it to the shipped digits CNN.
- ``LogDensityVerifier``: exact ``log p_data(x)``, e.g. from the Gaussian-mixture oracle
  (``gmm_verifier(oracle)``); an "oracle verifier".

Search against any one verifier can be hacked (a classifier's confidence rises while samples get
less diverse or less realistic), so benchmarks report a held-out metric next to the searched one.
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch


def check_samples(name: str, samples, sample_shape: Sequence[int] | None = None) -> torch.Tensor:
    """Validate a batch handed to verifier ``name``; returns it unchanged."""
    if not isinstance(samples, torch.Tensor):
        raise ValueError(f"verifier {name!r}: samples must be a torch.Tensor [N, ...], got {type(samples).__name__}")
    if not samples.is_floating_point():
        raise ValueError(f"verifier {name!r}: samples must be floating point, got {samples.dtype}")
    if samples.ndim < 1 or samples.shape[0] == 0:
        raise ValueError(f"verifier {name!r}: samples must be a non-empty batch [N, ...], got {tuple(samples.shape)}")
    if sample_shape is not None and tuple(samples.shape[1:]) != tuple(sample_shape):
        raise ValueError(f"verifier {name!r}: expected samples [N, {', '.join(map(str, sample_shape))}], "
                         f"got {list(samples.shape)}")
    return samples


def check_scores(name: str, scores, n: int) -> torch.Tensor:
    """Validate scores returned by verifier ``name`` for ``n`` samples -> float32 ``[n]``."""
    if not isinstance(scores, torch.Tensor):
        raise ValueError(f"verifier {name!r}: must return a torch.Tensor of scores [N], got {type(scores).__name__}")
    if not scores.is_floating_point():
        raise ValueError(f"verifier {name!r}: scores must be floating point, got {scores.dtype}")
    if tuple(scores.shape) != (n,):
        raise ValueError(f"verifier {name!r}: scores must have shape [{n}] (one per sample), got {list(scores.shape)}")
    if torch.isnan(scores).any() or (scores == float("inf")).any():
        raise ValueError(f"verifier {name!r}: scores contain NaN or +inf")
    return scores.float()


class Verifier:
    """Base class: subclasses implement ``score``; ``__call__`` validates input and output."""

    name: str = "verifier"
    sample_shape: tuple | None = None

    def score(self, samples: torch.Tensor) -> torch.Tensor:  # pragma: no cover - interface
        raise NotImplementedError

    @torch.no_grad()
    def __call__(self, samples: torch.Tensor) -> torch.Tensor:
        check_samples(self.name, samples, self.sample_shape)
        return check_scores(self.name, self.score(samples), samples.shape[0])

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


class FunctionVerifier(Verifier):
    """Wrap a plain callable ``fn(samples) -> scores`` with the same validation."""

    def __init__(self, fn: Callable[[torch.Tensor], torch.Tensor], name: str | None = None,
                 sample_shape: Sequence[int] | None = None):
        self.fn = fn
        self.name = name or getattr(fn, "__name__", "function")
        self.sample_shape = tuple(sample_shape) if sample_shape is not None else None

    def score(self, samples):
        return self.fn(samples)


def as_verifier(v, name: str | None = None) -> Verifier:
    """A ``Verifier`` as is, or a callable wrapped in ``FunctionVerifier``."""
    if isinstance(v, Verifier):
        return v
    if not callable(v):
        raise ValueError(f"verifier must be callable, got {type(v).__name__}")
    return FunctionVerifier(v, name)


class ClassifierVerifier(Verifier):
    """``log softmax(logits_fn(x))[target]`` (float32 before the softmax).

    Args:
        logits_fn: ``[N, *sample_shape] -> [N, C]`` logits.
        target: the requested class, an int or an int tensor ``[N]`` (one per sample).
    """

    def __init__(self, logits_fn: Callable[[torch.Tensor], torch.Tensor], target, name: str = "classifier",
                 sample_shape: Sequence[int] | None = None):
        self.logits_fn = logits_fn
        self.target = target
        self.name = name
        self.sample_shape = tuple(sample_shape) if sample_shape is not None else None

    def score(self, samples):
        logits = self.logits_fn(samples)
        if not isinstance(logits, torch.Tensor) or logits.ndim != 2 or logits.shape[0] != samples.shape[0]:
            raise ValueError(f"verifier {self.name!r}: logits_fn must return [N, C] logits, got "
                             f"{list(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__}")
        logp = torch.log_softmax(logits.float(), dim=-1)
        target = torch.as_tensor(self.target, device=logp.device).long()
        if target.ndim == 0:
            target = target.expand(logp.shape[0])
        if target.shape != (logp.shape[0],) or (target < 0).any() or (target >= logp.shape[1]).any():
            raise ValueError(f"verifier {self.name!r}: target must be a class in [0, {logp.shape[1]}) "
                             f"or one per sample, got {target.tolist()}")
        return logp.gather(1, target[:, None])[:, 0]


class LogDensityVerifier(Verifier):
    """Exact data log-density ``log_prob_fn(x) -> [N]`` as the score (float64 inside, float32 out)."""

    def __init__(self, log_prob_fn: Callable[[torch.Tensor], torch.Tensor], name: str = "log-density",
                 sample_shape: Sequence[int] | None = None):
        self.log_prob_fn = log_prob_fn
        self.name = name
        self.sample_shape = tuple(sample_shape) if sample_shape is not None else None

    def score(self, samples):
        return self.log_prob_fn(samples).float()


def gmm_verifier(oracle) -> LogDensityVerifier:
    """Exact log-density verifier for ``dlm.oracles.gaussian_mixture.GaussianMixtureOracle``.

    Uses the oracle's ``log_prob`` (closed form, float64); the expected sample shape is read from
    its config.
    """
    if not callable(getattr(oracle, "log_prob", None)):
        raise ValueError(f"gmm_verifier needs an oracle with a log_prob(x) method, got {type(oracle).__name__}")
    shape = getattr(getattr(oracle, "config", None), "sample_shape", None)
    return LogDensityVerifier(oracle.log_prob, name="gmm-log-density", sample_shape=shape)
