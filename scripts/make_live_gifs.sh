#!/usr/bin/env bash
# The two GIFs of docs/dlm.md ("Watching it decode"): record with `dlm sample --record`, render with pillow.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p runs
prompt="sort: tom fay ivy gus bo wes"
python -m dlm.cli sample --prompt "$prompt" --sampler saber --steps 64 --block-length 16 --record runs/live-saber.jsonl
python scripts/render_live_gif.py runs/live-saber.jsonl --out docs/figures/live_saber.gif
python -m dlm.cli sample --model tiny-dgemma --prompt "$prompt" --sampler confidence --steps 16 \
    --record runs/live-dgemma.jsonl
python scripts/render_live_gif.py runs/live-dgemma.jsonl --out docs/figures/live_dgemma.gif
