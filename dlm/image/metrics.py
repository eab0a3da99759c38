"""Quality metrics for generated 8x8 digits.

- ``digit_accuracy``: fraction of samples the classifier labels as the requested digit.
- ``frechet_distance``: Frechet distance between Gaussians fitted to classifier features
  (penultimate layer of the shipped CNN, 64-d) of the samples and of the 360 held-out real test
  digits -- an FID analogue. With a few hundred samples it carries a positive small-sample bias; the
  real train digits score about the same as a good model would (see ``docs/image.md``), so compare
  values at equal sample counts only.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch

from .digits_classifier import DigitsClassifier, digits_split, load_digits_classifier


def digit_accuracy(images: torch.Tensor, digits: torch.Tensor, classifier: DigitsClassifier | None = None) -> float:
    """``images`` [N, 1, 8, 8] in [-1, 1], ``digits`` int [N] -> accuracy in [0, 1]."""
    classifier = classifier or _default_classifier()
    digits = torch.as_tensor(digits).long().reshape(-1)
    if digits.shape[0] != images.shape[0]:
        raise ValueError(f"{images.shape[0]} images but {digits.shape[0]} requested digits")
    return (classifier.predict(images).cpu() == digits.cpu()).float().mean().item()


def gaussian_stats(features: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """``features`` [N, D] -> (mean [D], covariance [D, D]) in float64."""
    f = features.double().cpu().numpy()
    if f.shape[0] < 2:
        raise ValueError("need at least 2 samples for a Frechet distance")
    return f.mean(0), np.cov(f, rowvar=False)


def frechet_from_stats(mu1, cov1, mu2, cov2) -> float:
    """``|mu1 - mu2|^2 + tr(C1 + C2 - 2 (C1 C2)^{1/2})``, the trace term via the symmetric form
    ``(C1^{1/2} C2 C1^{1/2})^{1/2}`` so only symmetric eigendecompositions are needed."""
    def sqrtm_psd(c):
        w, v = np.linalg.eigh((c + c.T) / 2)
        return (v * np.sqrt(np.clip(w, 0, None))) @ v.T

    s1 = sqrtm_psd(cov1)
    cross = sqrtm_psd(s1 @ cov2 @ s1)
    return float(((mu1 - mu2) ** 2).sum() + np.trace(cov1) + np.trace(cov2) - 2 * np.trace(cross))


@lru_cache(maxsize=1)
def _default_classifier() -> DigitsClassifier:
    return load_digits_classifier("cnn")


@lru_cache(maxsize=1)
def _reference_stats():
    return gaussian_stats(_default_classifier().features(digits_split().test_images))


def frechet_distance(images: torch.Tensor, classifier: DigitsClassifier | None = None) -> float:
    """Frechet distance of ``images`` [N, 1, 8, 8] to the real test digits in CNN feature space."""
    if classifier is None:
        classifier, ref = _default_classifier(), _reference_stats()
    else:
        ref = gaussian_stats(classifier.features(digits_split().test_images))
    mu, cov = gaussian_stats(classifier.features(images))
    return frechet_from_stats(mu, cov, *ref)
