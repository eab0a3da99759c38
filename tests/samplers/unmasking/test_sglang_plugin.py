"""Our samplers as SGLang dLLM algorithms (samplers.unmasking.sglang_plugin).

Equality: on logits recorded from `dlm.generate`, the SGLang step commits exactly the tokens the
engine committed, step by step, for every sampler we register. Part 1 checks the wrapper's
SGLang-free driver (runs without SGLang); part 2 runs SGLang's own code: its plugin loader reading
our entry point, its `DllmConfig` / `get_algorithm` lookup, a real `ForwardBatch`, and its
`DllmAlgorithm.run` loops (synchronous and FDFO). SGLang's `ModelRunner` needs a GPU, so the model
side of `run` is a stand-in runner that evaluates the tests' toy model on prompt + block; everything
the algorithm reads (`batch_size`, `input_ids`, `dllm_prompt_mask`, `rids`) is a real ForwardBatch field.

Import surface (sglang 0.5.23 on CPU torch 2.13): `sglang.srt.dllm.algorithm.base` imports its
package, whose `DllmConfig` imports `sglang.srt.configs`, whose `nano_nemotron_vl` imports
`sglang.srt.multimodal.internvl_utils`, which imports `torchvision.transforms`. The PyPI torchvision
builds that match torch 2.13 (0.28, 0.29) are linked against CUDA torch and fail at import on the CPU
build (`torchvision::nms` does not exist); torchvision 0.16.2, whose import tolerates a missing ops
library, imports and serves `transforms`. Nothing is stubbed: the test environment installs sglang and
that torchvision with `--no-deps` (scripts/install_test_extras.sh, which the README's test command runs).

The SGLang tests are skipped only when sglang is not installed AND the README's test command does
not install it; once the README installs it, a missing sglang fails them.
"""
from __future__ import annotations

import importlib.util
import math
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import dlm
from samplers import SAMPLERS
from samplers.unmasking import sglang_plugin
from samplers.unmasking.sglang_plugin import PolicyDriver, algorithm_class, algorithm_names, refusal
from toy_models import ToyDLM

ROOT = Path(__file__).resolve().parents[3]
MASK = 15  # ToyDLM(vocab_size=16)'s mask id
BLOCK = 8


def readme_installs_sglang() -> bool:
    """Whether the README's test command (its second bash block, the one CI runs) installs sglang,
    itself or through a project script it runs (`scripts/install_test_extras.sh`)."""
    blocks = re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    if len(blocks) < 2:
        return False
    scripts = [ROOT / path for path in re.findall(r"scripts/[\w.-]+\.sh", blocks[1]) if (ROOT / path).is_file()]
    return any("sglang" in text for text in [blocks[1]] + [path.read_text() for path in scripts])


def test_the_readme_test_command_installs_sglang():
    """CI runs the README's test command: through scripts/install_test_extras.sh it installs sglang,
    so the tests below run there (a missing sglang fails them instead of skipping them)."""
    assert readme_installs_sglang()


SGLANG_ABSENT = importlib.util.find_spec("sglang") is None
needs_sglang = pytest.mark.skipif(
    SGLANG_ABSENT and not readme_installs_sglang(),
    reason="sglang is not installed and the README's test command does not install it")

# Options that make the adaptive samplers commit several tokens in some steps on the toy model.
OPTIONS = {"threshold": {"tau": 0.5}, "eb": {"gamma": 1.0}, "credit": {"tau": 0.5}, "hierarchical": {"tau": 0.6},
           "entropy_bound": {"entropy_bound": 0.5}}


class Recorder(torch.nn.Module):
    """The toy model, keeping a copy of every logits tensor it returns (`[B, L, V]` per call)."""

    def __init__(self, inner: ToyDLM):
        super().__init__()
        self.inner = inner
        self.config = inner.config
        self.logits: list[torch.Tensor] = []

    def forward(self, input_ids, attention_mask=None, **kw):
        out = self.inner(input_ids, attention_mask=attention_mask, **kw)
        self.logits.append(out.logits.detach().clone())
        return out


def prompts(batch: int, length: int = 6, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, MASK - 2, (batch, length), generator=g)  # no mask, EOS or pad... ids 0..12


def engine_run(name: str, prompt: torch.Tensor, gen_length: int, steps: int, temperature: float = 0.0, seed=None):
    model = Recorder(ToyDLM(vocab_size=16, seed=0))
    gen = None if seed is None else torch.Generator().manual_seed(seed)
    out = dlm.generate(model, prompt, gen_length=gen_length, block_length=BLOCK, steps=steps, sampler=name,
                       sampler_config=OPTIONS.get(name, {}), temperature=temperature, generator=gen,
                       eos_early_stop=False, return_trace=True)
    return out, model.logits


