"""Gaussian-mixture oracle: a data distribution whose exact denoiser is closed form.

Data: ``x0 ~ sum_k w_k N(mu_k, s_k^2 I)`` in ``D`` dimensions, reshaped to ``sample_shape`` (e.g.
``(2,)`` for plots or ``(1, 8, 8)`` to run inside a diffusers image pipeline).

Under any forward process of the form ``x_t = a x0 + s eps`` (VP: ``a = sqrt(alpha_bar)``,
``s = sqrt(1 - alpha_bar)``; rectified flow: ``a = 1 - t``, ``s = t``) the marginal is again a mixture,
``sum_k w_k N(a mu_k, (a^2 s_k^2 + s^2) I)``. Hence, with responsibilities ``r_k(x_t)``:

- score: ``grad log p_t(x) = -sum_k r_k (x - a mu_k) / v_k``,  ``v_k = a^2 s_k^2 + s^2``;
- ``E[x0 | x_t] = sum_k r_k (mu_k + a s_k^2 (x - a mu_k) / v_k)``;
- ``E[eps | x_t] = (x - a E[x0|x_t]) / s = -s * score``  (Tweedie);
- flow velocity ``E[eps - x0 | x_t] = (x - E[x0|x_t]) / t`` for ``a = 1 - t, s = t``.

All of it is computed in float64 with logsumexp, then cast to the input dtype. ``GaussianMixtureOracle``
packages this as a diffusers ``ModelMixin`` so ``DDPMPipeline(unet=oracle, scheduler=...)`` works and
every solver can be scored against the true distribution with :func:`sample_metrics`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Optional, Sequence

import numpy as np
import torch
from diffusers.configuration_utils import ConfigMixin, register_to_config
from diffusers.models.modeling_utils import ModelMixin
from diffusers.utils import BaseOutput

from samplers.solvers._vp import make_alphas_cumprod

ORACLE_PREDICTION_TYPES = ("epsilon", "v_prediction", "sample", "flow")


@dataclass
class OracleOutput(BaseOutput):
    """``sample``: ``[B, *sample_shape]`` the model prediction (type set by ``config.prediction_type``)."""

    sample: torch.Tensor


@dataclass
class MixtureMetrics:
    """Distance of a sample set from the true mixture.

    Attributes:
        mean_log_density: mean of ``log p_data(x)`` over the samples (higher is better; the truth's
            own expectation is minus the mixture's entropy, see ``GaussianMixtureOracle.reference_metrics``).
        mode_coverage: fraction of modes whose share of samples (nearest-mean assignment) is at least
            ``coverage_threshold`` times the mode's weight.
        sliced_wasserstein: sliced 2-Wasserstein distance to fresh true samples (lower is better).
        num_samples: number of samples scored.
        log_density_gap: ``|mean_log_density - E_data[log p]|``. A sampler that collapses samples
            onto the mode centres *raises* the mean log-density above the truth's, so the distance to
            the truth is this gap, not the raw value.
    """

    mean_log_density: float
    mode_coverage: float
    sliced_wasserstein: float
    num_samples: int
    log_density_gap: float = float("nan")

    def to_dict(self) -> dict:
        return asdict(self)


def ring_means(num_modes: int = 8, radius: float = 0.7, dim: int = 2, seed: int = 0) -> list:
    """Mode means: on a circle in the first two coordinates for ``dim == 2``; for larger ``dim`` random
    directions of norm ``radius * sqrt(dim)`` scaled into roughly ``[-1, 1]`` pixel range."""
    if dim == 2:
        ang = 2 * math.pi * np.arange(num_modes) / num_modes
        return (radius * np.stack([np.cos(ang), np.sin(ang)], 1)).tolist()
    rng = np.random.default_rng(seed)
    m = rng.uniform(-radius, radius, size=(num_modes, dim))
    return m.tolist()


class GaussianMixtureOracle(ModelMixin, ConfigMixin):
    """Exact denoiser of an isotropic Gaussian mixture, as a diffusers model.

    ``forward(sample, timestep)`` returns ``OracleOutput(sample=prediction)`` where the prediction is
    the exact ``E[eps | x_t]`` (``prediction_type="epsilon"``), ``E[v | x_t]`` (``"v_prediction"``),
    ``E[x0 | x_t]`` (``"sample"``) or the flow velocity ``E[eps - x0 | x_t]`` (``"flow"``; then
    ``timestep`` is ``sigma * num_train_timesteps`` as in FlowMatchEulerDiscreteScheduler). For the VP
    types the integer ``timestep`` indexes ``alphas_cumprod`` built from this config's beta schedule,
    which must match the scheduler's; non-integer timesteps are interpolated linearly in ``alpha_bar``.

    Args:
        means: ``K x D`` mode means (``D = prod(sample_shape)``).
        stds: per-mode standard deviation (``K`` values) or one value for all.
        weights: ``K`` mixture weights (normalised here); uniform when ``None``.
        sample_shape: shape of one sample, e.g. ``[2]`` or ``[1, 8, 8]``.
        num_train_timesteps, beta_start, beta_end, beta_schedule, trained_betas, rescale_betas_zero_snr:
            the VP training schedule (same meaning as in diffusers schedulers).
        prediction_type: see above.
    """

    config_name = "config.json"

    @register_to_config
    def __init__(
        self,
        means: Sequence[Sequence[float]] = ((-0.5, -0.5), (0.5, 0.5)),
        stds: float | Sequence[float] = 0.1,
        weights: Optional[Sequence[float]] = None,
        sample_shape: Sequence[int] = (2,),
        num_train_timesteps: int = 1000,
        beta_start: float = 0.0001,
        beta_end: float = 0.02,
        beta_schedule: str = "linear",
        trained_betas: Optional[Sequence[float]] = None,
        rescale_betas_zero_snr: bool = False,
        prediction_type: str = "epsilon",
        sample_size: Optional[int] = None,
        in_channels: Optional[int] = None,
    ):
        super().__init__()
        mu = torch.as_tensor(np.asarray(means, dtype=np.float64))
        if mu.ndim != 2:
            raise ValueError(f"means must be K x D, got shape {tuple(mu.shape)}")
        K, D = mu.shape
        shape = tuple(int(s) for s in sample_shape)
        if int(np.prod(shape)) != D:
            raise ValueError(f"sample_shape {shape} has {int(np.prod(shape))} entries but the means have D={D}")
        sd = torch.as_tensor(np.broadcast_to(np.asarray(stds, dtype=np.float64), (K,)).copy())
        if (sd <= 0).any():
            raise ValueError("stds must be positive")
        w = torch.ones(K, dtype=torch.float64) if weights is None else torch.as_tensor(np.asarray(weights, dtype=np.float64))
        if w.shape != (K,) or (w < 0).any() or w.sum() <= 0:
            raise ValueError(f"weights must be {K} non-negative numbers with a positive sum")
        if prediction_type not in ORACLE_PREDICTION_TYPES:
            raise ValueError(f"prediction_type={prediction_type!r}; use one of {ORACLE_PREDICTION_TYPES}")
        # float64 tables live outside the buffer list so module.to(dtype) cannot round them; only the
        # anchor below is a buffer: it gives the model its dtype/device (what pipelines read) and a
        # state dict, so save_pretrained/from_pretrained round-trip (everything else is config).
        self._tables = {
            "mu": mu,
            "var": sd**2,
            "logw": torch.log(w / w.sum()),
            "ac": make_alphas_cumprod(
                num_train_timesteps, beta_start, beta_end, beta_schedule, trained_betas, rescale_betas_zero_snr
            ).double(),
        }
        self._cache = {}
        self.register_buffer("dtype_anchor", torch.zeros((), dtype=torch.float32))
        self._shape = shape
        self._dim = D
        # Image pipelines (DDPMPipeline, DDIMPipeline) read unet.config.sample_size / in_channels.
        if len(shape) == 3 and (sample_size is None or in_channels is None):
            self.register_to_config(in_channels=shape[0], sample_size=shape[1] if shape[1] == shape[2] else list(shape[1:]))

    @property
    def num_modes(self) -> int:
        return self._tables["mu"].shape[0]

    @property
    def dim(self) -> int:
        return self._dim

    def _t(self, name: str, device) -> torch.Tensor:
        return self._tables[name].to(device=device)

    # ------------------------------------------------------------------ closed-form posterior
    def posterior(self, x: torch.Tensor, a, s):
        """Responsibilities and ``E[x0|x_t]`` for ``x_t = a x0 + s eps``.

        Args:
            x: ``[B, *sample_shape]`` (or ``[B, D]``).
            a, s: floats or ``[B]`` tensors (signal scale and noise std).
        Returns:
            ``(log_r [B, K], x0_hat [B, D], score [B, D])`` in float64.
        """
        dev = x.device
        xf = x.reshape(x.shape[0], -1).double()
        a = torch.as_tensor(a, dtype=torch.float64, device=dev).reshape(-1, 1)
        s = torch.as_tensor(s, dtype=torch.float64, device=dev).reshape(-1, 1)
        mu, var, logw = self._t("mu", dev), self._t("var", dev), self._t("logw", dev)
        v = a**2 * var[None, :] + s**2  # [B, K]
        logp = logw[None] - 0.5 * self._sqdist(xf, a, mu) / v - 0.5 * self._dim * torch.log(2 * math.pi * v)
        log_r = logp - torch.logsumexp(logp, dim=1, keepdim=True)
        r = log_r.exp()
        # Sums over modes written as [B, K] @ [K, D] products (no [B, K, D] temporaries):
        # score = -sum_k r_k (x - a mu_k) / v_k;  x0 = sum_k r_k (mu_k + g_k (x - a mu_k)), g_k = a s_k^2 / v_k.
        rv = r / v
        score = -rv.sum(1, keepdim=True) * xf + a * (rv @ mu)
        g = a * var[None, :] / v
        x0_hat = (r * (1 - g * a)) @ mu + (r * g).sum(1, keepdim=True) * xf
        return log_r, x0_hat, score

    def log_prob(self, x: torch.Tensor, a=1.0, s=0.0) -> torch.Tensor:
        """``log p(x_t)`` ``[B]`` (float64) of the noised mixture; the data density for the defaults."""
        dev = x.device
        xf = x.reshape(x.shape[0], -1).double()
        a = torch.as_tensor(a, dtype=torch.float64, device=dev).reshape(-1, 1)
        s = torch.as_tensor(s, dtype=torch.float64, device=dev).reshape(-1, 1)
        mu, var, logw = self._t("mu", dev), self._t("var", dev), self._t("logw", dev)
        v = a**2 * var[None, :] + s**2
        logp = logw[None] - 0.5 * self._sqdist(xf, a, mu) / v - 0.5 * self._dim * torch.log(2 * math.pi * v)
        return torch.logsumexp(logp, dim=1)

    @staticmethod
    def _sqdist(xf: torch.Tensor, a: torch.Tensor, mu: torch.Tensor) -> torch.Tensor:
        """``||x_b - a_b mu_k||^2`` ``[B, K]``; expanded, clamped at 0 against cancellation."""
        d2 = (xf**2).sum(1, keepdim=True) - 2 * a * (xf @ mu.T) + a**2 * (mu**2).sum(1)[None]
        return d2.clamp_min(0.0)

    def alpha_bar(self, timestep, batch: int, device) -> torch.Tensor:
        """``alpha_bar`` ``[B]`` (float64) at (possibly fractional) training timesteps."""
        ac = self._t("ac", device)
        t = torch.as_tensor(timestep, device=device, dtype=torch.float64).reshape(-1)
        if t.numel() == 1:
            t = t.expand(batch)
        t = t.clamp(0, ac.numel() - 1)
        lo = t.floor().long()
        hi = (lo + 1).clamp(max=ac.numel() - 1)
        frac = t - lo.double()
        return ac[lo] * (1 - frac) + ac[hi] * frac

    def eps_at(self, x: torch.Tensor, alpha_bar) -> torch.Tensor:
        """Exact ``E[eps | x_t]`` at VP level ``alpha_bar`` (float or ``[B]``), dtype and shape of ``x``."""
        ab = torch.as_tensor(alpha_bar, dtype=torch.float64, device=x.device)
        _, x0, score = self.posterior(x, ab.sqrt(), (1 - ab).sqrt())
        return (-(1 - ab).sqrt().reshape(-1, 1) * score).reshape(x.shape).to(x.dtype)

    def x0_at(self, x: torch.Tensor, alpha_bar) -> torch.Tensor:
        """Exact ``E[x0 | x_t]`` at VP level ``alpha_bar``."""
        ab = torch.as_tensor(alpha_bar, dtype=torch.float64, device=x.device)
        _, x0, _ = self.posterior(x, ab.sqrt(), (1 - ab).sqrt())
        return x0.reshape(x.shape).to(x.dtype)

    def velocity_at(self, x: torch.Tensor, t) -> torch.Tensor:
        """Exact rectified-flow velocity ``E[eps - x0 | x_t]`` for ``x_t = (1-t) x0 + t eps``."""
        tt = torch.as_tensor(t, dtype=torch.float64, device=x.device)
        _, x0, _ = self.posterior(x, 1 - tt, tt)
        v = (x.reshape(x.shape[0], -1).double() - x0) / tt.reshape(-1, 1)
        return v.reshape(x.shape).to(x.dtype)

    def eps_fn(self, x: torch.Tensor, timestep) -> torch.Tensor:
        """``eps_fn(x, t)`` over integer training timesteps: the denoiser form the plain-function samplers take."""
        return self.eps_at(x, self.alpha_bar(timestep, x.shape[0], x.device))

    # ------------------------------------------------------------------ diffusers model interface
    def forward(self, sample: torch.Tensor, timestep, *args, return_dict: bool = True, **kwargs):
        B, dev = sample.shape[0], sample.device
        pt = self.config.prediction_type
        if pt == "flow":
            t = torch.as_tensor(timestep, dtype=torch.float64, device=dev).reshape(-1) / self.config.num_train_timesteps
            out = self.velocity_at(sample, t.expand(B) if t.numel() == 1 else t)
        else:
            ab = self.alpha_bar(timestep, B, dev)
            a, s = ab.sqrt(), (1 - ab).sqrt()
            _, x0, score = self.posterior(sample, a, s)
            eps = -s[:, None] * score
            if pt == "epsilon":
                out = eps
            elif pt == "sample":
                out = x0
            else:  # v_prediction
                out = a[:, None] * eps - s[:, None] * x0
            out = out.reshape(sample.shape).to(sample.dtype)
        if not return_dict:
            return (out,)
        return OracleOutput(sample=out)

    # ------------------------------------------------------------------ truth and metrics
    def sample(self, num_samples: int, generator: Optional[torch.Generator] = None, device=None) -> torch.Tensor:
        """Exact draws from the data distribution, ``[N, *sample_shape]`` float64."""
        device = torch.device("cpu") if device is None else torch.device(device)
        mu, var, logw = self._t("mu", "cpu"), self._t("var", "cpu"), self._t("logw", "cpu")
        k = torch.multinomial(logw.exp(), num_samples, replacement=True, generator=generator)
        z = torch.randn(num_samples, self._dim, generator=generator, dtype=torch.float64)
        x = mu[k] + var[k].sqrt()[:, None] * z
        return x.reshape((num_samples,) + self._shape).to(device)

    def assign_modes(self, x: torch.Tensor) -> torch.Tensor:
        """Index ``[N]`` of the nearest mode mean for each sample."""
        xf = x.reshape(x.shape[0], -1).double()
        mu = self._t("mu", x.device)
        return torch.cdist(xf, mu).argmin(1)

    def metrics(
        self,
        samples: torch.Tensor,
        *,
        num_projections: int = 256,
        seed: int = 0,
        reference: Optional[torch.Tensor] = None,
        coverage_threshold: float = 0.5,
        reference_size: int = 50_000,
    ) -> MixtureMetrics:
        """Score ``samples`` ``[N, *sample_shape]`` against the truth; see :class:`MixtureMetrics`.

        The reference set for the sliced Wasserstein distance is ``max(N, reference_size)`` fresh true
        samples drawn from ``seed`` unless ``reference`` is given (a large reference removes its own
        sampling noise; the scored set's noise remains, see ``reference_metrics`` for that floor);
        projections are drawn from ``seed`` too, so calls with the same seed are directly comparable.
        """
        x = samples.reshape(samples.shape[0], -1).double().cpu()
        if not torch.isfinite(x).all():
            return MixtureMetrics(float("-inf"), 0.0, float("inf"), x.shape[0], float("inf"))
        N = x.shape[0]
        mld = self.log_prob(x).mean().item()
        counts = torch.bincount(self.assign_modes(x), minlength=self.num_modes).double() / N
        expected = self._t("logw", "cpu").exp()
        coverage = (counts >= coverage_threshold * expected).double().mean().item()
        if reference is None:
            theta, ref_sorted = self._sw_reference(seed, max(N, reference_size), num_projections)
        else:
            theta = _projections(self._dim, num_projections, torch.Generator().manual_seed(seed))
            ref_sorted = _sorted_proj(reference.reshape(reference.shape[0], -1).double().cpu(), theta)
        sw = _sw_sorted(_sorted_proj(x, theta), ref_sorted)
        return MixtureMetrics(mld, coverage, sw, N, abs(mld - self.expected_log_density()))

    def _sw_reference(self, seed: int, size: int, num_projections: int):
        # The reference set and its sorted projections are the same for every call with these
        # arguments; computing them once makes scoring many sample sets cheap.
        key = ("sw", seed, size, num_projections)
        if key not in self._cache:
            g = torch.Generator().manual_seed(seed)
            ref = self.sample(size, generator=g).reshape(size, -1)
            theta = _projections(self._dim, num_projections, g)
            self._cache[key] = (theta, _sorted_proj(ref, theta))
        return self._cache[key]

    def expected_log_density(self, num_samples: int = 100_000) -> float:
        """``E_data[log p(x)]`` (minus the entropy) by Monte Carlo with a fixed seed; cached."""
        if "expected_logp" not in self._cache:
            x = self.sample(num_samples, generator=torch.Generator().manual_seed(12345))
            self._cache["expected_logp"] = self.log_prob(x).mean().item()
        return self._cache["expected_logp"]

    def reference_metrics(self, num_samples: int, seed: int = 1, **kw) -> MixtureMetrics:
        """Metrics of an exact sample set of the same size: the floor any sampler can reach."""
        x = self.sample(num_samples, generator=torch.Generator().manual_seed(seed + 10_000))
        return self.metrics(x, **kw)


def sliced_wasserstein(
    x: torch.Tensor, y: torch.Tensor, num_projections: int = 256, generator: Optional[torch.Generator] = None
) -> float:
    """Sliced 2-Wasserstein distance between point sets ``x [N, D]`` and ``y [M, D]``.

    ``sqrt(mean_theta W2^2(theta.x, theta.y))`` over ``num_projections`` random unit directions; 1-D W2
    is computed between empirical quantile functions on a common grid of ``max(N, M)`` levels.
    """
    theta = _projections(x.shape[1], num_projections, generator)
    return _sw_sorted(_sorted_proj(x.double(), theta), _sorted_proj(y.double(), theta))


def _sorted_proj(x: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    """Projections ``[P, N]`` sorted along the last (contiguous) dim: much faster than sorting dim 0."""
    return torch.sort((theta.T @ x.T).contiguous(), dim=1).values


def _projections(dim: int, num_projections: int, generator: Optional[torch.Generator]) -> torch.Tensor:
    theta = torch.randn(dim, num_projections, generator=generator, dtype=torch.float64)
    return theta / theta.norm(dim=0, keepdim=True)


def _sw_sorted(px: torch.Tensor, py: torch.Tensor) -> float:
    """Sliced W2 from row-sorted projections ``[P, N]`` and ``[P, M]``. With unequal sizes both
    quantile functions are read at the ``min(N, M)`` mid-levels of the smaller set."""
    if px.shape[1] != py.shape[1]:
        n = min(px.shape[1], py.shape[1])
        q = (torch.arange(n, dtype=torch.float64) + 0.5) / n
        px, py = _quantiles(px, q), _quantiles(py, q)
    return ((px - py) ** 2).mean().sqrt().item()


def _quantiles(sorted_vals: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Linear-interpolated quantiles at levels ``q`` of each row of ``sorted_vals [P, n]``."""
    n = sorted_vals.shape[1]
    pos = (q * n - 0.5).clamp(0, n - 1)
    lo = pos.floor().long()
    hi = (lo + 1).clamp(max=n - 1)
    f = (pos - lo.double())[None, :]
    return sorted_vals[:, lo] * (1 - f) + sorted_vals[:, hi] * f


def image_oracle(
    num_modes: int = 8, size: int = 8, channels: int = 1, std: float = 0.1, seed: int = 0, **config
) -> GaussianMixtureOracle:
    """An oracle shaped like ``channels x size x size`` images with mode means uniform in ``[-0.7, 0.7]``
    per pixel; ``config.sample_size``/``config.in_channels`` are set so DDPMPipeline/DDIMPipeline can use it."""
    D = channels * size * size
    return GaussianMixtureOracle(
        means=ring_means(num_modes, 0.7, D, seed), stds=std, sample_shape=(channels, size, size), **config
    )


def plane_oracle(num_modes: int = 8, radius: float = 0.7, std: float = 0.05, **config) -> GaussianMixtureOracle:
    """The 2-D ring of ``num_modes`` Gaussians used for plots and the solver benchmark."""
    return GaussianMixtureOracle(means=ring_means(num_modes, radius, 2), stds=std, sample_shape=(2,), **config)
