#!/usr/bin/env bash
# The recipe of the shipped demo model (models/demo-int4.tinyloop), step by step. Steps run where they can:
#
#   scripts/train-demo.sh data       Debian machine: installs python3.11-doc, writes the corpus to build-data/
#                                    (train/valid/calib/eval, tools/demo_data.py) and copies eval.txt to data/
#   scripts/train-demo.sh train      a machine with a CUDA GPU and PyTorch (+ safetensors): trains and writes the
#                                    dense FP16 model build-demo/demo-fp16.tinyloop (tools/gpu/train_demo.py, ~1 min
#                                    on an H200)
#   scripts/train-demo.sh quantize   any machine with the project built: GPTQ, group 128, asymmetric, calibrated on
#                                    build-data/calib.txt, with frac4 channels (for cross-iteration rounding) ->
#                                    models/demo-int4.tinyloop, then scores data/eval.txt on the CPU, keeps the
#                                    dense file as models/demo-fp16.tinyloop and compares the two (tinyloop compare)
#
# The shipped model was made exactly this way on 2026-11-30 (training on the project's H200; the log of that run is
# models/demo-train.log). Training is not bit-reproducible across GPUs or PyTorch versions; the quantize step is
# deterministic given the FP16 file.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
build=${TL_BUILD_DIR:-$root/build}

case ${1:-} in
  data)
    if ! dpkg-query -W -f='${Status}' python3.11-doc 2>/dev/null | grep -q "install ok installed"; then
      sudo=""
      [ "$(id -u)" -eq 0 ] || sudo="sudo"
      $sudo apt-get update -qq
      DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq python3.11-doc
    fi
    python3 tools/demo_data.py build-data
    cp build-data/eval.txt data/eval.txt
    ;;
  train)
    mkdir -p build-demo
    python3 tools/gpu/train_demo.py --data build-data --out build-demo/demo-fp16.tinyloop | tee build-demo/train.log
    ;;
  quantize)
    mkdir -p models
    "$build/bin/tinyloop" quantize build-demo/demo-fp16.tinyloop models/demo-int4.tinyloop \
      --method gptq --group-size 128 --calib build-data/calib.txt --frac4
    "$build/bin/tinyloop" score models/demo-int4.tinyloop --text data/eval.txt --backend cpu
    # The dense original beside the INT4 file, and the INT4 weights' divergence from it (docs/quality.md).
    cp build-demo/demo-fp16.tinyloop models/demo-fp16.tinyloop
    "$build/bin/tinyloop" compare models/demo-fp16.tinyloop models/demo-int4.tinyloop --text data/eval.txt --backend cpu
    ;;
  *)
    echo "usage: scripts/train-demo.sh data | train | quantize" >&2
    exit 2
    ;;
esac
