"""Discrete unmasking policies for masked diffusion LMs: which masked tokens to commit (or remask).

Importing this package registers every policy in `samplers.registry` by name.
"""
from samplers.unmasking import random_order, confidence, margin, entropy, threshold, entropy_bounded  # noqa: F401
from samplers.unmasking import position_aware  # noqa: F401,E402
from samplers.unmasking import joint  # noqa: F401,E402
from samplers.unmasking import saber, credit, hierarchical  # noqa: F401,E402
from samplers.unmasking import lopa  # noqa: F401  (looks ahead through ctx.forward)
from samplers.unmasking import entropy_bound  # noqa: F401,E402  (DiffusionGemma's rule; native on uniform-noise models)
from samplers.unmasking import hex  # noqa: F401  (an ensemble: run by dlm.ensemble)
from samplers.unmasking import lossless  # noqa: F401,E402  (draft-and-verify over a deterministic sampler)

# Our samplers as diffusers discrete schedulers (LLaDA2Pipeline / DiffusionGemmaPipeline). Loaded on
# first access, so importing the policies does not import diffusers.
_DIFFUSERS_EXPORTS = ("as_diffusers_scheduler", "UnmaskingScheduler", "UnmaskingSchedulerOutput",
                      "fix_diffusion_gemma_for_diffusers")


def __getattr__(name):
    if name in _DIFFUSERS_EXPORTS:
        from samplers.unmasking import diffusers_scheduler

        return getattr(diffusers_scheduler, name)
    raise AttributeError(f"module 'samplers.unmasking' has no attribute {name!r}")
