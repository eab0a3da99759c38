"""DiffusionGemma's encoder/decoder calls for the canvas loop, and row subsets of its cache."""
from __future__ import annotations

import copy
import inspect
from typing import Any

import torch

from samplers.unmasking._common import rows_per_chunk

# The "mask" id our masked samplers see for a position not accepted yet: DiffusionGemma has no mask
# token (transformers' diffusers pipeline uses -1 too), and -1 can never be a real token.
UNACCEPTED = -1


# --------------------------------------------------------------------------------------------------
# The model: encoder/decoder calls of DiffusionGemma, row subsets of its cache


class DiffusionGemmaCanvasModel:
    """The calls the canvas loop makes on a `DiffusionGemmaForBlockDiffusion`.

    Attributes: canvas_length C, vocab_size V, embed_dtype (the self-conditioning logits' dtype)."""

    def __init__(self, model):
        self.model = model
        self.canvas_length = int(model.config.canvas_length)
        self.vocab_size = int(model.config.text_config.vocab_size)
        decoder = model.model.decoder
        self.embed_dtype = decoder.embed_tokens.weight.dtype
        # The decoder reads its previous step's logits only through `softmax(logits) @ E * scale`
        # (the soft embedding, `[C, H]` per row) fed to its `self_conditioning` block: the loop keeps
        # that instead of the `[C, V]` logits (a 262k vocabulary: 1 KB instead of 1 MB per position).
        self.self_conditioning_block = getattr(decoder, "self_conditioning", None)
        if not isinstance(self.self_conditioning_block, torch.nn.Module):
            raise ValueError("this DiffusionGemma decoder has no `self_conditioning` block; dlm's engine needs "
                             "transformers >= 5.19 (pip install -U transformers)")
        # transformers 5.24 renamed the cache keyword `past_key_values` -> `cache` (and the encoder
        # output's field); read the installed name once instead of pinning one release.
        params = inspect.signature(model._prepare_encoder_inputs).parameters
        self.cache_kw = "cache" if "cache" in params else "past_key_values"

    def encode(self, input_ids, attention_mask, cache, position_ids, is_prefill: bool):
        """Phase 1.a: the unseen tokens (all of `input_ids` at prefill, else its last canvas) into
        `cache`, with transformers' own mask construction. input_ids `[B, T]`, attention_mask `[B, T]`."""
        m, kw = self.model, self.cache_kw
        new_ids, mask_mapping = m._prepare_encoder_inputs(
            input_ids=input_ids, attention_mask=attention_mask, encoder_position_ids=position_ids, **{kw: cache},
            is_prefill=is_prefill, canvas_length=self.canvas_length, batch_size=input_ids.shape[0])
        out = m.model.encoder(input_ids=new_ids, attention_mask=mask_mapping, position_ids=position_ids, **{kw: cache})
        return getattr(out, kw)

    def decoder_masks(self, decoder_attention_mask, cache, canvas):
        """The decoder's attention masks for `canvas [R, C]` against `cache` (the same rows)."""
        return self.model.model.decoder.create_diffusion_decoder_attention_mask(
            config=self.model.config, inputs_embeds=canvas.unsqueeze(-1), decoder_attention_mask=decoder_attention_mask,
            **{self.cache_kw: cache})

    def soft_embeddings(self, logits: torch.Tensor, divide_by: torch.Tensor | None = None) -> torch.Tensor:
        """The decoder's self-conditioning input for the previous step's `logits [N, V]` (divided by
        `divide_by` first when given): `softmax(logits.to(embed dtype), float32).to(W) @ W * scale`,
        the operations of transformers' decoder, in chunks of positions (`rows_per_chunk`) so that no
        `[N, V]` probability table exists. Returns `[N, H]` in the embedding dtype."""
        embed = self.model.model.decoder.embed_tokens
        weight = embed.weight
        scale = embed.embed_scale.to(weight.dtype)
        out = torch.empty((logits.shape[0], weight.shape[1]), dtype=weight.dtype, device=logits.device)
        k = rows_per_chunk(logits.shape[0], logits.shape[1])
        for start in range(0, logits.shape[0], k):
            chunk = logits[start:start + k]
            if divide_by is not None:
                chunk = chunk / divide_by
            probs = chunk.to(self.embed_dtype).softmax(dim=-1, dtype=torch.float32).to(weight.dtype)
            out[start:start + k] = torch.matmul(probs, weight) * scale
        return out

    def decode(self, canvas, soft_embeddings, masks, cache, positions) -> torch.Tensor:
        """One decoder forward: logits `[R, C, V]` float32 for `canvas [R, C]`, self-conditioned on
        `soft_embeddings [R, C, H]` (`soft_embeddings` of the previous step; None at a canvas's first
        step, where transformers' decoder uses zeros).

        The decoder and the head called directly, with the operations of
        `DiffusionGemmaForBlockDiffusion.forward` (head, float32, tanh soft-capping, here in place on
        our own tensor: the same values, two vocabulary tables fewer): the same logits without two
        wrapper layers per step. The soft embeddings reach the decoder's `self_conditioning` block
        through a forward pre-hook in place of the zeros it computes when given no logits."""
        m = self.model
        hook = None
        if soft_embeddings is not None:
            def feed(module, args):
                return args[0], soft_embeddings
            hook = self.self_conditioning_block.register_forward_pre_hook(feed)
        try:
            hidden = m.model.decoder(decoder_input_ids=canvas, self_conditioning_logits=None,
                                     decoder_attention_mask=masks, decoder_position_ids=positions,
                                     **{self.cache_kw: cache}).last_hidden_state
        finally:
            if hook is not None:
                hook.remove()
        logits = m.lm_head(hidden).to(torch.float32)
        cap = m.final_logit_softcapping
        return logits.div_(cap).tanh_().mul_(cap)


