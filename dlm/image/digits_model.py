"""A class-conditioned diffusers transformer on scikit-learn's 8x8 digits, and its pipeline.

Model: diffusers' ``PixArtTransformer2DModel`` with a tiny config (sample_size 8, patch_size 2 -> 16
tokens, 1 channel in and out, epsilon prediction). The label reaches the network only through
cross-attention: ``DigitsLabelEmbedder`` maps a digit (0-9, or the null label 10 used for
classifier-free guidance) to ``num_tokens`` learned tokens of width ``cross_attention_dim``.
Noise schedule: variance preserving, linear betas 1e-4..0.02 over 1000 training steps (the DDPM
schedule), so any diffusers scheduler configured that way can drive it.

Pipeline: ``DigitsPipeline(transformer, label_embedder, scheduler)``;
``pipe(digits=[3, 7], num_inference_steps=20, guidance_scale=3.0, generator=g)`` returns
``DigitsPipelineOutput(images [N, 1, 8, 8] in [-1, 1], nfe, digits)``. ``pipe.scheduler`` can be
replaced by any compatible scheduler (``X.from_config(pipe.scheduler.config)``). NFE counts
transformer calls: with guidance the conditional and unconditional halves go in one batched call,
which counts once.
"""
from __future__ import annotations

import copy
import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import torch
import torch.nn as nn
from diffusers import DDIMScheduler, DiffusionPipeline, PixArtTransformer2DModel
from diffusers.configuration_utils import ConfigMixin, register_to_config
from diffusers.models.modeling_utils import ModelMixin

CHECKPOINT = Path(__file__).resolve().parent / "checkpoints" / "digits_dit"
NULL_LABEL = 10

#: The tiny PixArt config the shipped checkpoint uses (``scripts/train_digits_dit.py``).
TRANSFORMER_CONFIG = dict(
    num_attention_heads=2,
    attention_head_dim=48,
    in_channels=1,
    out_channels=1,
    num_layers=4,
    cross_attention_dim=32,
    sample_size=8,
    patch_size=2,
    norm_type="ada_norm_single",
    use_additional_conditions=False,
    caption_channels=None,
)
#: DDPM's linear-beta VP schedule; the shipped scheduler is DDIM (eta 0) on it.
SCHEDULE_CONFIG = dict(num_train_timesteps=1000, beta_start=1e-4, beta_end=0.02, beta_schedule="linear",
                       prediction_type="epsilon", clip_sample=False, set_alpha_to_one=True,
                       timestep_spacing="leading", steps_offset=1)


class DigitsLabelEmbedder(ModelMixin, ConfigMixin):
    """Digit label -> ``[B, num_tokens, embed_dim]`` cross-attention tokens.

    Label ``num_classes`` (10) is the null label used for classifier-free guidance.
    """

    @register_to_config
    def __init__(self, num_classes: int = 10, num_tokens: int = 4, embed_dim: int = 32):
        super().__init__()
        self.table = nn.Embedding(num_classes + 1, num_tokens * embed_dim)
        nn.init.normal_(self.table.weight, std=1.0)

    def forward(self, labels: torch.Tensor) -> torch.Tensor:
        cfg = self.config
        return self.table(labels.long()).view(labels.shape[0], cfg.num_tokens, cfg.embed_dim)


def build_transformer(**overrides) -> PixArtTransformer2DModel:
    return PixArtTransformer2DModel(**{**TRANSFORMER_CONFIG, **overrides})


def default_scheduler() -> DDIMScheduler:
    return DDIMScheduler(**SCHEDULE_CONFIG)


@dataclass
class DigitsPipelineOutput:
    """``images``: ``[N, 1, 8, 8]`` float32 in [-1, 1]; ``nfe``: transformer calls made;
    ``digits``: int64 ``[N]`` requested labels."""

    images: torch.Tensor
    nfe: int
    digits: torch.Tensor


def parse_digits(digits: int | Sequence[int] | torch.Tensor, device=None) -> torch.Tensor:
    """Validate requested digits -> int64 ``[N]``; anything outside 0-9 raises ValueError."""
    t = torch.as_tensor([digits] if isinstance(digits, int) else digits)
    if t.ndim != 1 or t.numel() == 0:
        raise ValueError("digits must be a non-empty list of integers 0-9")
    if t.is_floating_point() or ((t < 0) | (t > 9)).any():
        raise ValueError(f"digits must be integers 0-9, got {t.tolist()}")
    return t.long().to(device)


