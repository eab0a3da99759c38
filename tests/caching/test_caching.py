"""caching: exactness on full-compute steps, exact removal, counters proving skipped work,
repeatability across calls, img2img, the shipped DigitsPipeline, and input validation."""
from __future__ import annotations

import pytest
import torch

import caching
from caching._core import StepTracker
from tests.caching.tiny import sample, tiny_pixart, tiny_sd3, tiny_unet

STEPS = 8
NEVER_SKIP = [caching.BlockCacheConfig(threshold=0.0), caching.DeepCacheConfig(interval=1),
              caching.TGateConfig(gate_step=STEPS + 1, self_attn=True, warmup_steps=STEPS + 1),
              caching.ForecastConfig(interval=1)]
SKIPPING = [caching.BlockCacheConfig(threshold=10.0, warmup_steps=2, max_cached_steps=2),
            caching.DeepCacheConfig(interval=3), caching.TGateConfig(gate_step=3, self_attn=True, sp_interval=2),
            caching.ForecastConfig(interval=3, warmup_steps=2)]
MODELS = {"unet": tiny_unet, "pixart": tiny_pixart, "sd3": tiny_sd3}


def applies(name: str, config) -> bool:
    if isinstance(config, caching.BlockCacheConfig) and name == "unet":
        return False  # no transformer_blocks list
    if isinstance(config, caching.TGateConfig) and name == "sd3":
        return False  # joint attention, no cross-attention
    return True


CASES = [(m, c) for m in MODELS for c in range(len(NEVER_SKIP)) if applies(m, NEVER_SKIP[c])]
REFUSED = [(m, c) for m in MODELS for c in range(len(NEVER_SKIP)) if not applies(m, NEVER_SKIP[c])]
assert len(CASES) == 10 and len(REFUSED) == 2 and all(applies(m, SKIPPING[c]) for m, c in CASES)


@pytest.fixture(scope="module")
def models():
    return {k: f() for k, f in MODELS.items()}


@pytest.mark.parametrize("name,ci", REFUSED)
def test_a_cache_that_does_not_apply_is_refused_and_attaches_nothing(models, name, ci):
    model = models[name]
    for cfg in (NEVER_SKIP[ci], SKIPPING[ci]):
        with pytest.raises(ValueError, match="use "):
            caching.apply(model, cfg)
        assert not hasattr(model, "_diffusers_hook")  # nothing half-attached
        assert all("forward" not in m.__dict__ for m in model.modules())


@pytest.mark.parametrize("name,ci", CASES)
def test_never_skip_is_exact_and_removal_restores(models, name, ci):
    model, cfg = models[name], NEVER_SKIP[ci]
    ref = sample(model, STEPS)
    tracker = caching.apply(model, cfg)
    assert torch.equal(sample(model, STEPS), ref)
    skipped = {k: v for k, v in tracker.counters.items() if "skipped" in k or "cached" in k or "halved" in k}
    assert not any(skipped.values()), skipped
    assert caching.remove(model) > 0
    assert all(not hasattr(m, "_diffusers_hook") and "forward" not in m.__dict__ for m in model.modules())
    assert torch.equal(sample(model, STEPS), ref)


@pytest.mark.parametrize("name,ci", CASES)
def test_skipping_is_exact_before_first_skip_repeatable_and_resets(models, name, ci):
    model, cfg = models[name], SKIPPING[ci]
    # every cache here computes the first two steps fully: two-step runs are exact
    ref2, ref = sample(model, 2), sample(model, STEPS)
    init = torch.randn(1, 4, 8, 8, generator=torch.Generator().manual_seed(5))
    ref_i2i = sample(model, STEPS, init=init, strength=0.75)
    tracker = caching.apply(model, cfg)
    try:
        assert torch.equal(sample(model, 2), ref2)
        a, b = sample(model, STEPS), sample(model, STEPS)
        assert torch.equal(a, b)  # state reset between calls
        assert not torch.equal(a, ref)  # something was reused
        assert (a - ref).abs().max() < 0.5 * ref.abs().max()  # ...and the result is still close
        # img2img after text-to-image equals img2img on a freshly attached cache
        i2i = sample(model, STEPS, init=init, strength=0.75)
        assert tracker.counters["runs"] == 4
        caching.remove(model)
        caching.apply(model, cfg)
        assert torch.equal(sample(model, STEPS, init=init, strength=0.75), i2i)
        assert not torch.equal(i2i, ref_i2i)
    finally:
        caching.remove(model)


