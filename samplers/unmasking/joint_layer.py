"""The trainable layer of the approximate joint sampler (ADJUST), its files and the model fingerprint.

ADJUST ("approximate joint sampling", ALGORITHMS 1.9 in the project's algorithm notes) puts one small
transformer layer on top of a frozen masked diffusion LM. After one full forward, the layer is run
k-1 more times; each run sees the tokens unmasked so far in this step and corrects the model's
marginals towards the conditionals the model itself would give after committing them. No public code
exists, so the layer's exact inputs are our design:

- features of each block position from the full forward: the model's last hidden state `[H]` when
  the model returns hidden states (tiny-dlm, transformers models), otherwise the model's
  log-probabilities `[V]`, floored at `LOGP_FLOOR` (the analytic oracles give no hidden states);
- a learned embedding of the token committed at the position during this step's cheap passes
  (zero elsewhere), plus a learned flag for "committed this step";
- a learned embedding of the position inside the block (blocks up to `max_block` long).
One pre-norm transformer encoder layer (self-attention over the block, MLP) maps these to a
logit correction `[V]` added to the model's logits: the layer predicts
`logits_model(x_t) + delta(features(x_t), new tokens)`. The output projection starts at zero, so an
untrained layer samples exactly the model's marginals.

Files: a trained layer is `<stem>.safetensors` (weights) + `<stem>.json` (`JointLayerMeta`): the
vocabulary size, feature size and kind, the fingerprint of the model it was trained for and the
commit order it was trained for ("random" or "confidence"); a sampler refuses a layer whose metadata
does not match the model it is asked to decode, and warns when the order differs from its own.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

# Log-probabilities are floored here before they become features: the oracles give -1e4 for
# impossible tokens and the driver -inf for the mask token, which would swamp a linear layer.
LOGP_FLOOR = -20.0
FEATURE_KINDS = ("hidden", "logprobs")
# Commit orders of the joint sampler; a layer learns the conditionals along one of them.
ORDERS = ("random", "confidence")
CHECKPOINT_DIR = Path(__file__).resolve().parent / "checkpoints"
# Config entries that do not change what a model computes (left out of the fingerprint).
_FINGERPRINT_KEYS = ("model_type", "vocab_size", "hidden_size", "num_symbols", "gen_length")


def model_fingerprint(model) -> str:
    """A 16-hex-digit hash of what a model computes: its class, a few config entries and every
    parameter and buffer (name, dtype, shape, bytes).

    Works for any `nn.Module` (tiny-dlm, transformers models, the analytic oracles: the HMM's
    parameters are buffers; the permutation oracle has none and is identified by its config).
    Hashing a large model reads all its weights once; the result is cached on the module as
    `_dlm_fingerprint` (delete that attribute after changing weights in place).
    """
    cached = getattr(model, "_dlm_fingerprint", None)
    if cached is not None:
        return cached
    h = hashlib.sha256(type(model).__name__.encode())
    config = getattr(model, "config", None)
    for key in _FINGERPRINT_KEYS:
        h.update(f"{key}={getattr(config, key, None)!r};".encode())
    if isinstance(model, nn.Module):
        for name, tensor in sorted(model.state_dict().items()):
            t = tensor.detach().cpu().contiguous()
            h.update(f"{name}:{t.dtype}:{tuple(t.shape)};".encode())
            h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    digest = h.hexdigest()[:16]
    try:
        model._dlm_fingerprint = digest
    except AttributeError:  # pragma: no cover - objects that refuse attributes just hash again
        pass
    return digest


def model_sizes(model) -> tuple[int, int | None]:
    """`(vocab_size, hidden_size or None)` from a model's config."""
    config = getattr(model, "config", None)
    vocab = getattr(config, "vocab_size", None)
    if vocab is None:
        raise ValueError("the joint sampler needs a model whose config has vocab_size")
    hidden = getattr(config, "hidden_size", None)
    return int(vocab), (int(hidden) if hidden is not None else None)