class DigitsPipeline(DiffusionPipeline):
    """Class-conditioned sampling of 8x8 digits; see the module docstring."""

    model_cpu_offload_seq = "label_embedder->transformer"

    def __init__(self, transformer: PixArtTransformer2DModel, label_embedder: DigitsLabelEmbedder, scheduler):
        super().__init__()
        self.register_modules(transformer=transformer, label_embedder=label_embedder, scheduler=scheduler)
        self.nfe = 0

    # -- model call -------------------------------------------------------------------------------
    @torch.no_grad()
    def predict_noise(self, x: torch.Tensor, t, digits: torch.Tensor, guidance_scale: float = 1.0) -> torch.Tensor:
        """Epsilon at timestep ``t`` for samples ``x`` [N, 1, 8, 8] conditioned on ``digits`` [N].

        With ``guidance_scale != 1`` the unconditional half rides in the same batch: one call.
        """
        n = x.shape[0]
        labels = digits.to(x.device)
        guided = guidance_scale != 1.0
        if guided:
            x_in = torch.cat([x, x])
            labels = torch.cat([labels, torch.full_like(labels, NULL_LABEL)])
        else:
            x_in = x
        tt = torch.as_tensor(t, device=x.device).reshape(-1).expand(x_in.shape[0])
        dtype = self.transformer.dtype
        enc = self.label_embedder(labels).to(dtype)
        x_in = self.scheduler.scale_model_input(x_in, t) if hasattr(self.scheduler, "scale_model_input") else x_in
        out = self.transformer(x_in.to(dtype), encoder_hidden_states=enc, timestep=tt,
                               added_cond_kwargs={"resolution": None, "aspect_ratio": None}).sample.float()
        self.nfe += 1
        if not guided:
            return out
        cond, uncond = out[:n], out[n:]
        return uncond + guidance_scale * (cond - uncond)

    def prepare_latents(self, n: int, generator=None, latents=None) -> torch.Tensor:
        shape = (n, 1, 8, 8)
        if latents is None:
            latents = torch.randn(shape, generator=generator, device=self.device if generator is None else generator.device)
        elif tuple(latents.shape) != shape:
            raise ValueError(f"latents must have shape {shape}, got {tuple(latents.shape)}")
        return latents.to(self.device, torch.float32) * self.scheduler.init_noise_sigma

    @torch.no_grad()
    def __call__(self, digits: int | Sequence[int] | torch.Tensor = (0, 1, 2, 3, 4, 5, 6, 7, 8, 9),
                 num_inference_steps: int = 20, guidance_scale: float = 3.0,
                 generator: torch.Generator | None = None, latents: torch.Tensor | None = None,
                 output_type: str = "pt", return_dict: bool = True,
                 callback: Callable[[int, int], None] | None = None):
        """Sample one image per requested digit. ``output_type="pil"`` gives upscaled PIL images."""
        if int(num_inference_steps) < 1:
            raise ValueError(f"num_inference_steps must be >= 1, got {num_inference_steps}")
        labels = parse_digits(digits, self.device)
        x = self.prepare_latents(labels.shape[0], generator, latents)
        self.nfe = 0
        self.scheduler.set_timesteps(int(num_inference_steps), device=self.device)
        timesteps = self.scheduler.timesteps
        # stochastic schedulers take the generator; deterministic ones (UniPC) reject the keyword
        step_kw = {"generator": generator} if "generator" in inspect.signature(self.scheduler.step).parameters else {}
        for i, t in enumerate(self.progress_bar(timesteps)):
            eps = self.predict_noise(x, t, labels, guidance_scale)
            x = self.scheduler.step(eps, t, x, **step_kw).prev_sample
            if callback is not None:
                callback(i, len(timesteps))
        images = x.clamp(-1, 1).float().cpu()
        if output_type == "pil":
            images = to_pil(images)
        out = DigitsPipelineOutput(images=images, nfe=self.nfe, digits=labels.cpu())
        return out if return_dict else (out.images,)

    def denoiser(self, digit: int, num_inference_steps: int = 20, guidance_scale: float = 3.0):
        """A ``samplers.search.noise_search.SchedulerDenoiser`` for one requested digit (noise search).

        It works on a private copy of this pipeline's scheduler; each candidate costs one NFE per
        grid step.
        """
        from samplers.search.noise_search import SchedulerDenoiser

        label = parse_digits([digit], self.device)

        def eps_fn(x: torch.Tensor, t) -> torch.Tensor:
            return self.predict_noise(x, t, label.expand(x.shape[0]), guidance_scale)

        return SchedulerDenoiser(eps_fn, copy.deepcopy(self.scheduler), num_inference_steps,
                                 sample_shape=(1, 8, 8), postprocess=lambda x: x.clamp(-1, 1))


