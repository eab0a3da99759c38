"""Streaming in transformers' convention: `dlm.generate(..., streamer=s)`.

A streamer is any object with transformers' `BaseStreamer` interface: `put(value)` receives token
ids (first the prompt `[1, P]`, then the generated tokens as they become final) and `end()` is
called once at the end (also when generation raises, so a consumer thread reading a
`TextIteratorStreamer` is never left waiting). transformers' `TextStreamer` and
`TextIteratorStreamer` work unchanged; like them, streaming takes one prompt (batch 1).

A diffusion LM does not produce its tokens left to right, so "as they come" means:
- **masked models** (LLaDA, Dream, tiny-dlm): a token is pushed once it and every token before it
  are final: the growing final prefix. A committed token is final at once for a sampler that never
  remasks; for one that remasks (`saber`) only once its block is complete. The stream ends with the
  first EOS, as transformers' autoregressive `generate` does (with `eos_early_stop` on, the default,
  what follows it in `sequences` is EOS anyway).
- **uniform-noise models** (DiffusionGemma): each canvas once it is accepted, after the EOS/pad
  finalisation, exactly as transformers' `DiffusionGemmaForBlockDiffusion.generate` streams (its
  streamer calls are reproduced call for call in transformers' rule); a streamer with a
  `put_draft` method (transformers' `TextDiffusionStreamer`) also gets every step's argmax canvas
  as a draft in that rule, as transformers gives it.
- **ensembles** (`hex`): nothing is final before the vote, so the answer is pushed at the end.

Nothing here runs inside the decoding loops: `TokenStream` is a `callback` that reads the
`StepTrace` records (the loops keep each step's tokens when it is attached), so a call without a
streamer pays nothing, and a call with one pays one small device-to-host copy per step.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from dlm.outputs import GenerateOutput, StepTrace


def check_streamer(streamer: Any) -> None:
    """ValueError unless `streamer` has transformers' `BaseStreamer` interface (callable `put`, `end`)."""
    missing = [name for name in ("put", "end") if not callable(getattr(streamer, name, None))]
    if missing:
        raise ValueError(
            f"streamer must have transformers' BaseStreamer interface, put(token_ids) and end(); "
            f"{type(streamer).__name__} has no {' or '.join(missing)}(). Use transformers.TextStreamer, "
            "TextIteratorStreamer or a subclass of transformers.generation.BaseStreamer")


class TokenStream:
    """Feeds one generation's final tokens to a streamer; a `StepTrace` callback (see module doc).

    Built by `TokenStream.start` before the loop; `__call__(record)` on every step; `finish(out)`
    pushes what is left from the returned `sequences` (the authority) and calls `end()`;
    `abort()` calls `end()` when generation raised.
    """

    def __init__(self, streamer: Any, input_ids: torch.Tensor, *, per_step: bool):
        self.streamer = streamer
        self.prompt_length = input_ids.shape[1]
        self.per_step = per_step  # False: nothing is final before the end (an ensemble)
        self.pushed = 0  # generated tokens handed to the streamer so far
        self.ended = False
        streamer.put(input_ids.detach().cpu())  # transformers' generate puts the prompt first

    @staticmethod
    def start(streamer: Any, model, input_ids: torch.Tensor, plan) -> "TokenStream":
        """The stream for one `generate` call (`plan`: its `dlm.engine.families.CallPlan`). Checks the
        interface and batch 1 before anything is put."""
        from dlm.decoding_config import DEFAULT_GEN_LENGTH

        config, policy = plan.config, plan.policy
        check_streamer(streamer)
        if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 or input_ids.shape[0] != 1:
            shape = tuple(input_ids.shape) if isinstance(input_ids, torch.Tensor) else type(input_ids).__name__
            raise ValueError(f"streamer takes one prompt (batch 1, as transformers' streamers do); input_ids has "
                             f"shape {shape}: generate the rows one at a time, or drop streamer")
        ensemble = plan.ensemble
        if plan.family.uniform:
            drafts = config.sampler is None and callable(getattr(streamer, "put_draft", None))
            if drafts and getattr(streamer, "_takes_logits", False):
                raise ValueError("streamer._takes_logits is True, but dlm's engine gives drafts as token ids "
                                 "(put_draft(value=...)), not logits; set it to False")
            return CanvasStream(streamer, input_ids, canvas_length=int(model.config.canvas_length),
                                per_step=not ensemble, drafts=drafts)
        from dlm.adapters import DLMAdapter

        adapter = DLMAdapter.wrap(model, mask_token_id=config.mask_token_id, eos_token_id=config.eos_token_id)
        from dlm.decoding_config import default_block_length

        gen_length = DEFAULT_GEN_LENGTH if config.gen_length is None else config.gen_length
        remasks = bool(policy is not None and policy.remasks)
        return PrefixStream(streamer, input_ids, mask_id=adapter.mask_token_id, eos_id=adapter.eos_token_id,
                            gen_length=gen_length, block_length=config.block_length or default_block_length(gen_length),
                            remasks=remasks, per_step=not ensemble)

    def chain(self, callback: Callable[[StepTrace], None] | None) -> Callable[[StepTrace], None] | None:
        """The callback the loop gets: the user's (first) and this stream's."""
        if not self.per_step:
            return callback
        if callback is None:
            return self

        def both(record: StepTrace) -> None:
            callback(record)
            self(record)
        return both

    def __call__(self, record: StepTrace) -> None:
        raise NotImplementedError

    def finish(self, out: GenerateOutput) -> None:
        raise NotImplementedError

    def abort(self) -> None:
        if not self.ended:
            self.ended = True
            self.streamer.end()

    def _end(self) -> None:
        self.ended = True
        self.streamer.end()


