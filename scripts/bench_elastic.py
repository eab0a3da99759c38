"""kv_cache="elastic" against the fixed KV caches: quality over forward tokens, with the noise band.

    python scripts/bench_elastic.py --out runs/elastic                 # every bed (about an hour, 1 thread)
    python scripts/bench_elastic.py --beds replica-2 --seeds 4         # one bed, fewer seeds
    python scripts/bench_elastic.py --smoke --out /tmp/elastic-smoke   # seconds (the test's run)
    python scripts/bench_elastic.py --summary runs/elastic/results.json  # the condensed tables of a run

Every setting decodes the same prompts with the same sampler and budget as `kv_cache="none"`:
- fixed caches (Fast-dLLM's schedules): "prompt", "prefix", "dual", both with `cache_across_blocks`,
  "dual" with `cache_refresh_every` k;
- the elastic cache (`dlm.engine.masked.elastic`) over a grid of `cache_drift_threshold` x
  `cache_drift_probe`, and threshold 0 (a refresh only where a key or value turns by more than 90 degrees:
  the cheapest elastic setting, close to never refreshing).

Beds, where the fixed caches are approximations:
- `replica-2`, `replica-4`: random LLaDA-shaped models (`dlm.replica("llada-8b", layers=...)`, 64 wide)
  whose LM head is scaled up (`--head-scale`) so that `threshold` commits several tokens in some steps.
  Their prompt attends to the response, so every cache but a refresh at every step is approximate.
  Quality = token agreement with `kv_cache="none"` on the same prompts (%); one unit = one seed (its own
  weights and prompts); the decisions' numerics floor is the agreement of the float32 model with its
  float64 copy (both uncached). All of a seed's prompts go in one call (`--replica-batch` splits them): the
  elastic cache decides a refresh for the whole call.
- `chains` (tiny-dlm-chains on the chains suite) and `sum` (tiny-dlm-chains-hard on the running sum):
  task accuracy (%), one unit = one prompt. These models' prompts ignore the response, so "prompt" is
  exact there (the uncached tokens); the other caches are approximate only through the response's own
  K/V (positions of the response attend to each other).

Cost: forward tokens per sequence (query positions the model processed, counted by a hook on the model,
checked against the engine's own count) and its ratio to "none"; full forwards per sequence (calls
without a cache; for the elastic cache: the first forward plus its refreshes); wall time of the whole
setting (one thread by default) and its ratio to "none" in the same run.

Noise band: per unit, the quality difference between an elastic setting and its comparator (the best
fixed cache that costs no more forward tokens); the band is the 95% t-interval of the mean difference.
Outside the band and positive: elastic is better at no more cost; negative: a fixed cache is better.

Writes results.json, results.md and quality_vs_forward_tokens.png under --out.
"""

import argparse
import copy
import json
import math
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from statistics import fmean as mean

import torch
from tqdm.auto import tqdm

import dlm

# ----------------------------------------------------------------------------- settings

@dataclass(frozen=True)
class Setting:
    """One cache configuration. `kind`: "reference" (no cache), "fixed" or "elastic"."""

    label: str
    kv_cache: str
    across: bool = False
    refresh: int = 0
    threshold: float | None = None
    probe: int | None = None

    @property
    def kind(self) -> str:
        return {"none": "reference", "elastic": "elastic"}.get(self.kv_cache, "fixed")

    def generate_kwargs(self) -> dict:
        kw = dict(kv_cache=self.kv_cache, cache_across_blocks=self.across, cache_refresh_every=self.refresh)
        if self.kv_cache == "elastic":
            kw.update(cache_drift_threshold=self.threshold, cache_drift_probe=self.probe)
        return kw


def settings(thresholds: list[float], probes: list[int], refreshes: list[int], zero_probe: int | None) -> list[Setting]:
    """The reference, the fixed caches and the elastic grid (plus threshold 0 at `zero_probe`, if given)."""
    out = [Setting("none", "none"), Setting("prompt", "prompt"), Setting("prefix", "prefix"), Setting("dual", "dual"),
           Setting("prefix xblock", "prefix", across=True), Setting("dual xblock", "dual", across=True)]
    out += [Setting(f"dual refresh={k}", "dual", refresh=k) for k in refreshes]
    if zero_probe is not None:
        out.append(Setting(f"elastic 0 p={zero_probe}", "elastic", threshold=0.0, probe=zero_probe))
    out += [Setting(f"elastic {t:g} p={p}", "elastic", threshold=t, probe=p) for t in thresholds for p in probes]
    return out


