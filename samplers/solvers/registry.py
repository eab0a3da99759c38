"""Registry of the continuous-diffusion solvers (diffusers-compatible schedulers).

    from samplers.solvers import get_solver, solver_from_pipeline
    pipe.scheduler = solver_from_pipeline(pipe, "pndm")        # drop-in, keeps the model's schedule
    sched = get_solver("dpmpp-2m", beta_schedule="scaled_linear")  # standalone

Each entry names the scheduler class, the config it sets on top of the source config, the family of
model it can drive (``vp``: epsilon/v/x0 models on a beta schedule; ``flow``: rectified-flow velocity
models) and the plain-function form over a denoiser.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Callable, Dict

FLOW_SCHEDULER_NAMES = (
    "FlowMatchEulerDiscreteScheduler",
    "FlowMatchHeunDiscreteScheduler",
    "FlowMatchLCMScheduler",
    "FlowMatchSolverScheduler",
)


@dataclass(frozen=True)
class SolverSpec:
    """One registry entry.

    Attributes:
        scheduler: ``"module:Class"`` of the diffusers-compatible scheduler.
        defaults: config keys this entry fixes (e.g. ``skip_prk_steps``), applied over the source config.
        family: ``"vp"`` or ``"flow"``.
        function: ``"module:function"`` of the plain-function sampler.
        description: one line for listings.
    """

    scheduler: str
    defaults: Dict[str, Any] = field(default_factory=dict)
    family: str = "vp"
    function: str = ""
    description: str = ""

    def scheduler_class(self):
        mod, name = self.scheduler.split(":")
        return getattr(importlib.import_module(mod), name)

    def sample_fn(self) -> Callable:
        if not self.function:
            raise ValueError(f"{self.scheduler} in this configuration has no plain-function sampler; use it as a "
                             "scheduler (get_solver)")
        mod, name = self.function.split(":")
        return getattr(importlib.import_module(mod), name)


SOLVERS: Dict[str, SolverSpec] = {
    "ddim": SolverSpec(
        "samplers.solvers.ddim:DDIMSolver", {}, "vp", "samplers.solvers.ddim:sample_ddim", "DDIM (eta in config or step), NFE = N"
    ),
    "pndm": SolverSpec(
        "samplers.solvers.pndm:PNDMSolver",
        {"skip_prk_steps": False},
        "vp",
        "samplers.solvers.pndm:sample_pndm",
        "PNDM: pseudo Runge-Kutta warm start + PLMS, NFE = N + 9",
    ),
    "plms": SolverSpec(
        "samplers.solvers.pndm:PNDMSolver",
        {"skip_prk_steps": True},
        "vp",
        "samplers.solvers.pndm:sample_pndm",
        "PLMS with diffusers' Heun-like warm start (skip_prk_steps), NFE = N + 1",
    ),
    "dpmpp-2m": SolverSpec(
        "samplers.solvers.dpmpp_2m:DPMSolverPP2M",
        {},
        "vp",
        "samplers.solvers.dpmpp_2m:sample_dpmpp_2m",
        "DPM-Solver++ 2M (data prediction, multistep order 2), NFE = N",
    ),
    "dpmpp-3m": SolverSpec(
        "samplers.solvers.dpmpp_2m:DPMSolverPP2M",
        {"solver_order": 3},
        "vp",
        "",
        "DPM-Solver++ 3M (data prediction, multistep order 3), NFE = N",
    ),
    "dpmpp-2m-sde": SolverSpec(
        "samplers.solvers.dpmpp_2m:DPMSolverPP2M",
        {"algorithm_type": "sde-dpmsolver++"},
        "vp",
        "",
        "SDE-DPM-Solver++ 2M (stochastic, data prediction, multistep order 2; step takes a generator), NFE = N",
    ),
    "dpmpp-3m-sde": SolverSpec(
        "samplers.solvers.dpmpp_2m:DPMSolverPP2M",
        {"solver_order": 3, "algorithm_type": "sde-dpmsolver++"},
        "vp",
        "",
        "SDE-DPM-Solver++ 3M (stochastic, data prediction, multistep order 3; step takes a generator), NFE = N",
    ),
    "unipc": SolverSpec(
        "samplers.solvers.unipc:UniPCSolver",
        {},
        "vp",
        "",
        "UniPC (bh2 predictor-corrector, data prediction, order 2), NFE = N",
    ),
    "bespoke": SolverSpec(
        "samplers.solvers.bespoke:BespokeSolver",
        {},
        "vp",
        "",
        "learned per-model solver (step positions + coefficients, needs bespoke=<fitted file>), NFE = N",
    ),
    "flow-euler": SolverSpec(
        "samplers.solvers.flow:FlowMatchSolverScheduler",
        {"solver": "euler", "leap_tolerance": None},
        "flow",
        "samplers.solvers.flow:sample_flow",
        "rectified flow, Euler, NFE = N",
    ),
    "flow-heun": SolverSpec(
        "samplers.solvers.flow:FlowMatchSolverScheduler",
        {"solver": "heun", "leap_tolerance": None},
        "flow",
        "samplers.solvers.flow:sample_flow",
        "rectified flow, Heun (2nd order), NFE = 2N - 1",
    ),
    "flow-lpl": SolverSpec(
        "samplers.solvers.flow:FlowMatchSolverScheduler",
        {"solver": "euler", "leap_tolerance": 0.05},
        "flow",
        "samplers.solvers.flow:sample_flow",
        "rectified flow, Euler + Linear Proportional Leap once the velocity settles, NFE <= N",
    ),
}


def _spec(name: str) -> SolverSpec:
    if name not in SOLVERS:
        raise ValueError(f"unknown solver {name!r}; valid names: {', '.join(sorted(SOLVERS))}")
    return SOLVERS[name]


def get_solver(name: str, **config):
    """A fresh scheduler for solver ``name`` with the entry's defaults and ``config`` overrides."""
    spec = _spec(name)
    return spec.scheduler_class()(**{**spec.defaults, **config})


