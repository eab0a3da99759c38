"""Streaming (`dlm.generate(..., streamer=)`, `DLMPipeline(..., streamer=)`) with transformers' own
streamer classes, on both model families (tiny-dlm: masked; tiny-dgemma: transformers'
DiffusionGemma class, uniform noise).

References: for a masked model, the final prefix is recomputed in the test from the step trace
(a token is final once committed and everything before it is; the stream stops at the first EOS);
for DiffusionGemma in its own rule, transformers' `model.generate(..., streamer=)` itself: the same
calls (prompt, drafts, canvases, end) in the same order from the same seed."""
from __future__ import annotations

import copy
import threading

import pytest
import torch
from transformers import TextIteratorStreamer, TextStreamer

import dlm


class Recorder:
    """A BaseStreamer that logs every call (with `put_draft`, as transformers' TextDiffusionStreamer has)."""

    def __init__(self, log=None, drafts=False):
        self.log = [] if log is None else log
        if drafts:
            self.put_draft = lambda value: self.log.append(("draft", value.tolist()))

    def put(self, value):
        self.log.append(("put", value.tolist()))

    def end(self):
        self.log.append(("end",))


@pytest.fixture(scope="module")
def tiny():
    return dlm.load("tiny-dlm")


@pytest.fixture(scope="module")
def dgemma():
    return dlm.load("tiny-dgemma")


def _flat(value):
    return [t for row in value for t in row] if value and isinstance(value[0], list) else value


def _prompt(tokenizer, text):
    return torch.tensor([tokenizer.encode_prompt(text)])


@pytest.mark.parametrize("sampler,steps,block", [("confidence", 32, 4), ("threshold", 64, 4), ("lopa", 32, 4),
                                                 ("saber:backtrack=always", 64, 8)])
def test_masked_stream_pushes_the_final_prefix_as_soon_as_it_is_final(tiny, sampler, steps, block):
    """After every step, the tokens streamed so far are exactly the committed prefix the trace shows
    (whole complete blocks for `saber`, which remasks), cut after the first EOS; the stream opens
    with the prompt and closes with one end(); its tokens are the output's, up to that EOS."""
    model, tok = tiny
    ids = _prompt(tok, "shuffle: cyd uma jo ana")  # several steps even for threshold and lopa
    log = []
    out = dlm.generate(model, ids, gen_length=64, block_length=block, steps=steps, sampler=sampler, return_trace=True,
                       callback=lambda r: log.append(("step", r)), streamer=Recorder(log))
    assert log[0] == ("put", ids.tolist()) and log[-1] == ("end",)
    assert sum(entry[0] == "end" for entry in log) == 1
    mask, eos = model.config.mask_token_id, model.config.eos_token_id
    state, streamed, checked = [mask] * 64, [], 0
    for entry in log[1:] + [("step", None)]:
        if entry[0] == "put":
            streamed += _flat(entry[1])
            continue
        if entry[0] != "step":
            continue
        if checked:  # every put since the previous step brought the stream to the final prefix
            final = 0
            while final < 64 and state[final] != mask:
                final += 1
            if sampler.startswith("saber") and final < 64:
                final -= final % block  # a remasking sampler's block is final once complete
            expected = state[:final]
            if eos in expected:
                expected = expected[:expected.index(eos) + 1]
            if len(streamed) < len(expected) or eos not in streamed:  # before the end's flush
                assert streamed == expected, f"{sampler} step {checked}"
        record = entry[1]
        if record is not None and record.tokens is not None and record.rows.numel():
            start = record.block * block
            state[start:start + record.tokens.shape[1]] = record.tokens[0].tolist()
            checked += 1
    generated = out.sequences[0, ids.shape[1]:].tolist()
    if eos in generated:
        generated = generated[:generated.index(eos) + 1]
    assert streamed == generated and checked > 1
    if not sampler.startswith("saber"):  # (saber's answer fits its first block: one piece)
        assert len([e for e in log if e[0] == "put"]) > 2  # the answer arrived in several pieces


def test_masked_stream_drops_the_trace_it_borrowed(tiny):
    model, tok = tiny
    out = dlm.generate(model, _prompt(tok, "copy: bo jo"), gen_length=32, steps=32, streamer=Recorder())
    assert out.trace == []


def test_text_streamer_prints_the_pipeline_answer(tiny, capsys):
    """transformers' TextStreamer, unchanged, on the masked model: what it prints is the answer."""
    model, tok = tiny
    pipe = dlm.DLMPipeline(model, tok)
    out = pipe("sort: tom fay ivy gus", num_inference_steps=16, gen_length=64, block_length=32,
               sampler="confidence", streamer=TextStreamer(tok, skip_prompt=True))
    assert capsys.readouterr().out == out.texts[0] + "\n" and out.texts[0] == "fay gus ivy tom"


def test_text_iterator_streamer_yields_the_answer_from_another_thread(tiny):
    model, tok = tiny
    streamer = TextIteratorStreamer(tok, skip_prompt=True, timeout=60)
    pipe = dlm.DLMPipeline(model, tok)
    result = {}
    worker = threading.Thread(target=lambda: result.update(out=pipe("reverse: ana bo cyd", gen_length=64,
                                                                   block_length=32, streamer=streamer)))
    worker.start()
    pieces = list(streamer)
    worker.join()
    assert "".join(pieces) == result["out"].texts[0] == "cyd bo ana"


def test_hex_streams_its_voted_answer_at_the_end(tiny):
    model, tok = tiny
    ids = _prompt(tok, "copy: bo jo")
    log = []
    out = dlm.generate(model, ids, gen_length=32, sampler="hex", streamer=Recorder(log))
    generated = out.sequences[0, ids.shape[1]:].tolist()
    eos = model.config.eos_token_id
    assert [e[0] for e in log] == ["put", "put", "end"]
    assert log[1][1] == generated[:generated.index(eos) + 1]


