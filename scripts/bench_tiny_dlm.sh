#!/usr/bin/env bash
# Reproduce the tiny-dlm tables and figures of docs/benchmarks.md (CPU, one thread, ~45 min).
#
#   bash scripts/bench_tiny_dlm.sh [OUT_DIR]        # default runs/docs
#
# 1. every baseline sampler on every task suite at three budgets (the per-sampler frontier);
# 2. list edits and arithmetic with the KV caches beside diffusers' LLaDA2Pipeline (equal-quality
#    wall-time and NFE ratios, and the ParallelBench copy-vs-shuffle view);
# 3. per-task accuracy of the checkpoint at one token per step (scripts/eval_tiny_dlm.py).
set -euo pipefail
out="${1:-runs/docs}"
mkdir -p "$out"

dlm bench --suite all --samplers random,confidence,margin,entropy,threshold,eb \
    --steps 16,32,64 --limit 8 --threads 1 --out "$out/all" --json > "$out/all.json"

for suite in list_edits arithmetic; do
    dlm bench --suite "$suite" \
        --samplers confidence,confidence:kv=prefix,confidence:kv=dual,threshold,threshold:kv=dual,diffusers-llada2,diffusers-llada2-thr \
        --steps 2,4,8,16,32,64 --limit 16 --threads 1 --out "$out/$suite" --json > "$out/$suite.json"
done

# Remasking and dInfer samplers (section "Remasking and dInfer samplers"), one run per suite.
for suite in arithmetic puzzles list_edits; do
    extra=""; [ "$suite" != list_edits ] && extra=",saber:measure=token"
    dlm bench --suite "$suite" \
        --samplers "confidence,threshold,saber,saber:backtrack=always,saber:backtrack=off$extra,credit,hierarchical" \
        --steps 16,64 --limit 16 --threads 1 --out "$out/remask-$suite" --json > "$out/remask-$suite.json"
done
for suite in puzzles arithmetic; do
    dlm bench --suite "$suite" --samplers confidence,saber,saber:n=4,saber:min_drop=0.05,saber:n=4:min_drop=0.05 \
        --steps 64 --limit 16 --threads 1 --no-plots --out "$out/remask-variants-$suite" --json > "$out/remask-variants-$suite.json"
done

python scripts/eval_tiny_dlm.py --n 50 --json "$out/eval_tiny_dlm.json"
