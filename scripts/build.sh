#!/usr/bin/env bash
# Configures and builds into build/ (or $TL_BUILD_DIR). Extra arguments go to cmake's configure step.
# TL_BUILD_TARGETS="t1 t2 ..." builds only those CMake targets (and what they need); unset or empty, everything
# (the library, the CLI, every test and example, and the GPU benchmarks in a CUDA build).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${TL_BUILD_DIR:-$root/build}
targets=()
for target in ${TL_BUILD_TARGETS:-}; do
  targets+=(--target "$target")
done
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build "$build" -j"$(nproc)" "${targets[@]}"
