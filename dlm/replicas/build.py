"""Build a replica: the published shape (the JSON beside this file) -> a transformers config -> the model
on the meta device -> its weights allocated on the target device and filled at random there.

Why this order: a 26B-parameter model cannot be built on the host and copied (minutes, 52 GB of host
memory), and DiffusionGemma's encoder and decoder share every text weight only after transformers ties
them, so a plain build on the device would first allocate both (104 GB). Parameters are therefore created
on the meta device (no memory, ties kept as shared objects); buffers (rotary frequencies, scales) are built
for real on the host, since their values come from the config. Materialising allocates each distinct
parameter once on the device, and transformers' own `_init_weights` fills it there (normal(0, 0.02)
weights, ones for norms, its own rules for routers and experts), so nothing crosses the host boundary.
"""
from __future__ import annotations

import contextlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import torch
import torch.nn as nn

SHAPE_DIR = Path(__file__).resolve().parent
REPLICA_NAMES = ("llada-8b", "dream-7b", "llada2-mini", "diffusiongemma-26b-a4b")
# Reduced widths for CPU tests and the GPU report's smoke mode: the same classes, layer kinds, GQA ratios,
# expert routing (top-k of E, groups) and token roles as the real shapes, at a width and vocabulary that run
# in milliseconds. Token ids move to the top of the smaller vocabulary. Recorded in `replica_info.overrides`.
TINY_OVERRIDES: dict[str, dict] = {
    "llada-8b": dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=4, intermediate_size=128,
                     vocab_size=512, mask_token_id=500, eos_token_id=501, pad_token_id=501),
    "dream-7b": dict(hidden_size=56, num_attention_heads=7, num_key_value_heads=1, intermediate_size=128,
                     vocab_size=512, mask_token_id=500, eos_token_id=501, pad_token_id=501),
    "llada2-mini": dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=1, head_dim=16,
                        intermediate_size=128, moe_intermediate_size=16, n_routed_experts=16,
                        num_experts_per_tok=4, n_group=4, topk_group=2, vocab_size=512, mask_token_id=500,
                        eos_token_id=501, pad_token_id=501),
    "diffusiongemma-26b-a4b": dict(hidden_size=48, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                                   global_head_dim=32, num_global_key_value_heads=1, intermediate_size=64,
                                   num_experts=8, top_k_experts=2, moe_intermediate_size=16, vocab_size=512,
                                   canvas_length=16, boi_token_id=509, eoi_token_id=510, image_token_id=511),
}
# Kept free on the device beyond what `working_bytes` counts: the allocator's rounding and fragmentation.
HEADROOM_BYTES = 1 << 30
# The forward the fit check makes room for: one row of this many tokens (the GPU report's decoding shape,
# prompt 256 + block 32, fits; DiffusionGemma's 256-token canvas too).
FIT_FORWARD_TOKENS = 512
# Elements per piece when `init_random` scans the weights for NaN/inf: whole-tensor checks of a 518M-element
# embedding allocated a bool mask and, in bfloat16 on the CPU, an abs() copy, 2.6 GB beside 2.5 GB of weights
# for one layer of LLaDA-8B; in pieces they take a few tens of MB.
SCAN_ELEMENTS = 1 << 22


class ReplicaTooLarge(ValueError):
    """The replica (its weights, building them and one forward) does not fit the free memory of the
    device; the message names `layers=`.

    fit_layers: the deepest `layers=` that would fit (0 when not even one layer does)."""

    def __init__(self, message: str, fit_layers: int = 0):
        super().__init__(message)
        self.fit_layers = fit_layers


@dataclass(frozen=True)
class ReplicaInfo:
    """What was built, for the report to state (nothing is scaled silently).

    name / checkpoint: the replica and the checkpoint whose shape it has. layers / full_layers: the depth
    built and the checkpoint's. layer_types: per layer, for models mixing attention kinds (else None).
    overrides: config fields changed from the published shape (tests and smoke runs only; {} at real
    size). parameters / parameter_bytes: distinct parameters built and their bytes in `dtype`.
    experts_implementation: transformers' MoE kernel choice (None for dense models). fallback_init: the
    parameters transformers' `_init_weights` left untouched, filled here instead (normal(0, 0.02) or ones).
    """

    name: str
    checkpoint: str
    transformers_class: str
    layers: int
    full_layers: int
    dtype: str
    device: str
    parameters: int
    parameter_bytes: int
    build_seconds: float
    overrides: dict = field(default_factory=dict)
    layer_types: Optional[tuple[str, ...]] = None
    experts_implementation: Optional[str] = None
    fallback_init: tuple[str, ...] = ()


