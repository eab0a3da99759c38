"""The live canvas view (`dlm sample --live`), its frames and their recording (`--record`), and the
`--stream` / `--live` options of `dlm sample`.

Frames are checked against statuses the test derives from the step trace by itself; the view is
rendered into a string through rich's own Console."""
from __future__ import annotations

import io
import json

import pytest
import torch
from rich.console import Console

import dlm
from dlm.cli import main
from dlm.live import CanvasFrames, LiveView, frames_callback, read_frames, render_frame, token_pieces


@pytest.fixture(scope="module")
def tiny():
    return dlm.load("tiny-dlm")


@pytest.fixture(scope="module")
def dgemma():
    return dlm.load("tiny-dgemma")


def _frames_of(model, tok, prompt, sampler, *, block=8, steps=32, **kw):
    ids = torch.tensor([tok.encode_prompt(prompt)])
    frames = CanvasFrames(token_pieces(tok), block_length=block, mask_id=model.config.mask_token_id,
                          remasks=sampler.startswith("saber"), length=64)
    seen = []
    out = dlm.generate(model, ids, gen_length=64, block_length=block, steps=steps, sampler=sampler, return_trace=True,
                       callback=frames_callback(frames, [seen.append]), **kw)
    seen.append(frames.finish(out.sequences[0, ids.shape[1]:].tolist(), out.nfe))
    return out, ids, seen


def test_masked_frames_follow_the_trace(tiny):
    """Per step: committed positions show their token (new ones 'n', earlier ones 'f'), the others are
    masks; forwards and tokens per forward are the trace's; the last frame is the output, all final."""
    model, tok = tiny
    out, ids, frames = _frames_of(model, tok, "shuffle: cyd uma jo ana", "confidence")
    mask = model.config.mask_token_id
    state = [mask] * 64
    records = [r for r in out.trace if r.tokens is not None]
    assert len(frames) == len(records) + 1
    for record, frame in zip(records, frames):
        before = state[:]
        start = record.block * 8
        state[start:start + record.tokens.shape[1]] = record.tokens[0].tolist()
        expected = "".join("m" if t == mask else ("n" if b == mask else "f") for t, b in zip(state, before))
        # positions of earlier blocks past the EOS stop are filled only at the end
        assert frame.status == expected and frame.nfe == record.nfe
        assert frame.tokens == [None if t == mask else t for t in state]
        assert frame.final == sum(t != mask for t in state)
        assert frame.tokens_per_forward == pytest.approx(frame.final / record.nfe)
    last = frames[-1]
    assert last.tokens == out.sequences[0, ids.shape[1]:].tolist() and set(last.status) <= {"f", "n"}
    assert last.tokens_per_forward == pytest.approx(out.tpf)


def test_remasked_positions_are_marked(tiny):
    """saber (backtrack=always) takes committed tokens back: a position masked now that held a token
    in the previous frame is 'r'; committed tokens of an unfinished block are provisional ('p')."""
    model, tok = tiny
    out, _, frames = _frames_of(model, tok, "sort: tom fay ivy gus bo wes", "saber:backtrack=always", steps=64)
    remasked = 0
    for previous, frame in zip(frames, frames[1:-1]):
        for i, status in enumerate(frame.status):
            if frame.tokens[i] is None:
                held_before = previous.tokens[i] is not None
                assert status == ("r" if held_before else "m"), (frame.step, i)
                remasked += held_before
        block = frame.block
        in_block = frame.status[block * 8:(block + 1) * 8]
        if "m" in in_block or "r" in in_block:  # an unfinished block: its tokens are not final yet
            assert set(in_block) <= {"m", "r", "p"}
    assert remasked > 0


