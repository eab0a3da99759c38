"""Quality-vs-steps benchmark of dLLM samplers, beside the field's own engines as external rows
(`dlm.bench.external`: diffusers' LLaDA2Pipeline; transformers' and diffusers' DiffusionGemma decoding).

    from dlm.bench import BenchConfig, run_bench, write_all, format_table
    result = run_bench(BenchConfig(suite="list_edits", samplers=["confidence", "diffusers-llada2"], steps=[16, 64]))
    print(format_table(result)); write_all(result, "runs/bench-list_edits")

CLI: `dlm bench --model tiny-dlm --suite list_edits --samplers confidence,threshold --steps 8,16,32,64`;
`dlm bench --model tiny-dgemma --samplers threshold,transformers-diffusiongemma,diffusers-diffusiongemma,dlm-exact`.
"""
from dlm.bench.diffusers_llada2 import BASELINES, DiffusersModelWrapper, DiffusersTokenizerWrapper, build_pipeline, run_llada2
from dlm.bench.external import ExternalRow, ExternalRun
from dlm.bench.external_rows import external_rows
from dlm.bench.harness import (BenchConfig, BenchResult, PairResult, compare_to_baselines, load_model, resolve_suite,
                               run_bench, summarize_targets)
from dlm.bench.specs import SamplerSpec, parse_sampler_specs, parse_steps
from dlm.bench.report import format_markdown, format_table, load_result, plot_results, write_all, write_csv, write_json

__all__ = [
    "BASELINES", "BenchConfig", "compare_to_baselines", "BenchResult", "DiffusersModelWrapper", "DiffusersTokenizerWrapper", "ExternalRow", "ExternalRun", "PairResult",
    "SamplerSpec", "build_pipeline", "format_markdown", "format_table", "load_result", "load_model", "parse_sampler_specs", "parse_steps",
    "plot_results", "resolve_suite", "run_bench", "run_llada2", "external_rows", "summarize_targets", "write_all", "write_csv",
    "write_json",
]
