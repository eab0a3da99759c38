"""Keyed oracle: a language where the order of filling decides how many tokens pass a threshold.

LoPA's argument (Xu et al., 2025, arXiv:2512.16229): how many tokens a threshold decoder commits
per forward depends on the token-filling order; an order that leaves the rest of the block
confident lets many tokens pass at the next forward. This exact masked LM makes that argument
measurable. A sentence is `groups` groups and `independents` free positions:

- each group is a KEY position holding one of `codewords` symbols, uniform (confidence
  1 / codewords, the lowest in the block), followed by `dependents` positions holding the bits of
  the key's codeword in a seeded random linear code (`random_codewords`). Each bit alone is a fair
  coin (confidence 0.5); committing an independent bit halves the keys consistent with it, so a
  bit-by-bit order needs log2(codewords) forced commits before the rest of the group is certain,
  while committing the key first fixes every bit at once (they then pass any threshold);
- each independent position holds symbol 0 with probability `independent_p` (0.7) and 1 otherwise,
  independently of everything: the highest confidence below a 0.9 threshold, so confidence-greedy
  decoding forces those first, then the bits, and reaches the key last.

Bits of one codeword are dependent (not every pattern is a codeword): committing three of a
group's bits, or a key and a bit, in one forward can write an impossible sentence, so parallel decoding is
not free and the exact total variation to the joint is the quality. The conditionals are exact:
given the committed tokens of a group, the consistent keys are uniform; a bit's probability is the
share of them with that bit set; a committed key fixes its bits; a context no codeword fits gets
uniform conditionals (it has probability zero). Symbols: keys 0..codewords-1, bits and
independent values 0/1 (the other symbols impossible there).

`best_order_forwards(tau)` is the oracle's own answer to "which order is best" for a decoder that
commits every mask of confidence >= tau plus one position of its choice per forward: keys first.
Each group needs one forced commit (nothing in it passes before), each independent that does not
pass needs one, and committing a key first makes its whole group pass at the next forward, so no
order forces fewer; `KeyFirstSampler` decodes that order (a step policy that knows the keys).
"""
from __future__ import annotations

import itertools
import math

import numpy as np
import torch
from torch import nn

from dlm.oracles.permutation import OracleLMConfig, full_logits, split_generation
from samplers.base import Sampler, SamplerConfig, StepContext, StepResult
from samplers.unmasking._common import commit, negative_entropy, propose, token_probs, top_k_mask
from samplers.unmasking._state import seq_len, sizes_state


def random_codewords(count: int, bits: int, seed: int) -> np.ndarray:
    """`[count, bits]` int: the words of a seeded random binary linear code, `count` = 2^r keys.

    Bit j of key k is <k, c_j> mod 2 for `bits` distinct nonzero columns c_j in F2^r of rank r
    (drawn with a seeded numpy RNG): every bit is a fair coin (no bit is more confident than
    another) and any two bits are independent; with more bits than r, some sets of three or more
    are dependent (their columns sum to 0: with 8 keys and 5 bits, at least two triples), so
    committing many bits at once can write a word that is not a codeword."""
    r = int(round(math.log2(count)))
    if count < 2 or 2 ** r != count:
        raise ValueError(f"codewords must be a power of two >= 2 (a linear code), got {count}")
    if not r <= bits <= 2 ** r - 1:
        raise ValueError(f"dependents must be in [{r}, {2 ** r - 1}] for {count} codewords (distinct nonzero "
                         f"columns of rank {r}), got {bits}")
    rng = np.random.default_rng(seed)
    nonzero = np.arange(1, 2 ** r)
    while True:
        cols = rng.choice(nonzero, size=bits, replace=False)
        matrix = (cols[None, :] >> np.arange(r)[:, None]) & 1  # [r, bits]
        if np.linalg.matrix_rank(matrix.astype(float)) == r:  # rank over the reals >= rank over F2
            if _rank_f2(matrix) == r:
                break
    keys = (np.arange(count)[:, None] >> np.arange(r)[None, :]) & 1  # [count, r]
    return (keys @ matrix) % 2


