"""Training of the joint sampler's layer (ADJUST) by distilling the model's own sequential unmasking.

The frozen model is the teacher. A training example is a state `x_t` on the model's own decoding
trajectory: a complete sample drawn by the model's one-token-per-step random-order decoding at
temperature 1 (exact sampling of the model's joint), with the blocks after a chosen block masked
and a random fraction of that block masked. From `x_t` we run the exact sequential unmasking the
layer has to imitate: commit one masked position (uniformly chosen) with a token drawn from the
model's conditional, run the model again, and so on for up to `chain` tokens. After the m-th
commit the layer, fed only the FULL FORWARD ON `x_t` (its features) and the m tokens committed,
predicts the distributions at the block's remaining masks; the loss is
`KL(teacher || layer)` there, where the teacher is the model's forward on the state with the m
tokens committed. One teacher forward per chain link, the layer's passes are the only trained part.

Paper: ADJUST, approximate joint sampling for masked diffusion LMs (ALGORITHMS 1.9 in the project's
algorithm notes); the layer's inputs are our design (see `samplers.unmasking.joint_layer`).
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import torch

from dlm.adapters import DLMAdapter
from samplers.unmasking.joint_layer import JointLayer, JointLayerMeta, model_fingerprint, model_sizes


@dataclass(frozen=True)
class TrainJointConfig:
    """Settings of one training run (all recorded in the layer's metadata).

    Attributes:
        steps: optimiser steps. batch: states per step. chain: tokens committed per state
            (the largest number of tokens per forward the layer is trained for).
        pool: complete samples drawn by the model's own one-token-per-step decoding, the source
            of the training states. lr: AdamW learning rate. width / heads: layer shape.
        features: "auto" (hidden states when the model returns them, else log-probabilities),
            "hidden" or "logprobs". seed: seeds the pool, the states and the layer's init.
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

    def validate(self) -> None:
        for name in ("steps", "batch", "pool", "width", "heads"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.chain < 2:
            raise ValueError(f"chain must be >= 2 (tokens per forward to learn), got {self.chain}")
        if self.features not in ("auto", "hidden", "logprobs"):
            raise ValueError(f"features must be auto, hidden or logprobs, got {self.features!r}")


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


def draw_pool(source: TrainingSource, size: int, generator: torch.Generator):
    """`size` complete sequences `[size, P + gen]` from the model's one-token-per-step random-order
    decoding at temperature 1, with their prompts' attention masks."""
    import dlm

    idx = torch.randint(source.prompts.shape[0], (size,), generator=generator)
    prompts = source.prompts[idx]
    mask = None if source.attention_mask is None else source.attention_mask[idx]
    out = dlm.generate(source.model, prompts, attention_mask=mask, gen_length=source.gen_length,
                       block_length=source.block_length, steps=source.gen_length, sampler="random",
                       temperature=1.0, generator=generator, mask_token_id=source.mask_token_id)
    return out.sequences, mask


def train_joint_layer(source: TrainingSource, config: TrainJointConfig, log=print) -> JointLayer:
    """Train a `JointLayer` for `source.model`. Returns it (eval mode), metadata filled."""
    from dlm.generate import _full_attention

    config.validate()
    torch.manual_seed(config.seed)
    g = torch.Generator().manual_seed(config.seed)
    model = source.model
    adapter = DLMAdapter.wrap(model, mask_token_id=source.mask_token_id)
    vocab, hidden_size = model_sizes(model)
    features = config.features
    probe_ids = torch.cat([source.prompts[:1], torch.full((1, source.gen_length), source.mask_token_id)], 1)
    probe_mask = None if source.attention_mask is None else source.attention_mask[:1]
    if features in ("auto", "hidden"):
        full_mask, positions = _full_attention(probe_mask, source.gen_length)
        _, probe_hidden = adapter.full_with_hidden(probe_ids, full_mask, positions)
        if probe_hidden is None and features == "hidden":
            raise ValueError("--features hidden: this model returns no hidden states; use --features logprobs")
        features = "hidden" if probe_hidden is not None else "logprobs"
        if features == "hidden":
            hidden_size = int(probe_hidden.shape[-1])
    meta = JointLayerMeta(
        vocab_size=vocab, feature_size=hidden_size if features == "hidden" else vocab, features=features,
        model_fingerprint=model_fingerprint(model), model_name=source.name, width=config.width,
        heads=config.heads, max_block=source.block_length)
    layer = JointLayer(meta).train()
    opt = torch.optim.AdamW(layer.parameters(), lr=config.lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, config.steps)

    started = time.perf_counter()
    pool, pool_mask = draw_pool(source, config.pool, g)
    log(f"pool: {pool.shape[0]} samples of the model's own one-token-per-step decoding "
        f"({time.perf_counter() - started:.1f} s)")
    P = source.prompts.shape[1]
    nblocks = source.gen_length // source.block_length
    lb, mask_id = source.block_length, source.mask_token_id
    losses = []
    for it in range(config.steps):
        idx = torch.randint(pool.shape[0], (config.batch,), generator=g)
        x = pool[idx].clone()
        pmask = None if pool_mask is None else pool_mask[idx]
        full_mask, positions = _full_attention(pmask, source.gen_length)
        if getattr(model, "dlm_position_ids", None) is not None:
            positions = model.dlm_position_ids(x, full_mask)
        block = int(torch.randint(nblocks, (1,), generator=g))
        start = P + block * lb
        x[:, start + lb:] = mask_id  # later blocks are still masked on a semi-AR trajectory
        ratio = torch.rand(config.batch, 1, generator=g)
        masked = torch.rand(config.batch, lb, generator=g) < ratio
        masked[:, :2] |= masked.sum(1, keepdim=True) < 2  # at least two masks: one to commit, one to predict
        x[:, start:start + lb] = torch.where(masked, torch.full_like(masked, mask_id, dtype=torch.long),
                                             x[:, start:start + lb])
        with torch.no_grad():
            base, hid = _forward(adapter, x, full_mask, positions, features == "hidden")
            base = adapter.align(base, 0, start, start + lb)
            hid = None if hid is None else adapter.align(hid, 0, start, start + lb)
        feats = layer.features(base, hid)
        teacher, remaining = base, masked.clone()
        new = torch.zeros_like(masked)
        loss = 0.0
        for _ in range(config.chain - 1):
            live = remaining.sum(1) >= 2
            if not bool(live.any()):
                break
            with torch.no_grad():
                score = torch.where(remaining, torch.rand(remaining.shape, generator=g), torch.full(remaining.shape, -1.0))
                pick = torch.zeros_like(remaining).scatter_(1, score.argmax(1, keepdim=True), True) & live.unsqueeze(1)
                u = torch.rand(teacher.shape, dtype=torch.float64, generator=g)
                token = (teacher.double() - torch.log(-torch.log(u.clamp_min(1e-300)))).argmax(-1)
                blk = x[:, start:start + lb]
                x[:, start:start + lb] = torch.where(pick, token, blk)
                new, remaining = new | pick, remaining & ~pick
                teacher, _ = _forward(adapter, x, full_mask, positions, False)
                teacher = adapter.align(teacher, 0, start, start + lb)
            student = base + layer(feats, x[:, start:start + lb], new)
            loss = loss + _kl(teacher, student, remaining & live.unsqueeze(1))
        if isinstance(loss, float):
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
    record = {**dataclasses.asdict(config), "gen_length": source.gen_length, "block_length": lb,
              "final_kl_per_link": round(sum(tail) / len(tail), 5),
              "seconds": round(time.perf_counter() - started, 1)}
    layer.meta = dataclasses.replace(meta, training=record)
    return layer.eval()