def block_budgets(steps: int, steps_per_block: list[int]) -> list[int]:
    """The engine's budget of each block (`dlm.engine.schedule.block_budget` with roll-over of unused steps)."""
    budgets, left = [], steps
    for b, used in enumerate(steps_per_block):
        budgets.append(math.ceil(left / (len(steps_per_block) - b)))
        left -= used
    return budgets


CASES = [
    # (gen_length, steps, temperature, seed): a sub-block budget (several tokens a step), one token a
    # step over two blocks (adaptive blocks roll steps over), and sampling at temperature 1. A seed
    # everywhere: `random` draws its positions even when greedy.
    (BLOCK, 3, 0.0, 5),
    (2 * BLOCK, 2 * BLOCK, 0.0, 6),
    (2 * BLOCK, 6, 1.0, 7),
]


def replay(name, out, logits, steps, temperature, seed, step_fn):
    """Feed the engine's recorded block logits to `step_fn(x, block_logits, budget, new_block)` block by
    block and check every step's block against the engine's trace. Returns the number of steps."""
    checked = 0
    prompt_len = out.sequences.shape[1] - BLOCK * len(out.steps_per_block)
    for b, budget in enumerate(block_budgets(steps, out.steps_per_block)):
        start = prompt_len + b * BLOCK
        records = [t for t in out.trace if t.block == b]
        assert len(records) == out.steps_per_block[b]
        x = torch.full((out.sequences.shape[0], BLOCK), MASK)
        for t in records:
            x = step_fn(x, logits[t.nfe - 1][:, start:start + BLOCK].clone(), budget, b == 0 and t.step == 0)
            assert torch.equal(x, t.tokens), f"{name}: block {b} step {t.step} differs from the engine"
            checked += 1
        assert torch.equal(x, out.sequences[:, start:start + BLOCK])
    return checked


# ---------------------------------------------------------------- part 1: the SGLang-free driver

def test_registered_and_refused_names():
    names = algorithm_names()
    assert set(names.values()) == {"confidence", "credit", "eb", "entropy", "entropy_bound", "hierarchical", "margin",
                                   "position", "random", "threshold"}
    assert all(k == "dlm-" + v for k, v in names.items())
    for sampler, words in {"lopa": "extra model forwards", "hex": "ensemble", "joint": "hidden",
                           "saber": "remasks"}.items():
        reason = refusal(SAMPLERS[sampler])
        assert words in reason and f"dlm.generate(model, input_ids, sampler={sampler!r}" in reason
        with pytest.raises(ValueError, match=re.escape(words)):
            algorithm_class("dlm-" + sampler)
        with pytest.raises(ValueError, match=re.escape(words)):
            PolicyDriver(sampler, {}, BLOCK, MASK)


def test_bad_names_and_options():
    with pytest.raises(ValueError, match="unknown sampler 'nope'.*dlm-threshold"):
        algorithm_class("dlm-nope")
    with pytest.raises(ValueError, match="start with 'dlm-'"):
        algorithm_class("threshold")
    with pytest.raises(ValueError, match="tau must be in"):
        PolicyDriver("threshold", {"tau": 2.0}, BLOCK, MASK)
    with pytest.raises(ValueError, match="no option taux.*valid options: factor, tau"):
        PolicyDriver("threshold", {"taux": 0.5}, BLOCK, MASK)
    with pytest.raises(ValueError, match="steps"):
        PolicyDriver("confidence", {"steps": 0}, BLOCK, MASK)
    with pytest.raises(ValueError, match="temperature"):
        PolicyDriver("confidence", {"temperature": -1}, BLOCK, MASK)
    with pytest.raises(ValueError, match="seed"):
        PolicyDriver("confidence", {"seed": 1.5}, BLOCK, MASK)
    with pytest.raises(ValueError, match="Gemma4Renoise"):
        PolicyDriver("confidence", {}, BLOCK, -1)  # SGLang's mask id for DiffusionGemma (uniform noise)
    # SGLang's own config keys are not sampler options.
    PolicyDriver("confidence", {"block_size": 32, "capture_input_preparation": False}, BLOCK, MASK)


