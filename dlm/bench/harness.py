"""Quality-vs-steps benchmark: every (sampler, budget) pair on the same prompts.

    from dlm.bench import BenchConfig, run_bench
    result = run_bench(BenchConfig(model="tiny-dlm", suite="list_edits", samplers=["confidence", "threshold"],
                                   steps=[8, 16, 32, 64], limit=16))

Definitions (also in docs/benchmarks.md):
- quality: mean task score over the prompts, in percent (0-100); `quality_by_task` per task.
- nfe: forward passes per sequence, averaged over prompts: the number of model calls whose batch
  contained that prompt's row (our engine drops rows that finished at an EOS; diffusers' pipeline
  keeps every row in every call). `nfe_per_call`: forward passes per batched call, averaged over
  the batches (a batched forward counts once). A lookahead sampler's batched call over k candidate
  blocks per row (LoPA) counts as one forward pass here.
- branch_forwards: forward passes per sequence counted per evaluated branch (a lookahead call over k
  candidates adds k), averaged over prompts; equal to `nfe` for samplers that do not look ahead.
- tpf: tokens per forward, `prompts * gen_length / sum of per-sequence NFE`.
- seconds: wall time of all batches of the pair; a warm-up call per engine runs first and is excluded.
  tokens_per_s: `prompts * gen_length / seconds`.
- peak_mem_mb: on CUDA, `torch.cuda.max_memory_allocated` above the level before the pair; on CPU,
  the peak resident set size sampled every 5 ms by a thread reading /proc/self/statm, above the RSS
  before the pair (`mem_method` says which).
"""
from __future__ import annotations

import platform
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from itertools import groupby
from typing import Any

import torch
from tqdm.auto import tqdm

from dlm.bench.external_rows import external_rows
from dlm.bench.memory import PeakMemory
from dlm.bench.specs import SamplerSpec, parse_sampler_specs, parse_steps  # noqa: F401 (re-exported)
from dlm.decoding_config import KV_CACHE_MODES


def load_model(name_or_path: str, device: str = "cpu"):
    """`(model, tokenizer, ids)` for a built-in name or a checkpoint path; `ids` holds the mask, EOS and
    pad ids the loader resolved (None where unknown).

    """
    from dlm.loading import load as project_load

    try:
        obj = project_load(name_or_path, device=device)
    except (OSError, KeyError) as err:
        raise ValueError(f"cannot load model {name_or_path!r}: {err}") from None
    if isinstance(obj, tuple):
        return obj[0], obj[1], {}
    ids = {k: getattr(obj, k, None) for k in ("mask_token_id", "eos_token_id", "pad_token_id")}
    return obj.model, obj.tokenizer, ids


def resolve_suite(spec: str, extractor: str | None = None) -> list:
    """Tasks of a suite name, a task name, an oracle suite or `jsonl:PATH`."""
    if spec.startswith("jsonl:"):
        from dlm.tasks.jsonl import load_jsonl_task
        return [load_jsonl_task(spec[len("jsonl:"):], extractor=extractor or "exact")]
    if extractor is not None:
        raise ValueError("--extractor applies to jsonl:PATH suites only")
    from dlm.tasks import get_suite

    names = [spec, spec.replace("-", "_")]
    errors = []
    for name in dict.fromkeys(names):
        try:
            return get_suite(name)
        except ValueError as err:
            errors.append(err)
    raise errors[0]


def collect_examples(tasks: list, limit: int | None, seed: int) -> list:
    """The first `limit` test examples of every task (all of a JSONL file's lines when None)."""
    out = []
    for task in tasks:
        n = limit if limit is not None else getattr(task, "default_limit", 50)
        out.extend(task.examples("test", n=n, seed=seed))
    if not out:
        raise ValueError("no examples to run: the suite is empty or --limit is 0")
    return out


# ----------------------------------------------------------------------------- measurement helpers
def _cut_at_eos(ids: list[int], eos_id: int | None) -> list[int]:
    if eos_id is not None and eos_id in ids:
        return ids[: ids.index(eos_id)]
    return ids


def _batches(items: list, size: int):
    for i in range(0, len(items), size):
        yield items[i: i + size]


