"""Our engine as an lm-evaluation-harness model: `import dlm.lm_eval` registers it as `dlm`.

    dlm eval --model_args pretrained=tiny-dlm,sampler=threshold,steps=16,gen_length=64,block_length=32 \\
        --tasks dlm_tiny_arithmetic --limit 16
    lm_eval.simple_evaluate(model="dlm", model_args="pretrained=tiny-dlm,sampler=threshold", tasks=[...])

- `generate_until`: `dlm.generate` with the sampler, budget, blocks, cache, guidance, temperature and
  seed of `--model_args` (`dlm.evaluation.args.EvalArgs`), in left-padded batches of `batch_size`
  that change no output, stop sequences per request (`dlm.evaluation.generation`);
- `loglikelihood`: LLaDA's Monte Carlo estimator (`dlm.evaluation.likelihood`) for masked models,
  so multiple-choice tasks run; a uniform-noise model (DiffusionGemma) has no masked-token
  likelihood and is refused with what to use instead; `loglikelihood_rolling` is refused;
- per request: forwards, generated tokens (up to EOS), TPF and wall time (`self.records`,
  `dlm.evaluation.counts`); `dlm eval` writes them beside the harness's samples and prints a summary.

The harness (the `eval` extra, lm_eval 0.4.13) reads no entry points for models: a process must
import this module before it names the model `dlm`, which `dlm eval` does. The harness's own
models are registered first, because its `get_model` imports them only while the registry is empty.
"""
from __future__ import annotations

import logging
import sys

import lm_eval.models  # noqa: F401  (the harness's own models, before ours: see the module docstring)
import torch
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model
from tqdm.auto import tqdm

from dlm.evaluation.args import EvalArgs
from dlm.evaluation.counts import RequestCount, format_summary, summarize
from dlm.evaluation.generation import BatchedGenerator, GenerationRequest
from dlm.evaluation.likelihood import estimate_loglikelihoods, request_generator

log = logging.getLogger(__name__)

# The per-request counts of every model this process built, newest last: `dlm eval` reads those of the
# one the harness made (the harness drops the model itself when its run ends; its counts stay here).
RUNS: list[list[RequestCount]] = []


