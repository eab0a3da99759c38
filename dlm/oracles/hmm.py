"""Hidden-Markov language: an analytic oracle masked diffusion LM with exact posterior marginals.

A sentence ``x_1..x_n`` over ``V`` symbols is emitted by a ``K``-state hidden Markov chain:
``z_1 ~ pi``, ``z_{i+1} ~ A[z_i]``, ``x_i ~ E[z_i]``. For any pattern of masked positions the
model returns, at every masked position ``i``, the exact posterior marginal

    p(x_i = v | x_U) = sum_k p(z_i = k | x_{U, <i}) p(x_{U, >i} | z_i = k) E[k, v] / normaliser,

where ``U`` is the set of unmasked positions: forward-backward in which an unmasked position
contributes its emission likelihood ``E[:, x_i]`` and a masked one is marginalised (likelihood 1).
The recursions run batched in torch, float64, rescaled at every position (no underflow for any
``n``). Random-order decoding with one token per step at temperature 1 therefore samples the joint
exactly; committing several tokens per step samples them independently from their marginals and
loses the correlations the chain carries, by an amount that grows with the peakedness of ``A``.

Token layout (``vocab_size = V + 3``): symbols ``0..V-1``, BOS ``V``, MASK ``V+1``, EOS/pad ``V+2``.
Input ``[B, P + n]``: a prompt of ``P >= 1`` BOS tokens (ignored: the language is unconditional)
followed by the ``n`` generation positions; logits are aligned (ALGORITHMS 1.1).
"""
from __future__ import annotations

import itertools
import math

import numpy as np
import torch
from torch import nn

from dlm.oracles.permutation import MAX_ENUMERATION, OracleLMConfig, full_logits, split_generation