def suite_of(task_name: str) -> str | None:
    """The built-in suite (list_edits, arithmetic, puzzles) that holds a task, else None."""
    from dlm.tasks import SUITES

    return next((name for name, members in SUITES.items() if name != "all" and task_name in members), None)


def _suite_batches(examples: list, size: int) -> list[tuple[str | None, list]]:
    """Batches of at most `size` examples that never mix two suites, so that a multi-suite run
    (`--suite all`) can time each suite apart: each batch comes with its suite (None outside them)."""
    return [(suite, chunk) for suite, group in groupby(examples, key=lambda ex: suite_of(ex.task))
            for chunk in _batches(list(group), size)]


def encoded_suite_batches(tokenizer, examples: list, size: int, pad_id: int, device) -> list[tuple]:
    """`(suite, examples, input_ids, attention_mask)` per batch of `_suite_batches`: what every engine
    of a run is fed (left-padded with `pad_id`)."""
    return [(suite, chunk, *_encode_batch(tokenizer, [ex.input_text for ex in chunk], pad_id, device))
            for suite, chunk in _suite_batches(examples, size)]


def _encode_batch(tokenizer, texts: list[str], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor | None]:
    ids = [list(tokenizer.encode(t, add_special_tokens=False)) if _accepts_special(tokenizer) else list(tokenizer.encode(t))
           for t in texts]
    if any(len(i) == 0 for i in ids):
        raise ValueError("a prompt encodes to zero tokens")
    n = max(len(i) for i in ids)
    input_ids = torch.tensor([[pad_id] * (n - len(i)) + i for i in ids], dtype=torch.long, device=device)
    mask = torch.tensor([[0] * (n - len(i)) + [1] * len(i) for i in ids], dtype=torch.long, device=device)
    return input_ids, mask


def _accepts_special(tokenizer) -> bool:
    import inspect
    try:
        return "add_special_tokens" in inspect.signature(tokenizer.encode).parameters
    except (TypeError, ValueError):
        return False


# ----------------------------------------------------------------------------- config and results
@dataclass
class BenchConfig:
    """One benchmark run.

    `limit`: prompts per task (None: 50 per generated task, every line of a JSONL file, the suite's
    `num_samples` for an oracle suite). `temperature`: None means 0 (greedy) for task suites and 1
    for oracle suites, whose reference is exact sampling of the oracle's joint. `gen_length` /
    `block_length` None: the model's (`model_lengths`).
    """

    model: str = "tiny-dlm"
    suite: str = "list_edits"
    samplers: list = field(default_factory=lambda: ["confidence", "threshold"])
    steps: list = field(default_factory=lambda: [8, 16, 32, 64])
    limit: int | None = None
    gen_length: int | None = 64
    block_length: int | None = 32
    kv_cache: str = "auto"
    batch_size: int = 16
    seed: int = 0
    temperature: float | None = None
    eos_early_stop: bool = True
    extractor: str | None = None
    device: str = "cpu"
    warmup: bool = True

    def validate(self, check_steps: bool = True) -> None:
        """ValueError for a bad option; lengths left None (the model's) are checked once resolved."""
        lengths = self.gen_length is not None and self.block_length is not None
        if lengths and (self.gen_length <= 0 or self.block_length <= 0 or self.gen_length % self.block_length):
            raise ValueError(f"--gen-length ({self.gen_length}) must be a positive multiple of --block-length ({self.block_length})")
        if self.kv_cache not in KV_CACHE_MODES:
            raise ValueError(f"--kv-cache must be one of {', '.join(KV_CACHE_MODES)}, got {self.kv_cache!r}")
        if self.batch_size <= 0:
            raise ValueError(f"--batch-size must be positive, got {self.batch_size}")
        if self.limit is not None and self.limit < 0:
            raise ValueError(f"--limit must be >= 0, got {self.limit}")
        if self.temperature is not None and self.temperature < 0:
            raise ValueError(f"--temperature must be >= 0, got {self.temperature}")
        num_blocks = self.gen_length // self.block_length if lengths else 1
        small = [s for s in parse_steps(self.steps) if s < num_blocks] if check_steps and lengths else []
        if small:
            raise ValueError(f"--steps {small} below the number of blocks ({num_blocks}): each block needs at least one step")