# One case here: the SGLang test below runs all three through the same driver.
@pytest.mark.parametrize("gen_length,steps,temperature,seed", CASES[:1])
@pytest.mark.parametrize("name", sorted(algorithm_names().values()))
def test_driver_commits_what_the_engine_commits(name, gen_length, steps, temperature, seed):
    prompt = prompts(2)
    out, logits = engine_run(name, prompt, gen_length, steps, temperature, seed)
    config = {**OPTIONS.get(name, {}), "temperature": temperature, **({} if seed is None else {"seed": seed})}
    driver = PolicyDriver(name, config, BLOCK, MASK)
    states = []

    def step(x, block_logits, budget, first):
        driver.steps = budget  # SGLang gives every block the same budget; the engine's may roll over
        if x.eq(MASK).all():
            states[:] = driver.init_rows(x.shape[0], shared=True, device=x.device)
        new, done = driver.step(x, block_logits, None, states)
        # A block reports done on the call after its last commit (its row then has no mask).
        assert done == (~x.eq(MASK).any(dim=1)).tolist()
        return new

    assert replay(name, out, logits, steps, temperature, seed, step) == out.nfe
    # The call after the block's last step reports done and changes nothing.
    x = out.sequences[:, -BLOCK:]
    new, done = driver.step(x, logits[-1][:, -BLOCK:].clone(), None, states)
    assert done == [True, True] and torch.equal(new, x)


def test_driver_guarantees_progress_and_fill():
    """A policy that commits nothing still makes progress (the engine's contract): one token per step,
    and the budget's last step fills every mask."""
    driver = PolicyDriver("confidence", {"steps": 3}, BLOCK, MASK)
    driver.policy.step = lambda logits, ctx: sglang_plugin.StepResult(
        ctx.x.clone(), logits.argmax(-1), torch.softmax(logits, -1).amax(-1))
    x = torch.full((1, BLOCK), MASK)
    states = driver.init_rows(1, shared=True, device=x.device)
    logits = torch.randn(1, BLOCK, 16, generator=torch.Generator().manual_seed(0))
    left = []
    for _ in range(3):
        x, done = driver.step(x, logits.clone(), None, states)
        left.append(int(x.eq(MASK).sum()))
    assert left == [BLOCK - 1, BLOCK - 2, 0]
    assert driver.max_steps() == 4


def test_driver_guarantees_keep_committed_and_prompt_tokens():
    """SGLang's block may hold committed tokens and prompt tokens equal to the mask id
    (`dllm_prompt_mask`): a policy answer that rewrites them is put back, and only candidates fill."""
    x = torch.tensor([[5, MASK, MASK, 3]])
    candidates = torch.tensor([[False, True, False, False]])  # position 2 is a prompt token that is the mask id
    answer = torch.tensor([[1, 2, 4, 0]])  # rewrites the committed 5 and 3 and the prompt's mask id
    result = sglang_plugin.StepResult(answer, answer, torch.ones(1, 4))
    kept = sglang_plugin.driver_guarantees(result, x, candidates, last=False, mask_id=MASK)
    assert kept.tolist() == [[5, 2, MASK, 3]]


# ---------------------------------------------------------------- part 2: inside SGLang's own code

@pytest.fixture(scope="module")
def sgl():
    """SGLang's modules the tests use (real imports; see the module docstring for the chain)."""
    from sglang.srt.dllm import algorithm
    from sglang.srt.dllm.algorithm.base import DllmAlgorithm
    from sglang.srt.dllm.config import DllmConfig
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
    import sglang.srt.plugins as plugins

    return SimpleNamespace(algorithm=algorithm, DllmAlgorithm=DllmAlgorithm, DllmConfig=DllmConfig,
                           ForwardBatch=ForwardBatch, ForwardMode=ForwardMode, plugins=plugins)


@pytest.fixture(scope="module")
def registered(sgl):
    """Our names as SGLang's plugin loader registers them from the installed entry point."""
    from importlib.metadata import entry_points

    eps = [ep for ep in entry_points(group=sgl.plugins.GENERAL_PLUGINS_GROUP) if ep.name == "dlm_fast"]
    assert [ep.value for ep in eps] == ["samplers.unmasking.sglang_plugin:register"], \
        "the dlm_fast entry point is missing: reinstall the package (pip install -e .) after editing pyproject.toml"
    table = sgl.algorithm.algo_name_to_cls
    for name in algorithm_names():
        table.pop(name, None)  # only the loader below may put them back
    sgl.plugins._plugins_loaded = False  # load_plugins runs once per process; this test runs it
    sgl.plugins.load_plugins()
    return table


