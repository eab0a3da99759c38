"""Our solvers as drop-in schedulers in diffusers' own img2img pipelines, against diffusers' schedulers.

The pipelines are diffusers' (``StableDiffusionImg2ImgPipeline``, ``StableDiffusion3Img2ImgPipeline``):
they slice ``scheduler.timesteps`` by ``strength``, call ``set_begin_index`` where the scheduler has
it, noise the encoded image to the first kept level and step from there. The models are tiny
random-weight ones (the builders of ``tests/caching/tiny.py``, a one-level VAE), with prompt embeddings
passed in (no tokenizer can be downloaded). The same pipeline with diffusers' scheduler of the same
config is the reference: same latents to float32 rounding at every strength.
"""

import pytest
import torch
from diffusers import (
    AutoencoderKL,
    DDIMScheduler,
    DPMSolverMultistepScheduler,
    FlowMatchEulerDiscreteScheduler,
    FlowMatchHeunDiscreteScheduler,
    PNDMScheduler,
    StableDiffusion3Img2ImgPipeline,
    StableDiffusionImg2ImgPipeline,
    UniPCMultistepScheduler,
)

from samplers.solvers import solver_from_pipeline
from tests.caching.tiny import TEXT_DIM, tiny_sd3, tiny_unet

torch.set_num_threads(1)

SD15 = dict(beta_schedule="scaled_linear", beta_start=0.00085, beta_end=0.012, steps_offset=1)
# our solver name -> diffusers' scheduler of the same config (SD 1.5's schedule)
VP = {
    "ddim": DDIMScheduler(**SD15, clip_sample=False, set_alpha_to_one=False),
    "pndm": PNDMScheduler(**SD15, skip_prk_steps=False, set_alpha_to_one=False),
    "plms": PNDMScheduler(**SD15, skip_prk_steps=True, set_alpha_to_one=False),
    "dpmpp-2m": DPMSolverMultistepScheduler(**SD15),
    "dpmpp-3m": DPMSolverMultistepScheduler(**SD15, solver_order=3),
    "dpmpp-2m-sde": DPMSolverMultistepScheduler(**SD15, algorithm_type="sde-dpmsolver++"),
    "unipc": UniPCMultistepScheduler(**SD15),
}
FLOW = {
    "flow-euler": FlowMatchEulerDiscreteScheduler(shift=3.0),
    "flow-heun": FlowMatchHeunDiscreteScheduler(shift=3.0),
}
STRENGTHS = [0.3, 0.5, 0.8]


def _vae(latent_channels=4):
    torch.manual_seed(0)
    return AutoencoderKL(
        block_out_channels=(8,), in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",),
        up_block_types=("UpDecoderBlock2D",), latent_channels=latent_channels, norm_num_groups=4, sample_size=8,
    ).eval()


@pytest.fixture(scope="module")
def sd_parts():
    return tiny_unet(width=8), _vae()


@pytest.fixture(scope="module")
def sd3_parts():
    vae = _vae()
    vae.register_to_config(shift_factor=0.0, scaling_factor=1.0)  # SD3's pipeline reads both
    return tiny_sd3(layers=2, heads=2, head_dim=8), vae


def _inputs():
    g = torch.Generator().manual_seed(0)
    emb = torch.randn(1, 6, TEXT_DIM, generator=g)
    return g, emb, torch.rand(1, 3, 8, 8, generator=g)  # an image in [0, 1]


def _sd_pipe(parts, scheduler):
    unet, vae = parts
    pipe = StableDiffusionImg2ImgPipeline(vae=vae, text_encoder=None, tokenizer=None, unet=unet, scheduler=scheduler,
                                          safety_checker=None, feature_extractor=None, requires_safety_checker=False)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _sd3_pipe(parts, scheduler):
    transformer, vae = parts
    pipe = StableDiffusion3Img2ImgPipeline(transformer=transformer, scheduler=scheduler, vae=vae, text_encoder=None,
                                           tokenizer=None, text_encoder_2=None, tokenizer_2=None, text_encoder_3=None,
                                           tokenizer_3=None)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _sd_img2img(pipe, strength):
    g, emb, image = _inputs()
    with torch.no_grad():
        return pipe(prompt_embeds=emb, negative_prompt_embeds=torch.zeros_like(emb), image=image, strength=strength,
                    num_inference_steps=10, guidance_scale=3.0, output_type="latent",
                    generator=torch.Generator().manual_seed(1)).images


def _sd3_img2img(pipe, strength):
    g, emb, image = _inputs()
    pooled = torch.randn(1, TEXT_DIM, generator=g)
    with torch.no_grad():
        return pipe(prompt_embeds=emb, negative_prompt_embeds=torch.zeros_like(emb), pooled_prompt_embeds=pooled,
                    negative_pooled_prompt_embeds=torch.zeros_like(pooled), image=image, strength=strength, height=8,
                    width=8, num_inference_steps=10, guidance_scale=3.0, output_type="latent",
                    generator=torch.Generator().manual_seed(1)).images


@pytest.mark.parametrize("strength", STRENGTHS)
@pytest.mark.parametrize("name", list(VP))
def test_sd_img2img_matches_diffusers(sd_parts, name, strength):
    pipe = _sd_pipe(sd_parts, type(VP[name]).from_config(VP[name].config))
    b = _sd_img2img(pipe, strength)
    pipe.scheduler = solver_from_pipeline(pipe, name)  # the drop-in: ours, from diffusers' config
    assert type(pipe.scheduler).__module__.startswith("samplers.solvers")
    a = _sd_img2img(pipe, strength)
    # diffusers' PNDM with the Runge-Kutta warm start restarts it from the top of the grid after the
    # img2img entry, so its latents grow (to ~50 here) and its float32 rounding with them: relative check
    tol = 2e-6 * max(1.0, b.abs().max().item())
    assert a.shape == b.shape and torch.isfinite(a).all()
    assert (a - b).abs().max().item() < tol


@pytest.mark.parametrize("strength", STRENGTHS)
@pytest.mark.parametrize("name", list(FLOW))
def test_sd3_img2img_matches_diffusers(sd3_parts, name, strength):
    pipe = _sd3_pipe(sd3_parts, type(FLOW[name]).from_config(FLOW[name].config))
    b = _sd3_img2img(pipe, strength)
    pipe.scheduler = solver_from_pipeline(pipe, name)
    assert type(pipe.scheduler).__module__.startswith("samplers.solvers")
    a = _sd3_img2img(pipe, strength)
    assert torch.isfinite(a).all()
    assert (a - b).abs().max().item() < 1e-5


def test_pndm_img2img_is_not_txt2img(sd_parts):
    # the strengths above take effect: a weaker strength gives latents nearer the encoded image
    pipe = _sd_pipe(sd_parts, VP["plms"])
    pipe.scheduler = solver_from_pipeline(pipe, "plms")
    lat = [_sd_img2img(pipe, s) for s in (0.3, 1.0)]
    assert (lat[0] - lat[1]).abs().max().item() > 0.1
