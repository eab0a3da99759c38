"""`generate_until` for the harness: left-padded batches through `dlm.generate`, stop sequences, counts.

Batching never changes an output (the harness's users ask why their scores move with the batch size):
- at temperature 0 with a sampler that draws nothing, a request's tokens do not depend on the other
  rows of its batch: left padding is hidden by the attention mask and skipped by the positions;
- a setting that draws random numbers (temperature > 0, random-order samplers, DiffusionGemma's
  noise) would give each row draws that depend on its place in the batch. Each batched call tells:
  when it consumed random numbers (the generator's or torch's global state moved), that call is
  thrown away and from then on every request is decoded alone, from a generator seeded by the run's
  seed and the request's own tokens (`request_seed`), so that batch size and request order change
  nothing. A request decoded alone (batch_size 1) uses the same seed.
The first call of a run is repeated untimed (warm-up), so first-call costs stay out of the timings.
Stop sequences are applied per request (Fast-dLLM's batched version applied the last request's to the
whole batch, ALGORITHMS 5.3c), on the text decoded with special tokens kept and cut at the first EOS;
special tokens are removed after the cut, so a stop sequence may itself be a special token.
"""
from __future__ import annotations

import hashlib
import logging
import sys
import time
from dataclasses import dataclass
from typing import Any, Sequence

import torch
from tqdm.auto import tqdm

from dlm.evaluation.counts import RequestCount

log = logging.getLogger(__name__)


@dataclass
class GenerationRequest:
    """One request: prompt ids as the model expects them, its stop strings and generation length."""

    prompt_ids: list[int]
    until: list[str]
    gen_length: int
    task: str | None = None
    doc_id: int | None = None


def request_seed(seed: int, prompt_ids: Sequence[int], occurrence: int) -> int:
    """The seed of a request decoded alone: the run's seed, its tokens and which repeat of identical
    requests it is (so that `repeats` in a task still draws different samples)."""
    text = f"{seed}|{occurrence}|{','.join(map(str, prompt_ids))}"
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") & ((1 << 63) - 1)


def cut_at_stops(text: str, until: Sequence[str]) -> tuple[str, str | None]:
    """`text` up to the earliest occurrence of any stop string, and that string (None if none occurs)."""
    best, hit = len(text), None
    for stop in until:
        if stop:
            at = text.find(stop)
            if 0 <= at < best:
                best, hit = at, stop
    return text[:best], hit


def special_strings(tokenizer) -> list[str]:
    """The text of the tokenizer's special tokens, longest first (removed from a decoded answer)."""
    names = getattr(tokenizer, "all_special_tokens", None)
    if names is None:
        ids = getattr(tokenizer, "all_special_ids", [])
        names = tokenizer.convert_ids_to_tokens(ids) if ids else []
    return sorted({s for s in names if s}, key=len, reverse=True)


def decode_answer(tokenizer, ids: list[int], eos_id: int | None, until: Sequence[str],
                  specials: Sequence[str]) -> tuple[str, int, str]:
    """`(text, generated tokens, stop)` of one row's generated ids: cut at the first EOS (the tokens
    before it are the generated tokens), decoded with special tokens, cut at `until`, specials removed."""
    n = ids.index(eos_id) if eos_id is not None and eos_id in ids else len(ids)
    text, hit = cut_at_stops(tokenizer.decode(ids[:n], skip_special_tokens=False), until)
    for s in specials:
        text = text.replace(s, "")
    stop = hit if hit is not None else ("eos" if n < len(ids) else "length")
    return text, n, stop