def test_render_to_a_string_shows_statuses_and_counts(tiny):
    model, tok = tiny
    _, _, frames = _frames_of(model, tok, "shuffle: cyd uma jo ana", "confidence")
    frame = next(f for f in frames if "m" in f.status and "f" in f.status and "n" in f.status)
    plain = Console(file=io.StringIO(), width=200, no_color=True, force_terminal=False)
    plain.print(render_frame(frame, title="tiny-dlm | confidence"))
    lines = plain.file.getvalue().splitlines()
    assert lines[0] == "tiny-dlm | confidence"
    assert lines[1] == (f"step {frame.step} (block {frame.block}) | {frame.nfe} forwards | {frame.final}/64 final | "
                        f"{frame.final / frame.nfe:.2f} tokens/forward")
    pieces = token_pieces(tok)
    assert lines[2] == "".join("·" if t is None else pieces(t) for t in frame.tokens)
    colour = Console(file=io.StringIO(), width=200, force_terminal=True, color_system="standard")
    colour.print(render_frame(frame))
    ansi = colour.file.getvalue()
    assert "\x1b[2m·" in ansi  # masks dim
    new = next(i for i, s in enumerate(frame.status) if s == "n" and pieces(frame.tokens[i]) != "⋄")
    assert f"\x1b[1;32m{pieces(frame.tokens[new])}" in ansi  # new tokens bold green


def test_live_view_redraws_in_place_on_a_terminal(tiny):
    model, tok = tiny
    ids = torch.tensor([tok.encode_prompt("shuffle: cyd uma jo ana")])
    console = Console(file=io.StringIO(), width=120, force_terminal=True, color_system="standard")
    frames = CanvasFrames(token_pieces(tok), block_length=8, mask_id=model.config.mask_token_id, length=64)
    with LiveView(title="t", console=console) as view:
        out = dlm.generate(model, ids, gen_length=64, block_length=8, steps=32, sampler="confidence",
                           return_trace=True, callback=frames_callback(frames, [view]))
        view(frames.finish(out.sequences[0, ids.shape[1]:].tolist(), out.nfe))
    drawn = console.file.getvalue()
    steps = sum(r.tokens is not None for r in out.trace)
    assert all(f"step {k} (block" in drawn for k in range(1, steps + 2))  # every frame drawn (rich repaints the last on stop)
    assert drawn.count("\x1b[1A") >= 2 * steps  # each redraw moves the cursor back over the previous frame
    assert f"{out.nfe} forwards | 64/64 final | {out.tpf:.2f} tokens/forward" in drawn


def test_dgemma_frames_own_rule_and_sampler_mode(dgemma):
    """transformers' rule: the current canvas is provisional (its argmax) until done, earlier canvases
    final; sampler mode: accepted positions final, the noise elsewhere provisional."""
    model, tok = dgemma
    C = model.config.canvas_length
    ids = torch.tensor([tok.encode_prompt("copy: bo jo ana")])
    import copy
    gc = copy.deepcopy(model.generation_config)
    gc.eos_token_id = 1  # never produced: all three canvases run
    for sampler in (None, "confidence"):
        frames = CanvasFrames(token_pieces(tok), block_length=C)
        seen = []
        torch.manual_seed(0)
        kw = {} if sampler is None else dict(sampler=sampler, steps=12, generator=torch.Generator().manual_seed(0))
        out = dlm.generate(model, ids, generation_config=gc, return_trace=True,
                           callback=frames_callback(frames, [seen.append]), **kw)
        records = [r for r in out.trace if r.tokens is not None]
        for record, frame in zip(records, seen):
            start = record.block * C
            assert set(frame.status[:start]) <= {"f", "n"}
            current = frame.status[start:start + C]
            if sampler is None:
                assert current == "p" * C and frame.tokens[start:] == record.tokens[0].tolist()
            else:
                accepted = record.accepted[0].tolist()
                assert all((s in "fn") == a for s, a in zip(current, accepted))
        last = frames.finish(out.sequences[0, ids.shape[1]:].tolist(), out.nfe)
        assert len(last.tokens) == 3 * C and set(last.status) <= {"f", "n"}


