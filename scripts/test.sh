#!/usr/bin/env bash
# Runs every test: the CTest suites (C++, C conformance, format corpus, ABI checks; GPU tests skip without a GPU),
# cargo test, and the whole CTest suite again under AddressSanitizer + UndefinedBehaviorSanitizer.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
jobs=$(nproc)
"$root/scripts/install-deps.sh"

echo "== build and CTest =="
"$root/scripts/build.sh"
ctest --test-dir "${TL_BUILD_DIR:-$root/build}" --output-on-failure -j"$jobs"

echo "== cargo test =="
(cd "$root/rust" && cargo test --offline)

echo "== CTest under ASan + UBSan (CPU build) =="
TL_BUILD_DIR="$root/build-asan" "$root/scripts/build.sh" -DTL_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DTL_SANITIZE=address,undefined
# The slow-labelled test (the demo model's full evaluation text) is left out here: it checks numbers, not memory.
ASAN_OPTIONS=detect_leaks=1 ctest --test-dir "$root/build-asan" --output-on-failure -j"$jobs" -LE slow