def get_sample_fn(name: str) -> Callable:
    """The plain-function form of solver ``name`` (e.g. ``sample_pndm``)."""
    return _spec(name).sample_fn()


def _family_of(scheduler_or_config) -> str:
    cfg = getattr(scheduler_or_config, "config", scheduler_or_config)
    cls_name = cfg.get("_class_name") if hasattr(cfg, "get") else None
    if cls_name is None and hasattr(scheduler_or_config, "config"):
        cls_name = type(scheduler_or_config).__name__
    if cls_name in FLOW_SCHEDULER_NAMES:
        return "flow"
    keys = set(cfg.keys()) if hasattr(cfg, "keys") else set()
    if cfg.get("use_flow_sigmas", False) or cfg.get("prediction_type") == "flow_prediction":
        return "flow"
    if "beta_schedule" in keys or "trained_betas" in keys or "beta_start" in keys:
        return "vp"
    if "shift" in keys or "use_dynamic_shifting" in keys:
        return "flow"
    return "unknown"


def solver_from_pipeline(pipe, name: str, **overrides):
    """Build solver ``name`` from ``pipe.scheduler.config`` so it keeps the model's training schedule.

    Raises ``ValueError`` when the pipeline's scheduler belongs to the other family (a VP solver for a
    flow-matching model or the reverse) or has no config to convert.
    """
    spec = _spec(name)
    sched = getattr(pipe, "scheduler", None)
    if sched is None or not hasattr(sched, "config"):
        raise ValueError(f"{type(pipe).__name__} has no scheduler with a config to convert to {name!r}")
    fam = _family_of(sched)
    if fam != spec.family:
        valid = sorted(k for k, s in SOLVERS.items() if s.family == fam)
        raise ValueError(
            f"cannot convert {type(sched).__name__} ({fam} model) to {name!r} ({spec.family} solver); "
            + (f"solvers for this pipeline: {', '.join(valid)}" if valid else "no solver here fits this scheduler")
        )
    cls = spec.scheduler_class()
    return cls.from_config(sched.config, **{**spec.defaults, **overrides})
