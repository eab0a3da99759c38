"""dlm: fast parallel decoding for diffusion language models.

    import dlm
    model, tokenizer = dlm.load("tiny-dlm")
    out = dlm.generate(model, input_ids, gen_length=64, block_length=32, steps=32, sampler="threshold")
    out.sequences, out.nfe, out.tpf

    pipe = dlm.DLMPipeline.from_pretrained("tiny-dlm")
    pipe("reverse: ana bo cyd", num_inference_steps=16).texts
"""
from dlm.adapters import DLMAdapter
from dlm.generate import GenerateOutput, StepTrace, generate
from dlm.loading import LoadedModel, builtin_models, load
from dlm.pipeline import DLMPipeline, DLMPipelineOutput

__all__ = ["DLMAdapter", "DLMPipeline", "DLMPipelineOutput", "GenerateOutput", "LoadedModel",
           "StepTrace", "builtin_models", "generate", "load"]
