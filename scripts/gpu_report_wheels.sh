#!/usr/bin/env bash
# Wheels the GPU report needs on the bare GPU machine (no network there), downloaded here into wheels/
# (git-ignored) and carried with the run (the device tool's carry=["wheels"]). The machine's image has
# torch 2.11, Triton 3.6 and transformers 5.17 (DiffusionGemma's config layout needs >= 5.19) and no
# diffusers; both wheels are pure Python, pinned, and need nothing the image lacks (transformers 5.24:
# huggingface-hub >= 1.31, tokenizers 0.23, safetensors 0.8, typer, regex; diffusers 0.42.1: the same
# plus requests and Pillow; its importlib_metadata requirement is imported only on Python < 3.8, so it
# is not carried). scripts/gpu_report_run.sh installs them there with --no-index (no network is tried).
#
#   bash scripts/gpu_report_wheels.sh     # here, once
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf wheels && mkdir -p wheels
python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation py \
    --platform any -d wheels "transformers==5.24.0" "diffusers==0.42.1"
ls -la wheels