class CountingProcessor:
    def __init__(self, inner):
        self.inner, self.calls, self.batches = inner, 0, []

    def __call__(self, attn, hidden_states, *args, **kwargs):
        self.calls += 1
        self.batches.append(hidden_states.shape[0])
        return self.inner(attn, hidden_states, *args, **kwargs)


@pytest.mark.parametrize("name", ["unet", "pixart"])
def test_tgate_skips_cross_attention_and_halves_batch_after_gate(models, name):
    model = models[name]
    block = next(m for m in model.modules() if type(m).__name__ == "BasicTransformerBlock")
    attn1, attn2 = block.attn1, block.attn2
    procs = {}
    for a in (attn1, attn2):
        procs[a] = CountingProcessor(a.processor)
        a.processor = procs[a]
    try:
        gate = 3
        tracker = caching.apply(model, caching.TGateConfig(gate_step=gate, self_attn=True, warmup_steps=1,
                                                           sp_interval=100, fi_interval=2))
        sample(model, STEPS, batch=2)
        cross, selfp = procs[attn2], procs[attn1]
        assert cross.calls == gate and cross.batches == [4] * gate  # CFG batch 2B, then never again
        # self-attention: steps 0, 1 (warm-up, then every 100), 3 (gate), 5, 7 (fi_interval 2)
        assert selfp.batches == [4, 4, 2, 2, 2]
        assert tracker.counters["calls_halved"] == STEPS - gate
    finally:
        caching.remove(model)
        for a, p in procs.items():
            a.processor = p.inner


def test_tgate_without_cfg_batch_keeps_batch(models):
    model = models["pixart"]
    tracker = caching.apply(model, caching.TGateConfig(gate_step=2))
    x = torch.randn(2, 4, 8, 8)
    enc = torch.randn(2, 6, 32)
    for t in (900, 600, 300):  # different samples in the batch: not CFG, never halved
        out = model(x, encoder_hidden_states=enc, timestep=torch.tensor([t, t]),
                    added_cond_kwargs={"resolution": None, "aspect_ratio": None}).sample
        assert out.shape[0] == 2
    assert tracker.counters["calls_halved"] == 0 and tracker.counters["xattn_cached"] > 0
    caching.remove(model)


@pytest.mark.parametrize("last_blocks", [0, 1])
@pytest.mark.parametrize("name", ["pixart", "sd3"])
def test_block_cache_skips_middle_blocks(models, name, last_blocks):
    model = models[name]
    calls = [0] * len(model.transformer_blocks)
    handles = [(getattr(b, "attn1", None) or b.attn).register_forward_hook(lambda m, i, o, k=k: calls.__setitem__(k, calls[k] + 1))
               for k, b in enumerate(model.transformer_blocks)]
    try:
        tracker = caching.apply(model, caching.BlockCacheConfig(threshold=10.0, last_blocks=last_blocks,
                                                                 warmup_steps=2, max_cached_steps=2))
        sample(model, STEPS)
        # steps 0,1 full, then 2 skipped / 1 computed: 2,3 skip, 4 full, 5,6 skip, 7 full
        computed = STEPS - 4
        assert calls[0] == STEPS  # the probe always runs
        assert calls[-1] == (STEPS if last_blocks else computed)
        assert calls[1:-1] == [computed] * (len(calls) - 2)
        assert tracker.counters["steps_cached"] == 4 and tracker.counters["steps_computed"] == computed
        middle = len(calls) - 1 - last_blocks  # the cached range: after the probe, before the last blocks
        assert tracker.counters["blocks_computed"] == computed * middle
        assert tracker.counters["blocks_skipped"] == 4 * middle
    finally:
        for h in handles:
            h.remove()
        caching.remove(model)


