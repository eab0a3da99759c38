"""Search over initial noises under a verifier, with budgets counted in NFE.

Ma et al. 2025, *Inference-time scaling for diffusion models beyond scaling denoising steps*
Three searches share one call shape
``search(denoiser, verifier, budget_nfe=..., generator=..., ...) -> SearchResult``:

- ``random_search``: best-of-N initial noises.
- ``zero_order_search``: hill-climb from a pivot noise ``x``; each round draws neighbours
  ``|x| (lam u + sqrt(1 - lam^2) w)`` with ``u = x / |x|`` and ``w`` a random unit vector orthogonal
  to ``u`` (so every neighbour keeps the pivot's norm), denoises them fully and moves to the best if
  it beats the pivot.
- ``paths_search``: run N noises to an intermediate grid index, expand each into M copies by
  forward-noising back ``forward_steps`` grid steps, denoise ``backward_steps`` (> forward_steps) grid
  steps, score (the verifier sees the one-step ``x0`` prediction until the end of the grid), keep the
  best N, repeat to the end, best-of-N at the end.

NFE is counted per sample: denoising n samples over k grid steps costs ``n * k``; a one-step ``x0``
prediction costs 1 per sample; classifier-free guidance inside the model callable counts as one
(its two halves share a batch). Each search plans its spending before it runs and never exceeds
``budget_nfe``; ``SearchResult.nfe`` is what it actually used. Verifier calls are not NFE.

A denoiser is anything with the ``Denoiser`` interface below; ``SchedulerDenoiser`` adapts an
epsilon model plus any diffusers-compatible scheduler, ``FunctionDenoiser`` a bare callable. For
random and zero-order search the map noise -> sample must be deterministic (an ODE solver such as
DDIM with eta 0), otherwise the search ranks luck.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from .verifiers import as_verifier


# ------------------------------------------------------------------------------------- denoisers
class Denoiser:
    """Interface the searches use.

    ``num_steps``: length S of the timestep grid; grid index 0 is pure noise, S is the final sample.
    ``sample_shape``: shape of one sample. ``denoise(x, start, stop)`` runs grid steps
    ``start..stop-1`` on ``x [n, *sample_shape]`` (cost ``n * (stop - start)`` NFE) and returns the
    state at grid index ``stop`` (the post-processed final sample when ``stop == S``).
    ``alpha_bar(i)``: VP signal level at grid index i (1 at S), used to forward-noise between levels.
    ``predict_x0(x, i)``: one-model-call estimate of the final sample from state ``x`` at index i.
    ``calls`` counts the per-sample model evaluations actually made (tests check it against plans).
    """

    num_steps: int
    sample_shape: tuple
    calls: int = 0

    def denoise(self, x: torch.Tensor, start: int = 0, stop: int | None = None) -> torch.Tensor:
        raise NotImplementedError

    def alpha_bar(self, index: int) -> float:
        raise NotImplementedError

    def predict_x0(self, x: torch.Tensor, index: int) -> torch.Tensor:
        raise NotImplementedError

    def renoise(self, x: torch.Tensor, from_index: int, to_index: int, generator=None) -> torch.Tensor:
        """Forward-noise a state at grid index ``from_index`` to the noisier index ``to_index``:
        ``x' = sqrt(a'/a) x + sqrt(1 - a'/a) z`` (VP). No model call."""
        if not 0 <= to_index <= from_index <= self.num_steps:
            raise ValueError(f"renoise needs 0 <= to_index <= from_index <= {self.num_steps}, "
                             f"got {to_index}, {from_index}")
        ratio = self.alpha_bar(to_index) / self.alpha_bar(from_index)
        z = torch.randn(x.shape, generator=generator, dtype=torch.float32).to(x.device, x.dtype)
        return math.sqrt(ratio) * x + math.sqrt(max(0.0, 1.0 - ratio)) * z

    def _check_range(self, start: int, stop: int | None) -> int:
        stop = self.num_steps if stop is None else stop
        if not 0 <= start <= stop <= self.num_steps:
            raise ValueError(f"denoise needs 0 <= start <= stop <= {self.num_steps}, got start={start}, stop={stop}")
        return stop


class SchedulerDenoiser(Denoiser):
    """An epsilon model ``eps_fn(x, t) -> eps`` driven by a diffusers-compatible VP scheduler.

    Every ``denoise`` call runs ``scheduler.set_timesteps(num_inference_steps)`` first (clearing any
    multistep history), then steps grid entries ``start..stop-1``; so a multistep solver restarted
    mid-grid begins at low order again. One grid entry = one model call (PNDM's repeated timestep
    included).
    """

    def __init__(self, eps_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], scheduler,
                 num_inference_steps: int, sample_shape: Sequence[int],
                 postprocess: Callable[[torch.Tensor], torch.Tensor] | None = None):
        self.eps_fn = eps_fn
        self.scheduler = scheduler
        self.num_inference_steps = int(num_inference_steps)
        self.sample_shape = tuple(sample_shape)
        self.postprocess = postprocess
        scheduler.set_timesteps(self.num_inference_steps)
        self.timesteps = scheduler.timesteps.clone()
        self.num_steps = len(self.timesteps)
        self._abar = scheduler.alphas_cumprod.double().cpu()
        self.calls = 0

    def alpha_bar(self, index: int) -> float:
        if index >= self.num_steps:
            return 1.0
        return float(self._abar[int(self.timesteps[index])])

    def _set(self):
        self.scheduler.set_timesteps(self.num_inference_steps)
        if hasattr(self.scheduler, "set_begin_index"):
            try:
                self.scheduler.set_begin_index(0)
            except Exception:  # schedulers without begin-index support find the index by timestep
                pass

    @torch.no_grad()
    def denoise(self, x, start=0, stop=None):
        stop = self._check_range(start, stop)
        if start == stop:
            return x
        self._set()
        sched = self.scheduler
        if start > 0 and hasattr(sched, "_step_index"):
            sched._step_index = start  # resume mid-grid (the index lookup by value breaks on repeats)
        for i in range(start, stop):
            t = self.timesteps[i]
            eps = self.eps_fn(x, t)
            self.calls += x.shape[0]
            x = sched.step(eps, t, x).prev_sample
        if stop == self.num_steps and self.postprocess is not None:
            x = self.postprocess(x)
        return x

    @torch.no_grad()
    def predict_x0(self, x, index):
        if index >= self.num_steps:
            return x
        t = self.timesteps[index]
        a = self.alpha_bar(index)
        eps = self.eps_fn(x, t)
        self.calls += x.shape[0]
        x0 = (x - math.sqrt(1 - a) * eps) / math.sqrt(a)
        return self.postprocess(x0) if self.postprocess is not None else x0