# ------------------------------------------------------------------------------------------------
# DiffusionGemma (tiny-dgemma, transformers' class)
# ------------------------------------------------------------------------------------------------
def _no_eos(model, **overrides):
    """The model's generation config with an EOS id the model never produces (its unused mask token,
    id 1), so that every planned canvas is generated (None would fall back to the model's EOS)."""
    gc = copy.deepcopy(model.generation_config)
    gc.eos_token_id = 1
    for key, value in overrides.items():
        setattr(gc, key, value)
    return gc


@pytest.mark.parametrize("eos", [True, False])
def test_dgemma_stream_is_transformers_generate_call_for_call(dgemma, eos):
    """transformers' rule: prompt, every step's argmax draft, each finalised canvas, end: the calls a
    draft streamer gets from `model.generate` from the same seed (one canvas ending at EOS, and
    three canvases without EOS)."""
    model, tok = dgemma
    ids = _prompt(tok, "sort: tom fay ivy gus")
    gc = None if eos else _no_eos(model)
    streams = []
    for run in (model.generate, lambda *a, **k: dlm.generate(model, *a, **k)):
        log = []
        torch.manual_seed(3)
        run(ids, generation_config=gc, streamer=Recorder(log, drafts=True))
        streams.append(log)
    ours, reference = streams[1], streams[0]
    assert ours == reference
    assert sum(e[0] == "draft" for e in ours) > 1 and sum(e[0] == "put" for e in ours) == (2 if eos else 4)


def test_dgemma_sampler_mode_streams_each_canvas_once_accepted(dgemma):
    model, tok = dgemma
    ids = _prompt(tok, "copy: bo jo ana")
    log = []
    gen = torch.Generator().manual_seed(0)
    out = dlm.generate(model, ids, sampler="threshold", steps=24, generation_config=_no_eos(model),
                       generator=gen, return_trace=True, callback=lambda r: log.append(("step", r.block)),
                       streamer=Recorder(log, drafts=True))
    puts = [e[1] for e in log if e[0] == "put"]
    C = model.config.canvas_length
    generated = out.sequences[0, ids.shape[1]:]
    assert puts[1:] == [generated[i:i + C].view(1, -1).tolist() for i in range(0, generated.numel(), C)]
    assert not any(e[0] == "draft" for e in log)  # drafts are the argmax of transformers' rule only
    # each canvas is put on the first step of the next one (after the user's callback), the last at the end
    order = [e[1] if e[0] == "step" else e[0] for e in log[1:-1]]
    steps = [e for e in order if e != "put"]
    expected = [x for i, canvas in enumerate(steps)
                for x in ([canvas, "put"] if i and canvas != steps[i - 1] else [canvas])] + ["put"]
    assert order == expected and len(puts) == 4


@pytest.mark.parametrize("make", [lambda tok: TextStreamer(tok, skip_prompt=True),
                                  lambda tok: TextIteratorStreamer(tok, skip_prompt=True, timeout=60)])
def test_dgemma_with_transformers_text_streamers(dgemma, capsys, make):
    model, tok = dgemma
    streamer = make(tok)
    pipe = dlm.DLMPipeline(model, tok)
    result = {}

    def run():
        torch.manual_seed(0)
        result["out"] = pipe("sort: tom fay ivy", streamer=streamer)

    if isinstance(streamer, TextIteratorStreamer):
        worker = threading.Thread(target=run)
        worker.start()
        text = "".join(streamer)
        worker.join()
    else:
        run()
        text = capsys.readouterr().out.removesuffix("\n")
    assert text == result["out"].texts[0] == "fay ivy tom"


# ------------------------------------------------------------------------------------------------
# Bad input
# ------------------------------------------------------------------------------------------------
class PutOnly:
    def put(self, value):
        pass


def test_a_streamer_without_end_is_refused_naming_the_interface(tiny):
    model, tok = tiny
    with pytest.raises(ValueError, match=r"BaseStreamer interface.*no end\(\)"):
        dlm.generate(model, _prompt(tok, "copy: bo"), gen_length=32, streamer=PutOnly())


def test_a_batch_is_refused_before_anything_is_put(tiny):
    model, tok = tiny
    log = []
    ids = torch.cat([_prompt(tok, "copy: bo"), _prompt(tok, "copy: jo")])
    with pytest.raises(ValueError, match="batch 1"):
        dlm.generate(model, ids, gen_length=32, streamer=Recorder(log))
    assert log == []


def test_a_logits_draft_streamer_is_refused(dgemma):
    model, tok = dgemma
    streamer = Recorder(drafts=True)
    streamer._takes_logits = True
    with pytest.raises(ValueError, match="_takes_logits"):
        dlm.generate(model, _prompt(tok, "copy: bo"), streamer=streamer)


def test_end_is_called_when_generation_raises(tiny):
    """A consumer thread waiting on a TextIteratorStreamer must not hang when the model fails."""
    model, tok = tiny
    calls = {"n": 0}

    class Failing(torch.nn.Module):
        config = model.config

        def forward(self, *args, **kwargs):
            calls["n"] += 1
            if calls["n"] == 3:
                raise RuntimeError("out of memory (simulated)")
            return model(*args, **kwargs)

    log = []
    with pytest.raises(RuntimeError, match="simulated"):
        dlm.generate(Failing(), _prompt(tok, "reverse: ana bo cyd"), gen_length=32, steps=32, kv_cache="none",
                     sampler="confidence", streamer=Recorder(log))
    assert log[-1] == ("end",) and sum(e[0] == "end" for e in log) == 1
