"""Render a `dlm sample --record FILE` recording as an animated GIF (pillow), one image per step,
with the colours of `dlm sample --live`: final tokens plain, new ones bold green, provisional ones
grey, masks `·`, remasked positions a red `×`.

    dlm sample --sampler saber --steps 64 --block-length 16 --record runs/live-saber.jsonl
    python scripts/render_live_gif.py runs/live-saber.jsonl --out docs/figures/live_saber.gif

docs/dlm.md ("Watching it decode") shows the GIFs this made, with their commands.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dlm.live import FINAL, MASK_PIECE, MASKED, NEW, PROVISIONAL, REMASK_PIECE, REMASKED, read_frames  # noqa: E402

BACKGROUND = (255, 255, 255)
COLOURS = {FINAL: (20, 20, 20), NEW: (0, 140, 60), PROVISIONAL: (165, 165, 165), MASKED: (190, 190, 190),
           REMASKED: (210, 30, 30)}
HEAD = (60, 60, 60)


def _fonts(size: int):
    """DejaVu Sans Mono from matplotlib's own files (a dependency), so any machine renders the same."""
    import matplotlib
    from PIL import ImageFont

    folder = Path(matplotlib.__file__).parent / "mpl-data" / "fonts" / "ttf"
    return (ImageFont.truetype(str(folder / "DejaVuSansMono.ttf"), size),
            ImageFont.truetype(str(folder / "DejaVuSansMono-Bold.ttf"), size))


def _cells(frame) -> list[tuple[str, str]]:
    """(piece, status) per position, as the live view shows them."""
    out = []
    for status, piece in zip(frame.status, frame.text):
        if status == MASKED:
            piece = MASK_PIECE
        elif status == REMASKED:
            piece = REMASK_PIECE
        out.append((piece, status))
    return out


def _lines(cells, width: int) -> list[list[tuple[str, str]]]:
    """Wrap the canvas at `width` characters, between tokens."""
    lines, line, used = [], [], 0
    for piece, status in cells:
        if used + len(piece) > width and line:
            lines.append(line)
            line, used = [], 0
        line.append((piece, status))
        used += len(piece)
    return lines + [line]


def render(frames, header: dict, *, width: int = 48, size: int = 18):
    """One RGB image per frame, all the same size."""
    from PIL import Image, ImageDraw

    regular, bold = _fonts(size)
    char_w = regular.getlength("M")
    line_h = int(size * 1.45)
    title = f"{header.get('model', '')} | {header.get('sampler', '')} | {header.get('prompt', '')!r}"
    wrapped = [_lines(_cells(f), width) for f in frames]
    stats = [f"step {f.step} (block {f.block}) | {f.nfe} forwards | {f.final}/{len(f.status)} final | "
             f"{f.tokens_per_forward:.2f} tokens/forward" for f in frames]
    rows = 2 + max(len(w) for w in wrapped)
    image_w = int(char_w * max(width, len(title), *(len(s) for s in stats)) + 24)
    images = []
    for frame, lines, stat in zip(frames, wrapped, stats):
        image = Image.new("RGB", (image_w, rows * line_h + 16), BACKGROUND)
        draw = ImageDraw.Draw(image)
        draw.text((12, 8), title, font=bold, fill=HEAD)
        draw.text((12, 8 + line_h), stat, font=regular, fill=HEAD)
        for r, line in enumerate(lines):
            x = 12
            for piece, status in line:
                font = bold if status in (NEW, REMASKED) else regular
                draw.text((x, 8 + (2 + r) * line_h), piece, font=font, fill=COLOURS[status])
                x += char_w * len(piece)
        images.append(image)
    return images


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("frames", help="a `dlm sample --record` file (JSON lines)")
    ap.add_argument("--out", required=True, help="the GIF to write")
    ap.add_argument("--ms", type=int, default=450, help="milliseconds per step (default: 450)")
    ap.add_argument("--hold", type=int, default=2500, help="milliseconds on the last frame (default: 2500)")
    ap.add_argument("--width", type=int, default=48, help="characters per canvas line (default: 48)")
    args = ap.parse_args(argv)
    header, frames = read_frames(args.frames)
    if not frames:
        print(f"error: {args.frames} holds no frames", file=sys.stderr)
        return 2
    images = render(frames, header, width=args.width)
    durations = [args.ms] * (len(images) - 1) + [args.hold]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    images[0].save(args.out, save_all=True, append_images=images[1:], duration=durations, loop=0, optimize=True)
    print(f"wrote {args.out} ({len(images)} frames)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
