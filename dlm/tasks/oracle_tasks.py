"""Benchmark suites on the analytic oracle languages, and the metrics that score decoded sequences.

Unlike the text tasks of this package (one prompt, one checkable answer), an oracle suite scores a
SAMPLER as a sampler of a distribution: the model (`dlm.oracles.PermutationOracle`,
`dlm.oracles.HMMOracle`) is exact, so any gap between the outputs and the oracle's joint is the
decoding's fault (ALGORITHMS 1.10: committing k tokens in one step draws them independently, and
the KL to the data is bounded below by their total correlation). One-token-per-step random-order
decoding at temperature 1 is the exact reference.

Usage (the bench)::

    from dlm.tasks.oracle_tasks import get_oracle_suite, ORACLE_SUITE_NAMES
    suite = get_oracle_suite("oracle-hmm")
    run = suite.run(sampler="confidence", steps=4, block_length=8, seed=0)
    run.metrics.to_dict(), run.nfe, run.tpf

or with your own loop: ``oracle = suite.build()``, ``dlm.generate(oracle, suite.prompts(oracle),
**suite.generate_kwargs(oracle), ...)``, then ``suite.evaluate(oracle, out.sequences)``.

What the bench should report for each (suite, sampler, steps) cell, at temperature 1:
    valid_fraction      share of outputs with positive probability (permutation: all symbols
                        distinct). 1.0 for an exact sampler; the headline number for "oracle-permutation".
    log_prob_gap        E_true[log p] - mean log p(output) over valid outputs, in nats per sequence.
                        0 for an exact sampler (up to Monte Carlo error); positive = outputs less likely
                        than true samples (incoherent mixtures); negative = over-concentrated on
                        likely sequences (mode seeking, e.g. low temperature). Not a divergence: read
                        it together with the distribution metrics. Always 0 for valid permutations.
    total_variation     TV between the empirical output distribution and the exact joint (support
                        small enough to enumerate). Finite samples make it positive even for an exact
                        sampler: compare with reference_total_variation, the TV of the same number of
                        exact samples.
    kl_empirical_to_true  KL(empirical || true) in nats; inf if any output is invalid; compare
                        with reference_kl.
    chi2_pvalue         goodness-of-fit p-value of the outputs against the exact joint (small
                        expected counts merged); tiny values mean the sampler is provably inexact.
plus NFE and tokens per forward from `dlm.generate`.

"oracle-pivot" (a sticky 8-state HMM over 64 symbols, length 64: `dlm.oracles.PivotOracle`) has far
too many sequences to enumerate; it is scored instead by distances between the empirical and the
EXACT laws of two statistics of each output, the number of state switches S and the number of
positions holding their state's most likely symbol T (`PivotMetrics`, `pivot_metrics`):
total_variation is the larger of their TVs (a lower bound on the TV to the exact joint), with its
exact-sampling noise at the same N (reference_total_variation and its q95) beside it.

Reading the numbers: a sampler that chooses WHICH position to commit by the model's confidence is
not an exact sampler even at one token per step (the order then depends on the values drawn), and
on the HMM it shows as a negative log_prob_gap (mode seeking) with a large total variation;
random order at one token per step is exact, and loses exactness as tokens per step grow (positive
gap, growing TV; on the permutation language, invalid outputs).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Callable

import torch

from dlm.oracles.hmm import HMMOracle
from dlm.oracles.permutation import PermutationOracle, sequence_codes
from dlm.oracles.pivot import PivotOracle
from dlm.tasks.oracle_names import ORACLE_SUITE_NAMES

# Enumerating the support for distribution-level metrics is skipped beyond this many cells.
MAX_DISTRIBUTION_CELLS = 200_000


def _generation(oracle, sequences: torch.Tensor) -> torch.Tensor:
    """Last `n` columns of `[N, P + n]` or `[N, n]` outputs, checked."""
    if not isinstance(sequences, torch.Tensor) or sequences.dim() != 2 or sequences.shape[1] < oracle.gen_length:
        raise ValueError(f"sequences must be [N, >= n] with n={oracle.gen_length} (the generation is "
                         f"the last n columns); got {tuple(getattr(sequences, 'shape', ()))}")
    return sequences[:, -oracle.gen_length:].long().cpu()


def _support_size(oracle) -> int:
    """Sentences of positive probability an oracle can enumerate (its `support_size` when it knows
    it, e.g. the keyed oracle's, else every sequence of symbols)."""
    if isinstance(oracle, PermutationOracle):
        return math.factorial(oracle.n)
    own = getattr(oracle, "support_size", None)
    return own if own is not None else oracle.num_symbols ** oracle.gen_length


@dataclass
class CellCounts:
    """Outputs binned over the enumerated support of an oracle.

    Attributes:
        sequences: `[M, n]` the support cells (positive probability), lexicographic order.
        probs: `[M]` float64 exact probabilities (sum to 1).
        counts: `[M]` long, outputs falling in each cell.
        outside: outputs outside the support (invalid sequences).
    """

    sequences: torch.Tensor
    probs: torch.Tensor
    counts: torch.Tensor
    outside: int

    @property
    def total(self) -> int:
        return int(self.counts.sum()) + self.outside


def cell_counts(oracle, sequences: torch.Tensor) -> CellCounts:
    """Bin outputs `[N, P + n]` (or `[N, n]`) over the oracle's enumerated support."""
    gen = _generation(oracle, sequences)
    support, log_probs = oracle.enumerate_joint()
    support, log_probs = support.cpu(), log_probs.cpu()
    keep = torch.isfinite(log_probs)
    support, probs = support[keep], log_probs[keep].exp()
    base = oracle.num_symbols
    table = sequence_codes(support, base)  # increasing: lexicographic enumeration
    codes = sequence_codes(gen, base)
    idx = torch.searchsorted(table, codes).clamp_max(table.numel() - 1)
    hit = (table[idx] == codes) & (codes >= 0)
    counts = torch.bincount(idx[hit], minlength=table.numel())
    return CellCounts(support, probs, counts, int((~hit).sum()))


@dataclass
class ChiSquareResult:
    """Pearson goodness-of-fit of outputs to the exact joint.

    Attributes:
        statistic / pvalue: scipy's; `inf` / 0.0 when some output lies outside the support.
        dof: degrees of freedom (merged cells - 1).
        num_cells: cells after merging those with expected count below `min_expected`.
        outside: outputs outside the support.
    """

    statistic: float
    pvalue: float
    dof: int
    num_cells: int
    outside: int


def merge_small_cells(observed: torch.Tensor, expected: torch.Tensor, min_expected: float = 5.0):
    """Pool cells, smallest expected count first, until every pooled cell expects `min_expected`.

    Returns float64 numpy arrays `(observed, expected)` of the merged cells. The last pool, if still
    short, joins the previous one.
    """
    order = torch.argsort(expected, stable=True)
    obs, exp = observed[order].double().tolist(), expected[order].double().tolist()
    pooled_obs, pooled_exp, acc_o, acc_e = [], [], 0.0, 0.0
    for o, e in zip(obs, exp):
        acc_o, acc_e = acc_o + o, acc_e + e
        if acc_e >= min_expected:
            pooled_obs.append(acc_o)
            pooled_exp.append(acc_e)
            acc_o = acc_e = 0.0
    if acc_e > 0 or acc_o > 0:
        if pooled_exp:
            pooled_obs[-1] += acc_o
            pooled_exp[-1] += acc_e
        else:
            pooled_obs.append(acc_o)
            pooled_exp.append(acc_e)
    import numpy as np

    return np.asarray(pooled_obs), np.asarray(pooled_exp)


def chi_square_test(oracle, sequences: torch.Tensor, *, min_expected: float = 5.0) -> ChiSquareResult:
    """Chi-square test of the outputs against the oracle's exact joint (`scipy.stats.chisquare`).

    Cells are the enumerated support; cells whose expected count is below `min_expected` are merged
    (`merge_small_cells`) so the chi-square approximation holds. Any output outside the support
    makes the fit impossible: statistic inf, p-value 0.
    """
    from scipy.stats import chisquare

    bins = cell_counts(oracle, sequences)
    n_in = int(bins.counts.sum())
    if bins.outside > 0 or n_in == 0:
        return ChiSquareResult(float("inf"), 0.0, 0, 0, bins.outside)
    obs, exp = merge_small_cells(bins.counts, bins.probs * n_in, min_expected)
    exp = exp * (obs.sum() / exp.sum())  # scipy insists the totals agree to 1e-8
    if len(obs) < 2:
        return ChiSquareResult(0.0, 1.0, 0, len(obs), 0)
    res = chisquare(obs, exp)
    return ChiSquareResult(float(res.statistic), float(res.pvalue), len(obs) - 1, len(obs), 0)


def distribution_distances(oracle, sequences: torch.Tensor) -> tuple[float, float]:
    """`(total_variation, kl_empirical_to_true)` between the outputs' empirical distribution and the
    exact joint. Mass on invalid outputs counts fully towards TV and makes the KL infinite."""
    bins = cell_counts(oracle, sequences)
    total = bins.total
    if total == 0:
        raise ValueError("no sequences to score")
    emp = bins.counts.double() / total
    tv = 0.5 * (float((emp - bins.probs).abs().sum()) + bins.outside / total)
    if bins.outside:
        return tv, float("inf")
    seen = emp > 0
    kl = float((emp[seen] * (emp[seen].log() - bins.probs[seen].log())).sum())
    return tv, kl


@dataclass
class OracleMetrics:
    """How far decoded sequences are from exact samples of an oracle (see the module docstring).

    Attributes:
        num_samples: outputs scored.
        valid_fraction: share of outputs with positive probability under the oracle.
        mean_log_prob: mean exact log p(x) over VALID outputs (nats per sequence; nan if none).
        expected_log_prob: E_true[log p(x)] = minus the entropy of the language.
        expected_log_prob_exact: False when it is a Monte Carlo estimate (support too large).
        log_prob_gap: expected_log_prob - mean_log_prob (0 for an exact sampler).
        total_variation / kl_empirical_to_true / chi2_pvalue: distribution-level metrics; None
            when the support has more than `MAX_DISTRIBUTION_CELLS` cells.
        reference_total_variation / reference_kl: the same distances for `num_samples` exact
            samples (the finite-sample floor); None when not computed.
        num_cells: size of the support (None when not enumerated).
    """

    num_samples: int
    valid_fraction: float
    mean_log_prob: float
    expected_log_prob: float
    expected_log_prob_exact: bool
    log_prob_gap: float
    total_variation: float | None = None
    kl_empirical_to_true: float | None = None
    chi2_pvalue: float | None = None
    reference_total_variation: float | None = None
    reference_kl: float | None = None
    num_cells: int | None = None

    def to_dict(self) -> dict:
        """Plain dict (floats may be inf or nan: `json.dumps` writes them as Infinity / NaN)."""
        return asdict(self)


def oracle_metrics(oracle, sequences: torch.Tensor, *, distribution: bool | None = None,
                   reference: bool = True, seed: int = 0, mc_samples: int = 200_000) -> OracleMetrics:
    """Score decoded sequences against an oracle.

    Args:
        oracle: a `PermutationOracle` or `HMMOracle` (anything with `gen_length`, `num_symbols`,
            `log_prob`, `is_valid`, `sample`, `enumerate_joint`, `expected_log_prob`).
        sequences: `[N, P + n]` outputs of `dlm.generate` (or `[N, n]`); the last n columns count.
        distribution: compute TV / KL / chi-square (default: when the support has at most
            `MAX_DISTRIBUTION_CELLS` sequences).
        reference: also compute TV / KL of `N` exact samples (seeded by `seed`), the floor that
            finite sampling puts under the distances.
        mc_samples: samples for E_true[log p] when it cannot be enumerated.
    """
    gen = _generation(oracle, sequences)
    num = gen.shape[0]
    if num == 0:
        raise ValueError("no sequences to score")
    log_p = oracle.log_prob(gen).cpu()
    valid = torch.isfinite(log_p)
    mean_lp = float(log_p[valid].mean()) if bool(valid.any()) else float("nan")
    expected, exact = oracle.expected_log_prob(num_samples=mc_samples, seed=seed)
    metrics = OracleMetrics(
        num_samples=num, valid_fraction=float(valid.double().mean()), mean_log_prob=mean_lp,
        expected_log_prob=expected, expected_log_prob_exact=exact, log_prob_gap=expected - mean_lp)
    cells = _support_size(oracle)
    if distribution is None:
        distribution = cells <= MAX_DISTRIBUTION_CELLS
    if distribution:
        metrics.num_cells = cells
        metrics.total_variation, metrics.kl_empirical_to_true = distribution_distances(oracle, gen)
        metrics.chi2_pvalue = chi_square_test(oracle, gen).pvalue
        if reference:
            g = torch.Generator().manual_seed(seed)
            exact_samples = oracle.sample(num, g).cpu()
            metrics.reference_total_variation, metrics.reference_kl = distribution_distances(oracle, exact_samples)
    return metrics


@dataclass
class OracleRun:
    """One decoding run of an oracle suite: `metrics` plus the driver's cost numbers."""

    metrics: OracleMetrics
    nfe: int
    tpf: float
    seconds: float
    settings: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"nfe": self.nfe, "tpf": self.tpf, "seconds": self.seconds, **self.settings,
                **self.metrics.to_dict()}


