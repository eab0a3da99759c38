"""caching.module_forecast: Newton forecasts are exact on polynomials, a forecast step's module outputs
are the extrapolation of the computed ones, the schedules compute exactly the steps they say, and
bad settings are refused."""
from __future__ import annotations

import pytest
import torch

from diffusers import UNet2DModel

import caching
from caching.module_forecast import TaylorFactors
from tests.caching.tiny import sample, tiny_pixart, tiny_sd3, tiny_unet

STEPS = 8


@pytest.fixture(scope="module")
def models():
    return {"pixart": tiny_pixart(), "sd3": tiny_sd3()}


def poly(coeffs, s):
    return sum(c * s ** k for k, c in enumerate(coeffs))


@pytest.mark.parametrize("order", [0, 1, 2])
def test_newton_forecast_exact_on_polynomials_of_its_order(order):
    coeffs = [torch.randn(3, 4, generator=torch.Generator().manual_seed(k)) for k in range(order + 1)]
    f = TaylorFactors(order)
    for s in (0, 1, 4, 9):  # uneven gaps, as the adaptive schedule makes them
        f.update(poly(coeffs, s), s)
    for s in (10, 13):
        torch.testing.assert_close(f.predict(s), poly(coeffs, s), rtol=1e-5, atol=1e-4)
    if order < 2:  # one order too low is not exact: the test can fail
        g = TaylorFactors(order)
        quad = coeffs + [torch.ones(3, 4)]
        for s in (0, 1, 4, 9):
            g.update(poly(quad, s), s)
        assert not torch.allclose(g.predict(10), poly(quad, 10), atol=1e-2)


def test_factors_keep_tuples_and_nones_and_restart_on_new_shape():
    f = TaylorFactors(1)
    f.update((torch.zeros(2), None), 0)
    f.update((torch.ones(2), None), 1)
    out = f.predict(3)
    assert isinstance(out, tuple) and out[1] is None
    torch.testing.assert_close(out[0], torch.full((2,), 3.0))
    f.update((torch.ones(5), None), 2)  # another resolution: no difference against the old shape
    torch.testing.assert_close(f.predict(4)[0], torch.ones(5))


@pytest.mark.parametrize("name", ["pixart", "sd3"])
def test_forecast_steps_extrapolate_the_computed_outputs(models, name):
    model = models[name]
    ff = model.transformer_blocks[1].ff
    seen = []
    handle = ff.register_forward_hook(lambda m, i, o: seen.append(o.detach().clone()))
    try:
        caching.apply(model, caching.ForecastConfig(interval=3, warmup_steps=2))
        sample(model, STEPS)
    finally:
        handle.remove()
        caching.remove(model)
    assert len(seen) == STEPS  # torch hooks still see every call, computed or forecast
    y = seen
    # computed steps 0, 1, 2, 5; forecast 3, 4 from (1, 2) and 6, 7 from (2, 5)
    torch.testing.assert_close(y[3], y[2] + (y[2] - y[1]))
    torch.testing.assert_close(y[4], y[2] + 2 * (y[2] - y[1]))
    torch.testing.assert_close(y[6], y[5] + (y[5] - y[2]) / 3)
    torch.testing.assert_close(y[7], y[5] + 2 * (y[5] - y[2]) / 3)
    assert not torch.allclose(y[5], y[2] + 3 * (y[2] - y[1]))  # step 5 was really computed


class Counter:
    def __init__(self, module):
        self.n = 0
        self.handle = module.register_forward_pre_hook(self.hit)

    def hit(self, *_):
        self.n += 1


def inner_calls(module):
    """Count calls of a layer inside the module (the query projection of an attention, the first
    layer of a feed-forward): a pre-hook on the module itself fires even when the forecast hook
    returns without running it."""
    return Counter(module.to_q if hasattr(module, "to_q") else module.net[0])