@dataclass
class PairResult:
    """Metrics of one (sampler, budget) pair over all prompts; see the module docstring."""

    sampler: str
    budget: int
    engine: str
    kv_cache: str
    n: int
    quality: float
    quality_by_task: dict
    nfe: float
    nfe_per_call: float
    tpf: float
    tokens_per_s: float
    seconds: float
    forward_tokens: int
    peak_mem_mb: float | None
    mem_method: str
    branch_forwards: float | None = None
    extra: dict = field(default_factory=dict)
    samples: list = field(default_factory=list)
    by_suite: dict = field(default_factory=dict)


@dataclass
class BenchResult:
    config: dict
    meta: dict
    pairs: list

    def to_dict(self) -> dict:
        return {"config": self.config, "meta": self.meta, "pairs": [asdict(p) for p in self.pairs]}


# ----------------------------------------------------------------------------- running
class _Runner:
    """Runs one sampler spec at one budget on one batch: our engine, or an external row."""

    def __init__(self, model, tokenizer, cfg: BenchConfig, ids: dict | None = None):
        from dlm.engine.families import family_of

        self.model, self.tokenizer, self.cfg = model, tokenizer, cfg
        self.uniform_noise = family_of(model).uniform
        self._rows: dict = {}
        ids = ids or {}
        config = getattr(model, "config", None)

        def first(name):
            for source in (ids.get(name), getattr(tokenizer, name, None), getattr(config, name, None)):
                if isinstance(source, (list, tuple)):
                    source = source[0] if source else None
                if source is not None:
                    return int(source)
            return None

        # a uniform-noise model has no mask token, whatever its tokenizer defines
        self.mask_id = None if self.uniform_noise else first("mask_token_id")
        self.eos_id, pad = first("eos_token_id"), first("pad_token_id")
        if pad is None or pad == self.mask_id:
            pad = self.eos_id  # any id but the mask works under the attention mask
        self.pad_id = pad

    def row(self, name: str):
        """The external row `name`, built (and checked against the model's family) on first use."""
        if name not in self._rows:
            row = external_rows()[name][0](name, self.model, self.tokenizer, self.cfg, self.mask_id, self.eos_id, self.pad_id)
            row.check_model(self.uniform_noise)
            self._rows[name] = row
        return self._rows[name]

    def run(self, spec: SamplerSpec, budget: int, input_ids, attention_mask, generator, extract=None) -> tuple:
        """Returns generated ids `[B, gen_length]`, per-row NFE, batch NFE, forward tokens, seconds,
        per-row branch forwards, and for an ensemble (hex) its `HexExperts` (else None).

        `extract(row, generated ids) -> answer` is the ensemble's answer extractor (hex votes on it)."""
        cfg = self.cfg
        if spec.is_external:
            out = self.row(spec.name).run(spec, budget, input_ids, attention_mask, generator)
            return out.sequences, out.nfe_per_row, out.nfe, out.forward_tokens, out.seconds, out.nfe_per_row, None
        import dlm
        from samplers import get_sampler

        per_row = torch.zeros(input_ids.shape[0], dtype=torch.long)
        per_row_branches = torch.zeros(input_ids.shape[0], dtype=torch.long)

        def count(trace):
            rows = trace.rows.cpu()
            per_row[rows] += trace.forwards
            per_row_branches[rows] += trace.branch_forwards

        kw = dict(temperature=cfg.temperature, eos_token_id=self.eos_id, attention_mask=attention_mask,
                  generator=generator, kv_cache=spec.kv_cache or cfg.kv_cache, callback=count, **spec.engine_kwargs())
        if not self.uniform_noise:  # masked-engine options (a uniform-noise model refuses them when given)
            kw.update(mask_token_id=self.mask_id, cache_refresh_every=spec.cache_refresh_every,
                      eos_early_stop=cfg.eos_early_stop)
        policy = get_sampler(spec.name, **spec.option_dict)
        if policy.ensemble:
            from dlm.ensemble import hex_generate
            out = hex_generate(self.model, input_ids, gen_length=cfg.gen_length, steps=budget, config=policy.config,
                               extract=extract, **kw)
        else:
            out = dlm.generate(self.model, input_ids, gen_length=cfg.gen_length, block_length=spec.block_for(cfg),
                               steps=budget, sampler=policy, cache_across_blocks=spec.cache_across_blocks,
                               cut_trailing_masks=spec.cut_trailing_masks, window_blocks=spec.window_blocks,
                               window_open_at=spec.window_open_at, **kw)
        gen = out.sequences[:, input_ids.shape[1]:]
        if out.nfe_per_sequence is not None:  # uniform noise: transformers' count (rows whose sequence ended drop out)
            per_row = out.nfe_per_sequence
        return gen, per_row.tolist(), out.nfe, out.forward_tokens, out.seconds, per_row_branches.tolist(), out.experts