@dataclass(frozen=True)
class OracleTask:
    """A benchmark suite on one oracle language.

    Attributes:
        name: registry name ("oracle-permutation", "oracle-hmm").
        description: one line for listings.
        factory: builds the oracle model (cheap, deterministic).
        num_samples: default number of sequences to decode (one batched `dlm.generate` call).
        prompt_length: BOS tokens before the generation.
    """

    name: str
    description: str
    factory: Callable[[], torch.nn.Module]
    num_samples: int = 4096
    prompt_length: int = 1

    def build(self) -> torch.nn.Module:
        return self.factory()

    def prompts(self, oracle, num_samples: int | None = None, device=None) -> torch.Tensor:
        """`[num_samples, prompt_length]` BOS prompts."""
        return oracle.prompt(num_samples or self.num_samples, self.prompt_length, device=device)

    def generate_kwargs(self, oracle) -> dict:
        """Arguments `dlm.generate` needs for this oracle: `gen_length` must equal the sentence length."""
        return {"gen_length": oracle.gen_length, "mask_token_id": oracle.config.mask_token_id}

    def evaluate(self, oracle, sequences: torch.Tensor, **kwargs) -> OracleMetrics:
        """`oracle_metrics` of decoded `[N, P + n]` sequences."""
        return oracle_metrics(oracle, sequences, **kwargs)

    def run(self, *, sampler="random", steps: int | None = None, block_length: int | None = None,
            temperature: float = 1.0, num_samples: int | None = None, seed: int = 0,
            **generate_kwargs) -> OracleRun:
        """Decode `num_samples` sequences in one batched call and score them.

        `steps` defaults to one token per step. Temperature defaults to 1: the oracle's joint is the
        target, so other temperatures measure a different (sharpened) distribution.
        """
        import dlm

        oracle = self.build()
        n = oracle.gen_length
        g = torch.Generator().manual_seed(seed)
        out = dlm.generate(oracle, self.prompts(oracle, num_samples), **self.generate_kwargs(oracle),
                           block_length=block_length, steps=steps if steps is not None else n,
                           sampler=sampler, temperature=temperature, generator=g, **generate_kwargs)
        settings = {"suite": self.name, "sampler": sampler if isinstance(sampler, str) else sampler.name,
                    "steps": steps if steps is not None else n, "block_length": block_length or n,
                    "temperature": temperature, "seed": seed}
        return OracleRun(self.evaluate(oracle, out.sequences, seed=seed), out.nfe, out.tpf, out.seconds, settings)


