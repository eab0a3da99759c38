"""Analytic oracles: models whose outputs are exact, so samplers can be scored against the truth.

Token languages (masked diffusion LMs following the model contract of `dlm.generate`):
    PermutationOracle  uniform over permutations of n symbols (maximal dependence between tokens)
    HMMOracle          a hidden-Markov language; conditionals by forward-backward
    PivotOracle        a sticky HMM whose state path is readable from its output (exact laws of
                       run statistics: the "oracle-pivot" suite; with one symbol per state, "oracle-runs")
    KeyedOracle        keys whose codeword fixes several bits, beside free positions: the filling
                       order decides how many tokens pass a threshold (LoPA's bed, "oracle-keyed")
    ScheduleOracle     one right answer per prompt, failing under prompt-dependent block lengths
                       (HEX's bed, "oracle-schedules"; greedy, quality = exact answers)

One-token-per-step random-order decoding at temperature 1 draws their exact joint; see
`dlm.tasks.oracle_tasks` for the metrics and benchmark suites built on them.

(The Gaussian-mixture oracle for continuous diffusion lives in `dlm.oracles.gaussian_mixture`
and is imported from there: it needs diffusers.)
"""
from dlm.oracles.hmm import HMMOracle
from dlm.oracles.keyed import KeyedOracle
from dlm.oracles.permutation import IMPOSSIBLE_LOGIT, OracleLMConfig, PermutationOracle
from dlm.oracles.pivot import PivotOracle
from dlm.oracles.schedules import ScheduleOracle

__all__ = ["HMMOracle", "PivotOracle", "PermutationOracle", "KeyedOracle", "ScheduleOracle", "OracleLMConfig",
           "IMPOSSIBLE_LOGIT"]
