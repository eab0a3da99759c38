"""Permutation language: an analytic oracle masked diffusion LM whose conditionals are exact.

The language is the uniform distribution over permutations of ``n`` symbols: every sequence of ``n``
distinct symbols has probability ``1 / n!``. Given any set of unmasked generation positions, the
exact conditional at each masked position is uniform over the symbols not used yet. Hence
random-order decoding that commits ONE token per step at temperature 1 draws exact samples of the
joint (chain rule in a random order), while committing several tokens in one step draws them
independently and produces repeated symbols: the permutation language has maximal dependence
between tokens, which is what makes it a sharp probe for parallel decoding (ALGORITHMS 1.10).

Token layout (``vocab_size = n + 3``)::

    0 .. n-1   the symbols
    n          BOS (the prompt token)
    n + 1      MASK
    n + 2      EOS (also the pad id; never generated, present so EOS-aware code paths run)

Model contract (ALGORITHMS 1.1): ``model(input_ids [B, P + n], attention_mask=None, **kw)``
returns aligned logits ``[B, P + n, vocab_size]``. The LAST ``n`` columns are the generation
region; the prompt (``P >= 1`` tokens, normally BOS) is ignored since the language is
unconditional. Impossible tokens get logit ``IMPOSSIBLE_LOGIT`` (-1e4) rather than ``-inf`` so
softmax and Gumbel-max never see ``inf - inf``.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass

import torch
from torch import nn

IMPOSSIBLE_LOGIT = -1.0e4
# Enumerating the whole support is only meant for small test cases.
MAX_ENUMERATION = 2_000_000


@dataclass
class OracleLMConfig:
    """Config of a token oracle, read by `dlm.adapters.DLMAdapter` like a transformers config.

    Attributes:
        model_type: "oracle-permutation" or "oracle-hmm".
        vocab_size: symbols + 3 special tokens. num_symbols: the symbols (ids ``0..num_symbols-1``).
        gen_length: length ``n`` of a sentence of the language (the generation region).
        bos_token_id / mask_token_id / eos_token_id / pad_token_id: special ids (pad = eos).
        max_position_embeddings: longest accepted input, ``max_prompt_length + gen_length``.
    """

    model_type: str
    num_symbols: int
    gen_length: int
    max_prompt_length: int = 64

    @property
    def vocab_size(self) -> int:
        return self.num_symbols + 3

    @property
    def bos_token_id(self) -> int:
        return self.num_symbols

    @property
    def mask_token_id(self) -> int:
        return self.num_symbols + 1

    @property
    def eos_token_id(self) -> int:
        return self.num_symbols + 2

    @property
    def pad_token_id(self) -> int:
        return self.eos_token_id

    @property
    def max_position_embeddings(self) -> int:
        return self.max_prompt_length + self.gen_length

    def to_dict(self) -> dict:
        return asdict(self)


def split_generation(config: OracleLMConfig, input_ids: torch.Tensor) -> torch.Tensor:
    """The generation region ``input_ids[:, -n:]`` of a model input, checked.

    Raises ValueError when the input is not ``[B, P + n]`` with ``P >= 1`` or when the region
    holds a token that is neither a symbol nor MASK (usually ``gen_length != n``).
    """
    n = config.gen_length
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
        raise ValueError("input_ids must be a [batch, prompt_length + n] tensor")
    if input_ids.shape[1] < n + 1:
        raise ValueError(
            f"{config.model_type}: input has {input_ids.shape[1]} positions but needs a prompt of at "
            f"least one BOS token followed by exactly n={n} generation positions; call "
            f"dlm.generate(..., gen_length={n}) with a prompt from oracle.prompt(batch)")
    gen = input_ids[:, -n:]
    bad = (gen >= config.num_symbols) & (gen != config.mask_token_id)
    if bool(bad.any()):  # one host sync per call: a wrong gen_length would silently give garbage
        raise ValueError(
            f"{config.model_type}: the last n={n} positions must hold symbols (< {config.num_symbols}) "
            f"or MASK ({config.mask_token_id}); got another token there. Use gen_length={n} and a "
            f"prompt of BOS tokens (oracle.prompt(batch))")
    return gen


def full_logits(config: OracleLMConfig, input_ids: torch.Tensor, gen_probs: torch.Tensor,
                dtype: torch.dtype) -> torch.Tensor:
    """Assemble logits ``[B, L, vocab]`` from float64 symbol probabilities of the generation region.

    Args:
        gen_probs: ``[B, n, num_symbols]`` float64, each row summing to 1 (point masses at
            unmasked positions included).
    Prompt positions get a point mass on their own token (on BOS where the prompt is masked, as
    with classifier-free guidance). Special tokens are impossible inside the generation region.
    """
    batch, length = input_ids.shape
    n, s = config.gen_length, config.num_symbols
    out = torch.full((batch, length, config.vocab_size), IMPOSSIBLE_LOGIT, dtype=torch.float64,
                     device=input_ids.device)
    prompt = input_ids[:, : length - n]
    prompt = torch.where(prompt == config.mask_token_id, torch.full_like(prompt, config.bos_token_id), prompt)
    out[:, : length - n].scatter_(-1, prompt.unsqueeze(-1), 0.0)
    out[:, length - n:, :s] = gen_probs.log().clamp_min(IMPOSSIBLE_LOGIT)
    return out.to(dtype)


def sequence_codes(sequences: torch.Tensor, base: int) -> torch.Tensor:
    """Integer code ``sum_i x_i base^(n-1-i)`` of each row (lexicographic order). ``[N, n]`` -> ``[N]``.

    Entries outside ``0..base-1`` are mapped to -1 for the whole row.
    """
    seqs = sequences.long()
    n = seqs.shape[1]
    if n * math.log2(max(base, 2)) > 62:
        raise ValueError(f"base^n = {base}^{n} does not fit an int64 code; use a smaller case")
    weights = base ** torch.arange(n - 1, -1, -1, dtype=torch.long, device=seqs.device)
    codes = (seqs.clamp(0, base - 1) * weights).sum(dim=1)
    ok = ((seqs >= 0) & (seqs < base)).all(dim=1)
    return torch.where(ok, codes, torch.full_like(codes, -1))


class PermutationOracle(nn.Module):
    """Exact masked-diffusion LM of the uniform distribution over permutations of ``n`` symbols.

    Args:
        n: number of symbols = sentence length.
        max_prompt_length: longest prompt accepted (sets ``config.max_position_embeddings``).
        dtype: dtype of the returned logits (probabilities are computed in float64).

    Attributes:
        config: `OracleLMConfig` with ``mask_token_id``, ``eos_token_id``, ``vocab_size``,
            ``max_position_embeddings``, as `dlm.generate` reads them.
    """

    supports_dlm_kv_cache = False

    def __init__(self, n: int, *, max_prompt_length: int = 64, dtype: torch.dtype = torch.float32):
        super().__init__()
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"n must be a positive integer, got {n!r}")
        self.config = OracleLMConfig("oracle-permutation", num_symbols=n, gen_length=n,
                                     max_prompt_length=max_prompt_length)
        self.n = n
        self.dtype = dtype

    # -- the language ------------------------------------------------------------------------------
    @property
    def gen_length(self) -> int:
        return self.n

    @property
    def num_symbols(self) -> int:
        return self.n

    def prompt(self, batch_size: int, prompt_length: int = 1, device=None) -> torch.Tensor:
        """``[batch_size, prompt_length]`` BOS tokens: the input to pass to `dlm.generate`."""
        if prompt_length < 1:
            raise ValueError(f"prompt_length must be >= 1, got {prompt_length}")
        return torch.full((batch_size, prompt_length), self.config.bos_token_id, dtype=torch.long, device=device)

    def conditionals(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Exact ``p(x_i = v | unmasked generation tokens)`` for every generation position.

        Args: input_ids ``[B, P + n]``. Returns: ``[B, n, n]`` float64; at a masked position the
        uniform distribution over unused symbols, at an unmasked one a point mass on its token.
        A context with a repeated symbol has probability zero; the masked positions then still get
        the uniform distribution over unused symbols (there are always at least as many unused
        symbols as masks), so nothing is NaN.
        """
        gen = split_generation(self.config, input_ids)
        n = self.n
        masked = gen == self.config.mask_token_id
        onehot = torch.zeros(*gen.shape, n, dtype=torch.float64, device=gen.device)
        onehot.scatter_(-1, gen.clamp_max(n - 1).unsqueeze(-1), 1.0)
        onehot = onehot * (~masked).unsqueeze(-1)
        unused = (onehot.sum(dim=1) == 0).to(torch.float64)  # [B, n]
        uniform = unused / unused.sum(dim=1, keepdim=True).clamp_min(1.0)
        return torch.where(masked.unsqueeze(-1), uniform.unsqueeze(1).expand_as(onehot), onehot)

    def forward(self, input_ids: torch.Tensor, attention_mask=None, **kwargs) -> torch.Tensor:
        """Aligned logits ``[B, P + n, n + 3]`` (log of the exact conditionals; -1e4 if impossible)."""
        return full_logits(self.config, input_ids, self.conditionals(input_ids), self.dtype)

    # -- exact quantities --------------------------------------------------------------------------
    def is_valid(self, sequences: torch.Tensor) -> torch.Tensor:
        """``[N]`` bool: the row's last ``n`` tokens are a permutation of ``0..n-1``."""
        gen = sequences[:, -self.n:].long()
        in_range = ((gen >= 0) & (gen < self.n)).all(dim=1)
        counts = torch.zeros(gen.shape[0], self.n, dtype=torch.long, device=gen.device)
        counts.scatter_add_(1, gen.clamp(0, self.n - 1), torch.ones_like(gen))
        return in_range & (counts == 1).all(dim=1)

    def log_prob(self, sequences: torch.Tensor) -> torch.Tensor:
        """Exact ``log p(x)`` of the last ``n`` tokens of each row: ``-log n!`` or ``-inf``. ``[N]`` float64."""
        valid = self.is_valid(sequences)
        value = -math.lgamma(self.n + 1)
        return torch.where(valid, torch.full(valid.shape, value, dtype=torch.float64, device=valid.device),
                           torch.full(valid.shape, float("-inf"), dtype=torch.float64, device=valid.device))

    def entropy(self) -> float:
        """Exact entropy of the language in nats: ``log n!``."""
        return math.lgamma(self.n + 1)

    def expected_log_prob(self, **_) -> tuple[float, bool]:
        """``(E_true[log p(x)], exact)`` = ``(-log n!, True)``."""
        return -self.entropy(), True

    def sample(self, n_samples: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """``[n_samples, n]`` exact samples (argsort of i.i.d. uniforms is a uniform permutation)."""
        u = torch.rand(n_samples, self.n, dtype=torch.float64, generator=generator)
        return u.argsort(dim=1)

    def enumerate_joint(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The whole support in lexicographic order: sequences ``[n!, n]`` long, log-probs ``[n!]``."""
        if math.factorial(self.n) > MAX_ENUMERATION:
            raise ValueError(f"n! = {math.factorial(self.n)} sequences is too many to enumerate; use n <= 9")
        seqs = torch.tensor(list(itertools.permutations(range(self.n))), dtype=torch.long)
        return seqs, self.log_prob(seqs)

    def extra_repr(self) -> str:
        return f"n={self.n}"