def load_shape(name: str) -> dict:
    """The published shape of replica `name` (a copy of its JSON: config, token ids, sources)."""
    key = str(name).lower()
    if key not in REPLICA_NAMES:
        raise ValueError(f"unknown replica {name!r}; known: {', '.join(REPLICA_NAMES)}")
    with open(SHAPE_DIR / f"{key}.json") as f:
        return json.load(f)


def _apply_overrides(shape: dict, overrides: Optional[dict]) -> dict:
    """The shape with `overrides` applied: each key must name a field of the (text) config or a token id."""
    shape = json.loads(json.dumps(shape))
    if not overrides:
        return shape
    config = shape["config"]
    text = config.get("text_config", config)
    for key, value in overrides.items():
        if key in shape["tokens"]:
            shape["tokens"][key] = value
            if key in text:
                text[key] = value
        elif key in text:
            text[key] = value
        elif key in config:
            config[key] = value
        else:
            raise ValueError(f"overrides: {key!r} is not a config field or token id of {shape['name']}; fields: "
                             f"{', '.join(sorted(set(text) | set(config) | set(shape['tokens'])))}")
    return shape


def _layer_types(pattern: list[str], layers: int) -> list[str]:
    """The checkpoint's repeating attention pattern cut to `layers`, the last layer full attention (transformers
    requires it, and the full-size pattern ends on one: 5 sliding then 1 full, five times)."""
    types = [pattern[i % len(pattern)] for i in range(layers)]
    types[-1] = "full_attention"
    return types


def replica_config(name: str, layers: Optional[int] = None, overrides: Optional[dict] = None):
    """(transformers config, shape) of replica `name` at `layers` depth (default: the checkpoint's)."""
    shape = _apply_overrides(load_shape(name), overrides)
    config = dict(shape["config"])
    if shape["family"] == "uniform":
        from transformers import DiffusionGemmaConfig

        text = dict(config.pop("text_config"))
        full = int(text["num_hidden_layers"])
        depth = _check_layers(layers, full, shape["name"])
        text["num_hidden_layers"] = depth
        text["layer_types"] = _layer_types(text.pop("layer_pattern"), depth)
        vision = config.pop("vision_config")
        return DiffusionGemmaConfig(text_config=text, vision_config=vision, **config), shape
    full = int(config["num_hidden_layers"])
    config["num_hidden_layers"] = _check_layers(layers, full, shape["name"])
    config.update(shape["tokens"])
    if shape["decoding"].get("shift_logits"):
        config["shift_logits"] = True  # read by dlm.adapters.infer_shift_logits
    import transformers

    cls = getattr(transformers, shape["transformers_class"])
    return cls.config_class(**config), shape


def _check_layers(layers, full: int, name: str) -> int:
    if layers is None:
        return full
    if not isinstance(layers, int) or isinstance(layers, bool) or not 1 <= layers <= full:
        raise ValueError(f"layers must be an integer from 1 to {full} (the depth of {name}), got {layers!r}")
    return layers


@contextlib.contextmanager
def _parameters_on_meta():
    """Every parameter registered inside is moved to the meta device; buffers are built for real."""
    original = nn.Module.register_parameter

    def register(module, name, param):
        original(module, name, param)
        if param is not None and param.device.type != "meta":
            module._parameters[name] = nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)

    nn.Module.register_parameter = register
    try:
        yield
    finally:
        nn.Module.register_parameter = original


def build_on_meta(name: str, layers: Optional[int] = None, overrides: Optional[dict] = None,
                  experts_implementation: Optional[str] = None):
    """(transformers model with parameters on the meta device, shape). Takes well under a second even at
    26B: nothing is allocated or initialised. `experts_implementation` picks transformers' MoE kernel
    ("eager", "grouped_mm", "batched_mm"; default: transformers' choice, grouped_mm where it runs)."""
    import transformers
    from transformers.utils import logging

    config, shape = replica_config(name, layers, overrides)
    cls = getattr(transformers, shape["transformers_class"])
    if shape["family"] == "masked":
        config._attn_implementation = "sdpa"  # the masked wrapper passes SDPA-style boolean masks
    if experts_implementation is not None:
        config._experts_implementation = experts_implementation
    verbosity = logging.get_verbosity()
    logging.set_verbosity_error()  # "last layer must be full attention" etc. for cut depths
    try:
        with _parameters_on_meta():
            model = cls(config)
    finally:
        logging.set_verbosity(verbosity)
    return model.eval(), shape