@dataclass(frozen=True)
class JointLayerMeta:
    """What a trained layer was built for (the `.json` beside its weights).

    Attributes:
        vocab_size: V of the model. feature_size: H (hidden states) or V (log-probabilities).
        features: "hidden" or "logprobs". width / heads / max_block: layer shape.
        model_fingerprint: `model_fingerprint(model)` of the model it was trained for.
        model_name: a label for messages (e.g. "tiny-dlm", "oracle-permutation").
        order: the commit order of the chains it was trained on, "random" (uniform positions,
            tokens at temperature 1) or "confidence" (the confidence sampler's rule). Files written
            before the field existed were all trained for "random", its default.
        training: free-form record of how it was trained (command, steps, final loss).
    """

    vocab_size: int
    feature_size: int
    features: str
    model_fingerprint: str
    model_name: str = ""
    width: int = 64
    heads: int = 4
    max_block: int = 128
    order: str = "random"
    training: dict = dataclasses.field(default_factory=dict)

    def validate(self) -> None:
        if self.features not in FEATURE_KINDS:
            raise ValueError(f"features must be one of {FEATURE_KINDS}, got {self.features!r}")
        if self.order not in ORDERS:
            raise ValueError(f"order must be one of {ORDERS}, got {self.order!r}")
        if self.width % self.heads:
            raise ValueError(f"width ({self.width}) must be a multiple of heads ({self.heads})")

    def check_model(self, model, source: str = "the layer") -> None:
        """Raise ValueError when this layer was trained for another model (vocab, hidden size, hash)."""
        vocab, hidden = model_sizes(model)
        fix = (f"train a layer for this model with `dlm train-joint --model ...` and pass "
               f"layer=PATH to the joint sampler")
        if vocab != self.vocab_size:
            raise ValueError(f"{source} was trained for a vocabulary of {self.vocab_size} tokens "
                             f"({self.model_name}), this model has {vocab}; {fix}")
        if self.features == "hidden" and hidden != self.feature_size:
            raise ValueError(f"{source} was trained on hidden states of size {self.feature_size} "
                             f"({self.model_name}), this model has hidden_size={hidden}; {fix}")
        digest = model_fingerprint(model)
        if digest != self.model_fingerprint:
            raise ValueError(f"{source} was trained for model checkpoint {self.model_fingerprint} "
                             f"({self.model_name}), this model's checkpoint hash is {digest}; {fix}")