class HMMOracle(nn.Module):
    """Exact masked-diffusion LM of a hidden-Markov language.

    Args:
        initial: ``[K]`` initial state distribution ``pi``.
        transition: ``[K, K]`` row-stochastic ``A[k, k'] = p(z_{i+1} = k' | z_i = k)``.
        emission: ``[K, V]`` row-stochastic ``E[k, v] = p(x_i = v | z_i = k)``.
        n: sentence length (the generation region).
        max_prompt_length: longest prompt accepted. dtype: dtype of the returned logits.

    Use `HMMOracle.random(K, V, n, seed=...)` for seeded Dirichlet parameters.
    """

    supports_dlm_kv_cache = False

    def __init__(self, initial, transition, emission, n: int, *, max_prompt_length: int = 64,
                 dtype: torch.dtype = torch.float32):
        super().__init__()
        pi = torch.as_tensor(initial, dtype=torch.float64)
        A = torch.as_tensor(transition, dtype=torch.float64)
        E = torch.as_tensor(emission, dtype=torch.float64)
        K = pi.shape[0] if pi.dim() == 1 else -1
        if pi.dim() != 1 or A.shape != (K, K) or E.dim() != 2 or E.shape[0] != K:
            raise ValueError(
                f"expected initial [K], transition [K, K], emission [K, V]; got {tuple(pi.shape)}, "
                f"{tuple(A.shape)}, {tuple(E.shape)}")
        for name, m in (("initial", pi), ("transition", A), ("emission", E)):
            if bool((m < 0).any()) or not torch.allclose(m.sum(dim=-1), torch.ones(()).double(), atol=1e-9):
                raise ValueError(f"{name} must be non-negative with rows summing to 1")
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"n must be a positive integer, got {n!r}")
        self.register_buffer("initial", pi)
        self.register_buffer("transition", A)
        self.register_buffer("emission", E)
        self.n, self.num_states, self.V = n, K, E.shape[1]
        self.dtype = dtype
        self.config = OracleLMConfig("oracle-hmm", num_symbols=self.V, gen_length=n,
                                     max_prompt_length=max_prompt_length)

    @classmethod
    def random(cls, num_states: int = 3, num_symbols: int = 3, n: int = 5, *, seed: int = 0,
               concentration: float = 0.3, **kwargs) -> "HMMOracle":
        """Parameters drawn from symmetric Dirichlet(``concentration``) priors with a seeded numpy RNG.

        A concentration well below 1 makes rows peaked (near-deterministic transitions and
        emissions), so neighbouring tokens are strongly dependent and decoding order matters.
        """
        if concentration <= 0:
            raise ValueError(f"concentration must be > 0, got {concentration}")
        rng = np.random.default_rng(seed)
        pi = rng.dirichlet(np.full(num_states, concentration))
        A = rng.dirichlet(np.full(num_states, concentration), size=num_states)
        E = rng.dirichlet(np.full(num_symbols, concentration), size=num_states)
        return cls(pi, A, E, n, **kwargs)

    # -- the language ------------------------------------------------------------------------------
    @property
    def gen_length(self) -> int:
        return self.n

    @property
    def num_symbols(self) -> int:
        return self.V

    def prompt(self, batch_size: int, prompt_length: int = 1, device=None) -> torch.Tensor:
        """``[batch_size, prompt_length]`` BOS tokens: the input to pass to `dlm.generate`."""
        if prompt_length < 1:
            raise ValueError(f"prompt_length must be >= 1, got {prompt_length}")
        return torch.full((batch_size, prompt_length), self.config.bos_token_id, dtype=torch.long, device=device)

    def _evidence(self, gen: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-position state likelihoods ``[B, n, K]`` (1 at masked positions) and the mask ``[B, n]``."""
        masked = gen == self.config.mask_token_id
        lik = self.emission.t()[gen.clamp(0, self.V - 1)]  # [B, n, K]
        return torch.where(masked.unsqueeze(-1), torch.ones_like(lik), lik), masked

    def _forward_pass(self, evidence: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Predictive state distributions ``p(z_i | x_{U,<i})`` ``[B, n, K]`` and ``log p(x_U)`` ``[B]``."""
        batch, n, K = evidence.shape
        pred = torch.empty_like(evidence)
        log_norm = torch.zeros(batch, dtype=torch.float64, device=evidence.device)
        prior = self.initial.expand(batch, K)
        for i in range(n):
            pred[:, i] = prior
            filtered = prior * evidence[:, i]
            c = filtered.sum(dim=1, keepdim=True)
            log_norm = log_norm + c.squeeze(1).log()
            prior = (filtered / c.clamp_min(1e-300)) @ self.transition
        return pred, log_norm

    def _backward_pass(self, evidence: torch.Tensor) -> torch.Tensor:
        """``p(x_{U,>i} | z_i)`` up to a per-(row, position) constant, ``[B, n, K]``."""
        batch, n, K = evidence.shape
        beta = torch.empty_like(evidence)
        b = torch.ones(batch, K, dtype=torch.float64, device=evidence.device)
        for i in range(n - 1, -1, -1):
            beta[:, i] = b
            b = (evidence[:, i] * b) @ self.transition.t()
            b = b / b.sum(dim=1, keepdim=True).clamp_min(1e-300)
        return beta

    def conditionals(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Exact ``p(x_i = v | unmasked generation tokens)`` for every generation position.

        Args: input_ids ``[B, P + n]``. Returns ``[B, n, V]`` float64: the posterior marginal at a
        masked position, a point mass at an unmasked one. A zero-probability context (possible
        only when some parameter is exactly 0) gives the uniform distribution instead of NaN.
        """
        gen = split_generation(self.config, input_ids)
        evidence, masked = self._evidence(gen)
        pred, _ = self._forward_pass(evidence)
        state = pred * self._backward_pass(evidence)
        probs = state @ self.emission  # [B, n, V]
        total = probs.sum(dim=-1, keepdim=True)
        probs = torch.where(total > 0, probs / total.clamp_min(1e-300), torch.full_like(probs, 1.0 / self.V))
        onehot = torch.zeros_like(probs).scatter_(-1, gen.clamp(0, self.V - 1).unsqueeze(-1), 1.0)
        return torch.where(masked.unsqueeze(-1), probs, onehot)

    def forward(self, input_ids: torch.Tensor, attention_mask=None, **kwargs) -> torch.Tensor:
        """Aligned logits ``[B, P + n, V + 3]``: log of the exact conditionals, -1e4 if impossible."""
        return full_logits(self.config, input_ids, self.conditionals(input_ids), self.dtype)

    # -- exact quantities --------------------------------------------------------------------------
    def log_prob(self, sequences: torch.Tensor) -> torch.Tensor:
        """Exact ``log p(x)`` of the last ``n`` tokens of each row by the forward algorithm. ``[N]`` float64.

        ``-inf`` for rows holding a non-symbol (a mask left, a special token) or a sequence the
        chain cannot emit.
        """
        gen = sequences[:, -self.n:].long().to(self.initial.device)
        symbols = ((gen >= 0) & (gen < self.V)).all(dim=1)
        evidence = self.emission.t()[gen.clamp(0, self.V - 1)]
        _, log_norm = self._forward_pass(evidence)
        return torch.where(symbols, log_norm, torch.full_like(log_norm, float("-inf")))

    def is_valid(self, sequences: torch.Tensor) -> torch.Tensor:
        """``[N]`` bool: the sequence has positive probability."""
        return torch.isfinite(self.log_prob(sequences))

    def sample(self, n_samples: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """``[n_samples, n]`` exact ancestral samples (states by the chain, symbols by emission)."""
        dev = self.initial.device
        out = torch.empty(n_samples, self.n, dtype=torch.long, device=dev)
        z = torch.multinomial(self.initial.expand(n_samples, -1), 1, generator=generator).squeeze(1)
        for i in range(self.n):
            if i > 0:
                z = torch.multinomial(self.transition[z], 1, generator=generator).squeeze(1)
            out[:, i] = torch.multinomial(self.emission[z], 1, generator=generator).squeeze(1)
        return out

    def enumerate_joint(self) -> tuple[torch.Tensor, torch.Tensor]:
        """All ``V^n`` sequences in lexicographic order ``[V^n, n]`` and their exact log-probs ``[V^n]``."""
        if self.V ** self.n > MAX_ENUMERATION:
            raise ValueError(f"V^n = {self.V}^{self.n} sequences is too many to enumerate (limit {MAX_ENUMERATION})")
        seqs = torch.tensor(list(itertools.product(range(self.V), repeat=self.n)), dtype=torch.long,
                            device=self.initial.device)
        return seqs, self.log_prob(seqs)

    def entropy(self, *, num_samples: int = 200_000, seed: int = 0) -> tuple[float, bool]:
        """``(H, exact)``: exact entropy in nats by enumeration when ``V^n`` is small enough, else a
        Monte Carlo estimate ``-mean log p`` over ``num_samples`` exact samples."""
        if self.V ** self.n <= MAX_ENUMERATION:
            _, lp = self.enumerate_joint()
            p = lp.exp()
            return float(-(p * torch.where(p > 0, lp, torch.zeros_like(lp))).sum()), True
        g = torch.Generator(device=self.initial.device).manual_seed(seed)
        return float(-self.log_prob(self.sample(num_samples, g)).mean()), False

    def expected_log_prob(self, **kwargs) -> tuple[float, bool]:
        """``(E_true[log p(x)], exact)`` = minus `entropy`."""
        h, exact = self.entropy(**kwargs)
        return -h, exact

    def extra_repr(self) -> str:
        return f"num_states={self.num_states}, num_symbols={self.V}, n={self.n}"