def test_deepcache_unet_skips_deep_blocks(models):
    model = models["unet"]
    calls = {"mid": 0, "down0": 0, "down1": 0, "up0": 0, "up1": 0}
    watched = {"mid": model.mid_block, "down0": model.down_blocks[0], "down1": model.down_blocks[1],
               "up0": model.up_blocks[0], "up1": model.up_blocks[1]}
    # count calls of a sub-module: the cache hook sits on the block itself, so the block's own
    # pre-hooks would fire even when the cache returns the stored output
    handles = [b.resnets[0].register_forward_pre_hook(lambda m, a, k=k: calls.__setitem__(k, calls[k] + 1))
               for k, b in watched.items()]
    try:
        caching.apply(model, caching.DeepCacheConfig(interval=3, warmup_steps=1))
        sample(model, STEPS)
        full = 4  # steps 0 (warm-up), 1, 4, 7
        assert calls == {"mid": full, "down0": STEPS, "down1": full, "up0": full, "up1": STEPS}
    finally:
        for h in handles:
            h.remove()
        caching.remove(model)


def test_deepcache_shallow_layers_runs_only_the_branch_layers():
    """shallow_layers=1 (DeepCache's branch 0): on cached steps the outermost up block runs only its
    last layer and the outermost down block nothing; shallow_layers=all up layers reproduces the
    whole-block cache exactly (the down block's downsampler feeds only cached deep blocks)."""
    from tests.caching.tiny import tiny_sd_unet

    model = tiny_sd_unet()
    up, down = model.up_blocks[-1], model.down_blocks[0]
    calls = {"up_first": 0, "up_last": 0, "down_first": 0}
    # a sub-module of each resnet: the cache hook sits on the resnet itself (its pre-hooks always fire)
    watched = {"up_first": up.resnets[0].conv1, "up_last": up.resnets[-1].conv1, "down_first": down.resnets[0].conv1}
    handles = [m.register_forward_pre_hook(lambda m, a, k=k: calls.__setitem__(k, calls[k] + 1))
               for k, m in watched.items()]
    try:
        whole = caching.DeepCacheConfig(interval=3, warmup_steps=1)
        caching.apply(model, whole)
        ref = sample(model, STEPS)
        caching.remove(model)
        calls.update(dict.fromkeys(calls, 0))
        tracker = caching.apply(model, caching.DeepCacheConfig(interval=3, warmup_steps=1, shallow_layers=1))
        out = sample(model, STEPS)
        full = 4  # steps 0 (warm-up), 1, 4, 7
        assert calls == {"up_first": full, "up_last": STEPS, "down_first": full}
        assert tracker.counters["blocks_skipped"] > 0 and not torch.equal(out, ref)
        caching.remove(model)
        caching.apply(model, caching.DeepCacheConfig(interval=3, warmup_steps=1, shallow_layers=len(up.resnets)))
        assert torch.equal(sample(model, STEPS), ref)
    finally:
        for h in handles:
            h.remove()
        caching.remove(model)


def test_deepcache_without_warmup_computes_every_interval_from_step_zero(models):
    """warmup_steps=0: full steps 0, 3, 6 (the DeepCache package's uniform schedule; with
    shallow_layers=1 our output equals the package's bit for bit, docs/caching.md)."""
    model = models["unet"]
    calls = []
    handle = model.down_blocks[1].resnets[0].conv1.register_forward_pre_hook(lambda m, a: calls.append(1))
    try:
        tracker = caching.apply(model, caching.DeepCacheConfig(interval=3, warmup_steps=0))
        sample(model, STEPS)
        assert len(calls) == 3 and tracker.counters["blocks_computed"] > 0  # steps 0, 3, 6 of 8
    finally:
        handle.remove()
        caching.remove(model)


