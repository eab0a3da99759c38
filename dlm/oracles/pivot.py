"""Pivot oracle: a sticky hidden-Markov language whose state path can be read off its output.

A named configuration of `dlm.oracles.HMMOracle` (same forward-backward conditionals, same exact
``log_prob``), built so that parallel decoding has somewhere to fail and the failure is measurable
exactly:

- ``K`` hidden states with a high self-transition probability ``stay`` (long runs in one state,
  then a switch: the "pivot"); the other ``1 - stay`` goes to the other states with seeded
  Dirichlet weights.
- State ``k`` emits only from its own group of ``s`` symbols ``k*s .. k*s + s - 1`` (seeded
  Dirichlet weights inside the group), so ``V = K * s`` and the state path is a function of the
  output: ``z_i = x_i // s``.

Because the state path is observable, low-dimensional statistics of it have laws computable
exactly by dynamic programming on the chain; `switch_count_law` gives the law of the number of
state switches ``S = #{i : z_{i+1} != z_i}``. Committing several tokens in one step draws them
independently from their marginals (ALGORITHMS 1.10), which breaks runs (too many switches);
confidence-ordered decoding extends runs from what is already decoded (too few). Both move the law
of ``S``, so a distance between the empirical and the exact law of ``S`` scores a sampler as a
sampler (`dlm.tasks.oracle_tasks`, suite "oracle-pivot").

The entropy of the language is exact here too (the output determines the path):
``H(X) = H(Z) + sum_i E[H(E[z_i])]`` with ``H(Z) = H(pi) + sum_{i<n} E[H(A[z_i])]``.
"""
from __future__ import annotations

import numpy as np
import torch

from dlm.oracles.hmm import HMMOracle
from dlm.oracles.permutation import OracleLMConfig


