"""dlm: fast parallel decoding for diffusion language models.

    import dlm
    out = dlm.generate(model, input_ids, gen_length=64, block_length=32, steps=32, sampler="threshold")
    out.sequences, out.nfe, out.tpf
"""
from dlm.adapters import DLMAdapter
from dlm.generate import GenerateOutput, StepTrace, generate

__all__ = ["DLMAdapter", "GenerateOutput", "StepTrace", "generate"]