# ----------------------------------------------------------------------------- counting

class ForwardCounter:
    """Counts what the model is asked to compute, independently of the engine's own tally: per call,
    the query positions fed (`input_ids.numel()`), and whether it was a full forward (no cache passed
    in) and over how many rows. A forward pre-hook on the model; `close()` removes it."""

    def __init__(self, model: torch.nn.Module):
        self.tokens = self.full_calls = self.full_rows = self.calls = 0
        self._handle = model.register_forward_pre_hook(self._count, with_kwargs=True)

    def _count(self, module, args, kwargs):
        ids = args[0] if args else kwargs["input_ids"]
        self.calls += 1
        self.tokens += ids.numel()
        if kwargs.get("past_key_values") is None:
            self.full_calls += 1
            self.full_rows += ids.shape[0]

    def close(self) -> None:
        self._handle.remove()


@dataclass
class Measured:
    """One (bed, sampler, setting): per-unit quality and what it cost, summed over its calls."""

    quality: list[float]  # per unit, percent
    sequences: int = 0
    forward_tokens: int = 0  # hook count
    engine_forward_tokens: int = 0  # `GenerateOutput.forward_tokens`, summed
    full_rows: int = 0  # rows of full forwards, summed: full forwards per sequence = full_rows / sequences
    nfe_rows: int = 0  # rows x nfe, summed
    seconds: float = 0.0
    outputs: list = field(default_factory=list, repr=False)  # generated ids per call (not saved)


# ----------------------------------------------------------------------------- beds

def replica_model(layers: int, seed: int, head_scale: float):
    """A random LLaDA-shaped model (64 wide, 4 heads, 300 tokens) with its LM head scaled by `head_scale`."""
    model = dlm.replica("llada-8b", layers=layers, seed=seed, device="cpu", dtype=torch.float32, overrides=dict(
        hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=4, vocab_size=300,
        mask_token_id=299, eos_token_id=298, pad_token_id=298))
    with torch.no_grad():
        model.lm.lm_head.weight.mul_(head_scale)
    return model


class ReplicaBed:
    """Random LLaDA-shaped replicas: one unit per seed (its own weights and `prompts` random prompts);
    quality = % of generated tokens equal to the uncached engine's."""

    unit = "seed"
    metric = "token agreement with kv_cache='none' (%)"

    def __init__(self, layers: int, seeds: int, prompts: int, prompt_length: int, gen_length: int,
                 block_length: int, head_scale: float, batch_size: int = 0):
        self.name = f"replica-{layers}" + (f" batch {batch_size}" if batch_size else "")
        self.batch_size = batch_size or prompts  # rows per call: a refresh is decided for the whole call
        self.layers, self.seeds, self.prompts, self.head_scale = layers, seeds, prompts, head_scale
        self.prompt_length, self.gen_length, self.block_length = prompt_length, gen_length, block_length
        self._models = [replica_model(layers, s, head_scale) for s in range(seeds)]
        self._ids = [torch.randint(0, 290, (prompts, prompt_length), generator=torch.Generator().manual_seed(1000 + s))
                     for s in range(seeds)]

    def describe(self) -> dict:
        return dict(model=f'dlm.replica("llada-8b", layers={self.layers}) 64 wide, head x{self.head_scale:g}',
                    units=self.seeds, prompts_per_unit=self.prompts, prompt_length=self.prompt_length,
                    gen_length=self.gen_length, block_length=self.block_length, eos_early_stop=False,
                    batch_size=self.batch_size)

    def run(self, setting: Setting, sampler: str, steps: int) -> Measured:
        m = Measured(quality=[])
        for model, ids in zip(self._models, self._ids):
            outs = [_generate(model, ids[i: i + self.batch_size], None, setting, sampler, steps, self.gen_length,
                              self.block_length, eos_early_stop=False, into=m).sequences
                    for i in range(0, ids.shape[0], self.batch_size)]
            m.outputs.append(torch.cat(outs)[:, self.prompt_length:])
        return m

    def warm_up(self, sampler: str) -> None:
        for setting in (Setting("none", "none"), Setting("elastic", "elastic", threshold=0.999, probe=4)):
            _generate(self._models[0], self._ids[0][:2], None, setting, sampler, self.gen_length, self.gen_length,
                      self.block_length, eos_early_stop=False, into=Measured(quality=[]))

    def score(self, m: Measured, reference: Measured) -> None:
        m.quality = [100.0 * (a == b).float().mean().item() for a, b in zip(m.outputs, reference.outputs)]

    def numerics_floor(self, sampler: str, steps: int) -> list[float]:
        """Per unit: % of tokens the float32 model (uncached) shares with its float64 copy: how much a
        rounding-level change moves the decisions on this bed."""
        out = []
        for model, ids in zip(self._models, self._ids):
            kw = dict(gen_length=self.gen_length, block_length=self.block_length, steps=steps, sampler=sampler,
                      kv_cache="none", eos_early_stop=False)
            a = dlm.generate(model, ids, **kw).sequences
            b = dlm.generate(copy.deepcopy(model).double(), ids, **kw).sequences
            out.append(100.0 * (a == b)[:, self.prompt_length:].float().mean().item())
        return out


