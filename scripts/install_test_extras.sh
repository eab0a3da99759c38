#!/usr/bin/env bash
# What the tests need beyond `pip install -e ".[test]"`: SGLang, so that the tests of our SGLang plugin
# (tests/samplers/unmasking/test_sglang_plugin.py) run against SGLang's own algorithm classes.
#
# Why not an extra: sglang 0.5.23 pins transformers 5.19 (older than the DiffusionGemma API the
# engine reproduces) and torch 2.14.1 (we test on the CPU torch 2.13), so pip cannot resolve it beside
# our dependencies. It is installed with --no-deps, together with the pure-Python packages that the
# import chain of `sglang.srt.dllm` needs, and torchvision 0.16.2: the PyPI builds of torchvision for
# torch 2.13/2.14 link CUDA torch and fail to import beside the CPU build (`torchvision::nms does not
# exist`), while 0.16.2 tolerates the missing ops library and provides `torchvision.transforms`, which
# sglang.srt.multimodal.internvl_utils imports. Nothing is stubbed. `pip check` then reports sglang's
# unmet pins; the plugin tests are what shows the combination works.
#
# Run it in the virtual environment that runs the tests (python is that environment's).
set -euo pipefail
python -m pip install orjson psutil pybase64 starlette msgspec pyzmq ipython aiohttp dill apache-tvm-ffi \
    sentencepiece compressed-tensors gguf openai partial-json-parser uvicorn fastapi
python -m pip install --no-deps sglang==0.5.23 torchvision==0.16.2
# Fail here, not in the tests, if the chain the plugin tests import is broken.
python -c "import sglang.srt.dllm.algorithm" || {
    echo "install_test_extras.sh: sglang.srt.dllm.algorithm does not import; see the comments in this script" >&2
    exit 1
}
echo "install_test_extras.sh: sglang 0.5.23 installed for the SGLang plugin tests"