@register_model("dlm")
class DLMEvalLM(LM):
    """The harness model `dlm`; the keyword arguments are `EvalArgs` (docs/eval.md lists them).

    `pretrained` may also be a `dlm.LoadedModel` (from Python), as the harness's HFLM takes a model object.
    """

    def __init__(self, pretrained="tiny-dlm", **kwargs):
        super().__init__()
        self.args = EvalArgs.from_model_args({"pretrained": pretrained, **kwargs})
        device = self.args.device or ("cuda" if torch.cuda.is_available() else "cpu")
        try:
            self._device = torch.device(device)
        except RuntimeError:
            raise ValueError(f"device {device!r} is not a torch device; use cpu, cuda or cuda:N") from None
        if self._device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"device {device!r}: this torch ({torch.__version__}) sees no CUDA device; pass "
                             "--device cpu (or device=cpu in model_args)")
        if isinstance(pretrained, str):
            import dlm

            dtype = None if self.args.dtype == "auto" else getattr(torch, self.args.dtype)
            self.loaded = dlm.load(pretrained, device=self._device, dtype=dtype,
                                   trust_remote_code=self.args.trust_remote_code)
        else:
            self.loaded = pretrained
        self.tokenizer = self.loaded.tokenizer
        self.records: list[RequestCount] = []
        self._chat_applied = False
        self._generator = BatchedGenerator(self.loaded, self.args, self._device)
        self._likelihood_calls = 0
        RUNS.append(self.records)

    # ------------------------------------------------------------------ the harness's interface
    @property
    def tokenizer_name(self) -> str:
        return str(getattr(self.tokenizer, "name_or_path", None) or self.loaded.name).replace("/", "__")

    def chat_template(self, chat_template: bool | str = False) -> str | None:
        return getattr(self.tokenizer, "chat_template", None) or ""

    def apply_chat_template(self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        """The harness's `--apply_chat_template`: the tokenizer's own template, as text."""
        if not getattr(self.tokenizer, "chat_template", None):
            raise ValueError(f"--apply_chat_template: the tokenizer of {self.loaded.name!r} has no chat template; "
                             "drop the flag (the built-in models take their own prompt format)")
        self._chat_applied = True
        return self.tokenizer.apply_chat_template(chat_history, tokenize=False,
                                                  add_generation_prompt=add_generation_prompt)

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """One text per request: `args = (context, gen_kwargs)`; see `dlm.evaluation.generation`."""
        if not requests:
            return []
        batch = [self._generation_request(req) for req in requests]
        texts, counts = self._generator.run(batch, progress=not disable_tqdm)
        self.records.extend(counts)
        return texts

    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        """`(log p(continuation | context), is_greedy)` per request by LLaDA's Monte Carlo estimator
        with `mc_num` samples, `batch_size` rows per forward; `is_greedy` is False unless `check_greedy`."""
        if not requests:
            return []
        self._refuse_without_likelihood("loglikelihood")
        pairs = [self._likelihood_pair(*req.args) for req in requests]
        a, loaded = self.args, self.loaded
        counts: dict[tuple, int] = {}
        generators = []
        for prefix, target in pairs:  # repeated identical requests get different draws
            key = (tuple(prefix), tuple(target))
            generators.append(request_generator(a.seed, prefix, target, counts.get(key, 0)))
            counts[key] = counts.get(key, 0) + 1
        bar = tqdm(total=len(pairs) * a.mc_num, desc="dlm loglikelihood", unit="row", disable=disable_tqdm,
                   file=sys.stderr)
        start = _now(self._device)
        estimates = estimate_loglikelihoods(
            loaded.model, pairs, mask_token_id=loaded.mask_token_id, mc_num=a.mc_num, rows_per_forward=a.batch_size,
            cfg_scale=float(a.cfg), shift_logits=bool(loaded.shift_logits), pad_token_id=loaded.pad_token_id,
            device=self._device, generators=generators, progress=bar.update)
        seconds = _now(self._device) - start
        bar.close()
        out = []
        call = self._generator.calls + self._likelihood_calls
        self._likelihood_calls += 1
        for req, (prefix, target), est in zip(requests, pairs, estimates):
            greedy = self._is_greedy(prefix, target) if a.check_greedy else False
            self.records.append(RequestCount(
                kind="loglikelihood", task=req.task_name, doc_id=req.doc_id, prompt_tokens=len(prefix),
                generated_tokens=0, forwards=est.forwards, seconds=seconds, call=call, call_rows=len(requests),
                loglikelihood=est.loglikelihood, stderr=est.stderr, rows=est.rows))
            out.append((est.loglikelihood, greedy))
        return out

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        raise ValueError(
            "loglikelihood_rolling (perplexity tasks such as wikitext) is not supported by the dlm model: a "
            "diffusion LM gives no left-to-right probability of a whole text, and the Monte Carlo bound scores a "
            "continuation given a context; run loglikelihood (multiple-choice) or generate_until tasks")

    # ------------------------------------------------------------------ summary
    def summary(self) -> dict:
        """Totals of this model's requests so far (`dlm.evaluation.counts.summarize`)."""
        return summarize(self.records)

    def summary_table(self) -> str:
        return format_summary(self.summary())

    # ------------------------------------------------------------------ encoding
    def _encode_prompt(self, context: str) -> list[int]:
        """A context as the model expects its prompt: the built-in models' own format (`format_prompt`),
        else the text (already in the chat template when the harness applied it) with the tokenizer's
        special tokens unless `add_special_tokens` says otherwise or a chat template was applied."""
        tok = self.tokenizer
        own_format = getattr(tok, "format_prompt", None)
        if callable(own_format) and not self._chat_applied:
            context = own_format(context)
        special = self.args.add_special_tokens
        if special is None:
            special = not self._chat_applied
        ids = list(tok.encode(context, add_special_tokens=special))
        if not ids:
            raise ValueError("a context encodes to zero tokens; the dlm model needs a prompt")
        return ids

    def _generation_request(self, req) -> GenerationRequest:
        context, gen_kwargs = req.args
        gen_kwargs = dict(gen_kwargs or {})
        until = gen_kwargs.pop("until", None) or []
        until = [until] if isinstance(until, str) else list(until)
        max_gen = gen_kwargs.pop("max_gen_toks", None)
        self._note_ignored(gen_kwargs)
        gen_length = self.args.gen_length or max_gen
        if gen_length is None:
            raise ValueError("the request gives no max_gen_toks and model_args no gen_length; pass gen_length=N")
        block = self.args.block_length
        if block and gen_length % block:
            raise ValueError(f"the request's max_gen_toks ({gen_length}) is not a multiple of block_length ({block}); "
                             "pass gen_length=N in model_args (a multiple of block_length)")
        return GenerationRequest(self._encode_prompt(context), until, int(gen_length), req.task_name, req.doc_id)

    _IGNORED_SAID: set = set()

    def _note_ignored(self, gen_kwargs: dict) -> None:
        """The harness's sampling keywords do not steer our engine (model_args do): say so once per key."""
        for key, value in gen_kwargs.items():
            if key in ("do_sample", "temperature") and not value:
                continue  # greedy, as our default temperature 0; agrees unless model_args ask otherwise
            if key not in self._IGNORED_SAID:
                self._IGNORED_SAID.add(key)
                log.warning("dlm: gen_kwargs %s=%r is not used; set sampling in model_args (temperature=, sampler=, "
                            "seed=)", key, value)

    def _likelihood_pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        """Prefix and target ids (ALGORITHMS 5.3a): the context's trailing whitespace moves into the
        continuation; target = ids(context + continuation) after len(ids(context)). The built-in models
        take the context in their prompt format and the continuation as their response."""
        if not continuation:
            raise ValueError("loglikelihood: an empty continuation has nothing to score")
        tok = self.tokenizer
        if callable(getattr(tok, "format_prompt", None)) and not self._chat_applied:
            return self._encode_prompt(context), list(tok.encode(continuation))
        stripped = context.rstrip()
        continuation = context[len(stripped):] + continuation
        special = self.args.add_special_tokens if self.args.add_special_tokens is not None else not self._chat_applied
        whole = list(tok.encode(stripped + continuation, add_special_tokens=special))
        prefix = list(tok.encode(stripped, add_special_tokens=special)) if stripped else []
        if not prefix:  # an empty context: the BOS (else EOS) token stands in, as the harness's HF model does
            start = getattr(tok, "bos_token_id", None)
            start = start if start is not None else self.loaded.eos_token_id
            prefix, whole = [start], [start] + whole
        # as the harness's HF model and LLaDA's evaluation: both parts cut from the joint encoding, so a
        # token that merges across the boundary goes to the context
        return whole[:len(prefix)], whole[len(prefix):]

    def _is_greedy(self, prefix: list[int], target: list[int]) -> bool:
        """LLaDA's check: decode len(target) tokens one per step (low-confidence remasking) at temperature 0."""
        import dlm

        n = len(target)
        ids = torch.tensor([prefix], device=self._device)
        out = dlm.generate(self.loaded.model, ids, gen_length=n, block_length=n, steps=n, sampler="confidence",
                           mask_token_id=self.loaded.mask_token_id, eos_token_id=self.loaded.eos_token_id,
                           shift_logits=self.loaded.shift_logits, eos_early_stop=False, kv_cache="none")
        return out.sequences[0, len(prefix):].tolist() == target

    def _refuse_without_likelihood(self, what: str) -> None:
        if self.loaded.family != "masked":
            raise ValueError(
                f"{what}: {self.loaded.name!r} is a {self.loaded.family} model (DiffusionGemma family): it has no mask "
                "token, so there is no masked-token likelihood to estimate; run generate_until tasks with it (e.g. "
                "gsm8k), or a masked model (LLaDA, Dream, LLaDA2, tiny-dlm) for multiple-choice tasks")


def _now(device: torch.device) -> float:
    import time

    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def last_records() -> list[RequestCount] | None:
    """The counts of the newest `dlm` model built in this process (the one the harness made for `dlm eval`)."""
    return RUNS[-1] if RUNS else None
