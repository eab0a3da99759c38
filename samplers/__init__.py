"""Step policies: which masked tokens a dLLM commits each step, continuous solvers, noise search.

dLLM samplers are registered by name::

    from samplers import get_sampler, available_samplers
    sampler = get_sampler("threshold", tau=0.95)
"""
from samplers.base import Sampler, SamplerConfig, StepContext, StepResult
from samplers.registry import SAMPLERS, available_samplers, get_sampler, register

# Importing a sampler module registers it.
from samplers import random_order, confidence, margin, entropy, threshold, entropy_bounded  # noqa: E402,F401

__all__ = [
    "Sampler", "SamplerConfig", "StepContext", "StepResult",
    "SAMPLERS", "available_samplers", "get_sampler", "register",
]