class TaskBed:
    """A built-in model on its task suite: one unit per prompt; quality = task accuracy (%), plus the
    token agreement with kv_cache='none'. Batches as `dlm bench` makes them (left-padded, one suite each)."""

    unit = "prompt"
    metric = "task accuracy (%)"

    def __init__(self, name: str, model_name: str, suite: str, limit: int, block_length: int, batch_size: int):
        from dlm.bench.harness import collect_examples, encoded_suite_batches, load_model, resolve_suite
        from dlm.tasks import get_suite, suite_gen_length

        self.name, self.model_name, self.suite, self.limit, self.batch_size = name, model_name, suite, limit, batch_size
        self.model, self.tokenizer, ids = load_model(model_name)
        self.eos_id, pad = ids["eos_token_id"], ids["pad_token_id"]
        self.tasks = {t.name: t for t in get_suite(suite)}
        self.gen_length, self.block_length = suite_gen_length(suite), block_length
        examples = collect_examples(resolve_suite(suite, None), limit, 0)
        self.batches = [(chunk, ids_, mask) for _, chunk, ids_, mask in
                        encoded_suite_batches(self.tokenizer, examples, batch_size, pad, torch.device("cpu"))]
        self.prompts = len(examples)

    def describe(self) -> dict:
        return dict(model=self.model_name, suite=self.suite, units=self.prompts, prompts_per_task=self.limit,
                    gen_length=self.gen_length, block_length=self.block_length, eos_early_stop=True, batch_size=self.batch_size,
                    prompt_attends_response=bool(getattr(self.model.config, "prompt_attends_response", True)))

    def run(self, setting: Setting, sampler: str, steps: int) -> Measured:
        from dlm.bench.harness import _cut_at_eos

        m = Measured(quality=[])
        for chunk, ids, mask in self.batches:
            out = _generate(self.model, ids, mask, setting, sampler, steps, self.gen_length, self.block_length,
                            eos_early_stop=True, into=m)
            generated = out.sequences[:, ids.shape[1]:]
            m.outputs.append(generated)
            for ex, row in zip(chunk, generated.tolist()):
                text = self.tokenizer.decode(_cut_at_eos(row, self.eos_id), skip_special_tokens=True)
                m.quality.append(100.0 * float(self.tasks[ex.task].score(ex, text)))
        return m

    def warm_up(self, sampler: str) -> None:
        _, ids, mask = self.batches[0]
        for setting in (Setting("none", "none"), Setting("elastic", "elastic", threshold=0.999, probe=4)):
            _generate(self.model, ids[:2], mask[:2], setting, sampler, self.gen_length, self.gen_length,
                      self.block_length, eos_early_stop=True, into=Measured(quality=[]))

    def score(self, m: Measured, reference: Measured) -> None:
        """Accuracy is scored in `run`; agreement with the reference is kept beside it."""
        m.agreement = [100.0 * (a == b).float().mean().item()
                       for out, ref in zip(m.outputs, reference.outputs) for a, b in zip(out, ref)]


