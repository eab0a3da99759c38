"""Report section: the machine, and the two rates every floor in the report is divided by.

- device name, compute capability, memory; torch / triton / transformers / diffusers versions;
- `copy_gbps`: device-to-device copy bandwidth, bytes read + written per second (a 1 GiB `copy_`), the
  rate a weight-streaming kernel can approach (H100 SXM: about 3.0 of its nominal 3.35 TB/s);
- `matmul_tflops`: a square product in the run's dtype (bf16 on the GPU).
Both are stored in `ctx.facts` for the sections that follow.
"""
from __future__ import annotations

import importlib
import platform

import torch

from dlm.bench.gpu import ReportContext
from dlm.bench.gpu.replica_forward import measure_copy_gbps, measure_matmul_tflops


def _version(module: str) -> str | None:
    try:
        return getattr(importlib.import_module(module), "__version__", "unknown")
    except Exception:  # noqa: BLE001 - absent or broken: the report says so
        return None


def run(ctx: ReportContext) -> dict:
    out = {"device": str(ctx.device), "dtype": str(ctx.dtype).replace("torch.", ""), "python": platform.python_version(),
           "versions": {name: _version(name) for name in ("torch", "triton", "transformers", "diffusers")}}
    if ctx.device.type == "cuda":
        props = torch.cuda.get_device_properties(ctx.device)
        out.update(name=props.name, capability=f"{props.major}.{props.minor}", memory_gb=props.total_memory / 1e9,
                   multiprocessors=props.multi_processor_count, cuda=torch.version.cuda)
    else:
        out.update(name=platform.processor() or platform.machine(), threads=torch.get_num_threads())
    out["copy_gbps"] = ctx.facts["copy_gbps"] = measure_copy_gbps(ctx)
    out["matmul_tflops"] = ctx.facts["matmul_tflops"] = measure_matmul_tflops(ctx)
    ctx.log(f"machine: {out['name']}, copy {out['copy_gbps']:.0f} GB/s, matmul {out['matmul_tflops']:.0f} TFLOP/s")
    return out


def markdown(result: dict) -> str:
    v = result["versions"]
    lines = ["| device | dtype | copy GB/s (read+write) | matmul TFLOP/s | torch | triton | transformers | diffusers |",
             "|---|---|---|---|---|---|---|---|",
             f"| {result['name']} | {result['dtype']} | {result['copy_gbps']:.0f} | {result['matmul_tflops']:.1f} | "
             f"{v['torch']} | {v['triton']} | {v['transformers']} | {v['diffusers']} |"]
    return "\n".join(lines)