class PrefixStream(TokenStream):
    """Masked models: the growing final prefix, one `put` per step that made tokens final."""

    def __init__(self, streamer, input_ids, *, mask_id: int, eos_id: int | None, gen_length: int, block_length: int,
                 remasks: bool, per_step: bool):
        super().__init__(streamer, input_ids, per_step=per_step)
        self.mask_id, self.eos_id, self.block_length, self.remasks = mask_id, eos_id, block_length, remasks
        self.tokens = [mask_id] * gen_length  # the generation as the trace last showed it
        self.done = False  # the stream reached EOS

    def __call__(self, record: StepTrace) -> None:
        if self.done or record.tokens is None or record.rows.numel() == 0:
            return  # a lookahead call's extra record carries no tokens; an empty step changes nothing
        start = record.block * self.block_length
        block = record.tokens[0].tolist()  # the one host sync a streamed step costs
        self.tokens[start:start + len(block)] = block
        self._push(self._final_end())

    def _final_end(self) -> int:
        """End of the final prefix: the first mask (a sampler that never remasks), or the end of the
        last complete block before the first block still holding a mask (one that remasks)."""
        end = self.pushed
        while end < len(self.tokens) and self.tokens[end] != self.mask_id:
            end += 1
        if self.remasks and end < len(self.tokens):
            end -= end % self.block_length
        return max(end, self.pushed)

    def _push(self, end: int, tokens: list[int] | None = None) -> None:
        new = (self.tokens if tokens is None else tokens)[self.pushed:end]
        if self.eos_id is not None and self.eos_id in new:
            new = new[: new.index(self.eos_id) + 1]
            self.done = True
        if new:
            self.streamer.put(torch.tensor(new, dtype=torch.long))
            self.pushed += len(new)

    def finish(self, out: GenerateOutput) -> None:
        if not self.done:
            final = out.sequences[0, self.prompt_length:].tolist()
            self._push(len(final), final)
        self._end()


class CanvasStream(TokenStream):
    """Uniform-noise models: each canvas once accepted, as transformers' DiffusionGemma generate puts
    it; drafts (the argmax canvas of every step) to a `put_draft` streamer in transformers' rule."""

    def __init__(self, streamer, input_ids, *, canvas_length: int, per_step: bool, drafts: bool):
        super().__init__(streamer, input_ids, per_step=per_step)
        self.C, self.drafts = canvas_length, drafts
        self.canvas = 0  # index of the canvas being denoised
        self.last: torch.Tensor | None = None  # its tokens after the latest step, [C]

    def __call__(self, record: StepTrace) -> None:
        if record.tokens is None or record.rows.numel() == 0:
            return
        if record.block != self.canvas:
            # A new canvas started, so the previous one was accepted. It held no EOS (batch 1: a
            # canvas with EOS ends the generation), so transformers' finalisation left it unchanged.
            self._put_canvas(self.last)
            self.canvas = record.block
        self.last = record.tokens[0]
        if self.drafts:
            self.streamer.put_draft(value=record.tokens[:1].detach().cpu())

    def _put_canvas(self, tokens: torch.Tensor) -> None:
        self.streamer.put(tokens.detach().cpu().reshape(1, -1))  # transformers puts `[B, C]`
        self.pushed += tokens.numel()

    def finish(self, out: GenerateOutput) -> None:
        generated = out.sequences[0, self.prompt_length:]
        while self.pushed < generated.numel():  # the last canvas (finalised: pad after EOS), or all of an ensemble's
            self._put_canvas(generated[self.pushed:self.pushed + self.C])
        self._end()


__all__ = ["CanvasStream", "PrefixStream", "TokenStream", "check_streamer"]
