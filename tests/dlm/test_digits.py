"""Digits transformer, pipeline, classifiers and metrics (shipped checkpoints, a few steps only)."""
import pytest
import torch
from diffusers import DPMSolverMultistepScheduler, UniPCMultistepScheduler

from dlm.image.digits_classifier import digits_split, load_digits_classifier
from dlm.image.digits_model import (NULL_LABEL, DigitsPipeline, image_grid, load_digits_pipeline, parse_digits,
                                   to_pil)
from dlm.image.metrics import digit_accuracy, frechet_distance
from samplers.solvers import solver_from_pipeline
from samplers.solvers.dpmpp_2m import DPMSolverPP2M

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def pipe():
    return load_digits_pipeline()


def _reference_loop(pipe, digits, steps, guidance_scale, seed):
    """The pipeline's sampling written out here: the two guidance passes as separate calls of the
    transformer (the pipeline batches them), ``un + s (cond - un)``, a fresh copy of its scheduler."""
    import copy

    sched = copy.deepcopy(pipe.scheduler)
    sched.set_timesteps(steps)
    labels = torch.tensor(digits)
    x = torch.randn((len(digits), 1, 8, 8), generator=torch.Generator().manual_seed(seed)) * sched.init_noise_sigma
    null = torch.full_like(labels, NULL_LABEL)

    def eps(x, t, lab):
        tt = torch.full((x.shape[0],), int(t))
        return pipe.transformer(sched.scale_model_input(x, t), encoder_hidden_states=pipe.label_embedder(lab), timestep=tt,
                                added_cond_kwargs={"resolution": None, "aspect_ratio": None}).sample.float()
    with torch.no_grad():
        for t in sched.timesteps:
            cond, un = eps(x, t, labels), eps(x, t, null)
            x = sched.step(un + guidance_scale * (cond - un), t, x).prev_sample
    return x.clamp(-1, 1)


@pytest.mark.parametrize("guidance_scale", [1.0, 3.0])
def test_pipeline_equals_its_sampling_loop_written_out(pipe, guidance_scale):
    out = pipe(digits=[3, 7, 0], num_inference_steps=4, guidance_scale=guidance_scale,
               generator=torch.Generator().manual_seed(0))
    ref = _reference_loop(pipe, [3, 7, 0], 4, guidance_scale, seed=0)
    torch.testing.assert_close(out.images, ref, atol=1e-5, rtol=0)
    assert out.images.std() > 0.1  # not a constant image


def test_pipeline_draws_the_digits_it_is_asked_for(pipe):
    # the shipped model at 20 steps: the classifier reads back most of the requested digits (the
    # benchmark's 30-sample figure is 93%); one sample per digit here
    digits = list(range(10))
    out = pipe(digits=digits, num_inference_steps=20, generator=torch.Generator().manual_seed(0))
    assert digit_accuracy(out.images, torch.tensor(digits)) >= 0.7


def test_pipeline_shapes_and_nfe(pipe):
    assert isinstance(pipe, DigitsPipeline)
    out = pipe(digits=[3, 7, 0], num_inference_steps=4, guidance_scale=3.0, generator=torch.Generator().manual_seed(0))
    assert out.images.shape == (3, 1, 8, 8) and out.images.dtype == torch.float32
    assert out.images.min() >= -1 and out.images.max() <= 1
    assert out.nfe == 4  # CFG halves share one batched call per step
    assert out.digits.tolist() == [3, 7, 0]
    assert pipe(digits=[1], num_inference_steps=3, guidance_scale=1.0).nfe == 3


def test_pipeline_seeded_determinism_and_latents(pipe):
    a = pipe(digits=[1, 2], num_inference_steps=3, generator=torch.Generator().manual_seed(5)).images
    b = pipe(digits=[1, 2], num_inference_steps=3, generator=torch.Generator().manual_seed(5)).images
    c = pipe(digits=[1, 2], num_inference_steps=3, generator=torch.Generator().manual_seed(6)).images
    assert torch.equal(a, b) and not torch.equal(a, c)
    lat = torch.randn(2, 1, 8, 8, generator=torch.Generator().manual_seed(5))
    d = pipe(digits=[1, 2], num_inference_steps=3, latents=lat).images
    assert torch.allclose(a, d)
    with pytest.raises(ValueError):
        pipe(digits=[1, 2], latents=torch.randn(3, 1, 8, 8))


@pytest.mark.parametrize("cls", [DPMSolverMultistepScheduler, UniPCMultistepScheduler])
def test_scheduler_swap(pipe, cls):
    original = pipe.scheduler
    try:
        pipe.scheduler = cls.from_config(original.config)
        out = pipe(digits=[4, 5], num_inference_steps=5, generator=torch.Generator().manual_seed(0))
        assert out.images.shape == (2, 1, 8, 8) and torch.isfinite(out.images).all()
        assert out.nfe == 5
    finally:
        pipe.scheduler = original


def test_project_solver_swap_gives_diffusers_images(pipe):
    original = pipe.scheduler
    try:
        pipe.scheduler = DPMSolverMultistepScheduler.from_config(original.config)
        ref = pipe(digits=[6, 2], num_inference_steps=4, generator=torch.Generator().manual_seed(0)).images
        pipe.scheduler = solver_from_pipeline(pipe, "dpmpp-2m")
        assert isinstance(pipe.scheduler, DPMSolverPP2M)
        out = pipe(digits=[6, 2], num_inference_steps=4, generator=torch.Generator().manual_seed(0))
        assert out.images.shape == (2, 1, 8, 8) and out.nfe == 4
        torch.testing.assert_close(out.images, ref, atol=1e-5, rtol=0)
    finally:
        pipe.scheduler = original


def test_bad_digits():
    for bad in ([10], [-1], [], [1.5]):
        with pytest.raises(ValueError):
            parse_digits(bad)


def test_classifiers_on_real_test_digits():
    split = digits_split()
    assert split.test_images.shape == (360, 1, 8, 8) and split.train_images.shape[0] == 1437
    assert split.test_images.min() >= -1 and split.test_images.max() <= 1
    for name in ("cnn", "mlp"):
        clf = load_digits_classifier(name)
        acc = digit_accuracy(split.test_images, split.test_labels, clf)
        assert acc > 0.9, (name, acc)
        assert clf.features(split.test_images[:5]).shape == (5, 64)
    with pytest.raises(ValueError):
        load_digits_classifier("cnn").logits(torch.zeros(2, 8, 8))


def test_frechet_distance_orders_real_above_noise():
    split = digits_split()
    real = frechet_distance(split.train_images[:360])
    noise = frechet_distance(torch.rand(360, 1, 8, 8) * 2 - 1)
    assert 0 <= real < noise


def test_pil_helpers():
    imgs = torch.linspace(-1, 1, 3 * 64).reshape(3, 1, 8, 8)
    pils = to_pil(imgs, scale=4)
    assert len(pils) == 3 and pils[0].size == (32, 32)
    assert image_grid(imgs, scale=4).size[0] > 3 * 32


def test_search_on_digits_respects_budget(pipe):
    from samplers.search.noise_search import random_search
    from dlm.image.digits_classifier import digits_verifier

    den = pipe.denoiser(7, num_inference_steps=3, guidance_scale=3.0)
    res = random_search(den, digits_verifier(7), budget_nfe=10, generator=torch.Generator().manual_seed(0))
    assert res.nfe == 9 and res.scores.shape == (3,)
    assert res.best_score == pytest.approx(res.scores.max().item())
