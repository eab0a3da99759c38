#!/usr/bin/env bash
# The GPU report on the bare GPU machine, in the repository root there, with the wheels of
# scripts/gpu_report_wheels.sh carried in wheels/ (docs/gpu.md has the device call):
#
#   bash scripts/gpu_report_run.sh "$OUT"                               # the whole report, ~5.5 min
#   GPU_REPORT_TIMEOUT_S=300 bash scripts/gpu_report_run.sh "$OUT" --sections extras --budget-s 240  # rerun
#
# 1. installs the wheels into a folder put first on PYTHONPATH, offline (--no-index: pip never tries the
#    network the machine lacks) and without byte-compiling (--no-compile), its output and the card's
#    state as nvidia-smi reads it in OUT/install.log;
# 2. runs scripts/gpu_report.py --out OUT (report.json, report.md, report.log) under `timeout -s INT`, so a
#    run past GPU_REPORT_TIMEOUT_S (default 420) still writes its partial report before it ends.
# Environment: GPU_REPORT_PYTHON (default python3), WHEELS (default wheels), GPU_REPORT_SITE (default
# /tmp/gpu-site), GPU_REPORT_TIMEOUT_S.
set -uo pipefail
out=${1:?usage: gpu_report_run.sh OUT [gpu_report.py arguments...]}
shift
python=${GPU_REPORT_PYTHON:-python3}
wheels=${WHEELS:-wheels}
site=${GPU_REPORT_SITE:-/tmp/gpu-site}
mkdir -p "$out"
start=$EPOCHREALTIME
if ! compgen -G "$wheels/*.whl" > /dev/null; then
    echo "gpu_report_run.sh: no wheels in $wheels/: run scripts/gpu_report_wheels.sh here and carry $wheels" >&2
    exit 3
fi
if ! "$python" -m pip install --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
        "$wheels"/*.whl > "$out/install.log" 2>&1; then
    echo "gpu_report_run.sh: installing the wheels failed; $out/install.log:" >&2
    cat "$out/install.log" >&2
    exit 3
fi
awk -v a="$start" -v b="$EPOCHREALTIME" -v w="$(cd "$wheels" && echo *.whl)" \
    'BEGIN { printf "installed %s into the site folder in %.1f s\n", w, b - a }' >> "$out/install.log"
if command -v nvidia-smi > /dev/null; then  # read only: the card as found (clocks, memory in use)
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,memory.used,memory.total \
        --format=csv >> "$out/install.log" 2>&1
fi
export PYTHONPATH="$site:$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
timeout -s INT -k 30 "${GPU_REPORT_TIMEOUT_S:-420}" "$python" scripts/gpu_report.py --out "$out" "$@"
code=$?
echo "gpu_report_run.sh: gpu_report.py exited $code" | tee -a "$out/report.log" >&2
exit $code