def _generate(model, ids, mask, setting: Setting, sampler: str, steps: int, gen_length: int, block_length: int,
              eos_early_stop: bool, into: Measured):
    counter = ForwardCounter(model)
    try:
        started = time.perf_counter()
        out = dlm.generate(model, ids, attention_mask=mask, gen_length=gen_length, block_length=block_length,
                           steps=steps, sampler=sampler, eos_early_stop=eos_early_stop, **setting.generate_kwargs())
        into.seconds += time.perf_counter() - started
    finally:
        counter.close()
    into.sequences += ids.shape[0]
    into.forward_tokens += counter.tokens
    into.engine_forward_tokens += out.forward_tokens
    into.full_rows += counter.full_rows
    into.nfe_rows += out.nfe * ids.shape[0]
    return out


# ----------------------------------------------------------------------------- statistics

def std(xs: list[float]) -> float:
    """The sample standard deviation (0 for fewer than two values)."""
    return statistics.stdev(xs) if len(xs) >= 2 else 0.0


def t_quantile(n: int) -> float:
    """Two-sided 95% Student-t quantile for n - 1 degrees of freedom (inf for n < 2)."""
    if n < 2:
        return math.inf
    from scipy.stats import t

    return float(t.ppf(0.975, n - 1))


def paired(a: list[float], b: list[float]) -> dict:
    """Mean of `a - b` over paired units and the half-width of its 95% t-interval (0 when every
    difference is equal)."""
    d = [x - y for x, y in zip(a, b)]
    s = std(d)
    half = 0.0 if s == 0 else t_quantile(len(d)) * s / math.sqrt(len(d))
    return {"mean": mean(d), "band": half}


def verdict(diff: dict) -> str:
    if diff["mean"] == 0 and diff["band"] == 0:
        return "equal"
    if diff["mean"] - diff["band"] > 0:
        return "better"
    if diff["mean"] + diff["band"] < 0:
        return "worse"
    return "within noise"


def summarise(rows: list[dict]) -> None:
    """Adds to each elastic row its comparator (the best-quality fixed cache with no more forward tokens;
    the cheapest fixed cache when every one costs more) and the paired difference with its band."""
    fixed = [r for r in rows if r["kind"] == "fixed"]
    for r in rows:
        if r["kind"] != "elastic" or not fixed:
            continue
        cheaper = [f for f in fixed if f["forward_tokens_per_seq"] <= r["forward_tokens_per_seq"]]
        comp = max(cheaper, key=lambda f: (f["quality"], -f["forward_tokens_per_seq"])) if cheaper else \
            min(fixed, key=lambda f: f["forward_tokens_per_seq"])
        diff = paired(r["quality_units"], comp["quality_units"])
        r["comparator"] = comp["setting"]
        r["comparator_costs_more"] = not cheaper
        r["vs_comparator"] = diff
        r["verdict"] = verdict(diff)


# ----------------------------------------------------------------------------- the run

def measure(bed, sampler: str, steps: int, grid: list[Setting], repeats: int, bar) -> list[dict]:
    rows, reference = [], None
    for setting in grid:
        best = None
        for _ in range(repeats):  # the fastest repeat's time; the outputs are deterministic
            m = bed.run(setting, sampler, steps)
            best = m if best is None or m.seconds < best.seconds else best
        m = best
        if m.forward_tokens != m.engine_forward_tokens:  # two independent tallies of the same work
            raise RuntimeError(f"{bed.name} {sampler} {setting.label}: the model was fed {m.forward_tokens} query "
                               f"positions, the engine reports {m.engine_forward_tokens}")
        if setting.kind == "reference":
            reference = m
        bed.score(m, reference)
        n = m.sequences
        row = dict(setting=setting.label, kind=setting.kind, **{k: v for k, v in asdict(setting).items() if k != "label"},
                   quality=mean(m.quality), quality_std=std(m.quality), quality_min=min(m.quality),
                   quality_max=max(m.quality), quality_units=m.quality,
                   forward_tokens_per_seq=m.forward_tokens / n, engine_forward_tokens_per_seq=m.engine_forward_tokens / n,
                   full_forwards_per_seq=m.full_rows / n, nfe_per_seq=m.nfe_rows / n, seconds=m.seconds)
        if hasattr(m, "agreement"):
            row["agreement"] = mean(m.agreement)
        if reference is not None and reference is not m:
            row["forward_tokens_vs_none"] = row["forward_tokens_per_seq"] / rows[0]["forward_tokens_per_seq"]
            row["seconds_vs_none"] = row["seconds"] / rows[0]["seconds"]
        else:
            row["forward_tokens_vs_none"] = row["seconds_vs_none"] = 1.0
        rows.append(row)
        bar.update(1)
    summarise(rows)
    return rows


