"""Training of the joint sampler's layer (ADJUST) by distilling the model's own sequential unmasking.

The frozen model is the teacher. A training example is a state `x_t` on the model's own decoding
trajectory, in the commit order the layer is trained for (`TrainJointConfig.order`):

- "random": a complete sample drawn by the model's one-token-per-step random-order decoding at
  temperature 1 (exact sampling of the model's joint), with the blocks after a chosen block masked
  and a random fraction of that block masked (a random subset is a state of a random-order run);
- "confidence": a complete output of the `confidence` sampler at one token per step (the rule
  `joint:order=confidence` applies, at the decoding temperature, 0 = greedy by default), with the
  block's positions committed after the first n of that run masked again: exactly the states that
  run visited.

From `x_t` we run the exact sequential unmasking the layer has to imitate: commit one masked
position by the order's rule (uniformly chosen, token drawn from the model's conditional at
temperature 1; or the confidence sampler's rule: the token drawn at the temperature, argmax when 0,
at the position whose token is most probable), run the model again, and so on for up to `chain`
tokens. After the m-th commit the layer, fed only the FULL FORWARD ON `x_t` (its features) and the m
tokens committed, predicts the distributions at the block's remaining masks; the loss is
`KL(teacher || layer)` there, where the teacher is the model's forward on the state with the m
tokens committed. One teacher forward per chain link, the layer's passes are the only trained part.

The teacher of a greedy (temperature 0) chain is still the model's full conditional (softmax at
temperature 1), not the one-hot argmax: matching it matches the argmax token the next commit takes
and the probability the confidence rule ranks positions by, and it keeps a gradient where the
argmax does not move.

Paper: ADJUST, approximate joint sampling for masked diffusion LMs (ALGORITHMS 1.9 in the project's
algorithm notes); the layer's inputs are our design (see `samplers.unmasking.joint_layer`).
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import torch

from dlm.adapters import DLMAdapter
from samplers.unmasking._common import gather_prob, gumbel_max, token_probs, top_k_mask
from samplers.unmasking.joint_layer import (ORDERS, JointLayer, JointLayerMeta, model_fingerprint,
                                            model_sizes)

# A rank past every position of a block: "never committed by the pool's run" (masked in every state).
_NEVER = 1 << 30


@dataclass(frozen=True)
class TrainJointConfig:
    """Settings of one training run (all recorded in the layer's metadata).

    Attributes:
        steps: optimiser steps. batch: states per step. chain: tokens committed per state
            (the largest number of tokens per forward the layer is trained for).
        pool: complete samples drawn by the model's own one-token-per-step decoding, the source
            of the training states (in "confidence" order at temperature 0, distinct prompts while
            the prompts last: a prompt's greedy run is always the same). lr: AdamW learning rate.
            width / heads: layer shape.
        features: "auto" (hidden states when the model returns them, else log-probabilities),
            "hidden" or "logprobs". seed: seeds the pool, the states and the layer's init.
        order: "random" or "confidence", the commit order of the trajectories and chains.
        focus: confidence order only: share of each batch drawn among every state of the pool's
            runs in proportion to its doubt (`chain_doubt`: sum of 1 - max probability at the
            `chain` most confident masks, the ones a chain commits next; computed once, one forward
            per state); the rest of the batch is drawn uniformly. Greedy trajectories spend most
            steps on near-certain commits (an answer's EOS fill, deterministic tokens), where
            committing a token changes nothing to learn; 0 (default) draws states as they come.
        temperature: the chains' (and the confidence pool's) token temperature; None = the order's
            default: 1 for random (exact sampling), 0 for confidence (greedy, as `dlm bench` decodes
            task suites).
    """

    steps: int = 300
    batch: int = 64
    chain: int = 4
    pool: int = 1024
    lr: float = 3e-3
    width: int = 64
    heads: int = 4
    features: str = "auto"
    seed: int = 0
    order: str = "random"
    temperature: float | None = None
    focus: float = 0.0

    @property
    def token_temperature(self) -> float:
        """The temperature commits are drawn at (the order's default when `temperature` is None)."""
        if self.temperature is not None:
            return float(self.temperature)
        return 1.0 if self.order == "random" else 0.0

    def validate(self) -> None:
        for name in ("steps", "batch", "pool", "width", "heads"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.chain < 2:
            raise ValueError(f"chain must be >= 2 (tokens per forward to learn), got {self.chain}")
        if self.features not in ("auto", "hidden", "logprobs"):
            raise ValueError(f"features must be auto, hidden or logprobs, got {self.features!r}")
        if self.order not in ORDERS:
            raise ValueError(f"order must be one of {ORDERS}, got {self.order!r}")
        if not 0.0 <= self.focus <= 1.0:
            raise ValueError(f"focus must be in [0, 1] (share of each batch), got {self.focus}")
        if self.focus > 0 and self.order != "confidence":
            raise ValueError("focus needs order='confidence' (it weighs the states of the pool's confidence runs)")
        if self.temperature is not None and not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy) or None, got {self.temperature}")


@dataclass
class TrainingSource:
    """What to distil: the model, its prompts and the decoding layout.

    Attributes: model (frozen), prompts `[N, P]` long, attention_mask `[N, P]` or None,
    gen_length, block_length, mask_token_id, name (a label for the metadata)."""

    model: torch.nn.Module
    prompts: torch.Tensor
    attention_mask: torch.Tensor | None
    gen_length: int
    block_length: int
    mask_token_id: int
    name: str


def _forward(adapter: DLMAdapter, x, mask, positions, want_hidden: bool):
    """Raw logits `[B, L, V]` (mask id at -inf, as the driver gives them) and hidden `[B, L, H]` or None."""
    if want_hidden:
        logits, hidden = adapter.full_with_hidden(x, mask, positions)
    else:
        logits, _ = adapter.full(x, mask, positions)
        hidden = None
    logits = logits.float().clone()
    logits[..., adapter.mask_token_id] = float("-inf")
    return logits, hidden


def _kl(teacher: torch.Tensor, student: torch.Tensor, where: torch.Tensor) -> torch.Tensor:
    """Mean over `where` `[B, Lb]` of KL(softmax(teacher) || softmax(student)), both `[B, Lb, V]`."""
    log_t = torch.log_softmax(teacher, dim=-1)
    log_s = torch.log_softmax(student, dim=-1)
    p = log_t.exp()
    terms = torch.where(p > 0, p * (log_t - log_s), torch.zeros_like(p)).sum(dim=-1)
    return (terms * where).sum() / where.sum().clamp_min(1)


def draw_pool(source: TrainingSource, size: int, generator: torch.Generator, order: str = "random",
              temperature: float = 1.0):
    """`size` complete sequences `[size, P + gen]` of the model's own one-token-per-step decoding in
    `order`, their prompts' attention masks (or None) and each generated position's commit rank
    inside its block `[size, gen]` long (the step that committed it; None for random order, whose
    states are random subsets).

    Random order decodes at temperature 1 from prompts drawn with replacement. Confidence order runs
    the `confidence` sampler at `temperature` without EOS stop (every position gets a rank), from
    distinct prompts while they last (greedy runs of one prompt are identical)."""
    import dlm

    n = source.prompts.shape[0]
    if order == "random":
        idx = torch.randint(n, (size,), generator=generator)
    else:
        idx = torch.cat([torch.randperm(n, generator=generator) for _ in range(-(-size // n))])[:size]
    prompts = source.prompts[idx]
    mask = None if source.attention_mask is None else source.attention_mask[idx]
    common = dict(attention_mask=mask, gen_length=source.gen_length, block_length=source.block_length,
                  steps=source.gen_length, generator=generator, mask_token_id=source.mask_token_id)
    if order == "random":
        out = dlm.generate(source.model, prompts, sampler="random", temperature=1.0, **common)
        return out.sequences, mask, None
    out = dlm.generate(source.model, prompts, sampler="confidence", temperature=temperature,
                       eos_early_stop=False, return_trace=True, **common)
    return out.sequences, mask, commit_ranks(out.trace, size, source.gen_length, source.block_length,
                                             source.mask_token_id)


def commit_ranks(trace, rows: int, gen_length: int, block_length: int, mask_token_id: int) -> torch.Tensor:
    """Per generated position, the step inside its block that first unmasked it, from a decoding
    trace (`dlm.generate(..., return_trace=True)`). Returns `[rows, gen_length]` long; `_NEVER`
    where no step did."""
    rank = torch.full((rows, gen_length), _NEVER, dtype=torch.long)
    for record in trace:
        cols = slice(record.block * block_length, (record.block + 1) * block_length)
        current = rank[record.rows, cols]
        fresh = (record.tokens.cpu() != mask_token_id) & (current == _NEVER)
        rank[record.rows, cols] = torch.where(fresh, torch.full_like(current, record.step), current)
    return rank


def state_masks(ranks: torch.Tensor | None, batch: int, block_length: int, generator: torch.Generator) -> torch.Tensor:
    """Which positions of the chosen block are masked in each training state, `[batch, Lb]` bool,
    at least two per row (one to commit, one to predict).

    ranks None (random order): each position masked with a per-row probability drawn uniformly.
    ranks `[batch, Lb]` (confidence order): the positions the pool's run committed after its first
    n steps, n uniform over 0..Lb-2: the state that run was in after n steps."""
    ratio = torch.rand(batch, 1, generator=generator)
    if ranks is None:
        masked = torch.rand(batch, block_length, generator=generator) < ratio
        masked[:, :2] |= masked.sum(1, keepdim=True) < 2
        return masked
    done = (ratio * (block_length - 1)).long().clamp_max(block_length - 2)
    masked = ranks >= done
    # Ranks are distinct per block (one commit per step), so >= 2 stay masked; guard odd traces anyway.
    masked[:, -2:] |= masked.sum(1, keepdim=True) < 2
    return masked


def chain_commit(teacher: torch.Tensor, remaining: torch.Tensor, live: torch.Tensor, order: str,
                 temperature: float, generator: torch.Generator | None):
    """One link of the sequential unmasking the layer imitates: where and what to commit.

    Args: teacher `[B, Lb, V]` the model's logits on the current state; remaining `[B, Lb]` bool
    masked positions; live `[B]` bool rows that still commit. Returns `(pick [B, Lb] bool, one
    position per live row; token [B, Lb] long)`.

    random: a uniformly chosen remaining position, its token drawn at `temperature`. confidence: the
    confidence sampler's rule, as `joint:order=confidence` applies it: tokens drawn at `temperature`
    (argmax at 0), the position whose drawn token is most probable."""
    if order == "random":
        score = torch.where(remaining, torch.rand(remaining.shape, generator=generator),
                            torch.full(remaining.shape, -1.0))
        pick = torch.zeros_like(remaining).scatter_(1, score.argmax(1, keepdim=True), True) & live.unsqueeze(1)
        return pick, gumbel_max(teacher, temperature, generator)
    token = gumbel_max(teacher, temperature, generator)
    confidence = gather_prob(token_probs(teacher), token)
    return top_k_mask(confidence, remaining, live.long()), token


@dataclass
class _Setup:
    """What the training loop and the evaluation share: the adapter, the pool and the layout."""

    adapter: DLMAdapter
    features: str
    pool: torch.Tensor
    pool_mask: torch.Tensor | None
    ranks: torch.Tensor | None
    prompt_length: int
    doubt: torch.Tensor | None = None


def _sample_states(source: TrainingSource, setup: _Setup, batch: int, g: torch.Generator,
                   focus: float = 0.0):
    """A batch of training states: `(x [B, P + gen], attention (mask, positions), block start,
    masked [B, Lb])`, the chosen block partly masked and the later ones fully masked. With `focus`
    (confidence order, `setup.doubt` computed), that share of the rows is a pool run's state drawn
    in proportion to its doubt."""
    lb = source.block_length
    if setup.ranks is None:
        idx = torch.randint(setup.pool.shape[0], (batch,), generator=g)
        block = int(torch.randint(source.gen_length // lb, (1,), generator=g))
        return _build_states(source, setup, idx, block, state_masks(None, batch, lb, g))
    block, idx = _informative_rows(setup, source, batch, g)
    masked = state_masks(setup.ranks[idx, block * lb:(block + 1) * lb], batch, lb, g)
    k = int(round(focus * batch))
    weights = None if setup.doubt is None else setup.doubt[:, block].flatten()
    if k and weights is not None and float(weights.sum()) > 0:
        drawn = torch.multinomial(weights, k, replacement=True, generator=g)
        rows, done = drawn // (lb - 1), drawn % (lb - 1)
        idx = torch.cat([rows, idx[k:]])
        masked = torch.cat([setup.ranks[rows, block * lb:(block + 1) * lb] >= done.unsqueeze(1), masked[k:]])
    return _build_states(source, setup, idx, block, masked)


def _build_states(source: TrainingSource, setup: _Setup, idx: torch.Tensor, block: int, masked: torch.Tensor):
    """Pool rows `idx` with block `block` masked at `masked` `[B, Lb]` and the later blocks fully."""
    from dlm.engine.masked.inputs import full_attention_mask

    lb, mask_id = source.block_length, source.mask_token_id
    x = setup.pool[idx].clone()
    pmask = None if setup.pool_mask is None else setup.pool_mask[idx]
    full_mask, positions = full_attention_mask(pmask, source.gen_length)
    if getattr(source.model, "dlm_position_ids", None) is not None:
        positions = source.model.dlm_position_ids(x, full_mask)
    start = setup.prompt_length + block * lb
    x[:, start + lb:] = mask_id  # later blocks are still masked on a semi-AR trajectory
    x[:, start:start + lb] = torch.where(masked, torch.full_like(masked, mask_id, dtype=torch.long),
                                         x[:, start:start + lb])
    return x, (full_mask, positions), start, masked


@torch.no_grad()
def _state_doubt(source: TrainingSource, setup: _Setup, chain: int, chunk: int = 128) -> torch.Tensor:
    """`chain_doubt` of every state of the pool's confidence runs, `[N, blocks, Lb - 1]` (state n =
    the run after n steps of the block); 0 for a block that is one repeated token in that row."""
    lb = source.block_length
    n_rows, n_blocks = setup.pool.shape[0], source.gen_length // lb
    doubt = torch.zeros(n_rows, n_blocks, lb - 1)
    gen = setup.pool[:, setup.prompt_length:].reshape(n_rows, n_blocks, lb)
    informative = (gen != gen[..., :1]).any(dim=-1)
    for block in range(n_blocks):
        if not bool(informative[:, block].any()):
            continue
        for done in range(lb - 1):
            for lo in range(0, n_rows, chunk):
                idx = torch.arange(lo, min(lo + chunk, n_rows))
                masked = setup.ranks[idx, block * lb:(block + 1) * lb] >= done
                x, (full_mask, positions), start, masked = _build_states(source, setup, idx, block, masked)
                logits, _ = _forward(setup.adapter, x, full_mask, positions, False)
                logits = setup.adapter.align(logits, 0, start, start + lb)
                doubt[idx, block, done] = chain_doubt(logits, masked, chain)
    return doubt * informative.unsqueeze(-1)


def _informative_rows(setup: _Setup, source: TrainingSource, batch: int, g: torch.Generator):
    """Confidence order: `(block, rows [batch])`, the rows drawn among those whose output in the
    block is not one repeated token and the block chosen in proportion to how many such rows it has.
    A block that is all one token (the EOS fill after a short answer) holds nothing to learn, and
    `dlm bench` never decodes it (EOS stop). Uniform when no block of any row qualifies."""
    lb = source.block_length
    gen = setup.pool[:, setup.prompt_length:].reshape(setup.pool.shape[0], -1, lb)  # [N, blocks, Lb]
    informative = (gen != gen[..., :1]).any(dim=-1)  # [N, blocks]
    weights = informative.sum(0).double()
    if float(weights.sum()) == 0:
        informative = torch.ones_like(informative)
        weights = informative.sum(0).double()
    block = int(torch.multinomial(weights, 1, generator=g))
    eligible = informative[:, block].nonzero().squeeze(1)
    return block, eligible[torch.randint(eligible.numel(), (batch,), generator=g)]


def chain_doubt(logits: torch.Tensor, masked: torch.Tensor, chain: int) -> torch.Tensor:
    """How much a confidence-order chain from each state has to learn: the sum of 1 - max
    probability over the `chain` most confident masks (the ones it commits next). logits
    `[B, Lb, V]`, masked `[B, Lb]` bool -> `[B]`.

    Not the doubt of every mask: an early state's EOS fill is certain and committed first, its
    doubtful answer tokens lie beyond the chain, and committing certain tokens changes nothing."""
    confidence = torch.where(masked, torch.softmax(logits.float(), -1).amax(-1),
                             torch.full(masked.shape, -1.0, device=masked.device))
    nearest = confidence.topk(min(chain, masked.shape[1]), dim=1).values
    return torch.where(nearest >= 0, 1 - nearest, torch.zeros_like(nearest)).sum(1)


def _chain_loss(source: TrainingSource, setup: _Setup, layer: JointLayer, config: TrainJointConfig,
                state, g: torch.Generator):
    """Sum over the chain's links of the KL(teacher || layer) at the remaining masks, and the
    number of links run (0 when no row had two masks)."""
    x, (full_mask, positions), start, masked = state
    adapter, lb = setup.adapter, source.block_length
    with torch.no_grad():
        base, hid = _forward(adapter, x, full_mask, positions, setup.features == "hidden")
        base = adapter.align(base, 0, start, start + lb)
        hid = None if hid is None else adapter.align(hid, 0, start, start + lb)
    feats = layer.features(base, hid)
    teacher, remaining = base, masked.clone()
    new = torch.zeros_like(masked)
    loss, links = 0.0, 0
    for _ in range(config.chain - 1):
        live = remaining.sum(1) >= 2
        if not bool(live.any()):
            break
        with torch.no_grad():
            pick, token = chain_commit(teacher, remaining, live, config.order, config.token_temperature, g)
            x[:, start:start + lb] = torch.where(pick, token, x[:, start:start + lb])
            new, remaining = new | pick, remaining & ~pick
            teacher, _ = _forward(adapter, x, full_mask, positions, False)
            teacher = adapter.align(teacher, 0, start, start + lb)
        student = base + layer(feats, x[:, start:start + lb], new)
        loss = loss + _kl(teacher, student, remaining & live.unsqueeze(1))
        links += 1
    return loss, links


def _setup(source: TrainingSource, config: TrainJointConfig, features: str, g: torch.Generator, log) -> _Setup:
    started = time.perf_counter()
    pool, pool_mask, ranks = draw_pool(source, config.pool, g, config.order, config.token_temperature)
    log(f"pool: {pool.shape[0]} samples of the model's own one-token-per-step {config.order}-order decoding "
        f"({time.perf_counter() - started:.1f} s)")
    setup = _Setup(DLMAdapter.wrap(source.model, mask_token_id=source.mask_token_id), features, pool,
                   pool_mask, ranks, source.prompts.shape[1])
    if config.focus > 0:
        started = time.perf_counter()
        setup.doubt = _state_doubt(source, setup, config.chain)
        log(f"doubt of every pool state: mean {float(setup.doubt.mean()):.4f}, "
            f"{int((setup.doubt > 0.1).sum())} states above 0.1 ({time.perf_counter() - started:.1f} s)")
    return setup


def _resolve_features(source: TrainingSource, adapter: DLMAdapter, features: str, hidden_size):
    """"auto" -> "hidden" when the model returns hidden states, else "logprobs"; and the hidden size."""
    from dlm.engine.masked.inputs import full_attention_mask

    if features not in ("auto", "hidden"):
        return features, hidden_size
    probe_ids = torch.cat([source.prompts[:1], torch.full((1, source.gen_length), source.mask_token_id)], 1)
    probe_mask = None if source.attention_mask is None else source.attention_mask[:1]
    full_mask, positions = full_attention_mask(probe_mask, source.gen_length)
    _, probe_hidden = adapter.full_with_hidden(probe_ids, full_mask, positions)
    if probe_hidden is None and features == "hidden":
        raise ValueError("--features hidden: this model returns no hidden states; use --features logprobs")
    if probe_hidden is None:
        return "logprobs", hidden_size
    return "hidden", int(probe_hidden.shape[-1])


def train_joint_layer(source: TrainingSource, config: TrainJointConfig, log=print) -> JointLayer:
    """Train a `JointLayer` for `source.model` along `config.order`. Returns it (eval mode),
    metadata filled (the order included)."""
    config.validate()
    torch.manual_seed(config.seed)
    g = torch.Generator().manual_seed(config.seed)
    model = source.model
    adapter = DLMAdapter.wrap(model, mask_token_id=source.mask_token_id)
    vocab, hidden_size = model_sizes(model)
    features, hidden_size = _resolve_features(source, adapter, config.features, hidden_size)
    meta = JointLayerMeta(
        vocab_size=vocab, feature_size=hidden_size if features == "hidden" else vocab, features=features,
        model_fingerprint=model_fingerprint(model), model_name=source.name, width=config.width,
        heads=config.heads, max_block=source.block_length, order=config.order)
    layer = JointLayer(meta).train()
    opt = torch.optim.AdamW(layer.parameters(), lr=config.lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, config.steps)

    started = time.perf_counter()
    setup = _setup(source, config, features, g, log)
    losses = []
    for it in range(config.steps):
        state = _sample_states(source, setup, config.batch, g, config.focus)
        loss, links = _chain_loss(source, setup, layer, config, state, g)
        if not links:
            continue
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(layer.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(float(loss.detach()) / (config.chain - 1))
        if (it + 1) % max(1, config.steps // 10) == 0 or it == 0:
            recent = losses[-max(1, config.steps // 10):]
            log(f"step {it + 1}/{config.steps}: KL per link {sum(recent) / len(recent):.4f} nats "
                f"({time.perf_counter() - started:.0f} s)")
    tail = losses[-max(1, len(losses) // 10):] or [float("nan")]
    record = {**dataclasses.asdict(config), "temperature": config.token_temperature,
              "gen_length": source.gen_length, "block_length": source.block_length,
              "final_kl_per_link": round(sum(tail) / len(tail), 5),
              "seconds": round(time.perf_counter() - started, 1)}
    layer.meta = dataclasses.replace(meta, training=record)
    return layer.eval()


@torch.no_grad()
def evaluate_joint_layer(source: TrainingSource, layer: JointLayer, config: TrainJointConfig,
                         batches: int = 4, seed: int = 1234, log=lambda m: None) -> float:
    """Mean KL per chain link (nats) of `layer` on `batches` fresh batches of `config.order` states
    (a pool drawn from `seed`): the training loss, measured without training. A layer whose head is
    zero gives the KL of plain marginals (`JointLayer(meta)` untrained)."""
    config.validate()
    g = torch.Generator().manual_seed(seed)
    setup = _setup(source, config, layer.meta.features, g, log)
    total, count = 0.0, 0
    for _ in range(batches):
        loss, links = _chain_loss(source, setup, layer, config, _sample_states(source, setup, config.batch, g), g)
        if links:
            total, count = total + float(loss) / (config.chain - 1), count + 1
    return total / max(count, 1)