def forward_batch(sgl, x: torch.Tensor, prompt_mask=None, rids=None):
    """A real ForwardBatch for one denoising pass over blocks `x [B, Lb]`, with only the fields SGLang's
    scheduler fills for a dLLM block and its algorithms read (no KV cache on CPU: empty cache slots)."""
    b, lb = x.shape
    return sgl.ForwardBatch(forward_mode=sgl.ForwardMode.DLLM_EXTEND, batch_size=b, input_ids=x.reshape(-1).clone(),
                            req_pool_indices=torch.arange(b), seq_lens=torch.full((b,), lb),
                            out_cache_loc=torch.zeros(0, dtype=torch.long), seq_lens_sum=b * lb,
                            dllm_prompt_mask=prompt_mask, rids=rids)


def sglang_algorithm(sgl, name: str, config: dict, fdfo: bool = False):
    """Our algorithm as SGLang builds it: DllmConfig -> sglang.srt.dllm.algorithm.get_algorithm."""
    cfg = sgl.DllmConfig(algorithm="dlm-" + name, algorithm_config=config, block_size=BLOCK, mask_id=MASK,
                         max_running_requests=4, first_done_first_out_mode=fdfo)
    return sgl.algorithm.get_algorithm(cfg)


@needs_sglang
def test_load_plugins_registers_our_algorithms(sgl, registered):
    for name, sampler in algorithm_names().items():
        cls = registered[name]
        assert issubclass(cls, sgl.DllmAlgorithm) and cls.sampler_name == sampler
        assert cls.step is not sgl.DllmAlgorithm.step
    for refused in ("lopa", "hex", "joint", "saber"):
        assert "dlm-" + refused not in registered
    # SGLang's own algorithms are still there.
    assert {"LowConfidence", "JointThreshold"} <= set(registered)


@needs_sglang
@pytest.mark.parametrize("gen_length,steps,temperature,seed", CASES)
@pytest.mark.parametrize("name", sorted(algorithm_names().values()))
def test_sglang_step_commits_what_the_engine_commits(sgl, registered, name, gen_length, steps, temperature, seed):
    prompt = prompts(2)
    out, logits = engine_run(name, prompt, gen_length, steps, temperature, seed)
    config = {**OPTIONS.get(name, {}), "temperature": temperature, **({} if seed is None else {"seed": seed})}
    run = SimpleNamespace(algo=None, batch=None, states=None)

    def step(x, block_logits, budget, first):
        if x.eq(MASK).all():  # a new block: SGLang builds a batch and fresh states for it
            if run.algo is None or budget != run.algo.driver.steps:
                generator = None if run.algo is None else run.algo.driver.generator
                run.algo = sglang_algorithm(sgl, name, {**config, "steps": budget})
                run.algo.driver.generator = generator  # one random stream across blocks, as in the engine
            run.batch = forward_batch(sgl, x)
            run.states = run.algo.init_step_state(run.batch)
        ids = run.batch.input_ids
        done = run.algo.step(run.batch, block_logits.reshape(-1, block_logits.shape[-1]), run.states)
        assert done == (~x.eq(MASK).any(dim=1)).tolist()
        assert run.batch.input_ids is ids  # written in place, as SGLang's CUDA graphs need
        return ids.view(x.shape).clone()

    assert replay(name, out, logits, steps, temperature, seed, step) == out.nfe
    assert run.algo.step(run.batch, logits[-1][:, -BLOCK:].reshape(-1, 16).clone(), run.states) == [True, True]
    assert torch.equal(run.batch.input_ids.view(2, BLOCK), out.sequences[:, -BLOCK:])


class ToyRunner:
    """Stands in for SGLang's ModelRunner (which needs a GPU): `forward` evaluates the toy model on each
    request's prompt followed by its current block, and returns the block's logits `[B * Lb, V]`."""

    def __init__(self, prompt_of: dict[str, torch.Tensor]):
        self.model = ToyDLM(vocab_size=16, seed=0)
        self.prompt_of = prompt_of
        self.forwards = 0

    def forward(self, fb, pp_proxy_tensors=None):
        self.forwards += 1
        blocks = fb.input_ids.view(fb.batch_size, BLOCK)
        rows = [torch.cat([self.prompt_of[rid], blocks[i]]) for i, rid in enumerate(fb.rids)]
        logits = self.model(torch.stack(rows)).logits[:, -BLOCK:]
        return SimpleNamespace(logits_output=SimpleNamespace(full_logits=logits.reshape(-1, logits.shape[-1])),
                               can_run_graph=False)