def build_beds(args) -> list:
    beds = []
    for name in args.beds:
        if name.startswith("replica-"):
            beds.append(ReplicaBed(int(name.split("-")[1]), args.seeds, args.prompts, args.prompt_length,
                                   args.gen_length, args.block_length, args.head_scale, args.replica_batch))
        elif name == "chains":
            beds.append(TaskBed("chains", "tiny-dlm-chains", "chains", args.limit, args.task_block_length, args.batch_size))
        elif name == "sum":
            beds.append(TaskBed("sum", "tiny-dlm-chains-hard", "sum", args.limit, args.task_block_length, args.batch_size))
        else:
            raise SystemExit(f"bench_elastic.py: error: unknown bed {name!r}; valid: replica-N (N layers), chains, sum")
    return beds


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--beds", default="replica-2,replica-4,chains,sum", help="comma-separated: replica-N, chains, sum")
    p.add_argument("--samplers", default="confidence,threshold", help="samplers of every bed")
    p.add_argument("--task-samplers", default=None, help="samplers of the task beds (default: --samplers)")
    p.add_argument("--thresholds", default="0.9,0.99,0.999,0.9995,0.9999", help="cache_drift_threshold grid")
    p.add_argument("--probes", default="2,4,8", help="cache_drift_probe grid")
    p.add_argument("--zero-probe", type=int, default=4, help="probe of the threshold-0 setting (-1: leave it out)")
    p.add_argument("--refreshes", default="2,4", help="cache_refresh_every values of the dual cache")
    p.add_argument("--seeds", type=int, default=8, help="replica beds: seeds (units)")
    p.add_argument("--prompts", type=int, default=8, help="replica beds: prompts per seed")
    p.add_argument("--prompt-length", type=int, default=16)
    p.add_argument("--gen-length", type=int, default=64, help="replica beds (task beds: the suite's)")
    p.add_argument("--block-length", type=int, default=16, help="replica beds")
    p.add_argument("--replica-batch", type=int, default=0,
                   help="replica beds: prompts per call (0: all of a seed's prompts in one call)")
    p.add_argument("--head-scale", type=float, default=128.0, help="replica beds: LM head multiplier")
    p.add_argument("--limit", type=int, default=25, help="task beds: test prompts per task")
    p.add_argument("--task-block-length", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=16, help="task beds")
    p.add_argument("--repeats", type=int, default=1, help="runs per setting; the fastest is timed")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--smoke", action="store_true", help="a tiny run of every part (the test's)")
    p.add_argument("--summary", metavar="RESULTS_JSON", help="print the condensed tables of a finished run (no run)")
    p.add_argument("--summary-probe", type=int, default=4, help="the probe whose elastic rows the cost table shows")
    p.add_argument("--out", default="runs/elastic")
    args = p.parse_args(argv)
    if args.smoke:
        args.beds, args.samplers, args.task_samplers = "replica-2,sum", "confidence", "threshold"
        args.thresholds, args.probes, args.refreshes = "0.999,1.5", "2", "2"
        args.seeds, args.prompts, args.prompt_length, args.gen_length, args.block_length = 2, 3, 6, 32, 16
        args.limit, args.zero_probe = 1, 4
    args.beds = [b for b in args.beds.split(",") if b]
    args.samplers = [s for s in args.samplers.split(",") if s]
    args.task_samplers = args.samplers if args.task_samplers is None else [s for s in args.task_samplers.split(",") if s]
    args.thresholds = [float(t) for t in args.thresholds.split(",") if t]
    args.probes = [int(x) for x in args.probes.split(",") if x]
    args.refreshes = [int(x) for x in args.refreshes.split(",") if x]
    args.zero_probe = None if args.zero_probe < 0 else args.zero_probe
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.summary:
        print(summary_tables(json.loads(Path(args.summary).read_text()), args.summary_probe))
        return 0
    torch.set_num_threads(args.threads)
    grid = settings(args.thresholds, args.probes, args.refreshes, args.zero_probe)
    beds = build_beds(args)
    results = dict(args={k: v for k, v in vars(args).items()}, torch=torch.__version__, threads=torch.get_num_threads(),
                   time=time.strftime("%Y-%m-%dT%H:%M:%S"), beds=[])
    samplers = {bed.name: args.samplers if isinstance(bed, ReplicaBed) else args.task_samplers for bed in beds}
    bar = tqdm(total=sum(map(len, samplers.values())) * len(grid), desc="elastic", unit="setting", file=sys.stderr)
    with torch.inference_mode():
        for bed in beds:
            bed.warm_up(samplers[bed.name][0])  # untimed: first-call costs
            for sampler in samplers[bed.name]:
                steps = bed.gen_length  # the budget: one token per step for confidence, a cap for threshold
                bar.set_postfix_str(f"{bed.name} {sampler}")
                entry = dict(bed=bed.name, sampler=sampler, steps=steps, unit=bed.unit, metric=bed.metric,
                             **bed.describe(), rows=measure(bed, sampler, steps, grid, args.repeats, bar))
                if isinstance(bed, ReplicaBed):
                    entry["numerics_floor"] = bed.numerics_floor(sampler, steps)
                results["beds"].append(entry)
    bar.close()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    (out / "results.md").write_text(markdown(results))
    plot(results, out / "quality_vs_forward_tokens.png")
    print(markdown(results))
    print(f"wrote {out}/results.json, results.md, quality_vs_forward_tokens.png", file=sys.stderr)
    return 0


# ----------------------------------------------------------------------------- report

def markdown(results: dict) -> str:
    lines = []
    for e in results["beds"]:
        lines.append(f"#### {e['bed']}, {e['sampler']} (budget {e['steps']}): {e['metric']}, "
                     f"{e['units']} {e['unit']}s, up to {e['batch_size']} rows per call")
        if "numerics_floor" in e:
            f = e["numerics_floor"]
            lines.append(f"Numerics floor (float32 vs float64, uncached): {mean(f):.1f}% (min {min(f):.1f}).")
        extra = " | agreement %" if "agreement" in e["rows"][0] else ""
        lines.append("")
        lines.append(f"| setting | quality % (sd; min-max over {e['unit']}s){extra} | forward tokens/seq | vs none | "
                     "full forwards/seq | seconds | vs none | Δ vs comparator (95% band) | verdict |")
        lines.append("|---|---|" + ("---:|" if extra else "") + "---:|---:|---:|---:|---:|---|---|")
        for r in e["rows"]:
            q = f"{r['quality']:.1f} ({r['quality_std']:.1f}; {r['quality_min']:.0f}-{r['quality_max']:.0f})"
            ag = f" | {r['agreement']:.1f}" if extra else ""
            comp = ""
            if "vs_comparator" in r:
                d = r["vs_comparator"]
                more = " (costs more)" if r["comparator_costs_more"] else ""
                comp = f"{d['mean']:+.1f} ± {d['band']:.1f} vs {r['comparator']}{more} | {r['verdict']}"
            else:
                comp = " | "
            lines.append(f"| {r['setting']} | {q}{ag} | {r['forward_tokens_per_seq']:.0f} | {r['forward_tokens_vs_none']:.2f} | "
                         f"{r['full_forwards_per_seq']:.1f} | {r['seconds']:.2f} | {r['seconds_vs_none']:.2f} | {comp} |")
        lines.append("")
    return "\n".join(lines)


def summary_tables(results: dict, probe: int) -> str:
    """Condensed tables of a run, one pair per kind of bed (replicas; task beds): (1) per setting, quality /
    forward tokens vs none / full forwards per sequence (/ seconds vs none on task beds), the elastic rows at
    `probe` only; (2) every elastic row against its comparator with the 95% band (left out where every
    verdict is "equal")."""
    out = []
    for unit in ("seed", "prompt"):
        entries = [e for e in results["beds"] if e["unit"] == unit]
        if not entries:
            continue
        heads = [f"{e['bed']} {e['sampler']}" for e in entries]
        what = "agreement %" if unit == "seed" else "accuracy % / forward tokens vs none / full forwards per seq / seconds vs none"
        if unit == "seed":
            what += " / forward tokens vs none / full forwards per seq"
        out += [f"| setting ({what}) | " + " | ".join(heads) + " |", "|---|" + "---|" * len(entries)]
        for label in [r["setting"] for r in entries[0]["rows"] if r["kind"] != "elastic" or r["probe"] == probe]:
            cells = []
            for e in entries:
                r = _row(e, label)
                cell = "" if r is None else \
                    f"{r['quality']:.1f} / {r['forward_tokens_vs_none']:.2f} / {r['full_forwards_per_seq']:.1f}"
                if r is not None and unit == "prompt":
                    cell += f" / {r['seconds_vs_none']:.2f}"
                cells.append(cell)
            out.append(f"| {label} | " + " | ".join(cells) + " |")
        out.append("")
        elastic = [r["setting"] for r in entries[0]["rows"] if r["kind"] == "elastic"]
        if all(_row(e, label).get("verdict") == "equal" for e in entries for label in elastic if _row(e, label)):
            continue
        out += ["| elastic setting: Δ quality vs its comparator (95% band) | " + " | ".join(heads) + " |",
                "|---|" + "---|" * len(entries)]
        for label in elastic:
            cells = []
            for e in entries:
                r = _row(e, label)
                if r is None or "vs_comparator" not in r:
                    cells.append("")
                    continue
                d = r["vs_comparator"]
                more = ", costs more" if r["comparator_costs_more"] else ""
                cells.append(f"{d['mean']:+.1f} ± {d['band']:.1f} vs {r['comparator']}{more}: **{r['verdict']}**")
            out.append(f"| {label} | " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out)


def _row(entry: dict, label: str) -> dict | None:
    return next((r for r in entry["rows"] if r["setting"] == label), None)


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    entries = results["beds"]
    cols = min(len(entries), 4)
    rows_n = math.ceil(len(entries) / cols)
    fig, axes = plt.subplots(rows_n, cols, figsize=(4.2 * cols, 3.6 * rows_n), squeeze=False)
    colors = {2: "tab:green", 4: "tab:blue", 8: "tab:purple"}
    for ax, e in zip(axes.flat, entries):
        for r in e["rows"]:
            x, y = r["forward_tokens_vs_none"], r["quality"]
            if r["kind"] == "elastic":
                ax.plot(x, y, "o", ms=4, color=colors.get(r["probe"], "tab:red"), alpha=0.8)
            else:
                ax.plot(x, y, "*" if r["kind"] == "reference" else "s", ms=6,
                        color="black" if r["kind"] == "reference" else "tab:orange")
                ax.annotate(r["setting"].replace("refresh=", "r"), (x, y), fontsize=6, xytext=(3, -8),
                            textcoords="offset points")
        for p, c in colors.items():
            pts = sorted((r["forward_tokens_vs_none"], r["quality"]) for r in e["rows"]
                         if r["kind"] == "elastic" and r["probe"] == p and r["threshold"] > 0)
            if pts:
                ax.plot(*zip(*pts), color=c, lw=0.8, label=f"elastic probe {p}")
        ax.set_title(f"{e['bed']} / {e['sampler']}", fontsize=9)
        ax.set_xlabel("forward tokens / none")
        ax.set_ylabel("agreement %" if e["unit"] == "seed" else "accuracy %")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(entries):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=6, loc="lower right")
    fig.suptitle("kv_cache='elastic' (circles, by probe; lines join thresholds) vs fixed caches (squares): "
                 "mean quality over units (the noise band is in results.md)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