@pytest.mark.parametrize("ff", [True, False])
@pytest.mark.parametrize("name", ["pixart", "sd3"])
def test_fixed_schedule_runs_modules_only_on_computed_steps(models, name, ff):
    model = models[name]
    blocks = model.transformer_blocks
    attn0, attn1 = (getattr(b, "attn1", None) or b.attn for b in blocks[:2])
    counters = {"probe": inner_calls(attn0), "attn": inner_calls(attn1), "ff": inner_calls(blocks[1].ff)}
    try:
        tracker = caching.apply(model, caching.ForecastConfig(interval=3, warmup_steps=2, ff=ff))
        sample(model, STEPS)
    finally:
        for c in counters.values():
            c.handle.remove()
        caching.remove(model)
    assert counters["probe"].n == STEPS  # block 0 (first_blocks=1) always runs
    assert counters["attn"].n == 4  # steps 0, 1, 2, 5
    assert counters["ff"].n == (4 if ff else STEPS)
    assert tracker.counters["steps_cached"] == 4 and tracker.counters["steps_computed"] == 4


ADAPTIVE = [  # (a setting that never forecasts, one that forecasts whenever the cap allows)
    # probe: no change is under 1e-12, every change is under 10; cap 3 -> computed 0, 1, 4, 7
    (caching.ForecastConfig(threshold=1e-12, interval=3, warmup_steps=2),
     caching.ForecastConfig(threshold=10.0, interval=3, warmup_steps=2)),
    # error control: no forecast meets 1e-12; every one meets 1e9, so the gap doubles -> 0, 1, 2, 4
    (caching.ForecastConfig(tolerance=1e-12, interval=8), caching.ForecastConfig(tolerance=1e9, interval=8)),
]


@pytest.mark.parametrize("never,always", ADAPTIVE, ids=["probe", "error-control"])
@pytest.mark.parametrize("name", ["pixart", "sd3"])
def test_adaptive_schedules_compute_what_they_decide(models, name, never, always):
    model = models[name]
    ref = sample(model, STEPS)
    attn1 = getattr(model.transformer_blocks[1], "attn1", None) or model.transformer_blocks[1].attn
    counter = inner_calls(attn1)
    try:
        tracker = caching.apply(model, never)
        assert torch.equal(sample(model, STEPS), ref)  # never forecasts: the uncached output, bit for bit
        assert tracker.counters["steps_cached"] == 0 and counter.n == STEPS
        caching.remove(model)
        counter.n = 0
        tracker = caching.apply(model, always)
        out = sample(model, STEPS)
        assert counter.n == 4 and tracker.counters["steps_cached"] == 4
        assert not torch.equal(out, ref)
    finally:
        counter.handle.remove()
        caching.remove(model)