def _score_experts(experts, chunk, prompt_length, tokenizer, eos_id, task_of, into: dict) -> None:
    """Add each HEX expert's task scores on this batch to `into[block_length]` (a list), and the
    score of the token-level vote's winner to `into["token_vote"]`."""
    def score(ex, row):
        text = tokenizer.decode(_cut_at_eos(row, eos_id), skip_special_tokens=True)
        return float(task_of[ex.task].score(ex, text))

    for e, block in enumerate(experts.block_lengths):
        for ex, row in zip(chunk, experts.sequences[e, :, prompt_length:].tolist()):
            into.setdefault(block, []).append(score(ex, row))
    for r, (ex, w) in enumerate(zip(chunk, experts.token_winner)):
        into.setdefault("token_vote", []).append(score(ex, experts.sequences[w, r, prompt_length:].tolist()))


def _expert_summary(scores: dict, n: int) -> dict:
    """`extra` of a HEX pair: each expert's quality (as if run alone, same passes), the best, and
    the quality of the vote on generated tokens (the pair's own quality is the vote on the task's
    parsed answers)."""
    if not scores:
        return {}
    scores = dict(scores)
    token_vote = scores.pop("token_vote", None)
    quality = {str(b): 100.0 * sum(v) / len(v) for b, v in sorted(scores.items())}
    out = {"expert_quality": quality, "best_expert_quality": max(quality.values())}
    if token_vote:
        out["token_vote_quality"] = 100.0 * sum(token_vote) / len(token_vote)
    return out


