"""Random-weight models with the exact shapes of published diffusion LMs, for measuring speed and memory
at real size without downloading weights.

    import dlm
    model = dlm.replica("llada-8b")                 # CUDA + bfloat16 when a GPU is present
    model.replica_info                              # what was built: depth, parameters, bytes
    from dlm.replicas import forward_cost
    forward_cost(model, rows=1, query_tokens=32, cached_positions=256).floor_ms(copy_gbps=3000)

Replicas (`REPLICA_NAMES`), each stored as data beside this file (`<name>.json`: the config, the token ids,
where every number was checked, and what differs from the real architecture):
- "llada-8b": GSAI-ML/LLaDA-8B-Instruct, a bidirectional Llama of LLaDA's shape;
- "dream-7b": Dream-org/Dream-v0-Instruct-7B, a bidirectional Qwen2 (Qwen2.5-7B shape), shifted logits;
- "llada2-mini": inclusionAI/LLaDA2.0-mini, transformers' GLM-4-MoE (the same router, shared expert and
  attention as LLaDA2's remote code), block-causal over 32-token blocks;
- "diffusiongemma-26b-a4b": google/diffusiongemma-26B-A4B-it, transformers' own DiffusionGemma class.
"""
from dlm.replicas.build import (REPLICA_NAMES, TINY_OVERRIDES, ReplicaInfo, ReplicaTooLarge, build_on_meta, load_shape,
                                replica, replica_config)
from dlm.replicas.cost import ForwardCost, expected_distinct_experts, forward_cost, parameter_counts

__all__ = ["REPLICA_NAMES", "TINY_OVERRIDES", "ForwardCost", "ReplicaInfo", "ReplicaTooLarge", "build_on_meta",
           "expected_distinct_experts", "forward_cost", "load_shape", "parameter_counts", "replica",
           "replica_config"]