def test_forecast_validation(models):
    with pytest.raises(ValueError, match="order must be 0, 1 or 2"):
        caching.parse_spec("forecast:order=3")
    with pytest.raises(ValueError, match="first_blocks >= 1"):
        caching.parse_spec("forecast:threshold=0.1,first_blocks=0")
    with pytest.raises(ValueError, match="interval must be >= 1"):
        caching.ForecastConfig(interval=0).validate()
    assert caching.parse_spec("forecast:interval=5,ff=0") == caching.ForecastConfig(interval=5, ff=False)
    with pytest.raises(ValueError, match="first_blocks must leave a block"):
        caching.apply(models["pixart"], caching.ForecastConfig(first_blocks=len(models["pixart"].transformer_blocks)))
    torch.manual_seed(0)
    no_attention = UNet2DModel(sample_size=8, in_channels=4, out_channels=4, layers_per_block=1,
                               block_out_channels=(16, 32), norm_num_groups=8,
                               down_block_types=("DownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "UpBlock2D"))
    with pytest.raises(ValueError, match="no transformer blocks"):
        caching.apply(no_attention, caching.ForecastConfig())
    assert not any(hasattr(m, "_diffusers_hook") for m in models["pixart"].modules())


def test_error_is_measured_against_the_forecast():
    f = TaylorFactors(1)
    f.update(torch.zeros(4), 0)
    f.update(torch.ones(4), 1)
    num, den = f.error(torch.full((4,), 3.0), 3, stride=1)  # forecast 3 * 1 = 3: exact
    assert num == 0 and den == 12
    num, den = f.error(torch.full((4,), 5.0), 3, stride=1)
    assert num == 8 and den == 20
    num, den = f.error(torch.tensor([5.0, 9.0, 7.0, 9.0]), 3, stride=2)  # elements 0 and 2 only
    assert num == 6 and den == 12
    assert f.error(torch.ones(6), 3) == (0.0, 0.0)  # another shape: nothing to compare


def test_tolerance_validation():
    with pytest.raises(ValueError, match="set one of them"):
        caching.ForecastConfig(tolerance=0.1, threshold=0.1).validate()
    with pytest.raises(ValueError, match="tolerance must be >= 0"):
        caching.parse_spec("forecast:tolerance=-1")


def test_unet_attention_layers_are_forecast():
    model = tiny_unet()
    blocks = [m for m in model.modules() if type(m).__name__ == "BasicTransformerBlock"]
    first, later = inner_calls(blocks[0].attn1), inner_calls(blocks[-1].attn2)
    try:
        ref = sample(model, STEPS)
        first.n = later.n = 0
        tracker = caching.apply(model, caching.ForecastConfig(interval=3, warmup_steps=2))
        out = sample(model, STEPS)
        assert first.n == STEPS and later.n == 4  # the first block is the probe; the others: steps 0, 1, 2, 5
        assert tracker.counters["steps_cached"] == 4
        assert not torch.equal(out, ref) and (out - ref).abs().max() < 0.5 * ref.abs().max()
    finally:
        first.handle.remove()
        later.handle.remove()
        caching.remove(model)


@pytest.mark.parametrize("interval,warmup,computed,forward", [
    # counted back from step 6 (= STEPS - 2); without num_steps, forward from the warm-up
    (2, 3, {0, 1, 2, 4, 6}, {0, 1, 2, 3, 5, 7}),
    (3, 2, {0, 1, 3, 6}, {0, 1, 2, 5}),
    (1, 3, set(range(STEPS)), set(range(STEPS))),  # interval 1 never forecasts, not even the last step
])
def test_num_steps_counts_the_schedule_back_from_the_step_before_the_last(interval, warmup, computed, forward):
    def computed_steps(cfg):
        return {s for s in range(STEPS) if not cfg.fixed_forecast(s)}
    assert computed_steps(caching.ForecastConfig(interval=interval, warmup_steps=warmup, num_steps=STEPS)) == computed
    assert computed_steps(caching.ForecastConfig(interval=interval, warmup_steps=warmup)) == forward


@pytest.mark.parametrize("name", ["pixart", "sd3"])
def test_num_steps_forecasts_the_last_step_under_every_schedule(models, name):
    model = models[name]
    attn1 = getattr(model.transformer_blocks[1], "attn1", None) or model.transformer_blocks[1].attn
    counter = inner_calls(attn1)
    try:
        for never in (caching.ForecastConfig(threshold=1e-12, interval=3, warmup_steps=2, num_steps=STEPS),
                      caching.ForecastConfig(tolerance=1e-12, interval=8, num_steps=STEPS)):
            counter.n = 0
            tracker = caching.apply(model, never)  # would compute every step without num_steps
            sample(model, STEPS)
            caching.remove(model)
            assert counter.n == STEPS - 1 and tracker.counters["steps_cached"] == 1
        tracker = caching.apply(model, caching.ForecastConfig(interval=2, warmup_steps=3, num_steps=STEPS))
        counter.n = 0
        sample(model, STEPS)
        assert counter.n == 5 and tracker.counters["steps_cached"] == 3  # steps 0, 1, 2, 4, 6 computed
    finally:
        counter.handle.remove()
        caching.remove(model)


def test_num_steps_refuses_a_longer_run_and_bad_values(models):
    model = models["pixart"]
    try:
        caching.apply(model, caching.parse_spec("forecast:interval=2,num_steps=4"))
        with pytest.raises(ValueError, match="num_steps=4.*num_inference_steps"):
            sample(model, 6)
    finally:
        caching.remove(model)
    with pytest.raises(ValueError, match="num_steps must be"):
        caching.ForecastConfig(num_steps=-1).validate()


@pytest.mark.parametrize("interval,warmup,num_steps,computed", [
    (3, 2, 0, {0, 1, 3, 6}),  # forward: from warmup_steps + 1
    (3, 3, 0, {0, 1, 2, 4, 7}),  # diffusers' TaylorSeer(cache_interval=3, disable_cache_before_step=3)
    (2, 3, STEPS, {0, 1, 2, 3, 5}),  # back from step STEPS - 3; the last two steps forecast
    (3, 2, STEPS, {0, 1, 2, 5}),
])
def test_offset_moves_the_fixed_schedule_inwards(interval, warmup, num_steps, computed):
    cfg = caching.ForecastConfig(interval=interval, warmup_steps=warmup, num_steps=num_steps, offset=1)
    assert {s for s in range(STEPS) if not cfg.fixed_forecast(s)} == computed
    with pytest.raises(ValueError, match=r"offset must be in \[0, interval\)"):
        caching.ForecastConfig(interval=interval, offset=interval).validate()
    with pytest.raises(ValueError, match="offset must be in"):
        caching.ForecastConfig(offset=-1).validate()
    with pytest.raises(ValueError, match="offset shifts the fixed schedule"):
        caching.parse_spec("forecast:tolerance=0.5,offset=1")


@pytest.mark.parametrize("interval", [2, 4])
def test_offset_1_is_diffusers_taylorseer_bit_for_bit(models, interval):
    """Same modules (every block's attention and feed-forwards), same steps, same order-1 factors in
    float32: diffusers' TaylorSeer and ``offset=1`` give the same latents, bit for bit."""
    import copy

    from diffusers import TaylorSeerCacheConfig
    from diffusers.hooks import apply_taylorseer_cache
    from diffusers.hooks.hooks import CacheContext, _set_cache_context

    model = models["sd3"]
    twin = copy.deepcopy(model)
    every = [r"^transformer_blocks\.\d+\.(attn|ff|ff_context)$"]
    apply_taylorseer_cache(twin, TaylorSeerCacheConfig(cache_interval=interval, cache_identifiers=every,
                                                       taylor_factors_dtype=torch.float32))
    _set_cache_context(twin, CacheContext("cfg"))  # SD3 opens none; diffusers' hooks need one
    theirs = sample(twin, STEPS)
    try:
        tracker = caching.apply(model, caching.ForecastConfig(interval=interval, first_blocks=0, offset=1))
        ours = sample(model, STEPS)
    finally:
        caching.remove(model)
    assert torch.equal(ours, theirs) and not torch.equal(ours, sample(model, STEPS))
    assert tracker.counters["steps_computed"] == len({0, 1, 2} | set(range(4, STEPS, interval)))


def test_adaptive_rule_forecasts_below_the_threshold_within_the_interval():
    """The adaptive schedule's rule, case by case: compute in the warm-up, after interval - 1 forecasts in
    a row, when the probe changed by the threshold or more, and always with interval 1; else forecast."""
    config = caching.ForecastConfig(threshold=0.1, interval=2, warmup_steps=3)
    small, large, edge = torch.tensor(0.05), torch.tensor(0.5), torch.tensor(0.1)
    assert config.adaptive_forecast(3, 0, small) is True
    assert config.adaptive_forecast(2, 0, small) is False  # warm-up
    assert config.adaptive_forecast(3, 1, small) is False  # interval 2: one forecast, then compute
    assert config.adaptive_forecast(3, 0, large) is False and config.adaptive_forecast(3, 0, edge) is False
    wide = caching.ForecastConfig(threshold=0.1, interval=4, warmup_steps=0)
    assert [wide.adaptive_forecast(5, run, small) for run in range(4)] == [True, True, True, False]
    assert caching.ForecastConfig(threshold=0.1, interval=1, warmup_steps=0).adaptive_forecast(5, 0, small) is False