@needs_sglang
@pytest.mark.parametrize("name", ["threshold", "confidence", "credit", "eb", "position"])
def test_sglang_sync_loop_generates_the_engine_tokens(sgl, registered, name):
    """SGLang's synchronous loop (`DllmAlgorithm.run` with FDFO off) over one block per request."""
    prompt = prompts(3, seed=2)
    out, _ = engine_run(name, prompt, BLOCK, 4)
    algo = sglang_algorithm(sgl, name, {**OPTIONS.get(name, {}), "steps": 4})
    runner = ToyRunner({f"r{i}": prompt[i] for i in range(3)})
    fb = forward_batch(sgl, torch.full((3, BLOCK), MASK), rids=["r0", "r1", "r2"])
    _, tokens, _, _, _ = algo.run(runner, fb)
    assert torch.equal(torch.stack(tokens), out.sequences[:, -BLOCK:])
    # SGLang's loop runs one more forward than the engine: it writes the final tokens' KV cache.
    assert runner.forwards == out.nfe + 1


@needs_sglang
@pytest.mark.parametrize("name", ["threshold", "credit", "confidence"])
def test_sglang_fdfo_rounds_generate_the_engine_tokens(sgl, registered, name):
    """SGLang's first-done-first-out loop (its default): requests join at different rounds, so one
    batch holds requests at different steps of their blocks, and leave when done."""
    prompt = prompts(3, seed=3)
    expected = {f"r{i}": engine_run(name, prompt[i:i + 1], BLOCK, 5)[0].sequences[0, -BLOCK:] for i in range(3)}
    algo = sglang_algorithm(sgl, name, {**OPTIONS.get(name, {}), "steps": 5}, fdfo=True)
    runner = ToyRunner({f"r{i}": prompt[i] for i in range(3)})
    joins = {0: ["r0"], 1: ["r1"], 3: ["r2"]}
    live: dict[str, dict] = {}  # rid -> {"block": tokens, "state": carried algorithm state}
    finished: dict[str, torch.Tensor] = {}
    mixed_steps = False
    for round_ in range(20):
        for rid in joins.get(round_, []):
            live[rid] = {"block": torch.full((BLOCK,), MASK), "state": None}
        if not live:
            break
        rids = list(live)
        fb = forward_batch(sgl, torch.stack([live[r]["block"] for r in rids]), rids=rids)
        _, tokens, accepted, states, _ = algo.run(runner, fb, [live[r]["state"] for r in rids])
        used = {s["used"] for s in states if s is not None}
        mixed_steps |= len(used) > 1
        for i, rid in enumerate(rids):
            live[rid]["block"] = torch.tensor(tokens[i])
            live[rid]["state"] = states[i]
            if accepted[i] == BLOCK:
                finished[rid] = live.pop(rid)["block"]
    assert mixed_steps, "the test must batch requests at different steps"
    assert set(finished) == set(expected)
    for rid, block in finished.items():
        assert torch.equal(block, expected[rid]), rid


@needs_sglang
def test_sglang_prompt_tail_in_the_block_stays(sgl, registered):
    """A request's first block starts with its prompt's tail (`dllm_prompt_mask`), which may even hold
    the mask id as a literal token: those positions never change, the rest fills within the budget."""
    algo = sglang_algorithm(sgl, "threshold", {"tau": 0.5, "steps": 3})
    x = torch.full((2, BLOCK), MASK)
    x[0, :3] = torch.tensor([4, MASK, 6])  # a literal mask id inside the prompt
    x[1, :1] = 2
    prompt_mask = torch.zeros(2, BLOCK, dtype=torch.bool)
    prompt_mask[0, :3] = True
    prompt_mask[1, :1] = True
    fb = forward_batch(sgl, x, prompt_mask=prompt_mask, rids=["a", "b"])
    states = algo.init_step_state(fb)
    logits = ToyDLM(vocab_size=16, seed=0)(x).logits.reshape(-1, 16)
    calls = 0
    while True:
        calls += 1
        if all(algo.step(fb, logits.clone(), states)):
            break
    y = fb.input_ids.view(2, BLOCK)
    assert torch.equal(y[prompt_mask], x[prompt_mask])
    assert not y[~prompt_mask].eq(MASK).any()
    assert calls <= algo.max_steps(BLOCK) == 4


@needs_sglang
def test_sglang_refuses_bad_config(sgl, registered):
    with pytest.raises(ValueError, match="tau must be in"):
        sglang_algorithm(sgl, "threshold", {"tau": 1.5})
    with pytest.raises(ValueError, match="no option gamma"):
        sglang_algorithm(sgl, "threshold", {"gamma": 0.1})
    with pytest.raises(RuntimeError, match="Unknown diffusion LLM algorithm: dlm-lopa"):
        sglang_algorithm(sgl, "lopa", {})