# ------------------------------------------------------------------------------------------------
# dlm sample --stream / --live / --record
# ------------------------------------------------------------------------------------------------
def run_cli(capsys, *argv):
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_sample_stream_prints_the_answer_once(capsys):
    code, out, err = run_cli(capsys, "sample", "--stream", "--sampler", "confidence", "--steps", "32",
                             "--block-length", "8")
    assert code == 0 and out == "bo fay gus ivy tom wes\n" and "| confidence | nfe " in err


def test_sample_stream_on_dgemma(capsys):
    code, out, _ = run_cli(capsys, "sample", "--model", "tiny-dgemma", "--stream")
    _, plain, _ = run_cli(capsys, "sample", "--model", "tiny-dgemma")
    assert code == 0 and out == plain == "bo fay gus ivy tom wes\n"


def test_sample_live_without_a_terminal_streams_with_a_note(capsys):
    code, out, err = run_cli(capsys, "sample", "--live")
    assert code == 0 and out == "bo fay gus ivy tom wes\n"
    assert "--live needs a terminal on stderr; streaming the text instead" in err


def test_sample_live_on_a_terminal_draws_frames(capsys, monkeypatch):
    import sys

    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    monkeypatch.setenv("TTY_COMPATIBLE", "1")  # rich: treat the captured stderr as a terminal
    code, out, err = run_cli(capsys, "sample", "--live", "--sampler", "confidence", "--steps", "16",
                             "--block-length", "16")
    assert code == 0 and out == "bo fay gus ivy tom wes\n"
    assert err.count("forwards |") >= 2 and "64/64 final" in err and "\x1b[1A" in err


def test_sample_record_writes_frames_that_replay_to_the_answer(capsys, tmp_path):
    path = tmp_path / "frames.jsonl"
    code, out, _ = run_cli(capsys, "sample", "--json", "--record", str(path), "--sampler", "confidence",
                           "--steps", "16", "--block-length", "16")
    data = json.loads(out)
    header, frames = read_frames(path)
    assert code == 0 and header["sampler"] == "confidence" and header["family"] == "masked"
    assert len(frames) == data["nfe"] + 1  # one frame per forward pass, and the final one
    assert frames[-1].tokens == data["tokens"] and frames[-1].nfe == data["nfe"]
    assert [f.final for f in frames] == sorted(f.final for f in frames)


@pytest.mark.parametrize("argv,fragment", [
    (["--stream", "--json"], "--stream prints the answer as it is decoded, --json prints one object"),
    (["--live", "--json"], "--live prints the answer"),
    (["--stream", "--live", "--json"], "--stream and --live print"),
    (["--live", "--progress"], "drop --progress"),
    (["--live", "--sampler", "hex"], "'hex' is an ensemble"),
    (["--record", "/nonexistent-dir/x.jsonl"], "does not exist"),
])
def test_sample_watch_options_refuse_conflicts_in_one_line(capsys, argv, fragment):
    code, out, err = run_cli(capsys, "sample", *argv)
    assert code == 2 and out == "" and fragment in err and len(err.strip().splitlines()) == 1


def test_render_live_gif_draws_one_image_per_frame(tmp_path):
    """scripts/render_live_gif.py: a recording in, an animated GIF out, one image per frame, the
    status colours where the statuses are (a final token dark, a remasked position red)."""
    from PIL import Image

    from dlm.live import Frame, FrameRecorder
    from script_loader import load_script

    path = tmp_path / "frames.jsonl"
    recorder = FrameRecorder(path, {"model": "m", "sampler": "s", "prompt": "p"})
    recorder(Frame(1, 0, 0, 1, [None, 7, None], "mnm", [None, "ab", None]))
    recorder(Frame(2, 0, 1, 2, [None, 7, 8], "rfn", [None, "ab", "c"]))
    recorder.close()
    script = load_script("render_live_gif.py")
    out = tmp_path / "live.gif"
    assert script.main([str(path), "--out", str(out), "--ms", "100", "--hold", "200"]) == 0
    gif = Image.open(out)
    assert gif.n_frames == 2
    gif.seek(1)
    pixels = set(gif.convert("RGB").getdata())
    assert any(r > 150 and g < 90 and b < 90 for r, g, b in pixels)  # the red ×
