#!/usr/bin/env bash
# Wheels the GPU report needs on the bare GPU machine (no network there): its image has transformers 5.17
# (DiffusionGemma needs >= 5.19: another config layout before) and no diffusers. Pure-Python wheels, so
# one download serves any Python there. Run here, then carry `wheels/` (git-ignored) to the GPU machine:
#
#   bash scripts/gpu_report_wheels.sh
#   # on the GPU machine, in the repository root:
#   pip install --no-deps --target /tmp/gpu-site wheels/*.whl && \
#     PYTHONPATH=/tmp/gpu-site:$PWD python3 scripts/gpu_report.py --out "$OUT"
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p wheels
pip download --no-deps --only-binary=:all: -d wheels "transformers==5.24.0" "diffusers==0.42.1" importlib-metadata
ls -la wheels