# -- the pivot oracle: distances between laws of the number of state switches ------------------------
PIVOT_SMOOTHING = 0.5  # add-1/2 (Krichevsky-Trofimov) pseudo-count per cell for KL(true || empirical)
PIVOT_REFERENCE_REPEATS = 200  # exact-sample replicates behind the noise reference


def law_distances(counts: torch.Tensor, law: torch.Tensor, outside: int = 0,
                  smoothing: float = PIVOT_SMOOTHING) -> tuple[float, float, float]:
    """``(total_variation, kl_empirical_to_true, kl_true_to_smoothed)`` of binned counts against a law.

    Args:
        counts: ``[M]`` outputs per cell. law: ``[M]`` float64 exact probabilities (sum 1).
        outside: outputs in no cell (counted fully towards TV; they make KL(emp || true) infinite
            and are dropped from the smoothed estimate).
        smoothing: pseudo-count added to every cell before KL(true || empirical), which is infinite
            otherwise whenever a cell of positive probability is empty.
    """
    total = int(counts.sum()) + outside
    if total == 0:
        raise ValueError("no sequences to score")
    p = law.double()
    emp = counts.double() / total
    tv = 0.5 * (float((emp - p).abs().sum()) + outside / total)
    seen = emp > 0
    if outside or bool((p[seen] <= 0).any()):
        kl_forward = float("inf")
    else:
        kl_forward = float((emp[seen] * (emp[seen].log() - p[seen].log())).sum())
    q = (counts.double() + smoothing) / (float(counts.sum()) + smoothing * counts.numel())
    pos = p > 0
    kl_reverse = float((p[pos] * (p[pos].log() - q[pos].log())).sum())
    return tv, kl_forward, kl_reverse


