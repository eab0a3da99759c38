"""Step policies, in three rooms:

- ``samplers.unmasking``: dLLM policies, which masked tokens to commit (or remask) each step;
  registered by name::

      from samplers import get_sampler, available_samplers
      sampler = get_sampler("threshold", tau=0.95)

- ``samplers.solvers``: continuous x_t -> x_{t-1} steppers as diffusers schedulers
  (``from samplers.solvers import get_solver, solver_from_pipeline``);
- ``samplers.search``: noise search and its verifiers.

``base.py`` (the step contract) and ``registry.py`` stay at the top: every unmasking policy and the
driver share them.
"""
from samplers.base import Sampler, SamplerConfig, StepContext, StepResult
from samplers.registry import SAMPLERS, available_samplers, get_sampler, register

# Importing a sampler module registers it.
from samplers import unmasking  # noqa: E402,F401

__all__ = [
    "Sampler", "SamplerConfig", "StepContext", "StepResult",
    "SAMPLERS", "available_samplers", "get_sampler", "register",
]
