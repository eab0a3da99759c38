"""dlm: fast parallel decoding for diffusion language models.

    import dlm
    model, tokenizer = dlm.load("tiny-dlm")
    out = dlm.generate(model, input_ids, gen_length=64, block_length=32, steps=32, sampler="threshold")
    out.sequences, out.nfe, out.tpf

    pipe = dlm.DLMPipeline.from_pretrained("tiny-dlm")
    pipe("reverse: ana bo cyd", num_inference_steps=16).texts

    model = dlm.replica("llada-8b")   # random weights, LLaDA-8B's exact shapes (dlm.replicas)
"""
import importlib

# Public names resolve on first use (PEP 562), so `import dlm` and the `dlm` command start without
# torch and transformers; `dlm models` and `dlm --help` then answer in a fraction of a second.
_LAZY = {
    "DLMAdapter": "dlm.adapters",
    "GenerateOutput": "dlm.generation", "StepTrace": "dlm.generation", "generate": "dlm.generation",
    "LoadedModel": "dlm.loading", "builtin_models": "dlm.loading", "load": "dlm.loading",
    "DLMPipeline": "dlm.pipeline", "DLMPipelineOutput": "dlm.pipeline",
    "replica": "dlm.replicas",
}

__all__ = ["DLMAdapter", "DLMPipeline", "DLMPipelineOutput", "GenerateOutput", "LoadedModel",
           "StepTrace", "builtin_models", "generate", "load", "replica"]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'dlm' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + list(_LAZY))