def check_spec_blocks(specs: list[SamplerSpec], cfg: BenchConfig, budgets: list[int]) -> None:
    """ValueError, before any work, for an entry whose `block=N` does not divide `--gen-length` or
    leaves a budget below its number of blocks (each block needs at least one step)."""
    for spec in specs:
        if spec.block_length is None:
            continue
        block = spec.block_length
        if cfg.gen_length % block:
            raise ValueError(f"{spec.label!r}: block={block} must divide --gen-length ({cfg.gen_length})")
        small = [b for b in spec.budgets_for(budgets) if b < cfg.gen_length // block]
        if small:
            raise ValueError(f"{spec.label!r}: --steps {small} below its number of blocks "
                             f"({cfg.gen_length // block} of {block} tokens); raise the steps or the block")


def _engine_key(spec: SamplerSpec, cfg: BenchConfig) -> str:
    return spec.name if spec.is_external else f"dlm/{spec.kv_cache or cfg.kv_cache}"


def model_lengths(model, tasks=()) -> tuple[int, int]:
    """Default `(gen_length, block_length)` for a model: a DiffusionGemma's generation_config
    `max_new_tokens` (64 if unset) and its `canvas_length`; for a masked model 32-token blocks and
    64 tokens, or the longest `gen_length` of `tasks` (a suite with long answers, e.g. chains)."""
    from dlm.tasks import tasks_gen_length
    from dlm.engine.families import family_of
    from dlm.engine.uniform.plan import resolve_generation_config

    if not family_of(model).uniform:
        return tasks_gen_length(tasks), 32
    return resolve_generation_config(model, None).max_new_tokens or 64, int(model.config.canvas_length)


def run_bench(cfg: BenchConfig, *, progress: bool = True, model=None, tokenizer=None, journal=None) -> BenchResult:
    """Run every (sampler, budget) pair of `cfg` on the same prompts; see the module docstring.

    `journal` (a `dlm.bench.journal.Journal`): each finished pair is appended to it at once, and the
    pairs it already holds (`--resume`) are taken from it instead of being run again.
    """
    oracle_suite = _oracle_suite(cfg.suite)
    cfg.validate(check_steps=oracle_suite is None)  # an oracle fixes its own lengths
    specs = parse_sampler_specs(cfg.samplers)
    budgets = parse_steps(cfg.steps)
    if oracle_suite is not None:
        return _run_oracle(_with(cfg, gen_length=cfg.gen_length or 64, block_length=cfg.block_length or 32),
                           oracle_suite, specs, budgets, progress, journal)
    tasks = resolve_suite(cfg.suite, cfg.extractor)
    examples = collect_examples(tasks, cfg.limit, cfg.seed)
    ids = {}
    if model is None:
        model, tokenizer, ids = load_model(cfg.model, device=cfg.device)
    model.eval()
    if cfg.gen_length is None or cfg.block_length is None:
        gen, block = model_lengths(model, tasks)
        cfg = _with(cfg, gen_length=cfg.gen_length or gen, block_length=cfg.block_length or block)
        cfg.validate()
    check_spec_blocks(specs, cfg, budgets)
    device = torch.device(cfg.device)
    cfg = _with(cfg, temperature=0.0 if cfg.temperature is None else cfg.temperature)
    runner = _Runner(model, tokenizer, cfg, ids)
    if runner.mask_id is None and not runner.uniform_noise:
        raise ValueError(f"model {cfg.model!r} has no mask token: it is not a masked diffusion LM")
    task_of = {t.name: t for t in tasks}
    batches = encoded_suite_batches(tokenizer, examples, cfg.batch_size, runner.pad_id, device)
    suites = list(dict.fromkeys(suite for suite, *_ in batches))

    if cfg.warmup:  # one untimed call per engine: first-call allocations and lazy imports
        done = set()
        for spec in specs:
            key = _engine_key(spec, cfg)
            if key not in done:
                done.add(key)
                _, _, ids, mask = batches[0]
                runner.run(spec, spec.budgets_for(budgets)[0], ids[:2], mask[:2], torch.Generator().manual_seed(cfg.seed))

    meta = {
        "suite_tasks": [t.name for t in tasks], "prompts": len(examples), "batches": len(batches),
        "torch": torch.__version__, "python": platform.python_version(), "device": str(device),
        "threads": torch.get_num_threads(), "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "model_parameters": sum(p.numel() for p in model.parameters()),
        "definitions": "see dlm/bench/harness.py docstring and docs/benchmarks.md",
    }
    if journal is not None:
        journal.begin(asdict(cfg), meta, [(s.label, b) for s in specs for b in s.budgets_for(budgets)])
    pairs: list[PairResult] = []
    bar = tqdm(total=sum(len(s.budgets_for(budgets)) for s in specs) * len(batches), desc=f"bench {cfg.suite}", unit="batch",
               disable=not progress, file=sys.stderr)
    for spec in specs:
        for budget in spec.budgets_for(budgets):
            if journal is not None and (done := journal.done(spec.label, budget)) is not None:
                pairs.append(done)  # finished by an earlier run of this configuration
                bar.update(len(batches))
                continue
            bar.set_postfix_str(f"{spec.label} steps={budget}")
            generator = torch.Generator().manual_seed(cfg.seed)
            scores, by_task, per_seq_nfe, call_nfe, per_seq_branches = [], {}, [], [], []
            seconds, forward_tokens, samples, expert_scores = 0.0, 0, [], {}
            per_suite: dict = {}
            with PeakMemory(device) as mem:
                for suite, chunk, ids, mask in batches:
                    def extract(row, generated, chunk=chunk):
                        text = tokenizer.decode(_cut_at_eos(generated.tolist(), runner.eos_id), skip_special_tokens=True)
                        return task_of[chunk[row].task].extract(text)

                    gen, row_nfe, nfe, ftok, sec, row_branches, experts = runner.run(spec, budget, ids, mask, generator, extract)
                    per_seq_branches.extend(row_branches)
                    acc = per_suite.setdefault(suite, {"scores": [], "nfe": 0, "seconds": 0.0, "experts": {}})
                    if experts is not None:
                        _score_experts(experts, chunk, ids.shape[1], tokenizer, runner.eos_id, task_of, expert_scores)
                        _score_experts(experts, chunk, ids.shape[1], tokenizer, runner.eos_id, task_of, acc["experts"])
                    seconds += sec
                    forward_tokens += ftok
                    call_nfe.append(nfe)
                    per_seq_nfe.extend(row_nfe)
                    acc["nfe"] += sum(row_nfe)
                    acc["seconds"] += sec
                    for ex, row in zip(chunk, gen.tolist()):
                        text = tokenizer.decode(_cut_at_eos(row, runner.eos_id), skip_special_tokens=True)
                        s = float(task_of[ex.task].score(ex, text))
                        scores.append(s)
                        acc["scores"].append(s)
                        by_task.setdefault(ex.task, []).append(s)
                        if len(samples) < 3:
                            samples.append({"prompt": ex.prompt, "output": text, "score": s})
                    bar.update(1)
            n = len(scores)
            total_nfe = sum(per_seq_nfe)
            pairs.append(PairResult(
                sampler=spec.label, budget=budget, engine=runner.row(spec.name).engine if spec.is_external else "dlm",
                kv_cache="none" if spec.is_external else (spec.kv_cache or cfg.kv_cache), n=n,
                quality=100.0 * sum(scores) / n,
                quality_by_task={k: 100.0 * sum(v) / len(v) for k, v in by_task.items()},
                nfe=total_nfe / n, nfe_per_call=sum(call_nfe) / len(call_nfe),
                tpf=n * cfg.gen_length / max(total_nfe, 1), tokens_per_s=n * cfg.gen_length / max(seconds, 1e-9),
                seconds=seconds, forward_tokens=forward_tokens, peak_mem_mb=mem.peak_mb, mem_method=mem.method,
                branch_forwards=sum(per_seq_branches) / n, samples=samples,
                extra=_expert_summary(expert_scores, n),
                by_suite=_suite_summary(per_suite, cfg.gen_length) if len(suites) > 1 else {}))
            if journal is not None:
                journal.record(pairs[-1])
    bar.close()
    if not pairs:
        raise ValueError("the benchmark produced no results")
    result = BenchResult(config=asdict(cfg), meta=meta, pairs=pairs)
    result.meta["targets"] = summarize_targets(result)
    result.meta["vs_diffusers"] = compare_to_baselines(result)
    if len(suites) > 1:
        result.meta["vs_diffusers_by_suite"] = compare_by_suite(result)
    if journal is not None:
        journal.finish(result)
    return result


def _suite_summary(per_suite: dict, gen_length: int) -> dict:
    """{suite: {n, quality, nfe, tpf, seconds[, extra]}} of one pair, from its suite-pure batches
    (`extra`: a HEX pair's expert summary on that suite's prompts)."""
    out = {}
    for suite, acc in per_suite.items():
        n, total_nfe = len(acc["scores"]), acc["nfe"]
        out[suite] = {"n": n, "quality": 100.0 * sum(acc["scores"]) / n, "nfe": total_nfe / n,
                      "tpf": n * gen_length / max(total_nfe, 1), "seconds": acc["seconds"]}
        if acc.get("experts"):
            out[suite]["extra"] = _expert_summary(acc["experts"], n)
    return out


def result_suites(result: BenchResult) -> list[str]:
    """The suites of a multi-suite run, in run order (empty for a single-suite run)."""
    return list(dict.fromkeys(s for p in result.pairs for s in p.by_suite))


def compare_by_suite(result: BenchResult, tolerance: float = 1.0) -> dict:
    """`compare_to_baselines` on each suite of a multi-suite run: {suite: {baseline: ...}}.

    Each pair is seen through its `by_suite` entry (that suite's prompts, NFE and wall time only), so
    every suite gets its own operating points, as if it had been run alone in this run.
    """
    out = {}
    for suite in result_suites(result):
        # a `by_suite` entry holds the PairResult fields (n, quality, nfe, tpf, seconds) of that suite
        view = [replace(p, **p.by_suite[suite]) for p in result.pairs if suite in p.by_suite]
        out[suite] = compare_to_baselines(BenchResult(config=result.config, meta={}, pairs=view), tolerance)
    return out


def _with(cfg: BenchConfig, **changes) -> BenchConfig:
    return replace(cfg, **changes)


def _oracle_suite(name: str):
    try:
        from dlm.tasks.oracle_tasks import ORACLE_SUITES
    except ImportError:
        return None
    return ORACLE_SUITES.get(name)


def _finite(value):
    if isinstance(value, float) and value != value:
        return None
    if isinstance(value, float) and value in (float("inf"), float("-inf")):
        return "inf" if value > 0 else "-inf"
    return value


def _run_oracle(cfg: BenchConfig, suite, specs: list[SamplerSpec], budgets: list[int], progress: bool,
                journal=None) -> BenchResult:
    """Oracle suites: the model is the suite's exact oracle (`--model` is not used), all samples
    decode in one batched call per pair, and quality is 100 x valid_fraction for the permutation
    oracle, 100 x (1 - total variation to the exact joint) otherwise (all metrics under `extra`)."""
    import dlm

    bad = [s.label for s in specs if s.is_external]
    if bad:
        raise ValueError(f"{', '.join(bad)}: an external engine cannot run an oracle suite (it does not run the "
                         f"oracle's model interface); use dlm samplers")
    bad = [s.label for s in specs if s.block_length is not None]
    if bad:
        raise ValueError(f"{', '.join(bad)}: an oracle suite fixes its own block length; drop block=")
    # a suite whose prompts are drawn (the schedule oracle's scenarios) draws them from the run's seed
    oracle = suite.build(seed=cfg.seed) if getattr(suite, "seeded", False) else suite.build()
    gen = oracle.gen_length
    block = cfg.block_length if gen % cfg.block_length == 0 else gen
    temperature = getattr(suite, "temperature", 1.0) if cfg.temperature is None else cfg.temperature
    n = cfg.limit if cfg.limit is not None else suite.num_samples
    if n <= 0:
        raise ValueError("no examples to run: --limit is 0")
    prompts = suite.prompts(oracle, n)
    cfg = _with(cfg, gen_length=gen, block_length=block, temperature=temperature, model=suite.name, limit=n)
    headline = getattr(suite, "quality_metric", None) or (  # the pivot suite names its own statistic
        "valid_fraction" if "permutation" in suite.name else "1 - total_variation")
    meta = {"suite_tasks": [suite.name], "prompts": n, "batches": 1, "oracle": True, "quality_metric": headline,
            "torch": torch.__version__, "python": platform.python_version(), "device": cfg.device,
            "threads": torch.get_num_threads(), "time": time.strftime("%Y-%m-%dT%H:%M:%S")}
    if journal is not None:
        journal.begin(asdict(cfg), meta, [(s.label, b) for s in specs for b in s.budgets_for(budgets)])
    pairs = []
    bar = tqdm(total=sum(len(s.budgets_for(budgets)) for s in specs), desc=f"bench {suite.name}", unit="pair", disable=not progress, file=sys.stderr)
    for spec in specs:
        kv = spec.kv_cache or cfg.kv_cache
        for budget in spec.budgets_for(budgets):
            if journal is not None and (done := journal.done(spec.label, budget)) is not None:
                pairs.append(done)
                bar.update(1)
                continue
            g = torch.Generator().manual_seed(cfg.seed)
            with PeakMemory(torch.device(cfg.device)) as mem:
                out = dlm.generate(oracle, prompts, **suite.generate_kwargs(oracle), block_length=block, steps=budget,
                                   sampler=spec.name, sampler_config=spec.option_dict or None, temperature=temperature,
                                   generator=g, kv_cache=kv, **spec.engine_kwargs())
            metrics = suite.evaluate(oracle, out.sequences, seed=cfg.seed).to_dict()
            quality = _oracle_quality(metrics, headline)
            if out.experts is not None:  # HEX: each expert scored as if run alone (same passes; no noise reference)
                experts = {str(b): _oracle_quality(suite.evaluate(oracle, out.experts.sequences[e], seed=cfg.seed,
                                                                  reference=False).to_dict(), headline)
                           for e, b in enumerate(out.experts.block_lengths)}
                metrics.update(expert_quality=experts, best_expert_quality=max(experts.values()))
            pairs.append(PairResult(
                sampler=spec.label, budget=budget, engine="dlm", kv_cache=kv, n=n, quality=quality,
                quality_by_task={suite.name: quality}, nfe=float(out.nfe), nfe_per_call=float(out.nfe),
                tpf=gen / max(out.nfe, 1), tokens_per_s=n * gen / max(out.seconds, 1e-9), seconds=out.seconds,
                forward_tokens=out.forward_tokens, peak_mem_mb=mem.peak_mb, mem_method=mem.method,
                branch_forwards=float(out.branch_forwards),
                extra={k: (v if isinstance(v, dict) else _finite(v)) for k, v in metrics.items()}))
            if journal is not None:
                journal.record(pairs[-1])
            bar.update(1)
    bar.close()
    result = BenchResult(config=asdict(cfg), meta=meta, pairs=pairs)
    result.meta["targets"] = summarize_targets(result)
    result.meta["vs_diffusers"] = compare_to_baselines(result)
    if journal is not None:
        journal.finish(result)
    return result


def _oracle_quality(metrics: dict, headline: str) -> float:
    """Quality of an oracle pair: 100 x valid_fraction (the permutation oracle, exact answers), else
    100 x (1 - total variation)."""
    if headline == "valid_fraction" or metrics.get("total_variation") is None:
        return 100.0 * metrics["valid_fraction"]
    return 100.0 * (1.0 - metrics["total_variation"])


def compare_to_baselines(result: BenchResult, tolerance: float = 1.0) -> dict:
    """Equal-quality speed ratios of each of our samplers against each external baseline (engine not "dlm").

    For a baseline, its operating point is its smallest-NFE pair within `tolerance` points of its own
    budget = gen_length run (see `summarize_targets`). For each of our samplers, the matching point is
    its fastest pair (least wall time) whose quality is at least the baseline's operating quality minus
    `tolerance`; None when no pair reaches it. Ratios > 1 mean ours is faster / uses fewer forwards.
    """
    targets = summarize_targets(result, tolerance)
    engines = {p.sampler: p.engine for p in result.pairs}
    out: dict[str, Any] = {}
    for base, bt in targets.items():
        if engines[base] == "dlm":
            continue
        base_pair = next(p for p in result.pairs if p.sampler == base and p.budget == bt["min_budget"])
        rows = {}
        for name in targets:
            if engines[name] != "dlm":
                continue
            ok = [p for p in result.pairs if p.sampler == name and p.quality >= base_pair.quality - tolerance]
            if not ok:
                rows[name] = None
                continue
            best = min(ok, key=lambda p: p.seconds)
            rows[name] = {"budget": best.budget, "quality": best.quality, "nfe": best.nfe, "seconds": best.seconds,
                          "wall_ratio": base_pair.seconds / max(best.seconds, 1e-9),
                          "nfe_ratio": base_pair.nfe / max(best.nfe, 1e-9)}
        out[base] = {"budget": base_pair.budget, "quality": base_pair.quality, "nfe": base_pair.nfe,
                     "seconds": base_pair.seconds, "ours": rows}
    return out


def summarize_targets(result: BenchResult, tolerance: float = 1.0) -> dict:
    """Per sampler: its reference (the pair at budget = gen_length, else the largest budget) and the
    smallest-NFE pair whose quality is within `tolerance` points of it, with that pair's TPF."""
    gen_length = result.config["gen_length"]
    out: dict[str, Any] = {}
    by_sampler: dict[str, list] = {}
    for p in result.pairs:
        by_sampler.setdefault(p.sampler, []).append(p)
    for name, ps in by_sampler.items():
        ref = next((p for p in ps if p.budget == gen_length), max(ps, key=lambda p: p.budget))
        ok = [p for p in ps if p.quality >= ref.quality - tolerance]
        best = min(ok, key=lambda p: (p.nfe, p.seconds))
        out[name] = {"reference_budget": ref.budget, "reference_quality": ref.quality, "reference_nfe": ref.nfe,
                     "min_budget": best.budget, "min_nfe": best.nfe, "quality": best.quality, "tpf": best.tpf,
                     "seconds": best.seconds}
    return out
