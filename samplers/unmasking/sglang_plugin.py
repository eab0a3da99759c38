"""Our unmasking samplers as SGLang dLLM algorithms, for serving masked diffusion LMs with SGLang.

    pip install "dlm-fast[sglang]"
    python -m sglang.launch_server --model-path inclusionAI/LLaDA2.0-mini --dllm-algorithm dlm-threshold \\
        --dllm-algorithm-config cfg.yaml          # cfg.yaml: tau: 0.9  (and optionally steps, temperature, seed)

SGLang (>= 0.5.23) looks a dLLM algorithm up by name in `sglang.srt.dllm.algorithm.algo_name_to_cls`
and calls every function of the entry point group `sglang.srt.plugins` early in each of its
processes (`sglang.srt.plugins.load_plugins`). Our entry point is `register` below: it adds one
`DllmAlgorithm` subclass per sampler that can run inside SGLang's loop, named `dlm-<sampler>`
(`dlm-threshold`, `dlm-eb`, ...; `algorithm_names()` lists them).

Each class is a thin driver around the same pure-torch policy the engine runs
(`samplers.get_sampler(name).step(logits, StepContext)`); no policy is written twice. SGLang denoises
one fixed block of `block_size` positions per request (`ForwardBatch.input_ids`, `[B * block_size]`,
with the prompt's tail at the front of a request's first block, marked by `dllm_prompt_mask`) and
calls `step(forward_batch, full_logits [B * block_size, V], states)` after every forward; the step
writes the new block into `input_ids` in place and returns, per request, whether its block is done.
Per step and request the wrapper does what `dlm.generate` does for one block:

- candidates: the block's mask positions outside the prompt;
- the mask token's logit set to -inf (never a valid answer), in place as the engine does;
- `num_transfer = ceil(masks left / steps left)` over a per-block budget of `steps` forward passes
  (algorithm config `steps`, default `block_size`: one token per step for the fixed-quota samplers,
  and adaptive ones such as `threshold` finish in fewer); `last_step` when the budget is spent;
- the engine's guarantees on the policy's answer (`driver_guarantees`).

A block reports done on the step after its last mask is filled, as SGLang's own `LowConfidence` does:
SGLang keeps the block's KV cache, so the final tokens need one more forward before they are emitted.

Differences from the engine, by construction of SGLang's loop (documented in docs/dlm.md, "SGLang"):
each block has its own budget (the engine rolls steps an adaptive block left unused over to later
blocks); the first block's prompt tail shares the block, so position j of `ctx.x` is position j of
SGLang's block; sampling options are algorithm config (`temperature`, 0 = greedy, and `seed`, default
0 so that tensor-parallel ranks draw alike), not per-request sampling parameters, as with SGLang's own
algorithms.

Not registered (each with the reason `refusal` gives; `algorithm_class` raises ValueError naming it):
samplers that look ahead with extra forwards (`lopa`), ensembles of whole generations (`hex`), a
sampler that checks a trained layer against the model and may read hidden states (`joint`), and
samplers that remask (`saber`: SGLang's first block holds the prompt's tail among its committed
tokens, which a remasking policy could take back, and saber's threshold reads earlier blocks'
commits, which SGLang's per-block algorithm state does not carry).

Under `--dllm-fdfo` (SGLang's default) requests enter and leave the batch at different steps: the
wrapper keeps each request's step count in its SGLang state and runs the policy once per group of
requests at the same step (once per request for samplers with per-row state, e.g. `credit`).
"""
from __future__ import annotations

from typing import Any

import torch

from samplers.base import Sampler, StepContext, StepResult
from samplers.contract import enforce_step_contract, tokens_this_step
from samplers.registry import SAMPLERS, get_sampler

PREFIX = "dlm-"
# Algorithm-config keys the wrapper reads; every other key is a sampler option. `block_size` and
# `capture_input_preparation` are SGLang's own keys (read by its DllmConfig), not passed on.
WRAPPER_KEYS = ("steps", "temperature", "seed")
SGLANG_KEYS = ("block_size", "capture_input_preparation")