def distinct_parameters(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """(name, parameter) once per parameter object: tied weights count once."""
    seen, out = set(), []
    for module_name, module in model.named_modules():
        for name, p in module._parameters.items():
            if p is not None and id(p) not in seen:
                seen.add(id(p))
                out.append((f"{module_name}.{name}" if module_name else name, p))
    return out


def parameter_bytes(model: nn.Module, dtype: torch.dtype) -> int:
    """Bytes of the distinct parameters once floating ones are cast to `dtype`."""
    size = torch.empty((), dtype=dtype).element_size()
    return sum(p.numel() * (size if p.is_floating_point() else p.element_size()) for _, p in distinct_parameters(model))


def _free_bytes(device: torch.device) -> Optional[int]:
    """Free memory of `device` in bytes: CUDA's free memory, or the host's MemAvailable; None if unknown."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    if device.type == "cpu":
        try:
            with open("/proc/meminfo") as f:
                for line in f:
                    if line.startswith("MemAvailable:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            return None
    return None


def working_bytes(model: nn.Module, dtype: torch.dtype, tokens: int = FIT_FORWARD_TOKENS) -> int:
    """Bytes beyond the weights that building the replica and one forward of one row of `tokens` tokens
    take at their peak, whatever the depth (a forward without gradients frees each layer's activations
    before the next):

    - building: `init_random`'s NaN/inf scan of one `SCAN_ELEMENTS` piece (bool masks and a copy);
    - the forward: the logits `[tokens, V]` in `dtype`, the float32 copy decoding makes of them and its
      softmax, plus DiffusionGemma's self-conditioning input `[tokens, V]`; one layer's activations, counted in float32
      as 8 hidden-size and 3 MLP-width vectors per token (the MoE width: the active experts' and the
      shared expert's); attention scores `[heads, tokens, tokens]` in float32 (the math path).

    An upper estimate, checked against the measured peak on the CPU (tests/dlm/test_replicas.py)."""
    text = model.config.get_text_config()
    size = torch.empty((), dtype=dtype).element_size()
    vocab, hidden = int(text.vocab_size), int(text.hidden_size)
    width = int(getattr(text, "intermediate_size", 0) or 0)
    experts_width = int(getattr(text, "moe_intermediate_size", 0) or 0) * int(
        getattr(text, "num_experts_per_tok", 0) or getattr(text, "top_k_experts", 0) or 0)
    shared = int(getattr(text, "moe_intermediate_size", 0) or 0) * int(getattr(text, "n_shared_experts", 0) or 0)
    mlp = max(width, experts_width + shared)
    heads = int(text.num_attention_heads)
    logits = tokens * vocab * (size + 8) + (tokens * vocab * size if hasattr(model.config, "canvas_length") else 0)
    layer = tokens * (8 * hidden + 3 * mlp) * 4 + heads * tokens * tokens * 4
    return int(logits + layer + build_bytes(dtype))


def build_bytes(dtype: torch.dtype) -> int:
    """Bytes beyond the weights that building takes at its peak: `init_random`'s scan of one
    `SCAN_ELEMENTS` piece (an abs() copy in `dtype`, bool masks, the first use of each kernel)."""
    return SCAN_ELEMENTS * (12 + 2 * torch.empty((), dtype=dtype).element_size())


def check_fits(model: nn.Module, shape: dict, device: torch.device, dtype: torch.dtype) -> None:
    """Raise `ReplicaTooLarge` (one line: the model, its size, the depth that would fit) when the weights,
    what building them and one forward take (`working_bytes`) and `HEADROOM_BYTES` exceed the device's
    free memory. Checked before anything is allocated."""
    free = _free_bytes(device)
    if free is None:
        return
    weights = parameter_bytes(model, dtype)
    working = working_bytes(model, dtype)
    if weights + working + HEADROOM_BYTES <= free:
        return
    layers = _decoder_layers(model)
    per_layer = parameter_bytes(layers, dtype) / max(len(layers), 1)
    rest = weights - parameter_bytes(layers, dtype)
    fit = max(0, min(int((free - HEADROOM_BYTES - working - rest) // per_layer) if per_layer else 0, len(layers) - 1))
    hint = (f"pass layers={fit} or fewer to cut its depth (about {per_layer / 1e9:.2f} GB a layer)"
            if fit >= 1 else "it does not fit even with layers=1; use a device with more free memory")
    dtype_name = str(dtype).replace("torch.", "")
    raise ReplicaTooLarge(f"{shape['name']} replica needs {weights / 1e9:.1f} GB of weights ({dtype_name}, "
                          f"{len(layers)} layers) and {(working + HEADROOM_BYTES) / 1e9:.1f} GB more to build them "
                          f"and run one {FIT_FORWARD_TOKENS}-token forward, but {device} has {free / 1e9:.1f} GB "
                          f"free: {hint}", fit)


def _decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The stack `layers=` cuts: the causal LM's layers, or DiffusionGemma's decoder layers (the encoder's
    are the same tied parameters). Takes the transformers model or the masked wrapper around one."""
    inner = getattr(model, "lm", model).model
    return inner.decoder.layers if hasattr(inner, "decoder") else inner.layers


def materialize(model: nn.Module, device: torch.device, dtype: torch.dtype) -> None:
    """Allocate every distinct meta parameter on `device` (floating ones in `dtype`, uninitialised) and move
    buffers there in their own dtype. Tied parameters stay tied: one allocation per parameter object. On
    the meta device itself only the parameters' dtype changes (nothing is allocated; buffers stay real)."""
    fresh: dict[int, nn.Parameter] = {}
    for module in model.modules():
        for name, p in module._parameters.items():
            if p is None:
                continue
            if id(p) not in fresh:
                target = dtype if p.is_floating_point() else p.dtype
                fresh[id(p)] = nn.Parameter(torch.empty(p.shape, device=device, dtype=target), requires_grad=False)
            module._parameters[name] = fresh[id(p)]
        for name, b in module._buffers.items():
            if b is not None and device.type != "meta":
                module._buffers[name] = b.to(device)


def init_random(model: nn.Module, seed: int) -> tuple[str, ...]:
    """Fill every parameter with transformers' own random init for the class, on its device, from `seed`
    (the caller's random state is left as it was). Returns the names of parameters `_init_weights` did not
    cover (filled with normal(0, 0.02), or ones for 1-D ones) so the report can say so."""
    params = distinct_parameters(model)
    device = params[0][1].device
    std = getattr(model.config.get_text_config(), "initializer_range", 0.02) or 0.02
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), torch.no_grad():
        torch.manual_seed(seed)
        for _, p in params:
            p.fill_(float("nan"))  # marks what `_init_weights` leaves untouched
        for module in model.modules():
            # Only modules owning parameters: buffers (rotary frequencies, scales) were built from the config
            # already, and re-deriving some of them fails outside from_pretrained (Gemma 4's vision rotary).
            if any(p is not None for p in module._parameters.values()):
                model._init_weights(module)
        missed = tuple(name for name, p in params if _any_piece(p, torch.isnan))
        for name, p in params:
            if name in missed:
                p.fill_(1.0) if p.dim() == 1 else p.normal_(0.0, std)
    bad = [name for name, p in params if _any_piece(p, lambda piece: ~torch.isfinite(piece))]
    if bad:
        raise RuntimeError(f"random init left non-finite values in {bad[:5]}")
    return missed


def _any_piece(p: torch.Tensor, test) -> bool:
    """`bool(test(p).any())` computed `SCAN_ELEMENTS` at a time (see there), one host read at the end."""
    flat = p.detach().reshape(-1)
    found = torch.zeros((), dtype=torch.bool, device=p.device)
    for piece in flat.split(SCAN_ELEMENTS):
        found |= test(piece).any()
    return bool(found)


def attach_generation_config(model: nn.Module, shape: dict) -> None:
    """DiffusionGemma: a generation config for `model.generate` (the checkpoint's is not available here):
    one canvas, the issue's fixed budget of denoising steps, the project's tiny-dgemma stopping rule."""
    from transformers.models.diffusion_gemma.generation_diffusion_gemma import (DiffusionGemmaGenerationConfig,
                                                                               EntropyBoundSamplerConfig)

    tokens = shape["tokens"]
    model.generation_config = DiffusionGemmaGenerationConfig(
        max_new_tokens=int(model.config.canvas_length), max_denoising_steps=shape["decoding"]["max_denoising_steps"],
        t_min=0.4, t_max=0.8, sampler_config=EntropyBoundSamplerConfig(entropy_bound=0.1), stability_threshold=1,
        confidence_threshold=0.005, pad_token_id=tokens["pad_token_id"], eos_token_id=tokens["eos_token_id"])


def resolve_device_dtype(device, dtype) -> tuple[torch.device, torch.dtype]:
    """Defaults: CUDA when available, bfloat16 there and float32 on the CPU."""
    device = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    if dtype is None:
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating torch.dtype (torch.bfloat16 on a GPU), got {dtype!r}")
    return device, dtype


def replica(name: str, layers: Optional[int] = None, device=None, dtype: Optional[torch.dtype] = None,
            seed: int = 0, overrides: Optional[dict[str, Any]] = None,
            experts_implementation: Optional[str] = None) -> nn.Module:
    """A random-weight model with the exact shapes of a published diffusion LM.

    Args:
        name: one of `REPLICA_NAMES`: "llada-8b" (GSAI-ML/LLaDA-8B-Instruct), "dream-7b"
            (Dream-org/Dream-v0-Instruct-7B), "llada2-mini" (inclusionAI/LLaDA2.0-mini),
            "diffusiongemma-26b-a4b" (google/diffusiongemma-26B-A4B-it).
        layers: build only the first `layers` decoder layers (a card that cannot hold the whole model);
            `model.replica_info` records the depth, and nothing is scaled to the full depth.
        device / dtype: default CUDA + bfloat16 when a GPU is present, else CPU + float32. "meta" builds
            the model without allocating its weights (parameter counts, bytes per forward).
        seed: the random weights' seed; the caller's random state is not changed.
        overrides: config fields to change (test and smoke sizes only, e.g. `{"hidden_size": 64}`; token ids
            too); recorded in `replica_info.overrides`.
        experts_implementation: transformers' MoE kernel for the MoE replicas ("eager", "grouped_mm",
            "batched_mm"); default transformers' choice (grouped_mm where the device and dtype allow it).

    Returns:
        The masked models as `dlm.replicas.masked.MaskedReplica` (the project's masked-model contract with
        a windowed KV cache; LLaDA2 block-causal over 32-token blocks), DiffusionGemma as transformers'
        `DiffusionGemmaForBlockDiffusion`; in eval mode, without gradients, with `replica_info`
        (a `ReplicaInfo`).

    Raises:
        ValueError: an unknown name (the message lists the names), a bad `layers`, an unknown override.
        ReplicaTooLarge (a ValueError): the weights do not fit the device's free memory; the one-line
            message gives the size in GB and the `layers=` that would fit.
    """
    started = time.perf_counter()
    device, dtype = resolve_device_dtype(device, dtype)
    model, shape = build_on_meta(name, layers, overrides, experts_implementation)
    full_layers = int(load_shape(name)["config"].get("text_config", load_shape(name)["config"])["num_hidden_layers"])
    fallback: tuple[str, ...] = ()
    if device.type != "meta":
        check_fits(model, shape, device, dtype)
        materialize(model, device, dtype)
        fallback = init_random(model, seed)
    else:  # no memory, but the parameters say the dtype `replica_info` reports
        materialize(model, device, dtype)
    for p in model.parameters():
        p.requires_grad_(False)
    text = model.config.get_text_config()
    layer_types = tuple(text.layer_types) if getattr(text, "layer_types", None) and shape["family"] == "uniform" else None
    experts = getattr(model.config, "_experts_implementation", None) if _has_experts(text) else None
    info = ReplicaInfo(
        name=shape["name"], checkpoint=shape["checkpoint"], transformers_class=shape["transformers_class"],
        layers=int(text.num_hidden_layers), full_layers=full_layers, dtype=str(dtype).replace("torch.", ""),
        device=str(device), parameters=sum(p.numel() for _, p in distinct_parameters(model)),
        parameter_bytes=parameter_bytes(model, dtype), build_seconds=time.perf_counter() - started,
        overrides=dict(overrides or {}), layer_types=layer_types, experts_implementation=experts,
        fallback_init=fallback)
    if shape["family"] == "uniform":
        attach_generation_config(model, shape)
        out = model
    else:
        from dlm.replicas.masked import MaskedReplica

        out = MaskedReplica(model, block_length=shape["decoding"].get("block_length")
                            if shape["decoding"].get("block_causal") else None).eval()
    out.replica_info = info
    return out


def _has_experts(text_config) -> bool:
    return bool(getattr(text_config, "num_experts", None) or getattr(text_config, "n_routed_experts", None))