def expected_total_variation(law: torch.Tensor, num_samples: int) -> float:
    """Exact ``E[TV]`` between the empirical law of ``num_samples`` i.i.d. draws from ``law`` and ``law``.

    Each cell count is Binomial(N, p); De Moivre's mean absolute deviation
    ``E|X - Np| = 2 (m + 1) C(N, m + 1) p^(m+1) (1 - p)^(N - m)``, ``m = floor(Np)``, gives
    ``E[TV] = sum_j E|X_j - N p_j| / (2N)``: the bias of the TV estimator for an exact sampler.
    It shrinks like ``sum_j sqrt(p_j (1 - p_j)) / sqrt(2 pi N)``.
    """
    if num_samples < 1:
        raise ValueError(f"num_samples must be >= 1, got {num_samples}")
    N, total = num_samples, 0.0
    for p in law.double().tolist():
        m = math.floor(N * p)
        if p <= 0 or p >= 1 or m + 1 > N:
            continue
        log_mad = (math.log(2 * (m + 1)) + math.lgamma(N + 1) - math.lgamma(m + 2) - math.lgamma(N - m)
                   + (m + 1) * math.log(p) + (N - m) * math.log1p(-p))
        total += math.exp(log_mad)
    return total / (2 * N)


@dataclass
class PivotMetrics:
    """Outputs of the pivot oracle scored by the exact laws of two statistics of each output.

    S = number of state switches of the observable state path (0..n-1; `PivotOracle.switch_count_law`)
    sees the coherence of runs: parallel commits break runs (S too large), confidence order
    stretches them (S too small). T = positions holding their state's most likely symbol (0..n;
    `PivotOracle.top_symbol_count_law`) sees mode seeking inside a state's symbol group, which S
    misses. A function of the output cannot increase total variation, so TV of either statistic's
    law is a lower bound on the TV between the output law and the exact joint; the headline
    `total_variation` is the larger of the two, which errors of opposite sign in one statistic
    cannot hide.

    Every distance is positive for an exact sampler at finite N (the estimator's bias, about
    ``sum_j sqrt(p_j (1 - p_j)) / sqrt(2 pi N)`` for TV): read it against its ``reference_*``
    field, the same distance for N exact sequences (`PivotOracle.sample_statistics`: equal in law
    to N one-token-per-step random-order decodes), mean and 95th percentile over
    `PIVOT_REFERENCE_REPEATS` replicate sets. Above the q95 is a gap at about 5% false alarms.

    Attributes:
        num_samples: outputs scored (N). statistic: what is binned.
        valid_fraction: outputs made only of symbols (each such output has positive probability).
        total_variation: max(total_variation_switches, total_variation_top): the headline.
        total_variation_switches / total_variation_top: TV(empirical law, exact law) of S / of T;
            invalid outputs count fully.
        mean_switches / expected_switches, mean_top_symbols / expected_top_symbols: means of S and
            T over the outputs / under the exact laws.
        kl_empirical_to_true: KL(empirical || exact) of S in nats, no smoothing (the exact law is
            positive on every cell); inf if any output is invalid.
        kl_true_to_smoothed: KL(exact || empirical with `PIVOT_SMOOTHING` added to each of the n
            cells) of S in nats: it sees mass the sampler fails to produce. The pseudo-counts bias
            it (n / 2 of them beside N real ones); the reference carries the same bias.
        chi2_pvalue: Pearson test of the counts of S against its exact law (cells merged to an
            expected count >= 5); tiny = provably not the exact law.
        expected_total_variation_switches: exact E[TV of S] for N exact outputs
            (`expected_total_variation`): the bias, with no sampling noise of its own.
        reference_<distance> / reference_<distance>_q95: mean and 95th percentile of that distance
            over the exact replicates (<distance>: total_variation, total_variation_switches,
            total_variation_top, kl_empirical_to_true, kl_true_to_smoothed).
        mean_log_prob: mean exact log p(x) over valid outputs (nats per sequence).
        expected_log_prob: E_true[log p(x)] = -H, exact (`PivotOracle.entropy`).
        log_prob_gap: expected_log_prob - mean_log_prob (positive: outputs less likely than exact
            samples; negative: mode seeking). log_prob_gap_stderr: standard error of mean_log_prob
            over the outputs. reference_log_prob_gap: the gap of N exact ancestral samples.
    """

    num_samples: int
    statistic: str
    valid_fraction: float
    total_variation: float
    total_variation_switches: float
    total_variation_top: float
    mean_switches: float
    expected_switches: float
    mean_top_symbols: float
    expected_top_symbols: float
    kl_empirical_to_true: float
    kl_true_to_smoothed: float
    chi2_pvalue: float
    expected_total_variation_switches: float
    mean_log_prob: float
    expected_log_prob: float
    expected_log_prob_exact: bool
    log_prob_gap: float
    log_prob_gap_stderr: float
    reference_total_variation: float | None = None
    reference_total_variation_q95: float | None = None
    reference_total_variation_switches: float | None = None
    reference_total_variation_switches_q95: float | None = None
    reference_total_variation_top: float | None = None
    reference_total_variation_top_q95: float | None = None
    reference_kl_empirical_to_true: float | None = None
    reference_kl_empirical_to_true_q95: float | None = None
    reference_kl_true_to_smoothed: float | None = None
    reference_kl_true_to_smoothed_q95: float | None = None
    reference_log_prob_gap: float | None = None

    def to_dict(self) -> dict:
        """Plain dict (floats may be inf or nan: `json.dumps` writes them as Infinity / NaN)."""
        return asdict(self)


