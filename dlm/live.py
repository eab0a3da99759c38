"""Watching a diffusion LM decode: per-step frames of the whole generation, drawn live on a
terminal with rich (`dlm sample --live`) or written as JSON lines (`dlm sample --record FILE`).

Everything here is a `callback` of `dlm.generate` (a `StepTrace` consumer; the loop keeps each
step's tokens when the caller passes `return_trace=True`): there is no second decoding loop.

A frame gives every generated position one status:
- `f` final: it will not change (a masked model's committed token, for a sampler that never
  remasks; for one that does, once its block is complete; a DiffusionGemma canvas once done);
- `n` new: final, committed at this step;
- `p` provisional: shown but not final (DiffusionGemma: the argmax canvas of transformers' rule,
  or the noise at positions a sampler has not accepted; a remasking sampler's committed token in
  an unfinished block);
- `m` masked: no token yet;
- `r` remasked: it held a token at the previous frame and is masked (or renoised) again.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Callable, Iterable

from dlm.outputs import StepTrace

FINAL, NEW, PROVISIONAL, MASKED, REMASKED = "f", "n", "p", "m", "r"
_SHOWN = (FINAL, NEW, PROVISIONAL)  # statuses that hold a token


@dataclass
class Frame:
    """One step of the generation. `tokens[i]` is None where masked; `text[i]` its piece as shown."""

    step: int  # frames so far (1-based)
    block: int  # block (masked model) or canvas (DiffusionGemma) index
    block_step: int
    nfe: int  # forward passes so far
    tokens: list
    status: str  # one status letter per position (module docstring)
    text: list

    @property
    def final(self) -> int:
        return sum(s in (FINAL, NEW) for s in self.status)

    @property
    def tokens_per_forward(self) -> float:
        return self.final / max(self.nfe, 1)


class CanvasFrames:
    """`StepTrace` records -> `Frame`s of the whole generation (batch row 0).

    Args:
        piece: token id -> the text shown for it (one token, special tokens included).
        block_length: where a record's `tokens` start (`record.block * block_length`): the block length
            on a masked model, the canvas length on DiffusionGemma.
        final_unit: a remasking sampler's tokens are final once their unit (block, or sub-block of a
            canvas) is complete (default: block_length).
        mask_id: a masked model's mask id; None on a uniform-noise model, where a record's `accepted`
            says what is held (sampler mode) and, in transformers' rule, nothing is before the canvas ends.
        remasks: the sampler may take committed tokens back.
        length: positions known in advance (masked: gen_length; DiffusionGemma grows canvas by canvas).
    """

    def __init__(self, piece: Callable[[int], str], *, block_length: int, final_unit: int | None = None,
                 mask_id: int | None = None, remasks: bool = False, length: int = 0):
        self.piece, self.block_length = piece, block_length
        self.final_unit = final_unit or block_length
        self.mask_id, self.remasks = mask_id, remasks
        self.tokens: list = []
        self.status: list[str] = []
        self.held: list[bool] = []  # committed (masked) or accepted (uniform) at the last frame
        self._grow(length)
        self.count = 0
        self.last: Frame | None = None

    def __call__(self, record: StepTrace) -> Frame | None:
        """The frame after this step, or None for a record without tokens (a lookahead call's extra record)."""
        if record.tokens is None or record.rows.numel() == 0:
            return None
        start = record.block * self.block_length
        block = record.tokens[0].tolist()
        self._grow(start + len(block))
        if self.mask_id is not None:
            held = [t != self.mask_id for t in block]
        elif record.accepted is not None:
            held = record.accepted[0].tolist()
        else:
            held = None  # transformers' rule: the canvas is provisional until it is done
        self._settle(start)
        for i, token in enumerate(block):
            at = start + i
            now = None if held is None else held[i]
            self.status[at] = self._status(now, self.held[at], self.status[at], self._unit_complete(held, i))
            self.tokens[at] = None if self.mask_id is not None and not now else token
            self.held[at] = bool(now)
        return self._frame(record.block, record.step, record.nfe)

    def _settle(self, start: int) -> None:
        """Last frame's new tokens are now plain final ones; everything before `start` (earlier blocks
        and canvases: they run in order) is final."""
        for i, status in enumerate(self.status):
            if status == NEW:
                self.status[i] = FINAL
            elif i < start and status != FINAL:
                self.status[i] = NEW

    def _status(self, held: bool | None, was_held: bool, before: str, unit_complete: bool) -> str:
        if held is None:
            return PROVISIONAL
        if not held:
            if was_held:
                return REMASKED
            return MASKED if self.mask_id is not None else PROVISIONAL
        if self.remasks and not unit_complete:
            return PROVISIONAL
        return FINAL if before == FINAL else NEW

    def _unit_complete(self, held: list | None, i: int) -> bool:
        if held is None:
            return False
        lo = i // self.final_unit * self.final_unit
        return all(held[lo:lo + self.final_unit])

    def _grow(self, end: int) -> None:
        extra = end - len(self.tokens)
        if extra > 0:
            self.tokens += [None] * extra
            self.status += [MASKED] * extra
            self.held += [False] * extra

    def _frame(self, block: int, block_step: int, nfe: int) -> Frame:
        self.count += 1
        text = [None if t is None else self.piece(t) for t in self.tokens]
        self.last = Frame(self.count, block, block_step, nfe, list(self.tokens), "".join(self.status), text)
        return self.last

    def finish(self, generated: Iterable[int], nfe: int) -> Frame:
        """The last frame: the returned tokens (`sequences[0, P:]`), all final."""
        self.tokens = list(generated)
        before = self.last.status if self.last else ""
        self.status = [FINAL if i < len(before) and before[i] in (FINAL, NEW) else NEW for i in range(len(self.tokens))]
        self.held = [True] * len(self.tokens)
        last = self.last
        return self._frame(last.block if last else 0, (last.block_step + 1) if last else 0, nfe)


SPECIAL_PIECE = "⋄"


def token_pieces(tokenizer) -> Callable[[int], str]:
    """Token id -> a one-line piece: the tokenizer's text of that one token; special tokens (EOS,
    pad) as a small marker, newlines and tabs as visible symbols, so the canvas keeps its layout."""
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    cache: dict[int, str] = {}

    def piece(token: int) -> str:
        if token not in cache:
            if token in special:
                cache[token] = SPECIAL_PIECE
            else:
                text = tokenizer.decode([token], skip_special_tokens=False)
                cache[token] = text.replace("\n", "↵").replace("\t", "→") or "∅"
        return cache[token]
    return piece


# --------------------------------------------------------------------------------------------------
# Rendering (rich) and recording (JSON lines)
# --------------------------------------------------------------------------------------------------
STYLES = {FINAL: "", NEW: "bold green", PROVISIONAL: "dim", MASKED: "dim", REMASKED: "bold red"}
MASK_PIECE, REMASK_PIECE = "·", "×"


def render_frame(frame: Frame, *, title: str = ""):
    """A `rich.text.Text`: a status line (step, forwards, tokens per forward) and the canvas, final
    tokens plain, new ones bold green, provisional ones dim, masks `·`, remasked positions a red `×`."""
    from rich.text import Text

    out = Text()
    if title:
        out.append(title + "\n", style="bold")
    out.append(f"step {frame.step} (block {frame.block}) | {frame.nfe} forwards | {frame.final}/{len(frame.status)} final | "
               f"{frame.tokens_per_forward:.2f} tokens/forward\n", style="bold")
    for status, piece in zip(frame.status, frame.text):
        if status == MASKED:
            out.append(MASK_PIECE, style=STYLES[MASKED])
        elif status == REMASKED:
            out.append(REMASK_PIECE, style=STYLES[REMASKED])
        elif piece == SPECIAL_PIECE:  # EOS and padding: kept per position, but quiet
            out.append(piece, style="dim green" if status == NEW else "dim")
        else:
            out.append(piece, style=STYLES[status])
    return out


class LiveView:
    """Draws each frame in place on `console` (rich `Live`; stderr by default)."""

    def __init__(self, title: str = "", console=None):
        from rich.console import Console
        from rich.live import Live

        self.console = console if console is not None else Console(stderr=True)
        self.title = title
        self.live = Live(console=self.console, auto_refresh=False, transient=False)

    def __enter__(self) -> "LiveView":
        self.live.start()
        return self

    def __call__(self, frame: Frame) -> None:
        self.live.update(render_frame(frame, title=self.title), refresh=True)

    def __exit__(self, *exc) -> None:
        self.live.stop()


class FrameRecorder:
    """Writes one JSON object per frame (`Frame` fields); the first line is a header (`meta`)."""

    def __init__(self, path, meta: dict):
        self.file = open(path, "w", encoding="utf-8")
        self.file.write(json.dumps({"header": meta}) + "\n")

    def __call__(self, frame: Frame) -> None:
        self.file.write(json.dumps(asdict(frame)) + "\n")

    def close(self) -> None:
        self.file.close()


def read_frames(path) -> tuple[dict, list[Frame]]:
    """A `--record` file back as (header, frames)."""
    with open(path, encoding="utf-8") as handle:
        lines = [json.loads(line) for line in handle if line.strip()]
    return lines[0]["header"], [Frame(**line) for line in lines[1:]]


def frames_callback(frames: CanvasFrames, sinks: list[Callable[[Frame], None]]) -> Callable[[StepTrace], None]:
    """The `dlm.generate` callback that turns records into frames and hands each frame to `sinks`."""
    def on_step(record: StepTrace) -> None:
        frame = frames(record)
        if frame is not None:
            for sink in sinks:
                sink(frame)
    return on_step


__all__ = ["CanvasFrames", "Frame", "FrameRecorder", "LiveView", "frames_callback", "read_frames", "render_frame",
           "token_pieces"]