def refusal(cls: type[Sampler]) -> str | None:
    """Why sampler class `cls` cannot run as an SGLang algorithm, or None if it can."""
    name = cls.name
    if cls.ensemble:
        return (f"sampler {name!r} combines whole generations (an ensemble), which SGLang's per-step algorithm "
                f"cannot run; use dlm.generate(model, input_ids, sampler={name!r}, ...)")
    if cls.looks_ahead:
        return (f"sampler {name!r} scores candidate blocks with extra model forwards (ctx.forward), which an "
                f"SGLang algorithm's step cannot make; use dlm.generate(model, input_ids, sampler={name!r}, ...)")
    if cls.prepare is not Sampler.prepare or cls.needs_hidden_states:
        return (f"sampler {name!r} checks a trained layer against the model (Sampler.prepare) and may read hidden "
                f"states; an SGLang step sees logits only; use dlm.generate(model, input_ids, sampler={name!r}, ...)")
    if cls.remasks:
        return (f"sampler {name!r} takes committed tokens back (remasks), and in SGLang's block the prompt's tail "
                f"sits among the committed tokens; saber's threshold also reads earlier blocks' commits, which "
                f"SGLang's per-block algorithm state does not carry; use "
                f"dlm.generate(model, input_ids, sampler={name!r}, ...)")
    return None


def registered_sampler(sampler_name: str) -> type[Sampler]:
    """The sampler class for `sampler_name`; ValueError when unknown or unable to run in SGLang's loop."""
    cls = SAMPLERS.get(sampler_name)
    if cls is None:
        raise ValueError(f"unknown sampler {sampler_name!r}; SGLang algorithms: {', '.join(algorithm_names())}")
    reason = refusal(cls)
    if reason is not None:
        raise ValueError(reason)
    return cls


def algorithm_names() -> dict[str, str]:
    """`{SGLang algorithm name: sampler name}` for every sampler that runs inside SGLang."""
    return {PREFIX + name: name for name, cls in sorted(SAMPLERS.items()) if refusal(cls) is None}


def split_config(sampler_name: str, algorithm_config: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """SGLang's `--dllm-algorithm-config` mapping -> (wrapper options, sampler options), validated.

    Unknown sampler options raise ValueError listing the valid ones (via `get_sampler`).
    """
    if not isinstance(algorithm_config, dict):
        raise ValueError(f"--dllm-algorithm-config must be a YAML mapping, got {type(algorithm_config).__name__}")
    wrapper = {k: algorithm_config[k] for k in WRAPPER_KEYS if k in algorithm_config}
    options = {k: v for k, v in algorithm_config.items() if k not in WRAPPER_KEYS + SGLANG_KEYS}
    steps = wrapper.get("steps")
    if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 1):
        raise ValueError(f"steps (forward passes per block) must be an integer >= 1, got {steps!r}")
    temperature = wrapper.get("temperature", 0.0)
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or temperature < 0:
        raise ValueError(f"temperature must be a number >= 0 (0 is greedy), got {temperature!r}")
    seed = wrapper.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise ValueError(f"seed must be an integer (default 0) or null (torch's global RNG), got {seed!r}")
    get_sampler(sampler_name, **options)  # raises ValueError naming a bad option and the valid ones
    return wrapper, options


def steps_left_quota(masks_left: torch.Tensor, steps_left: int) -> torch.Tensor:
    """`[B]` long: tokens to commit now (the engine's quota, `samplers.contract.tokens_this_step`)."""
    return tokens_this_step(masks_left, steps_left)


def driver_guarantees(result: StepResult, x: torch.Tensor, candidates: torch.Tensor, last: bool,
                      mask_id: int) -> torch.Tensor:
    """The engine's guarantees on a non-remasking policy's answer (`samplers.contract`), `[R, Lb]`,
    filling candidates only: a prompt token in SGLang's block may be the mask id itself
    (`dllm_prompt_mask`), and it must stay. Without them a policy that commits nothing would make
    SGLang's loop spin to its step limit."""
    return enforce_step_contract(result, x, candidates, remasks=False, last=last, mask_id=mask_id, fillable=candidates)