def _switch_chi2_pvalue(counts: torch.Tensor, law: torch.Tensor, outside: int) -> float:
    from scipy.stats import chisquare

    n_in = int(counts.sum())
    if outside or n_in == 0:
        return 0.0
    obs, exp = merge_small_cells(counts, law * n_in)
    if len(obs) < 2:
        return 1.0
    return float(chisquare(obs, exp * (obs.sum() / exp.sum())).pvalue)


def _statistic_counts(values: torch.Tensor, law: torch.Tensor) -> tuple[torch.Tensor, int, float]:
    """``(counts [M], outside, mean)`` of a per-row statistic ``[N]`` (-1 = no value) over its law's cells."""
    valid = values >= 0
    counts = torch.bincount(values[valid], minlength=law.numel())
    mean = float(values[valid].double().mean()) if bool(valid.any()) else float("nan")
    return counts, int((~valid).sum()), mean


def _law_mean(law: torch.Tensor) -> float:
    return float((law * torch.arange(law.numel(), dtype=torch.float64)).sum())


def _distances(switches: torch.Tensor, top: torch.Tensor, laws: tuple[torch.Tensor, torch.Tensor]) -> dict:
    """Every distance of `PivotMetrics` for one set of outputs' statistics ``S [N]``, ``T [N]``."""
    counts, outside, _ = _statistic_counts(switches, laws[0])
    tv_s, kl_f, kl_r = law_distances(counts, laws[0], outside)
    top_counts, top_outside, _ = _statistic_counts(top, laws[1])
    tv_t = law_distances(top_counts, laws[1], top_outside)[0]
    return {"total_variation": max(tv_s, tv_t), "total_variation_switches": tv_s, "total_variation_top": tv_t,
            "kl_empirical_to_true": kl_f, "kl_true_to_smoothed": kl_r}


