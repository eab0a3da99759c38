"""Tiny random-weight DiffusionGemma models (transformers' real classes, ~0.1-0.4M parameters).

transformers always builds a vision tower and makes every decoder layer MoE; a one-layer vision
tower and four small experts keep a model at a fraction of a second per generate call. `sharpen`
scales the LM head so the logits are peaked: rows then stop denoising at different steps (adaptive
stopping) and EOS ids appear, as with a trained model.
"""
from __future__ import annotations

import torch

VOCAB = 300


def tiny_diffusion_gemma(seed: int = 0, *, canvas_length: int = 16, layers: int = 2, sliding_window: int = 64,
                         sharpen: float = 8.0, vocab: int = VOCAB, eos_token_id=1, pad_token_id: int = 0):
    from transformers import DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion
    from transformers.utils import logging

    logging.set_verbosity_error()  # "last layer must use full_attention" is expected for 2-layer configs
    torch.manual_seed(seed)
    text = dict(vocab_size=vocab, hidden_size=48, intermediate_size=64, num_hidden_layers=layers,
                num_attention_heads=2, num_key_value_heads=1, head_dim=16, global_head_dim=16, num_experts=4,
                top_k_experts=2, moe_intermediate_size=32, sliding_window=sliding_window, pad_token_id=pad_token_id,
                eos_token_id=eos_token_id, bos_token_id=2, max_position_embeddings=1024)
    vision = dict(model_type="gemma4_vision", hidden_size=16, intermediate_size=16, num_hidden_layers=1,
                  num_attention_heads=1, num_key_value_heads=1, head_dim=16)
    config = DiffusionGemmaConfig(text_config=text, vision_config=vision, canvas_length=canvas_length,
                                  image_token_id=vocab - 1, boi_token_id=vocab - 2, eoi_token_id=vocab - 3)
    model = DiffusionGemmaForBlockDiffusion(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(sharpen)
    return model


def generation_config(**kw):
    from transformers.models.diffusion_gemma.generation_diffusion_gemma import (DiffusionGemmaGenerationConfig,
                                                                               EntropyBoundSamplerConfig)

    bound = kw.pop("entropy_bound", 0.1)
    base = dict(max_new_tokens=32, max_denoising_steps=16, t_min=0.4, t_max=0.8, stability_threshold=1,
                confidence_threshold=0.5, eos_token_id=1, pad_token_id=0)
    base.update(kw)
    return DiffusionGemmaGenerationConfig(sampler_config=EntropyBoundSamplerConfig(entropy_bound=bound), **base)


def left_padded_prompts(batch: int, length: int, seed: int, pad: int = 0, vocab: int = VOCAB):
    """`[B, P]` prompts of ids 3..vocab-4 and their attention mask; row r > 0 has r+1 pad tokens."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab - 4, (batch, length), generator=g)
    mask = torch.ones_like(ids)
    for r in range(1, batch):
        cut = min(r + 1, length - 1)
        ids[r, :cut], mask[r, :cut] = pad, 0
    return ids, mask