class BatchedGenerator:
    """Runs `GenerationRequest`s through `dlm.generate` with one model's ids and one `EvalArgs`."""

    def __init__(self, loaded, args, device: torch.device):
        self.loaded, self.args, self.device = loaded, args, torch.device(device)
        self.calls = 0
        self.stochastic = False  # set when a batched call drew random numbers
        self.warmed = False
        self.specials = special_strings(loaded.tokenizer)

    # ------------------------------------------------------------------ one call
    def _generate_kwargs(self, gen_length: int) -> dict:
        kw = self.args.generate_kwargs()
        kw["gen_length"] = gen_length
        if self.args.block_length is not None:
            kw["block_length"] = self.args.block_length
        if self.loaded.family == "masked":
            kw.update(mask_token_id=self.loaded.mask_token_id, eos_token_id=self.loaded.eos_token_id,
                      shift_logits=self.loaded.shift_logits)
        return kw

    def _call(self, requests: list[GenerationRequest], seed: int) -> tuple[Any, list[int], float, bool]:
        """One `dlm.generate` call; returns the output, per-row forwards, wall seconds and whether it
        drew random numbers."""
        import dlm

        width = max(len(r.prompt_ids) for r in requests)
        pad = self.loaded.pad_token_id if self.loaded.pad_token_id is not None else 0
        ids = torch.tensor([[pad] * (width - len(r.prompt_ids)) + r.prompt_ids for r in requests], device=self.device)
        mask = torch.tensor([[0] * (width - len(r.prompt_ids)) + [1] * len(r.prompt_ids) for r in requests],
                            device=self.device)
        per_row = torch.zeros(len(requests), dtype=torch.long)

        def count(trace):
            per_row[trace.rows.cpu()] += trace.forwards

        generator = torch.Generator(device=self.device).manual_seed(seed)
        cuda = self.device.type == "cuda"
        with torch.random.fork_rng(devices=[self.device] if cuda else []):
            torch.manual_seed(seed)  # DiffusionGemma's own rule draws from torch's global generator
            before = _rng_states(generator, self.device)
            if cuda:
                torch.cuda.synchronize(self.device)
            start = time.perf_counter()
            # transformers' own DiffusionGemma rule (no sampler) takes no generator: it draws from torch's
            kw = self._generate_kwargs(requests[0].gen_length)
            if self.loaded.family == "masked" or self.args.sampler is not None:
                kw["generator"] = generator
            out = dlm.generate(self.loaded.model, ids, attention_mask=mask, callback=count, **kw)
            if cuda:
                torch.cuda.synchronize(self.device)
            seconds = time.perf_counter() - start
            drew = any(not torch.equal(a, b) for a, b in zip(before, _rng_states(generator, self.device)))
        self.calls += 1
        if out.nfe_per_sequence is not None:  # uniform noise: transformers' count per sequence
            per_row = out.nfe_per_sequence.cpu()
        return out, per_row.tolist(), seconds, drew

    # ------------------------------------------------------------------ a list of requests
    def run(self, requests: list[GenerationRequest], progress: bool = False) -> tuple[list[str], list[RequestCount]]:
        """Texts and counts, in the order of `requests`."""
        seeds = self._seeds(requests)
        texts: list[str | None] = [None] * len(requests)
        counts: list[RequestCount | None] = [None] * len(requests)
        bar = tqdm(total=len(requests), desc="dlm generate_until", unit="req", disable=not progress, file=sys.stderr)
        if not self.warmed:  # first-call allocations and lazy imports stay out of the timings
            self._call([requests[0]], seeds[0])
            self.calls -= 1
            self.warmed = True
        for batch in self._batches(requests):
            if len(batch) > 1 and not self.stochastic:
                out, per_row, seconds, drew = self._call([requests[i] for i in batch], seeds[batch[0]])
                if not drew:
                    self._record(requests, batch, out, per_row, seconds, texts, counts)
                    bar.update(len(batch))
                    continue
                # its rows' draws depended on their places in the batch: thrown away, and from now on
                # every request is decoded alone (the batches before drew nothing, so they stand)
                self.calls -= 1
                self.stochastic = True
                log.warning("dlm: this setting draws random numbers (temperature > 0, a random-order sampler or "
                            "DiffusionGemma's noise): requests are decoded one at a time, each from its own seed, "
                            "so that batch_size changes no output")
            for i in batch:  # alone, from the request's own seed
                out, per_row, seconds, _ = self._call([requests[i]], seeds[i])
                self._record(requests, [i], out, per_row, seconds, texts, counts)
                bar.update(1)
        bar.close()
        return texts, counts

    def _seeds(self, requests: list[GenerationRequest]) -> list[int]:
        seen: dict[tuple, int] = {}
        seeds = []
        for r in requests:
            key = tuple(r.prompt_ids)
            seeds.append(request_seed(self.args.seed, r.prompt_ids, seen.get(key, 0)))
            seen[key] = seen.get(key, 0) + 1
        return seeds

    def _batches(self, requests: list[GenerationRequest]) -> list[list[int]]:
        """Request indices in batches of `batch_size` sharing one generation length, longest prompts
        first (less padding; the order changes no output)."""
        order = sorted(range(len(requests)), key=lambda i: (requests[i].gen_length, -len(requests[i].prompt_ids)))
        size = self.args.batch_size
        batches = []
        for i in order:
            if batches and len(batches[-1]) < size and requests[batches[-1][0]].gen_length == requests[i].gen_length:
                batches[-1].append(i)
            else:
                batches.append([i])
        return batches

    def _record(self, requests, batch, out, per_row, seconds, texts, counts) -> None:
        width = max(len(requests[i].prompt_ids) for i in batch)
        generated = out.sequences[:, width:].tolist()
        for row, i in enumerate(batch):
            r = requests[i]
            text, n, stop = decode_answer(self.loaded.tokenizer, generated[row], self.loaded.eos_token_id, r.until,
                                          self.specials)
            texts[i] = text
            counts[i] = RequestCount(kind="generate_until", task=r.task, doc_id=r.doc_id, prompt_tokens=len(r.prompt_ids),
                                     generated_tokens=n, forwards=int(per_row[row]), seconds=seconds,
                                     call=self.calls - 1, call_rows=len(batch), stop=stop)


def _rng_states(generator: torch.Generator, device: torch.device) -> list[torch.Tensor]:
    states = [generator.get_state().clone(), torch.get_rng_state()]
    if device.type == "cuda":
        states.append(torch.cuda.get_rng_state(device))
    return states