def _reference_distances(oracle: PivotOracle, laws, num: int, seed: int, repeats: int) -> dict:
    """Mean and 95th percentile of each distance over `repeats` sets of `num` exact outputs."""
    import numpy as np

    switches, top = oracle.sample_statistics(num * repeats, torch.Generator().manual_seed(seed))
    rows = [_distances(s, t, laws) for s, t in zip(switches.view(repeats, num), top.view(repeats, num))]
    out = {}
    for name in rows[0]:
        values = np.array([r[name] for r in rows])
        out[f"reference_{name}"] = float(values.mean())
        out[f"reference_{name}_q95"] = float(np.quantile(values, 0.95))
    return out


def pivot_metrics(oracle: PivotOracle, sequences: torch.Tensor, *, reference: bool = True, seed: int = 0,
                  repeats: int = PIVOT_REFERENCE_REPEATS) -> PivotMetrics:
    """Score decoded `[N, P + n]` (or `[N, n]`) outputs of a `PivotOracle` (see `PivotMetrics`).

    `reference`: also compute the exact-sampling noise reference (`repeats` replicate sets of N
    exact outputs' statistics, and N exact ancestral samples for the log-likelihood), seeded by `seed`.
    """
    if not isinstance(oracle, PivotOracle):
        raise ValueError(f"oracle must be a PivotOracle (the metric needs its observable state path), "
                         f"got {type(oracle).__name__}")
    if repeats < 2:
        raise ValueError(f"repeats must be >= 2 for a reference spread, got {repeats}")
    gen = _generation(oracle, sequences)
    num = gen.shape[0]
    if num == 0:
        raise ValueError("no sequences to score")
    laws = (oracle.switch_count_law(), oracle.top_symbol_count_law())
    switches, top = oracle.num_switches(gen), oracle.num_top_symbols(gen)
    counts, outside, mean_s = _statistic_counts(switches, laws[0])
    log_p = oracle.log_prob(gen).cpu()
    finite = torch.isfinite(log_p)
    lp = log_p[finite]
    expected, exact = oracle.expected_log_prob()
    mean_lp = float(lp.mean()) if lp.numel() else float("nan")
    metrics = PivotMetrics(
        num_samples=num, statistic="S = state switches, T = top-symbol count",
        valid_fraction=float(finite.double().mean()), **_distances(switches, top, laws),
        mean_switches=mean_s, expected_switches=_law_mean(laws[0]),
        mean_top_symbols=_statistic_counts(top, laws[1])[2], expected_top_symbols=_law_mean(laws[1]),
        chi2_pvalue=_switch_chi2_pvalue(counts, laws[0], outside),
        expected_total_variation_switches=expected_total_variation(laws[0], num),
        mean_log_prob=mean_lp, expected_log_prob=expected, expected_log_prob_exact=exact,
        log_prob_gap=expected - mean_lp,
        log_prob_gap_stderr=float(lp.std() / math.sqrt(lp.numel())) if lp.numel() > 1 else float("nan"))
    if reference:
        for key, value in _reference_distances(oracle, laws, num, seed, repeats).items():
            setattr(metrics, key, value)
        exact_samples = oracle.sample(num, torch.Generator().manual_seed(seed))
        metrics.reference_log_prob_gap = expected - float(oracle.log_prob(exact_samples).mean())
    return metrics