def to_pil(images: torch.Tensor, scale: int = 8):
    """``[N, 1, 8, 8]`` in [-1, 1] -> list of grayscale PIL images, nearest-neighbour upscaled."""
    from PIL import Image

    arr = ((images.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).cpu().numpy()
    return [Image.fromarray(a[0]).resize((8 * scale, 8 * scale), Image.NEAREST) for a in arr]


def image_grid(images: torch.Tensor, ncols: int | None = None, scale: int = 8, pad: int = 1):
    """Tile ``[N, 1, 8, 8]`` images into one PIL image (nearest-neighbour upscale, grey gutters)."""
    from PIL import Image

    n = images.shape[0]
    ncols = ncols or min(n, 10)
    nrows = (n + ncols - 1) // ncols
    side = 8 * scale
    grid = Image.new("L", (ncols * (side + pad) + pad, nrows * (side + pad) + pad), color=128)
    for i, im in enumerate(to_pil(images, scale)):
        r, c = divmod(i, ncols)
        grid.paste(im, (pad + c * (side + pad), pad + r * (side + pad)))
    return grid


def labeled_grid(images: torch.Tensor, captions: list[str], title: str, ncols: int | None = None, scale: int = 12):
    """A readable grid: each ``[1, 8, 8]`` image upscaled ``scale``x with its caption underneath
    (e.g. "asked 3 / got 3") and a title line on top (solver, steps, guidance). Returns a PIL image."""
    from PIL import Image, ImageDraw, ImageFont

    n = images.shape[0]
    if len(captions) != n:
        raise ValueError(f"captions has {len(captions)} entries for {n} images")
    ncols = ncols or min(n, 10)
    nrows = (n + ncols - 1) // ncols
    font = ImageFont.load_default()
    side, pad, cap_h, title_h = 8 * scale, 6, 16, 22
    width = max(ncols * (side + pad) + pad, 8 * len(title) + 2 * pad)
    grid = Image.new("L", (width, title_h + nrows * (side + cap_h + pad) + pad), color=255)
    draw = ImageDraw.Draw(grid)
    draw.text((pad, 4), title, fill=0, font=font)
    for i, (im, caption) in enumerate(zip(to_pil(images, scale), captions)):
        r, c = divmod(i, ncols)
        x, y = pad + c * (side + pad), title_h + r * (side + cap_h + pad)
        grid.paste(im, (x, y))
        draw.text((x + 2, y + side + 2), caption, fill=0, font=font)
    return grid


def load_digits_pipeline(path: str | Path | None = None, device: str | torch.device = "cpu") -> DigitsPipeline:
    """Load the shipped digits pipeline (transformer, label embedder, DDIM scheduler).

    Equivalent to ``DigitsPipeline.from_pretrained(CHECKPOINT)`` with the progress bar off.
    """
    path = Path(path) if path is not None else CHECKPOINT
    if not (path / "transformer").exists():
        raise FileNotFoundError(f"no digits checkpoint at {path}; train one with scripts/train_digits_dit.py")
    if (path / "model_index.json").exists():  # the standard diffusers layout
        from diffusers.utils import logging as dlogging

        bar_was_on = dlogging.is_progress_bar_enabled()
        dlogging.disable_progress_bar()  # no "Loading pipeline components" bar on the CLI's stderr
        try:
            pipe = DigitsPipeline.from_pretrained(path)
        finally:
            if bar_was_on:
                dlogging.enable_progress_bar()
    else:
        pipe = DigitsPipeline(PixArtTransformer2DModel.from_pretrained(path / "transformer"),
                              DigitsLabelEmbedder.from_pretrained(path / "label_embedder"),
                              DDIMScheduler.from_pretrained(path / "scheduler"))
    pipe.transformer.eval()
    pipe.label_embedder.eval()
    pipe.set_progress_bar_config(disable=True)
    return pipe.to(device)