def select_cache_rows(cache, rows: torch.Tensor, repeat: int = 1):
    """A cache holding only `rows` of `cache` (each repeated `repeat` times, row-major), sharing
    nothing mutable with it: the layers are shallow copies whose K/V are new tensors."""
    out = copy.copy(cache)
    out.layers = []
    for layer in cache.layers:
        new = copy.copy(layer)
        new.keys, new.values = layer.keys[rows], layer.values[rows]
        if repeat > 1:
            new.keys = new.keys.repeat_interleave(repeat, dim=0)
            new.values = new.values.repeat_interleave(repeat, dim=0)
        out.layers.append(new)
    return out


class RowSubsetDecoder:
    """Runs the decoder on a subset of the batch, rebuilding the row-selected cache and masks only
    when the subset changes (rows only ever leave within a canvas). The subset is known on the host
    (`live`, the loop's list of batch rows; None for every row), so no device read decides it."""

    def __init__(self, canvas_model: DiffusionGemmaCanvasModel, cache, decoder_attention_mask, positions, batch: int):
        self.cm, self.cache, self.mask2d, self.positions = canvas_model, cache, decoder_attention_mask, positions
        self.batch = batch
        self._rows_key, self._cache, self._masks, self._full_masks = None, None, None, None
        self.forward_tokens = 0

    def _prepared(self, rows: torch.Tensor, canvas: torch.Tensor, live: list[int] | None):
        key = None if live is None else tuple(live)  # rows leave, and come back at a new sub-block
        if self._rows_key != key or self._cache is None:
            every = live is None
            self._cache = self.cache if every else select_cache_rows(self.cache, rows)
            self._masks = self._masks_for(rows, canvas, every)
            self._rows_key = key
        return self._cache, self._masks

    def _masks_for(self, rows: torch.Tensor, canvas: torch.Tensor, every: bool):
        """The decoder's masks for `rows`: the whole batch's (built once per canvas by transformers'
        helper, as transformers' generate uses them for every row) indexed by row, so a change of the
        live set reads nothing from the device; transformers' helper itself for mask kinds that are
        not batch-first tensors."""
        if self._full_masks is None:
            full_canvas = canvas if every else canvas.new_zeros((self.batch, canvas.shape[1]))
            self._full_masks = self.cm.decoder_masks(self.mask2d, self.cache, full_canvas)
        if every:
            return self._full_masks
        if all(m is None or (isinstance(m, torch.Tensor) and m.shape[0] == self.batch)
               for m in self._full_masks.values()):
            return {kind: None if m is None else m[rows] for kind, m in self._full_masks.items()}
        return self.cm.decoder_masks(self.mask2d[rows], self._cache, canvas)

    def __call__(self, canvas: torch.Tensor, self_conditioning, rows: torch.Tensor, live: list[int] | None) -> torch.Tensor:
        cache, masks = self._prepared(rows, canvas, live)
        self.forward_tokens += canvas.numel()
        return self.cm.decode(canvas, self_conditioning, masks, cache, self.positions)

    def branches(self, canvases: torch.Tensor, self_conditioning, rows: torch.Tensor, k: int) -> torch.Tensor:
        """Logits `[R*k, C, V]` for `canvases [R*k, C]`: each of `rows` repeated k times."""
        cache = select_cache_rows(self.cache, rows, repeat=k)
        masks = self.cm.decoder_masks(self.mask2d[rows].repeat_interleave(k, dim=0), cache, canvases)
        sc = None if self_conditioning is None else self_conditioning.repeat_interleave(k, dim=0)
        self.forward_tokens += canvases.numel()
        return self.cm.decode(canvases, sc, masks, cache, self.positions)


# --------------------------------------------------------------------------------------------------
# Rules: score, accept, renoise, stop