class JointLayer(nn.Module):
    """One transformer layer mapping (features, tokens committed this step) to logit corrections.

    Args: meta: `JointLayerMeta` (sizes). Parameters: about `width * (H + 2V + 12 width)`.
    """

    def __init__(self, meta: JointLayerMeta):
        super().__init__()
        meta.validate()
        self.meta = meta
        w = meta.width
        self.feature_proj = nn.Linear(meta.feature_size, w)
        self.position = nn.Embedding(meta.max_block, w)
        self.token = nn.Embedding(meta.vocab_size, w)
        self.new_flag = nn.Parameter(torch.zeros(w))
        self.block = nn.TransformerEncoderLayer(w, meta.heads, 2 * w, dropout=0.0, batch_first=True,
                                                norm_first=True)
        self.norm = nn.LayerNorm(w)
        self.head = nn.Linear(w, meta.vocab_size)
        # Zero correction at start: an untrained layer reproduces marginal sampling exactly.
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def features(self, logits: torch.Tensor, hidden: torch.Tensor | None) -> torch.Tensor:
        """Per-position features of the full forward. logits `[B, Lb, V]`, hidden `[B, Lb, H]` or
        None. Returns `[B, Lb, F]` float32."""
        if self.meta.features == "hidden":
            if hidden is None:
                raise ValueError("this joint layer reads hidden states but the model returned none "
                                 "(it must accept output_hidden_states=True); train a layer with "
                                 "`dlm train-joint --features logprobs`")
            return hidden.float()
        return torch.log_softmax(logits.float(), dim=-1).clamp_min(LOGP_FLOOR)

    def forward(self, features: torch.Tensor, tokens: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
        """Logit corrections `[B, Lb, V]`.

        Args:
            features: `[B, Lb, F]` from `features`.
            tokens: `[B, Lb]` long, the block's tokens (only read where `new`).
            new: `[B, Lb]` bool, positions committed during this step's cheap passes.
        """
        lb = features.shape[1]
        if lb > self.meta.max_block:
            raise ValueError(f"block of {lb} tokens is longer than this joint layer's max_block "
                             f"({self.meta.max_block}); use a shorter block_length or retrain")
        pos = self.position(torch.arange(lb, device=features.device))
        committed = (self.token(tokens.clamp(0, self.meta.vocab_size - 1)) + self.new_flag) * new.unsqueeze(-1)
        h = self.feature_proj(features) + pos + committed
        # Each position attends only to itself and to the tokens committed this step: the layer's job
        # is to condition on those, and the full forward's view of everything else is already in the
        # features. Focused attention learns that far faster than attention over the whole block.
        lb = new.shape[1]
        allowed = new.unsqueeze(1) | torch.eye(lb, dtype=torch.bool, device=new.device)
        blocked = (~allowed).repeat_interleave(self.meta.heads, dim=0)  # [B * heads, Lb, Lb]
        return self.head(self.norm(self.block(h, src_mask=blocked)))


def save_layer(layer: JointLayer, stem: str | Path) -> tuple[Path, Path]:
    """Write `<stem>.safetensors` and `<stem>.json`. Returns both paths."""
    from safetensors.torch import save_file

    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    weights, meta = stem.with_suffix(".safetensors"), stem.with_suffix(".json")
    save_file({k: v.detach().cpu().contiguous() for k, v in layer.state_dict().items()}, str(weights))
    meta.write_text(json.dumps(dataclasses.asdict(layer.meta), indent=2, sort_keys=True) + "\n")
    return weights, meta


def _stem(path: str | Path) -> Path:
    p = Path(path)
    return p.with_suffix("") if p.suffix in (".json", ".safetensors") else p


def load_layer(path: str | Path) -> JointLayer:
    """A layer from `<stem>.safetensors` + `<stem>.json` (either file or the stem may be given)."""
    from safetensors.torch import load_file

    stem = _stem(path)
    weights, meta_path = stem.with_suffix(".safetensors"), stem.with_suffix(".json")
    if not weights.is_file() or not meta_path.is_file():
        raise FileNotFoundError(f"joint layer {stem}: need {weights.name} and {meta_path.name} side by side; "
                                f"train one with `dlm train-joint --model ... --out {stem}`")
    meta = JointLayerMeta(**json.loads(meta_path.read_text()))
    layer = JointLayer(meta)
    layer.load_state_dict(load_file(str(weights)))
    return layer.eval()


def shipped_layers() -> dict[str, Path]:
    """Layers shipped with the package: name -> stem (`checkpoints/joint-<name>`)."""
    return {p.stem[len("joint-"):]: p.with_suffix("") for p in sorted(CHECKPOINT_DIR.glob("joint-*.json"))}


def find_layer_for(model, order: str = "random") -> JointLayer | None:
    """The shipped layer trained for exactly this model (same fingerprint), or None.

    A layer trained for `order` wins over one trained for another order, which is still returned
    when it is the only one (the caller checks `layer.meta.order`)."""
    digest = model_fingerprint(model)
    fits = []
    for stem in shipped_layers().values():
        meta = json.loads(stem.with_suffix(".json").read_text())
        if meta.get("model_fingerprint") == digest:
            fits.append((meta.get("order", "random") != order, stem))
    if not fits:
        return None
    # Stable on the shipped (sorted) order among layers of the same kind.
    return load_layer(min(fits, key=lambda f: f[0])[1])