def sticky_hmm_parameters(num_states: int, symbols_per_state: int, stay: float, *, seed: int = 0,
                          concentration: float = 1.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(initial [K], transition [K, K], emission [K, K*s])`` float64 of a sticky block-emission HMM.

    initial: uniform. transition: ``stay`` on the diagonal, ``1 - stay`` spread over the other
    states by Dirichlet(``concentration``) weights. emission: row ``k`` is Dirichlet(``concentration``)
    weights on symbols ``k*s .. k*s+s-1`` and 0 elsewhere. All draws from one seeded numpy RNG.
    """
    if not isinstance(num_states, int) or num_states < 2:
        raise ValueError(f"num_states must be an integer >= 2 (a switch needs two states), got {num_states!r}")
    if not isinstance(symbols_per_state, int) or symbols_per_state < 1:
        raise ValueError(f"symbols_per_state must be a positive integer, got {symbols_per_state!r}")
    if not 0 < stay < 1:
        raise ValueError(f"stay must be in (0, 1) (both runs and switches must be possible), got {stay}")
    if concentration <= 0:
        raise ValueError(f"concentration must be > 0, got {concentration}")
    rng = np.random.default_rng(seed)
    K, s = num_states, symbols_per_state
    transition = np.zeros((K, K))
    for k in range(K):
        others = [j for j in range(K) if j != k]
        transition[k, others] = (1 - stay) * rng.dirichlet(np.full(K - 1, concentration))
        transition[k, k] = stay
    emission = np.zeros((K, K * s))
    for k in range(K):
        emission[k, k * s:(k + 1) * s] = rng.dirichlet(np.full(s, concentration))
    return np.full(K, 1.0 / K), transition, emission


class PivotOracle(HMMOracle):
    """A sticky HMM language with one emission group per state (see the module docstring).

    Args:
        num_states: ``K`` hidden states (>= 2; the suite uses 8).
        symbols_per_state: ``s`` symbols per state; the vocabulary has ``V = K * s`` symbols.
        n: sentence length (the generation region).
        stay: self-transition probability; the expected number of switches is about ``(n - 1)(1 - stay)``.
        seed / concentration: of the Dirichlet draws (`sticky_hmm_parameters`).
        max_prompt_length / dtype: as for `HMMOracle`.
    """

    def __init__(self, num_states: int = 8, symbols_per_state: int = 8, n: int = 64, *, stay: float = 0.95,
                 seed: int = 0, concentration: float = 0.5, max_prompt_length: int = 64,
                 dtype: torch.dtype = torch.float32):
        pi, A, E = sticky_hmm_parameters(num_states, symbols_per_state, stay, seed=seed, concentration=concentration)
        super().__init__(pi, A, E, n, max_prompt_length=max_prompt_length, dtype=dtype)
        self.symbols_per_state, self.stay = symbols_per_state, stay
        self.config = OracleLMConfig("oracle-pivot", num_symbols=self.V, gen_length=n,
                                     max_prompt_length=max_prompt_length)

    # -- the observable state path -------------------------------------------------------------------
    def state_path(self, sequences: torch.Tensor) -> torch.Tensor:
        """``[N, n]`` long: the hidden state of each of the last ``n`` tokens (``x // s``), -1 at a
        token that is not a symbol (a mask left, a special token)."""
        gen = sequences[:, -self.n:].long().cpu()
        symbol = (gen >= 0) & (gen < self.V)
        return torch.where(symbol, gen // self.symbols_per_state, torch.full_like(gen, -1))

    def num_switches(self, sequences: torch.Tensor) -> torch.Tensor:
        """``[N]`` long: number of positions ``i`` with ``z_{i+1} != z_i``; -1 for a row holding a
        non-symbol (it has no state path)."""
        z = self.state_path(sequences)
        switches = (z[:, 1:] != z[:, :-1]).sum(dim=1)
        return torch.where((z >= 0).all(dim=1), switches, torch.full_like(switches, -1))

    def switch_count_law(self) -> torch.Tensor:
        """Exact law of the number of switches: ``[n]`` float64, entry ``c`` = ``P(S = c)``.

        Dynamic programming over ``(state, switches so far)``: ``f_1[k, 0] = pi_k``;
        ``f_{i+1}[k', c] = f_i[k', c] A[k', k'] + sum_{k != k'} f_i[k, c - 1] A[k, k']``;
        ``P(S = c) = sum_k f_n[k, c]``. O(n^2 K^2) operations.
        """
        A = self.transition.cpu()
        stay = torch.diag(A)
        move = A - torch.diag(stay)  # switching transitions only
        f = torch.zeros(self.num_states, self.n, dtype=torch.float64)
        f[:, 0] = self.initial.cpu()
        for _ in range(self.n - 1):
            switched = torch.zeros_like(f)
            switched[:, 1:] = move.t() @ f[:, :-1]
            f = f * stay.unsqueeze(1) + switched
        return f.sum(dim=0)

    def top_symbols(self) -> torch.Tensor:
        """``[K]`` long: each state's most likely symbol (smallest id on ties)."""
        return self.emission.cpu().argmax(dim=1)

    def num_top_symbols(self, sequences: torch.Tensor) -> torch.Tensor:
        """``[N]`` long: positions whose symbol is its state's most likely one (`top_symbols`); -1 for
        a row holding a non-symbol. Mode-seeking decoding inflates it."""
        gen = sequences[:, -self.n:].long().cpu()
        z = self.state_path(gen)
        top = (gen == self.top_symbols()[z.clamp_min(0)]).sum(dim=1)
        return torch.where((z >= 0).all(dim=1), top, torch.full_like(top, -1))

    def top_symbol_count_law(self) -> torch.Tensor:
        """Exact law of `num_top_symbols`: ``[n + 1]`` float64, entry ``c`` = ``P(T = c)``.

        With ``q_k = max_v E[k, v]`` and ``g_i[k, c] = P(z_i = k, T_{1..i} = c)``:
        ``g_{i+1}[k', c] = (1 - q_k') sum_k g_i[k, c] A[k, k'] + q_k' sum_k g_i[k, c - 1] A[k, k']``.
        """
        q = self.emission.cpu().max(dim=1).values.unsqueeze(1)  # [K, 1]
        A = self.transition.cpu()
        entering = torch.zeros(self.num_states, self.n + 1, dtype=torch.float64)  # P(z_i = k, T_{<i} = c)
        entering[:, 0] = self.initial.cpu()
        for _ in range(self.n):
            g = entering * (1 - q)
            g[:, 1:] += entering[:, :-1] * q
            entering = A.t() @ g
        return g.sum(dim=0)

    def sample_statistics(self, num_samples: int, generator: torch.Generator | None = None
                          ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(S [N], T [N])`` long: `num_switches` and `num_top_symbols` of ``N`` exact sequences,
        simulated on the state chain alone (``z_1 ~ pi``, ``z_{i+1} ~ A[z_i]`` by inversion; position
        ``i`` holds its state's top symbol with probability ``max_v E[z_i, v]``). Same joint law as
        the statistics of `sample`, at a fraction of its cost (no symbols drawn)."""
        if num_samples < 1:
            raise ValueError(f"num_samples must be >= 1, got {num_samples}")
        A_cum, pi_cum = self.transition.cpu().cumsum(dim=1), self.initial.cpu().cumsum(dim=0)
        q = self.emission.cpu().max(dim=1).values
        u = torch.rand(self.n, num_samples, 1, generator=generator, dtype=torch.float64)  # position-major
        h = torch.rand(self.n, num_samples, generator=generator, dtype=torch.float64)
        last = self.num_states - 1  # guards a cumulative sum that rounds below 1
        z = torch.searchsorted(pi_cum, u[0, :, 0], right=True).clamp_max(last)
        switches = torch.zeros(num_samples, dtype=torch.long)
        top = (h[0] < q[z]).long()
        for i in range(1, self.n):
            nxt = torch.searchsorted(A_cum[z], u[i], right=True).squeeze(1).clamp_max(last)
            switches += (nxt != z).long()
            top += (h[i] < q[nxt]).long()
            z = nxt
        return switches, top

    # -- exact entropy (replaces HMMOracle's Monte Carlo estimate: the output determines the path) ------
    def state_marginals(self) -> torch.Tensor:
        """``[n, K]`` float64: ``P(z_i = k)`` by propagating ``pi`` through the chain."""
        out = torch.empty(self.n, self.num_states, dtype=torch.float64)
        p = self.initial.cpu()
        for i in range(self.n):
            out[i] = p
            p = p @ self.transition.cpu()
        return out

    def entropy(self, **_ignored) -> tuple[float, bool]:
        """``(H, True)``: the exact entropy in nats, ``H(Z) + sum_i E[H(E[z_i])]`` (module docstring)."""
        def row_entropy(m: torch.Tensor) -> torch.Tensor:
            return -(m * torch.where(m > 0, m.log(), torch.zeros_like(m))).sum(dim=-1)

        occupancy = self.state_marginals()
        h_path = float(row_entropy(self.initial.cpu())) + float((occupancy[:-1] @ row_entropy(self.transition.cpu())).sum())
        h_emit = float((occupancy @ row_entropy(self.emission.cpu())).sum())
        return h_path + h_emit, True

    def extra_repr(self) -> str:
        return (f"num_states={self.num_states}, symbols_per_state={self.symbols_per_state}, "
                f"num_symbols={self.V}, n={self.n}, stay={self.stay}")


__all__ = ["PivotOracle", "sticky_hmm_parameters"]