class FunctionDenoiser(Denoiser):
    """A bare callable ``fn(x, start, stop) -> x`` over a grid of ``len(alpha_bars) - 1`` steps.

    ``alpha_bars[i]`` is the signal level at grid index i (``alpha_bars[-1]`` is normally 1);
    ``x0_fn(x, i) -> x0`` is optional (needed only by ``paths_search``).
    """

    def __init__(self, fn, alpha_bars: Sequence[float], sample_shape: Sequence[int], x0_fn=None):
        self.fn = fn
        self.alpha_bars = [float(a) for a in alpha_bars]
        self.num_steps = len(self.alpha_bars) - 1
        self.sample_shape = tuple(sample_shape)
        self.x0_fn = x0_fn
        self.calls = 0

    def alpha_bar(self, index):
        return self.alpha_bars[index]

    def denoise(self, x, start=0, stop=None):
        stop = self._check_range(start, stop)
        self.calls += x.shape[0] * (stop - start)
        return self.fn(x, start, stop) if stop > start else x

    def predict_x0(self, x, index):
        if self.x0_fn is None:
            raise ValueError("this FunctionDenoiser has no x0_fn; paths_search needs one")
        self.calls += x.shape[0]
        return self.x0_fn(x, index)


# ---------------------------------------------------------------------------------------- result
@dataclass
class SearchResult:
    """Outcome of one noise search.

    Attributes:
        best_sample: ``[*sample_shape]`` the highest-scoring final sample.
        best_noise: ``[*sample_shape]`` the initial noise it came from (for ``paths_search`` the
            root noise of the winning path; that path was also re-noised on the way).
        best_score: its verifier score.
        scores: ``[C]`` verifier scores of every final sample evaluated, in evaluation order
            (intermediate ``x0``-prediction scores of ``paths_search`` are in ``history``).
        samples: ``[C, *sample_shape]`` those final samples, same order.
        nfe: model evaluations used (per sample), always ``<= budget``.
        budget: the NFE budget.
        method: ``"random"``, ``"zero-order"`` or ``"paths"``.
        history: one dict per round: ``round``, ``nfe`` (cumulative), ``best_score`` (best so far).
    """

    best_sample: torch.Tensor
    best_noise: torch.Tensor
    best_score: float
    scores: torch.Tensor
    samples: torch.Tensor
    nfe: int
    budget: int
    method: str
    history: list = field(default_factory=list)