class PolicyDriver:
    """The SGLang-independent half of the wrapper: one block step for rows of a batch.

    Holds the policy (`samplers.get_sampler(name, **options)`), the per-block budget and the sampling
    options; `init_rows` makes per-request states, `step` advances `x [B, Lb]` given `logits [B, Lb, V]`.
    """

    def __init__(self, sampler_name: str, algorithm_config: dict[str, Any], block_size: int, mask_id: int):
        registered_sampler(sampler_name)
        if isinstance(mask_id, bool) or not isinstance(mask_id, int) or mask_id < 0:
            # SGLang gives mask_id -1 for DiffusionGemma (uniform noise, no mask token), which it serves
            # with its own Gemma4Renoise only.
            raise ValueError(f"mask_id={mask_id!r}: SGLang algorithms dlm-<sampler> decode masked diffusion models "
                             f"(a mask token id >= 0); serve DiffusionGemma with --dllm-algorithm Gemma4Renoise")
        wrapper, options = split_config(sampler_name, algorithm_config or {})
        self.policy = get_sampler(sampler_name, **options)
        self.block_size = block_size
        self.mask_id = mask_id
        self.steps = wrapper.get("steps") or block_size
        self.temperature = float(wrapper.get("temperature", 0.0))
        # Seeded by default: with tensor parallelism every rank runs this step on the same logits and
        # must draw the same tokens, which torch's per-process global RNG would not guarantee.
        self.seed = wrapper.get("seed", 0)
        self.generator: torch.Generator | None = None
        # Samplers with per-row history (credit) keep it in `init_state`'s dict, indexed by `ctx.rows`.
        self.stateful = type(self.policy).init_state is not Sampler.init_state

    def max_steps(self) -> int:
        """Step calls a block needs at most: its budget (never above its masks) plus the done call."""
        return min(self.steps, self.block_size) + 1

    def init_rows(self, batch_size: int, shared: bool, device: torch.device) -> list[dict]:
        """Fresh per-request states: the request's step count in its block and the policy's state.

        `shared`: one policy state for the whole batch (SGLang's synchronous loop, where all requests
        start the block together, as the engine's batch does); else one per request (FDFO)."""
        if shared:
            common = self.policy.init_state(batch_size, self.block_size, device) if self.stateful else {}
            return [{"used": 0, "state": common, "row": i} for i in range(batch_size)]
        return [{"used": 0, "state": self.policy.init_state(1, self.block_size, device) if self.stateful else {},
                 "row": 0} for _ in range(batch_size)]

    def _generator(self, device: torch.device) -> torch.Generator | None:
        if self.seed is None:
            return None
        if self.generator is None or self.generator.device != device:
            self.generator = torch.Generator(device=device).manual_seed(self.seed)
        return self.generator

    def step(self, x: torch.Tensor, logits: torch.Tensor, prompt_mask: torch.Tensor | None,
             states: list[dict]) -> tuple[torch.Tensor, list[bool]]:
        """One denoising step. x `[B, Lb]` long, logits `[B, Lb, V]`, prompt_mask `[B, Lb]` bool or None.

        Returns the new block `[B, Lb]` and, per row, whether the block was already complete (done).
        """
        candidates = x == self.mask_id
        if prompt_mask is not None:
            candidates = candidates & ~prompt_mask
        masks_left = candidates.sum(dim=1)
        done = (masks_left == 0).tolist()  # SGLang needs a host list; one sync per step
        logits[..., self.mask_id] = float("-inf")
        new_x = x.clone()
        for rows, state, used in self._groups(states):
            if all(done[r] for r in rows):
                continue  # nothing to commit; the engine would not call the policy either
            index = torch.tensor(rows, device=x.device)
            steps_left = max(self.steps - used + 1, 1)
            last = used >= self.steps
            ctx = StepContext(
                x=x[index], candidates=candidates[index],
                num_transfer=steps_left_quota(masks_left[index], steps_left), step=used - 1,
                steps_in_block=self.steps, last_step=last, temperature=self.temperature,
                generator=self._generator(x.device), mask_token_id=self.mask_id, block_start=0, state=state,
                rows=torch.tensor([states[r]["row"] for r in rows], device=x.device))
            result = self.policy.step(logits[index], ctx)
            new_x[index] = driver_guarantees(result, ctx.x, ctx.candidates, last, self.mask_id)
        return new_x, done

    def _groups(self, states: list[dict]) -> list[tuple[list[int], dict, int]]:
        """Rows that share one policy call: the same step count and, for a sampler with per-row
        state, the same state dict (so under FDFO such a sampler runs once per request).

        Every row's step count advances here (the engine counts steps per block for the whole batch,
        finished rows included, which then have no candidates and do not change)."""
        groups: dict[tuple[int, int | None], list[int]] = {}
        for i, s in enumerate(states):
            s["used"] += 1
            groups.setdefault((s["used"], id(s["state"]) if self.stateful else None), []).append(i)
        return [(rows, states[rows[0]]["state"] if self.stateful else {}, used)
                for (used, _), rows in groups.items()]