def _rank_f2(matrix: np.ndarray) -> int:
    """Rank over F2 of a 0/1 matrix (Gaussian elimination)."""
    m = matrix.copy() % 2
    rank = 0
    for col in range(m.shape[1]):
        pivot = next((i for i in range(rank, m.shape[0]) if m[i, col]), None)
        if pivot is None:
            continue
        m[[rank, pivot]] = m[[pivot, rank]]
        for i in range(m.shape[0]):
            if i != rank and m[i, col]:
                m[i] ^= m[rank]
        rank += 1
    return rank


class KeyedOracle(nn.Module):
    """Exact masked LM of the keyed language (module docstring).

    Args:
        groups: key groups. codewords: keys per group (symbols 0..codewords-1; a power of two).
        dependents: bits per group (codewords <= 2^dependents). independents: free positions.
        independent_p: probability of symbol 0 at an independent position (in (0.5, 1)).
        seed: of the codewords. max_prompt_length / dtype: as the other oracles.

    Layout of the n = groups * (1 + dependents) + independents generation positions: each group's
    key then its bits, groups one after another, then the independents.
    """

    supports_dlm_kv_cache = False

    def __init__(self, groups: int = 2, codewords: int = 8, dependents: int = 5, independents: int = 2, *,
                 independent_p: float = 0.7, seed: int = 0, max_prompt_length: int = 64,
                 dtype: torch.dtype = torch.float32):
        super().__init__()
        if not isinstance(groups, int) or groups < 1:
            raise ValueError(f"groups must be a positive integer, got {groups!r}")
        if not isinstance(independents, int) or independents < 0:
            raise ValueError(f"independents must be an integer >= 0, got {independents!r}")
        if not 0.5 < independent_p < 1:
            raise ValueError(f"independent_p must be in (0.5, 1), got {independent_p}")
        self.groups, self.codewords, self.dependents, self.independents = groups, codewords, dependents, independents
        self.independent_p = independent_p
        self.register_buffer("code", torch.as_tensor(random_codewords(codewords, dependents, seed)))  # [M, D]
        self.group_size = 1 + dependents
        self.n = groups * self.group_size + independents
        self.V = max(codewords, 2)
        self.dtype = dtype
        self.config = OracleLMConfig("oracle-keyed", num_symbols=self.V, gen_length=self.n,
                                     max_prompt_length=max_prompt_length)

    # -- the language ------------------------------------------------------------------------------
    @property
    def gen_length(self) -> int:
        return self.n

    @property
    def num_symbols(self) -> int:
        return self.V

    @property
    def support_size(self) -> int:
        return self.codewords ** self.groups * 2 ** self.independents

    def key_positions(self) -> list[int]:
        """Generation positions (0-based) of the keys."""
        return [g * self.group_size for g in range(self.groups)]

    def prompt(self, batch_size: int, prompt_length: int = 1, device=None) -> torch.Tensor:
        if prompt_length < 1:
            raise ValueError(f"prompt_length must be >= 1, got {prompt_length}")
        return torch.full((batch_size, prompt_length), self.config.bos_token_id, dtype=torch.long, device=device)

    def _group_probs(self, part: torch.Tensor) -> torch.Tensor:
        """Conditionals `[B, 1 + D, V]` of one group's tokens `[B, 1 + D]` (MASK where masked)."""
        mask_id, V, M = self.config.mask_token_id, self.V, self.codewords
        key, bits = part[:, 0], part[:, 1:]
        code = self.code.unsqueeze(0)  # [1, M, D]
        bit_ok = (bits.unsqueeze(1) == mask_id) | (bits.unsqueeze(1) == code)  # [B, M, D]
        keys = torch.arange(M, device=part.device).unsqueeze(0)
        consistent = bit_ok.all(dim=2) & ((key.unsqueeze(1) == mask_id) | (key.unsqueeze(1) == keys))  # [B, M]
        weight = consistent.double()
        none = weight.sum(dim=1, keepdim=True) == 0
        weight = torch.where(none, torch.ones_like(weight), weight)  # a zero-probability context: uniform
        weight = weight / weight.sum(dim=1, keepdim=True)
        out = torch.zeros(part.shape[0], self.group_size, V, dtype=torch.float64, device=part.device)
        out[:, 0, :M] = weight
        one = (weight.unsqueeze(2) * code.double()).sum(dim=1)  # [B, D] P(bit = 1)
        out[:, 1:, 0], out[:, 1:, 1] = 1 - one, one
        return out

    def conditionals(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Exact `p(x_i = v | committed tokens)` `[B, n, V]` float64; a point mass where committed."""
        gen = split_generation(self.config, input_ids)
        mask_id = self.config.mask_token_id
        parts = [self._group_probs(gen[:, g * self.group_size:(g + 1) * self.group_size]) for g in range(self.groups)]
        free = torch.zeros(gen.shape[0], self.independents, self.V, dtype=torch.float64, device=gen.device)
        free[..., 0], free[..., 1] = self.independent_p, 1 - self.independent_p
        probs = torch.cat(parts + [free], dim=1)
        masked = gen == mask_id
        onehot = torch.zeros_like(probs).scatter_(-1, gen.clamp(0, self.V - 1).unsqueeze(-1), 1.0)
        return torch.where(masked.unsqueeze(-1), probs, onehot)

    def forward(self, input_ids: torch.Tensor, attention_mask=None, **kwargs) -> torch.Tensor:
        """Aligned logits `[B, P + n, V + 3]`: log of the exact conditionals (-1e4 if impossible)."""
        return full_logits(self.config, input_ids, self.conditionals(input_ids), self.dtype)

    # -- exact quantities --------------------------------------------------------------------------
    def log_prob(self, sequences: torch.Tensor) -> torch.Tensor:
        """Exact `log p(x)` of the last n tokens of each row, `[N]` float64 (-inf if impossible)."""
        gen = sequences[:, -self.n:].long().to(self.code.device)
        ok = torch.ones(gen.shape[0], dtype=torch.bool, device=gen.device)
        for g in range(self.groups):
            part = gen[:, g * self.group_size:(g + 1) * self.group_size]
            key = part[:, 0]
            valid_key = (key >= 0) & (key < self.codewords)
            ok &= valid_key & (part[:, 1:] == self.code[key.clamp(0, self.codewords - 1)]).all(dim=1)
        free = gen[:, self.groups * self.group_size:]
        ok &= ((free == 0) | (free == 1)).all(dim=1)
        zeros = (free == 0).sum(dim=1).double()
        lp = (-self.groups * math.log(self.codewords) + zeros * math.log(self.independent_p)
              + (self.independents - zeros) * math.log(1 - self.independent_p))
        return torch.where(ok, lp, torch.full_like(lp, float("-inf")))

    def is_valid(self, sequences: torch.Tensor) -> torch.Tensor:
        return torch.isfinite(self.log_prob(sequences))

    def _sequence(self, keys: torch.Tensor, free: torch.Tensor) -> torch.Tensor:
        """`[N, n]` sentences from keys `[N, groups]` and independent values `[N, independents]`."""
        parts = [torch.cat([keys[:, g:g + 1], self.code[keys[:, g]]], dim=1) for g in range(self.groups)]
        return torch.cat(parts + [free], dim=1)

    def sample(self, n_samples: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """`[n_samples, n]` exact samples."""
        keys = torch.randint(0, self.codewords, (n_samples, self.groups), generator=generator)
        free = (torch.rand(n_samples, self.independents, generator=generator, dtype=torch.float64)
                >= self.independent_p).long()
        return self._sequence(keys, free)

    def enumerate_joint(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The support (`support_size` sentences) in lexicographic order and their log-probs."""
        keys = list(itertools.product(range(self.codewords), repeat=self.groups))
        free = list(itertools.product(range(2), repeat=self.independents))
        k = torch.tensor([a for a in keys for _ in free], dtype=torch.long).view(-1, self.groups)
        f = torch.tensor([b for _ in keys for b in free], dtype=torch.long).view(-1, self.independents)
        seqs = self._sequence(k, f)
        order = torch.argsort(self._codes(seqs))
        seqs = seqs[order]
        return seqs, self.log_prob(seqs)

    def _codes(self, seqs: torch.Tensor) -> torch.Tensor:
        weights = self.V ** torch.arange(self.n - 1, -1, -1, dtype=torch.long)
        return (seqs * weights).sum(dim=1)

    def entropy(self) -> float:
        """Exact entropy in nats: groups * log(codewords) + independents * H(independent_p)."""
        p = self.independent_p
        return self.groups * math.log(self.codewords) - self.independents * (p * math.log(p) + (1 - p) * math.log(1 - p))

    def expected_log_prob(self, **_) -> tuple[float, bool]:
        return -self.entropy(), True

    # -- the best filling order --------------------------------------------------------------------
    def best_order_forwards(self, tau: float) -> float:
        """Expected forwards of the best order (keys first, `KeyFirstSampler`) for a decoder that commits
        every mask with confidence >= tau plus one chosen mask per forward, at temperature 1.

        Forwards 1..G force the keys; forward G+1 commits the last group's bits (p = 1) and forces an
        independent; each later forward forces one more. At every forward an independent still
        masked also passes when its drawn value has probability >= tau; the expectation over that is
        exact (a distribution over the number of independents left)."""
        p = self.independent_p
        q = (p if p >= tau else 0.0) + ((1 - p) if 1 - p >= tau else 0.0)  # an independent passes

        def forward(dist: list[float], forced: int) -> list[float]:
            out = [0.0] * len(dist)
            for left, w in enumerate(dist):
                rest = max(left - forced, 0)
                for stay in range(rest + 1):
                    out[stay] += w * math.comb(rest, stay) * (1 - q) ** stay * q ** (rest - stay)
            return out

        dist = [0.0] * self.independents + [1.0]
        for _ in range(self.groups):
            dist = forward(dist, 0)
        expected = self.groups + 1.0
        dist = forward(dist, 1)
        while 1 - dist[0] > 1e-12:
            expected += 1 - dist[0]
            dist = forward(dist, 1)
        return expected

    def extra_repr(self) -> str:
        return (f"groups={self.groups}, codewords={self.codewords}, dependents={self.dependents}, "
                f"independents={self.independents}, n={self.n}")


class KeyFirstSampler(Sampler):
    """The keyed oracle's best order as a step policy: every mask with confidence >= tau, plus each
    step the schedule's quota (1 with one step per token) of chosen masks among those that do not
    pass: keys first (in order), then the lowest entropy.
    Not registered: it needs the oracle's key positions. Shapes as `samplers.base`."""

    name = "key-first"
    adaptive = True

    def __init__(self, oracle: KeyedOracle, tau: float = 0.9):
        super().__init__(SamplerConfig())
        self.keys, self.n, self.tau = oracle.key_positions(), oracle.n, tau

    def init_state(self, batch_size: int, seq_len: int, device: torch.device) -> dict:
        return sizes_state(batch_size, seq_len)

    def step(self, logits: torch.Tensor, ctx: StepContext) -> StepResult:
        proposal, confidence, _ = propose(logits, ctx)
        cand, lb = ctx.candidates, ctx.candidates.shape[1]
        generation_start = seq_len(ctx) - self.n
        first = torch.zeros(lb, dtype=torch.float64, device=cand.device)
        for rank, pos in enumerate(self.keys):  # above any probability, earlier keys higher
            local = generation_start + pos - ctx.block_start
            if 0 <= local < lb:
                first[local] = 2.0 + len(self.keys) - rank
        # the forced position is chosen before its value matters (keys, then the lowest entropy), so
        # the order never depends on the drawn tokens and the decoding stays an exact sampler
        ready = negative_entropy(token_probs(logits)).double().exp()  # in (0, 1], higher = more certain
        passing = cand & (confidence >= self.tau)
        forced = top_k_mask(ready + first, cand & ~passing, ctx.num_transfer)  # one chosen beyond the passers
        chosen = forced | passing
        return StepResult(commit(ctx.x, proposal, chosen), proposal, confidence)