def _noise(n: int, shape: tuple, generator) -> torch.Tensor:
    return torch.randn((n,) + shape, generator=generator, dtype=torch.float32)


def _check_budget(budget_nfe, per: int, what: str) -> int:
    if budget_nfe is None or int(budget_nfe) < 1:
        raise ValueError(f"budget_nfe must be a positive integer, got {budget_nfe}")
    if int(budget_nfe) < per:
        raise ValueError(f"budget_nfe={budget_nfe} is below the {per} NFE one {what} needs")
    return int(budget_nfe)


def _device(denoiser, device):
    return torch.device(device) if device is not None else torch.device("cpu")


# ------------------------------------------------------------------------------------ searches
def random_search(denoiser: Denoiser, verifier, *, budget_nfe: int | None = None, num_candidates: int | None = None,
                  generator: torch.Generator | None = None, batch_size: int = 64, device=None) -> SearchResult:
    """Best-of-N: denoise N random noises fully and keep the one the verifier scores highest.

    Give ``budget_nfe`` (then N = budget // S) or ``num_candidates`` (then the budget is N * S);
    giving both checks that N * S fits.
    """
    verifier = as_verifier(verifier)
    S = denoiser.num_steps
    if num_candidates is not None:
        if int(num_candidates) < 1:
            raise ValueError(f"num_candidates must be >= 1, got {num_candidates}")
        budget_nfe = int(num_candidates) * S if budget_nfe is None else budget_nfe
    budget = _check_budget(budget_nfe, S, "full denoising")
    n = budget // S if num_candidates is None else int(num_candidates)
    if n * S > budget:
        raise ValueError(f"{n} candidates x {S} steps = {n * S} NFE exceeds budget_nfe={budget}")
    dev = _device(denoiser, device)
    noises = _noise(n, denoiser.sample_shape, generator)
    samples, scores, history, used = [], [], [], 0
    for r, i in enumerate(range(0, n, batch_size)):
        x = noises[i:i + batch_size].to(dev)
        out = denoiser.denoise(x, 0, S)
        used += x.shape[0] * S
        samples.append(out.cpu())
        scores.append(verifier(out).cpu())
        history.append({"round": r, "nfe": used, "best_score": torch.cat(scores).max().item()})
    samples, scores = torch.cat(samples), torch.cat(scores)
    b = int(scores.argmax())
    return SearchResult(samples[b], noises[b], scores[b].item(), scores, samples, used, budget, "random", history)