def algorithm_class(algorithm_name: str):
    """The SGLang `DllmAlgorithm` subclass for `dlm-<sampler>` (imports SGLang).

    A sampler that cannot run in SGLang's loop raises ValueError with the reason and the engine call.
    """
    if not algorithm_name.startswith(PREFIX):
        raise ValueError(f"SGLang algorithm names of this package start with {PREFIX!r}, got {algorithm_name!r}")
    sampler_name = algorithm_name[len(PREFIX):]
    registered_sampler(sampler_name)
    from sglang.srt.dllm.algorithm.base import DllmAlgorithm

    def __init__(self, config):
        DllmAlgorithm.__init__(self, config)
        self.driver = PolicyDriver(sampler_name, config.algorithm_config, config.block_size, config.mask_id)

    def max_steps(self, block_size: int) -> int:
        return self.driver.max_steps()

    def init_step_state(self, forward_batch) -> list:
        # SGLang's synchronous loop starts every request of the batch on a new block together; under
        # FDFO each request's state is carried across rounds on its own.
        return self.driver.init_rows(forward_batch.batch_size, shared=not self.fdfo,
                                     device=forward_batch.input_ids.device)

    def step(self, forward_batch, full_logits: torch.Tensor, states: list) -> list:
        """Advance every request's block one step in `forward_batch.input_ids` (in place, as SGLang's
        algorithms do, keeping the tensor CUDA-graph safe); returns per request whether it is done."""
        b = forward_batch.batch_size
        x = forward_batch.input_ids.view(b, self.block_size)
        logits = full_logits.view(b, self.block_size, full_logits.shape[-1])
        new_x, done = self.driver.step(x, logits, forward_batch.dllm_prompt_mask, states)
        forward_batch.input_ids.copy_(new_x.view(-1))
        return done

    camel = "".join(part.capitalize() for part in sampler_name.replace("-", "_").split("_"))
    return type(f"Dlm{camel}", (DllmAlgorithm,), {
        "__init__": __init__, "max_steps": max_steps, "init_step_state": init_step_state, "step": step,
        "__doc__": f"SGLang dLLM algorithm running this package's {sampler_name!r} sampler "
                   f"(samplers.unmasking.sglang_plugin).",
        "sampler_name": sampler_name, "__module__": __name__,
    })


def register() -> list[str]:
    """Entry point of the `sglang.srt.plugins` group: add every runnable sampler to SGLang's
    `algo_name_to_cls` as `dlm-<sampler>`. Returns the names registered."""
    from sglang.srt.dllm.algorithm import algo_name_to_cls

    names = algorithm_names()
    for algorithm_name in names:
        algo_name_to_cls[algorithm_name] = algorithm_class(algorithm_name)
    return list(names)