@dataclass(frozen=True)
class PivotTask(OracleTask):
    """The pivot oracle's suite: `evaluate` scores by the law of state switches (`pivot_metrics`).

    quality_metric: what the bench's quality column is (100 x (1 - this TV)).
    """

    quality_metric: str = "1 - max(TV of the law of state switches, TV of the law of top-symbol count)"

    def evaluate(self, oracle, sequences: torch.Tensor, **kwargs) -> PivotMetrics:
        """`pivot_metrics` of decoded `[N, P + n]` sequences."""
        return pivot_metrics(oracle, sequences, **kwargs)


@dataclass
class AnswerMetrics:
    """Outputs of the schedule oracle scored against each prompt's one right answer.

    Attributes: num_samples (prompts); valid_fraction (share answered exactly: the quality);
    total_variation None (deterministic answers: no distribution to compare)."""

    num_samples: int
    valid_fraction: float
    total_variation: float | None = None

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class ScheduleTask(OracleTask):
    """The schedule oracle's suite (HEX's bed, `dlm.oracles.schedules`): `num_samples` prompts whose
    scenarios are drawn from the run's seed, greedy decoding (`temperature` 0), quality = % exact
    answers."""

    gen_length: int = 32
    temperature: float = 0.0
    quality_metric: str = "exact answers (valid_fraction)"
    seeded = True  # the bench draws the scenarios from its --seed

    def build(self, num_samples: int | None = None, seed: int = 0):
        from dlm.oracles.schedules import ScheduleOracle, draw_scenarios

        n = num_samples or self.num_samples
        return ScheduleOracle(draw_scenarios(n, self.gen_length, seed=seed), self.gen_length)

    def prompts(self, oracle, num_samples: int | None = None, device=None) -> torch.Tensor:
        n = num_samples or len(oracle.scenarios)
        if n > len(oracle.scenarios):
            raise ValueError(f"the schedule oracle holds {len(oracle.scenarios)} prompts; ask for at most that many")
        return oracle.prompt(range(n)).to(device)

    def generate_kwargs(self, oracle) -> dict:
        return {"gen_length": oracle.gen_length, "mask_token_id": oracle.config.mask_token_id}

    def evaluate(self, oracle, sequences: torch.Tensor, **kwargs) -> AnswerMetrics:
        right = oracle.score(sequences.cpu(), range(sequences.shape[0]))
        return AnswerMetrics(num_samples=int(right.numel()), valid_fraction=float(right.double().mean()))