def zo_neighbors(pivot: torch.Tensor, n: int, lam: float = 0.95, generator=None) -> torch.Tensor:
    """``n`` neighbours of ``pivot [*shape]`` on its sphere: ``|x| (lam u + sqrt(1 - lam^2) w)``,
    ``u = x/|x|``, ``w`` uniform on the unit sphere orthogonal to ``u``. Returns ``[n, *shape]``."""
    if not 0.0 <= lam <= 1.0:
        raise ValueError(f"lam must be in [0, 1], got {lam}")
    flat = pivot.reshape(-1).double()
    norm = flat.norm()
    u = flat / norm
    w = torch.randn(n, flat.numel(), generator=generator, dtype=torch.float64)
    w = w - (w @ u)[:, None] * u[None]
    w = w / w.norm(dim=1, keepdim=True)
    out = norm * (lam * u[None] + math.sqrt(1 - lam * lam) * w)
    return out.to(pivot.dtype).reshape((n,) + tuple(pivot.shape))


def zero_order_search(denoiser: Denoiser, verifier, *, budget_nfe: int, num_neighbors: int = 4,
                      lam: float = 0.95, pivot: torch.Tensor | None = None,
                      generator: torch.Generator | None = None, device=None) -> SearchResult:
    """Zero-order search: pivot (1 full denoise), then rounds of ``num_neighbors`` neighbours until
    the budget runs out (the last round may have fewer neighbours so the budget is used fully)."""
    verifier = as_verifier(verifier)
    if int(num_neighbors) < 1:
        raise ValueError(f"num_neighbors must be >= 1, got {num_neighbors}")
    S = denoiser.num_steps
    budget = _check_budget(budget_nfe, S, "full denoising")
    dev = _device(denoiser, device)
    x = _noise(1, denoiser.sample_shape, generator)[0] if pivot is None else pivot.detach().float().cpu()
    if tuple(x.shape) != denoiser.sample_shape:
        raise ValueError(f"pivot must have shape {denoiser.sample_shape}, got {tuple(x.shape)}")
    out = denoiser.denoise(x[None].to(dev), 0, S)
    used = S
    s = verifier(out).cpu()
    samples, scores = [out.cpu()], [s]
    best_noise, best_sample, best = x, out[0].cpu(), s[0].item()
    history = [{"round": 0, "nfe": used, "best_score": best}]
    r = 0
    while budget - used >= S:
        r += 1
        k = min(int(num_neighbors), (budget - used) // S)
        cand = zo_neighbors(best_noise, k, lam, generator)
        out = denoiser.denoise(cand.to(dev), 0, S)
        used += k * S
        s = verifier(out).cpu()
        samples.append(out.cpu())
        scores.append(s)
        j = int(s.argmax())
        if s[j].item() > best:
            best, best_noise, best_sample = s[j].item(), cand[j], out[j].cpu()
        history.append({"round": r, "nfe": used, "best_score": best})
    return SearchResult(best_sample, best_noise, best, torch.cat(scores), torch.cat(samples), used, budget,
                        "zero-order", history)


def paths_plan(num_steps: int, start_index: int, forward_steps: int, backward_steps: int) -> list[tuple[int, int]]:
    """The ``(renoise_to, denoise_to)`` grid indices of each expansion round."""
    if not 0 < start_index <= num_steps:
        raise ValueError(f"start_index must be in [1, {num_steps}], got {start_index}")
    if not 0 < forward_steps < backward_steps:
        raise ValueError(f"need 0 < forward_steps < backward_steps, got {forward_steps}, {backward_steps}")
    rounds, i = [], start_index
    while i < num_steps:
        j = max(0, i - forward_steps)
        k = min(num_steps, j + backward_steps)
        rounds.append((j, k))
        i = k
    return rounds


def paths_cost(num_paths: int, num_branches: int, num_steps: int, start_index: int, plan) -> int:
    """NFE of ``paths_search`` for this plan: N * start_index, then per round N * M * (steps + 1 if the
    candidates are scored by an ``x0`` prediction, i.e. before the grid ends)."""
    cost = num_paths * start_index
    for j, k in plan:
        cost += num_paths * num_branches * ((k - j) + (1 if k < num_steps else 0))
    return cost


def paths_search(denoiser: Denoiser, verifier, *, budget_nfe: int, num_paths: int | None = None,
                 num_branches: int = 2, start_index: int | None = None, forward_steps: int | None = None,
                 backward_steps: int | None = None, generator: torch.Generator | None = None,
                 device=None) -> SearchResult:
    """Search over paths. Defaults: start at 40% of the grid, re-noise back 20%, denoise forward 40%
    (at least 1 and 2 grid steps); ``num_paths`` defaults to the largest N whose plan fits the budget."""
    verifier = as_verifier(verifier)
    S = denoiser.num_steps
    if int(num_branches) < 1:
        raise ValueError(f"num_branches must be >= 1, got {num_branches}")
    start_index = max(1, round(0.4 * S)) if start_index is None else int(start_index)
    forward_steps = max(1, round(0.2 * S)) if forward_steps is None else int(forward_steps)
    backward_steps = max(forward_steps + 1, round(0.4 * S)) if backward_steps is None else int(backward_steps)
    plan = paths_plan(S, start_index, forward_steps, backward_steps)
    per_path = paths_cost(1, num_branches, S, start_index, plan)
    budget = _check_budget(budget_nfe, per_path, f"path ({num_branches} branches, plan {plan})")
    n = budget // per_path if num_paths is None else int(num_paths)
    if n < 1 or paths_cost(n, num_branches, S, start_index, plan) > budget:
        raise ValueError(f"{n} paths need {paths_cost(max(n, 1), num_branches, S, start_index, plan)} NFE, "
                         f"over budget_nfe={budget}")
    dev = _device(denoiser, device)
    roots = _noise(n, denoiser.sample_shape, generator)
    x = denoiser.denoise(roots.to(dev), 0, start_index)
    root_of = torch.arange(n)
    used = n * start_index
    history = []
    final_scores = final_samples = None
    for r, (j, k) in enumerate(plan):
        i = start_index if r == 0 else plan[r - 1][1]
        rep = x.repeat_interleave(num_branches, dim=0)
        cand_root = root_of.repeat_interleave(num_branches)
        cand = denoiser.renoise(rep, i, j, generator)
        cand = denoiser.denoise(cand, j, k)
        used += cand.shape[0] * (k - j)
        if k < S:
            scored = denoiser.predict_x0(cand, k)
            used += cand.shape[0]
        else:
            scored = cand
        s = verifier(scored).cpu()
        keep = torch.topk(s, min(n, s.shape[0])).indices
        x, root_of = cand[keep], cand_root[keep]
        history.append({"round": r + 1, "nfe": used, "best_score": s.max().item(), "grid": [i, j, k]})
        if k == S:
            final_scores, final_samples = s[keep], cand[keep].cpu()
    if final_scores is None:  # start_index == S: no expansion rounds, plain best-of-N
        final_scores, final_samples = verifier(x).cpu(), x.cpu()
        history.append({"round": 0, "nfe": used, "best_score": final_scores.max().item(), "grid": [S, S, S]})
    b = int(final_scores.argmax())
    return SearchResult(final_samples[b], roots[root_of[b]], final_scores[b].item(), final_scores, final_samples,
                        used, budget, "paths", history)


SEARCHES = {"random": random_search, "zero-order": zero_order_search, "paths": paths_search}


def run_search(method: str, denoiser: Denoiser, verifier, *, budget_nfe: int, generator=None, **kw) -> SearchResult:
    """Dispatch by name: ``"random"``, ``"zero-order"`` or ``"paths"``."""
    if method not in SEARCHES:
        raise ValueError(f"unknown search {method!r}; choose from {', '.join(SEARCHES)}")
    return SEARCHES[method](denoiser, verifier, budget_nfe=budget_nfe, generator=generator, **kw)
