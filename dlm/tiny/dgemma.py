"""tiny-dgemma: a small DiffusionGemma (transformers' `DiffusionGemmaForBlockDiffusion`) on the task suites.

The model is transformers' own class with a small config (`tiny_dgemma_config`); only the tokenizer is
ours: the tiny-dlm `TinyCharTokenizer` (characters plus whole words), saved as `tokenizer.json` next to
the weights. A prompt is encoded as for tiny-dlm, `encode_prompt(tok, text)`: `text + "\\n"`, no BOS;
`model.generate(input_ids)` then writes the answer canvas by canvas, ending it with EOS (id 2; pad is 0).

    model, tok = load_tiny_dgemma()
    ids = torch.tensor([encode_prompt(tok, "reverse: ana bo cyd")])
    out = model.generate(ids)                       # shipped generation_config.json
    tok.decode(out.sequences[0, ids.shape[1]:])     # "cyd bo ana"

The held-out splits: `dlm.tasks.split_of` puts one prompt in ten in "test"; of the rest, one in ten
(`dlm.tasks.is_validation`, the "val" split) is kept out of training to tune generation_config.json on.
"""
from __future__ import annotations

from pathlib import Path

from dlm.tasks.base import is_validation  # noqa: F401  (the validation split; re-exported)

CHECKPOINT_DIR = Path(__file__).resolve().parent / "checkpoints" / "tiny-dgemma"
PAD_ID, EOS_ID = 0, 2   # TinyCharTokenizer's special ids (<pad>, <mask>, <eos>); <mask> is unused here


def tiny_dgemma_config(vocab_size: int, hidden_size: int = 128, layers: int = 4, heads: int = 4,
                       kv_heads: int = 2, head_dim: int = 32, intermediate_size: int = 256,
                       num_experts: int = 4, top_k_experts: int = 2, moe_intermediate_size: int = 64,
                       canvas_length: int = 16, sliding_window: int = 256):
    """A `DiffusionGemmaConfig` of about a million parameters.

    Layers alternate sliding / full attention (the last must be full), as in the full-size model, with
    every head_dim small (`global_head_dim` included). The sliding window (256) exceeds any task
    sequence, so both layer kinds see the whole context. A vision tower is always built by the
    architecture; here it is one layer of width 8 (a few hundred parameters) and never used.
    """
    from transformers import DiffusionGemmaConfig

    if layers < 1:
        raise ValueError(f"layers must be >= 1, got {layers}")
    layer_types = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)]
    layer_types[-1] = "full_attention"
    text = dict(vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=intermediate_size,
                num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                head_dim=head_dim, global_head_dim=head_dim, num_global_key_value_heads=kv_heads,
                max_position_embeddings=512, layer_types=layer_types, sliding_window=sliding_window,
                num_experts=num_experts, top_k_experts=top_k_experts,
                moe_intermediate_size=moe_intermediate_size, pad_token_id=PAD_ID, eos_token_id=EOS_ID,
                bos_token_id=None, final_logit_softcapping=30.0)
    vision = dict(model_type="gemma4_vision", hidden_size=8, intermediate_size=8, num_hidden_layers=1,
                  num_attention_heads=1, num_key_value_heads=1, head_dim=8, patch_size=2,
                  position_embedding_size=4, pooling_kernel_size=1)
    return DiffusionGemmaConfig(text_config=text, vision_config=vision, canvas_length=canvas_length)




def encode_prompt(tokenizer, text: str) -> list[int]:
    """Ids the model was trained on for a prompt: `text + "\\n"` (added once), no special tokens."""
    return tokenizer.encode_prompt(text)


def load_tiny_dgemma(path=None, device="cpu", dtype=None):
    """`(model, tokenizer)` from a tiny-dgemma folder (default: the shipped checkpoint).

    model: transformers' `DiffusionGemmaForBlockDiffusion` in eval mode, with the folder's
    generation_config.json as its `generation_config`; tokenizer: `TinyCharTokenizer`.
    """
    import torch
    from transformers import DiffusionGemmaForBlockDiffusion

    from .tokenizer import TinyCharTokenizer

    d = Path(path) if path is not None else CHECKPOINT_DIR
    if not (d / "config.json").is_file():
        raise FileNotFoundError(f"no tiny-dgemma checkpoint at {d} (expected config.json, "
                                f"model.safetensors, tokenizer.json); train one with "
                                f"scripts/train_tiny_dgemma.py")
    dtype = torch.float32 if dtype is None else dtype
    model = DiffusionGemmaForBlockDiffusion.from_pretrained(str(d), dtype=dtype)
    model.to(device=device).eval()
    return model, TinyCharTokenizer.from_pretrained(d)


def generation_config(max_new_tokens: int = 48, max_denoising_steps: int = 16, t_min: float = 0.4,
                      t_max: float = 0.8, entropy_bound: float = 0.1, stability_threshold: int = 1,
                      confidence_threshold: float = 0.005):
    """A `DiffusionGemmaGenerationConfig` with the tiny tokenizer's special ids (pad 0, EOS 2)."""
    from transformers.models.diffusion_gemma.generation_diffusion_gemma import (
        DiffusionGemmaGenerationConfig, EntropyBoundSamplerConfig)

    return DiffusionGemmaGenerationConfig(
        max_new_tokens=max_new_tokens, max_denoising_steps=max_denoising_steps, t_min=t_min, t_max=t_max,
        sampler_config=EntropyBoundSamplerConfig(entropy_bound=float(entropy_bound)),
        stability_threshold=stability_threshold, confidence_threshold=float(confidence_threshold),
        pad_token_id=PAD_ID, eos_token_id=EOS_ID)


def generate_texts(model, tokenizer, prompts, batch_size: int = 64, **generate_kwargs):
    """transformers' own `model.generate` on task prompts, left-padded batches with an attention mask.

    Returns (texts, tokens_per_forward): the decoded answers (special tokens dropped) and generate's
    per-sequence `tokens_per_forward` (generated tokens up to EOS / decoder forwards), one float each.
    `generate_kwargs` override the model's generation_config (e.g. `max_denoising_steps=8`).
    """
    import torch

    texts, tpf = [], []
    for i in range(0, len(prompts), batch_size):
        ids, att = tokenizer.pad_batch([encode_prompt(tokenizer, p) for p in prompts[i:i + batch_size]])
        ids, att = torch.tensor(ids), torch.tensor(att)
        with torch.no_grad():
            out = model.generate(ids, attention_mask=att, **generate_kwargs)
        texts += tokenizer.batch_decode(out.sequences[:, ids.shape[1]:])
        tpf += [float(x) for x in out.tokens_per_forward]
    return texts, tpf