def _keyed_oracle():
    from dlm.oracles.keyed import KeyedOracle

    return KeyedOracle(groups=2, codewords=8, dependents=5, independents=2, independent_p=0.7, seed=0)


ORACLE_SUITES: dict[str, OracleTask] = {
    "oracle-permutation": OracleTask(
        "oracle-permutation",
        "uniform permutations of 8 symbols: validity collapses when tokens are committed in parallel",
        lambda: PermutationOracle(8)),
    "oracle-hmm": OracleTask(
        "oracle-hmm",
        "hidden-Markov language (4 states, 2 symbols, length 8, Dirichlet(0.3) parameters, seed 0)",
        # 256 cells: with the default 4096 samples exact sampling sits at TV ~0.07, while random
        # order at 2 / 4 tokens per step reaches ~0.12 / ~0.26 (seeded measurements, CPU).
        lambda: HMMOracle.random(4, 2, 8, seed=0, concentration=0.3)),
    "oracle-pivot": PivotTask(
        "oracle-pivot",
        "sticky HMM (8 states, 64 symbols in 8 groups, length 64, stay 0.95): TV to exact laws of run statistics",
        # ~3.15 switches per sequence. At 1024 samples exact sampling sits at TV 0.060 (q95 0.075; the
        # noise of T dominates); random order at 4 tokens per step breaks runs (TV(S) ~0.8 at 512).
        lambda: PivotOracle(8, 8, 64, stay=0.95, seed=0, concentration=0.5),
        num_samples=1024),
    # The beds of issue 44, one per seed sampler's own argument (docs/benchmarks.md, "Where each pays").
    "oracle-keyed": OracleTask(
        "oracle-keyed",
        "fill order matters (LoPA): 2 keys of 8 codewords fixing 5 bits each, 2 independent 0.7/0.3 positions, length 14",
        # 256 sentences; exact sampling at 2048 samples sits at TV ~0.13 (the finite-sample floor)
        _keyed_oracle, num_samples=2048),
    "oracle-runs": PivotTask(
        "oracle-runs",
        "confidence rises with context (Saber): sticky chain of 8 symbols (stay 0.9), length 64",
        # one symbol per state: each committed token makes its neighbours 0.9 likely; ~6.3 switches
        lambda: PivotOracle(8, 1, 64, stay=0.9, seed=0, concentration=0.5),
        num_samples=1024,
        quality_metric="1 - TV of the law of the number of symbol changes"),
    "oracle-schedules": ScheduleTask(
        "oracle-schedules",
        "schedules fail differently (HEX): per-prompt padding collapse and late anchors, answers exact, gen 32",
        None, num_samples=48),
}
if tuple(ORACLE_SUITES) != ORACLE_SUITE_NAMES:
    raise ImportError("dlm/tasks/oracle_names.py must list the oracle suites of ORACLE_SUITES, in order: "
                      f"{tuple(ORACLE_SUITES)}")


def get_oracle_suite(name: str) -> OracleTask:
    """An oracle suite by name; ValueError lists the valid names."""
    try:
        return ORACLE_SUITES[name]
    except KeyError:
        raise ValueError(f"unknown oracle suite {name!r}; valid: {', '.join(ORACLE_SUITE_NAMES)}") from None


__all__ = ["OracleTask", "OracleRun", "OracleMetrics", "PivotTask", "PivotMetrics", "pivot_metrics",
           "law_distances", "expected_total_variation", "ChiSquareResult", "CellCounts",
           "ORACLE_SUITES", "ORACLE_SUITE_NAMES", "get_oracle_suite", "oracle_metrics",
           "chi_square_test", "distribution_distances", "cell_counts", "merge_small_cells",
           "MAX_DISTRIBUTION_CELLS"]