@pytest.mark.parametrize("cfg,match", [(caching.DeepCacheConfig(shallow=2, shallow_layers=1), "needs shallow=1"),
                                       (caching.DeepCacheConfig(shallow_layers=-1), "shallow_layers must be >= 0"),
                                       (caching.DeepCacheConfig(shallow_layers=4), "between 1 and")])
def test_deepcache_shallow_layers_validation(cfg, match):
    from tests.caching.tiny import tiny_sd_unet

    model = tiny_sd_unet()
    with pytest.raises(ValueError, match=match):
        caching.apply(model, cfg)
    assert not any(hasattr(m, "_diffusers_hook") for m in model.modules())


def test_deepcache_shallow_layers_refused_on_a_transformer(models):
    with pytest.raises(ValueError, match="for a transformer use first_blocks"):
        caching.apply(models["pixart"], caching.DeepCacheConfig(shallow_layers=1))
    assert not any(hasattr(m, "_diffusers_hook") for m in models["pixart"].modules())


def test_tracker_steps_branches_and_runs():
    tr = StepTracker()
    seen = []
    for t in (999, 999, 800, 800, 500, 999, 700, 300):
        tr.begin(t)
        tr.state["x"] = t
        seen.append((tr.step, tr.branch))
    assert seen == [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (0, 0), (1, 0), (2, 0)]
    assert tr.counters["runs"] == 2 and tr.state["x"] == 300 and set(tr._states) == {0}


def test_digits_pipeline_repeatable_and_accurate():
    from dlm.image.digits_model import load_digits_pipeline
    from dlm.image.metrics import digit_accuracy

    pipe = load_digits_pipeline()
    digits = list(range(10))
    ref = pipe(digits=digits, num_inference_steps=10, generator=torch.Generator().manual_seed(0)).images
    ref_acc = digit_accuracy(ref, torch.tensor(digits))
    for cfg in (caching.TGateConfig(gate_step=5, cond_index=0), caching.BlockCacheConfig(threshold=0.2),
                caching.DeepCacheConfig(interval=2), caching.ForecastConfig(interval=2)):
        tracker = caching.apply(pipe, cfg)
        try:
            a = pipe(digits=digits, num_inference_steps=10, generator=torch.Generator().manual_seed(0)).images
            b = pipe(digits=digits, num_inference_steps=10, generator=torch.Generator().manual_seed(0)).images
        finally:
            caching.remove(pipe)
        assert torch.equal(a, b), type(cfg).__name__
        assert not torch.equal(a, ref) and tracker.counters["runs"] == 2
        assert digit_accuracy(a, torch.tensor(digits)) >= ref_acc - 0.1 - 1e-6, type(cfg).__name__  # at most one of ten lost


def test_validation_messages(models):
    with pytest.raises(ValueError, match="choose from"):
        caching.parse_spec("nope")
    with pytest.raises(ValueError, match="key=value"):
        caching.parse_spec("tgate:gate=3")
    with pytest.raises(ValueError, match="must be a int"):
        caching.parse_spec("tgate:gate_step=x")
    assert caching.parse_spec("tgate:gate_step=4,self_attn=true", cond_index=0) == caching.TGateConfig(
        gate_step=4, self_attn=True, cond_index=0)
    with pytest.raises(ValueError, match="threshold"):
        caching.BlockCacheConfig(threshold=-1).validate()
    with pytest.raises(ValueError, match="must be one of"):
        caching.apply(models["pixart"], object())
    with pytest.raises(ValueError, match="middle block"):
        caching.apply(models["pixart"], caching.BlockCacheConfig(first_blocks=2, last_blocks=2))
    caching.apply(models["pixart"], caching.DeepCacheConfig())
    with pytest.raises(ValueError, match="already attached"):
        caching.apply(models["pixart"], caching.TGateConfig())
    caching.remove(models["pixart"])
