"""The external rows of `dlm bench`, by `--samplers` name: `{name: (row class, description)}`.

Listed here rather than registered by the row modules on import, so imports go one way: this module
imports the row modules, which import only the base types of `dlm.bench.external`. A new row is a
module with an `ExternalRow` subclass and one entry below.
"""
from __future__ import annotations


def external_rows() -> dict[str, tuple[type, str]]:
    """`{name: (row class, description)}` of every external row (imports the row modules)."""
    from dlm.bench.diffusers_dgemma import DiffusersDiffusionGemmaRow
    from dlm.bench.diffusers_llada2 import BASELINE_DESCRIPTIONS, LLaDA2Row
    from dlm.bench.transformers_dgemma import DlmExactRow, TransformersDiffusionGemmaRow

    return {
        "diffusers-diffusiongemma": (
            DiffusersDiffusionGemmaRow,
            "diffusers' DiffusionGemmaPipeline + EntropyBoundScheduler, shipped generation_config, entropy_bound swept"),
        "diffusers-llada2-thr": (LLaDA2Row, BASELINE_DESCRIPTIONS["diffusers-llada2-thr"]),
        "diffusers-llada2": (LLaDA2Row, BASELINE_DESCRIPTIONS["diffusers-llada2"]),
        "transformers-diffusiongemma": (
            TransformersDiffusionGemmaRow,
            "transformers' DiffusionGemmaForBlockDiffusion.generate, shipped generation_config, entropy_bound swept"),
        "dlm-exact": (DlmExactRow,
                      "dlm.generate in exact mode (transformers' rule, token-equal to transformers-diffusiongemma)"),
    }
