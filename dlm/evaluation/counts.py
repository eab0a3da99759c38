"""Per-request counts of a harness run and their summary, counted as the papers count them.

Generated tokens are the tokens before the first EOS: never the prompt, never the EOS padding a
masked model leaves after its answer (Fast-dLLM counted the prompt in one of its versions, and the
padding in another; ALGORITHMS 5.3c). Forwards are the model calls a request's row took part in
(a row that finished at an EOS leaves the batch), so TPF is generated tokens per forward of that
request. Tokens per second divide all generated tokens by the wall time of all decoding calls, each
call counted once however many requests it held.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass
class RequestCount:
    """One harness request.

    Attributes:
        kind: "generate_until" or "loglikelihood". task / doc_id: the harness's, to join its samples.
        prompt_tokens: context tokens as the model saw them. generated_tokens: tokens before the
            first EOS (0 for a likelihood request). forwards: model calls that held this request's
            rows. seconds: wall time of the call that decoded it (shared by the requests of a batch).
        call: index of that call in the run; call_rows: requests it held. stop: the stop sequence
            that cut the text, "eos", or "length" (neither: the generation length ran out); None for
            likelihood requests. loglikelihood / stderr / rows: likelihood requests only.
    """

    kind: str
    task: str | None
    doc_id: int | None
    prompt_tokens: int
    generated_tokens: int
    forwards: int
    seconds: float
    call: int
    call_rows: int
    stop: str | None = None
    loglikelihood: float | None = None
    stderr: float | None = None
    rows: int | None = None

    @property
    def tpf(self) -> float:
        return self.generated_tokens / self.forwards if self.forwards else 0.0

    def to_dict(self) -> dict:
        return {**asdict(self), "tpf": self.tpf}


def summarize(records: list[RequestCount]) -> dict:
    """Totals per kind: requests, generated tokens, forwards (per request, summed), calls and their
    forwards, wall seconds (each call once), TPF and generated tokens per second."""
    out = {}
    for kind in dict.fromkeys(r.kind for r in records):
        rs = [r for r in records if r.kind == kind]
        calls = {r.call: r.seconds for r in rs}
        seconds = sum(calls.values())
        tokens, forwards = sum(r.generated_tokens for r in rs), sum(r.forwards for r in rs)
        out[kind] = {"requests": len(rs), "generated_tokens": tokens, "forwards": forwards, "calls": len(calls),
                     "seconds": seconds, "tpf": tokens / forwards if forwards else 0.0,
                     "tokens_per_s": tokens / seconds if seconds > 0 else 0.0}
    return out


def format_summary(summary: dict) -> str:
    """The summary as a markdown table, printed under the harness's own table."""
    lines = ["|kind|requests|generated tokens|forwards|TPF|seconds|tokens/s|", "|---|--:|--:|--:|--:|--:|--:|"]
    for kind, s in summary.items():
        lines.append(f"|{kind}|{s['requests']}|{s['generated_tokens']}|{s['forwards']}|{s['tpf']:.2f}|"
                     f"{s['seconds']:.2f}|{s['tokens_per_s']:.1f}|")
    return "\n".join(lines)


def write_jsonl(records: list[RequestCount], path: str | Path) -> Path:
    """One JSON object per request (with its `tpf`), in the order the harness sent them."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r.to_dict()) + "\n")
    return path
