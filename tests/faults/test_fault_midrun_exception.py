"""A model that raises in the middle of a generation leaves nothing behind: the same model (and its
KV caches, caching hooks, video.streamline patches) then gives exactly the output of a clean run."""
from __future__ import annotations

import pytest
import torch

import caching
import dlm
import video
from dlm.tiny import TinyCharTokenizer, TinyDLMConfig, TinyDLMModel
from tests.caching.tiny import sample, tiny_pixart, tiny_unet
from tests.video.video_tiny import motion_inputs, tiny_motion_unet


class Boom(RuntimeError):
    pass


def raise_on_call(module: torch.nn.Module, n: int):
    """A pre-hook that raises on the n-th call of `module` (1-based); returns its handle."""
    calls = [0]

    def hook(*_):
        calls[0] += 1
        if calls[0] == n:
            raise Boom(f"injected fault at call {n}")
    return module.register_forward_pre_hook(hook)


@pytest.fixture(scope="module")
def lm():
    torch.manual_seed(0)
    tok = TinyCharTokenizer()
    config = TinyDLMConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                           intermediate_size=64, mask_token_id=tok.mask_token_id, eos_token_id=tok.eos_token_id,
                           pad_token_id=tok.pad_token_id)
    return TinyDLMModel(config).eval()


def _prompts():
    ids = torch.randint(3, 40, (2, 7), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    ids[0, :3], mask[0, :3] = 0, 0  # one left-padded row
    return ids, mask


@pytest.mark.parametrize("kv_cache", ["none", "prefix", "dual"])
@pytest.mark.parametrize("sampler", ["confidence", "threshold"])
def test_generate_after_a_mid_run_exception_is_identical(lm, kv_cache, sampler):
    ids, mask = _prompts()
    kw = dict(gen_length=16, block_length=8, steps=8, sampler=sampler, attention_mask=mask, kv_cache=kv_cache,
              mask_token_id=lm.config.mask_token_id, temperature=1.0)
    clean = dlm.generate(lm, ids, generator=torch.Generator().manual_seed(3), **kw)
    layer = next(m for m in lm.modules() if m is not lm and len(list(m.children())) and
                 type(m).__name__.lower().endswith(("layer", "block")))
    handle = raise_on_call(layer, 5)  # inside the 3rd forward of a 2-layer model, mid block
    try:
        with pytest.raises(Boom):
            dlm.generate(lm, ids, generator=torch.Generator().manual_seed(3), **kw)
    finally:
        handle.remove()
    again = dlm.generate(lm, ids, generator=torch.Generator().manual_seed(3), **kw)
    assert torch.equal(again.sequences, clean.sequences)
    assert again.nfe == clean.nfe


CACHES = {"deepcache": (tiny_unet, caching.DeepCacheConfig(interval=3)),
          "tgate": (tiny_unet, caching.TGateConfig(gate_step=3, self_attn=True, sp_interval=2)),
          "block": (tiny_pixart, caching.BlockCacheConfig(threshold=10.0, warmup_steps=2, max_cached_steps=2)),
          "forecast": (tiny_pixart, caching.ForecastConfig(interval=3, warmup_steps=2))}


@pytest.mark.parametrize("name", sorted(CACHES))
def test_cached_pipeline_after_a_mid_run_exception_is_identical(name):
    make, config = CACHES[name]
    model = make()
    caching.apply(model, config)
    try:
        clean = sample(model, steps=6)
        root_calls = [0]
        handle = model.register_forward_pre_hook(lambda *_: root_calls.__setitem__(0, root_calls[0] + 1))
        inner = next(m for m in model.modules() if m is not model and isinstance(m, torch.nn.Linear))
        # raise in the 5th denoiser call, past T-GATE's gate and the caches' first reuse
        fault = inner.register_forward_pre_hook(
            lambda *_: (_ for _ in ()).throw(Boom("injected")) if root_calls[0] == 5 else None)
        try:
            with pytest.raises(Boom):
                sample(model, steps=6)
        finally:
            handle.remove()
            fault.remove()
        again = sample(model, steps=6)
    finally:
        caching.remove(model)
    assert torch.equal(again, clean)


@torch.no_grad()
def test_streamlined_video_unet_after_a_mid_call_exception_is_identical():
    unet = tiny_motion_unet()
    video.streamline(unet, slices=4, temporal_slices=2)
    try:
        x, t, ehs = motion_inputs(frames=8)
        seen = []  # modules of the second up block that run through __call__ (some run inside slice loops)
        spies = [m.register_forward_pre_hook(lambda mod, *_: seen.append(mod)) for m in unet.up_blocks[1].modules()
                 if m is not unet.up_blocks[1]]
        clean = unet(x, t, encoder_hidden_states=ehs).sample
        for spy in spies:
            spy.remove()
        assert seen
        # raise inside the second up block, after the first deferred its upsample to it
        handle = raise_on_call(seen[len(seen) // 2], 1)
        try:
            with pytest.raises(Boom):
                unet(x, t, encoder_hidden_states=ehs)
        finally:
            handle.remove()
        again = unet(x, t, encoder_hidden_states=ehs).sample
    finally:
        video.unstreamline(unet)
    assert torch.equal(again, clean)
    assert all("forward" not in m.__dict__ for m in unet.modules())  # unstreamline still removes every patch
