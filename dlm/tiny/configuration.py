"""Configuration of the built-in tiny masked-diffusion LM (model_type "tiny-dlm")."""
from __future__ import annotations

from transformers import PretrainedConfig


class TinyDLMConfig(PretrainedConfig):
    """Sizes and special-token ids of a small bidirectional transformer trained as a masked
    diffusion LM (LLaDA-style, aligned logits: `logits[:, i]` predicts token `i`).

    Pre-norm RMSNorm blocks, rotary positions, SwiGLU MLP, tied input/output embeddings.
    """

    model_type = "tiny-dlm"

    def __init__(
        self,
        vocab_size: int = 56,
        hidden_size: int = 256,
        num_hidden_layers: int = 6,
        num_attention_heads: int = 8,
        intermediate_size: int = 704,
        max_position_embeddings: int = 192,
        rope_theta: float = 10000.0,
        rms_norm_eps: float = 1e-6,
        initializer_range: float = 0.02,
        mask_token_id: int = 1,
        eos_token_id: int = 2,
        pad_token_id: int = 0,
        tie_word_embeddings: bool = True,
        position_restart_token_id: int | None = None,
        prompt_attends_response: bool = True,
        **kwargs,
    ):
        if hidden_size % num_attention_heads:
            raise ValueError(
                f"hidden_size ({hidden_size}) must be divisible by num_attention_heads "
                f"({num_attention_heads})"
            )
        if (hidden_size // num_attention_heads) % 2:
            raise ValueError("head dimension must be even for rotary embeddings")
        if mask_token_id == pad_token_id:
            raise ValueError("mask_token_id must differ from pad_token_id")
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.intermediate_size = intermediate_size
        self.max_position_embeddings = max_position_embeddings
        self.rope_theta = rope_theta
        self.rms_norm_eps = rms_norm_eps
        self.initializer_range = initializer_range
        self.mask_token_id = mask_token_id
        # When set, rotary positions restart at 0 after the first occurrence of this token (the
        # prompt/response separator): see `TinyDLMModel.dlm_position_ids`.
        self.position_restart_token_id = position_restart_token_id
        # When False (needs position_restart_token_id), prompt positions, through the separator,
        # attend only to the prompt: their K/V never depend on the response, so a prompt KV cache
        # is exact (see `TinyDLMModel.forward`).
        if not prompt_attends_response and position_restart_token_id is None:
            raise ValueError("prompt_attends_response=False needs position_restart_token_id (the separator)")
        self.prompt_attends_response = prompt_attends_response
        super().__init__(
            eos_token_id=eos_token_id,
            pad_token_id=pad_token_id,
            tie_word_embeddings=tie_word_embeddings,
            **kwargs,
        )
