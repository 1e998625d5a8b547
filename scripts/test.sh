#!/usr/bin/env bash
# Runs every test: the CTest suites (C++, C conformance, format corpus, ABI checks; GPU tests skip without a GPU),
# the Python package's pytest suite (in a venv), cargo test, the whole CTest suite again under AddressSanitizer +
# UndefinedBehaviorSanitizer, a bounded libFuzzer run of every parser of outside input (tests/fuzz) and the
# concurrency tests under ThreadSanitizer.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
jobs=$(nproc)
# The sanitizer and fuzz builds compile at -O1 with line tables only, the optimization level the sanitizers' and
# OSS-Fuzz's documentation recommend: half the compile time of RelWithDebInfo's -O2 -g on a two-core machine
# (cpp/gptq/gptq.cpp under ASan: 26 -> 14 s), and their reports still name files and lines.
sanitizer_flags="-O1 -g1 -DNDEBUG"
"$root/scripts/install-deps.sh"

echo "== build and CTest =="
TL_BUILD_TARGETS="" "$root/scripts/build.sh"  # everything: the library, CLI, tests, examples, benchmarks
ctest --test-dir "${TL_BUILD_DIR:-$root/build}" --output-on-failure -j"$jobs"

echo "== Python package: install into a venv, pytest =="
# Debian's interpreter, whose numpy and pytest the venv sees (--system-site-packages); pip builds the package offline
# with Debian's setuptools (--no-build-isolation --no-index). A copy of the package's sources keeps setuptools' build/
# and egg-info out of the checkout (and leaves out a library copied into python/tinyloop/ by hand). The tests use the
# library and the CLI just built.
step_start=$SECONDS
build=${TL_BUILD_DIR:-$root/build}
rm -rf "$build/python-venv" "$build/python-src"
"${TL_PYTHON:-/usr/bin/python3}" -m venv --system-site-packages "$build/python-venv"
mkdir -p "$build/python-src/tinyloop"
cp "$root/python/pyproject.toml" "$build/python-src/"
cp "$root"/python/tinyloop/*.py "$build/python-src/tinyloop/"
"$build/python-venv/bin/python" -m pip install --quiet --no-build-isolation --no-index "$build/python-src"
(cd "$root" && TINYLOOP_LIBRARY="$build/lib/libtinyloop.so" TINYLOOP_CLI="$build/bin/tinyloop" \
  "$build/python-venv/bin/python" -m pytest -q -p no:cacheprovider python/tests)
echo "Python package step: $((SECONDS - step_start)) s"

echo "== consumers: find_package, pkg-config, FetchContent =="
# The build above installed into a scratch prefix, plus a CPU-only FetchContent build of the library (tests/consumers).
"$root/tests/consumers/run.sh" "$root" "$root/build-consumers" "${TL_BUILD_DIR:-$root/build}"

echo "== cargo test =="
# The checkout's C++, not an installed libtinyloop that pkg-config might find.
(cd "$root/rust" && TINYLOOP_SYS_USE_PKG_CONFIG=0 cargo test --offline)

echo "== Rust: a project outside the repository, pkg-config, cargo package =="
step_start=$SECONDS
TINYLOOP_SYS_USE_PKG_CONFIG=0 "$root/rust/check-consumer.sh" --expect-build-type "cargo (Release: -O3 -DNDEBUG)"
"$root/rust/check-pkg-config.sh" "${TL_BUILD_DIR:-$root/build}"
"$root/rust/tinyloop-sys/check-package.sh"
echo "Rust consumer/pkg-config/package checks: $((SECONDS - step_start)) s"

echo "== CTest under ASan + UBSan (CPU build) =="
TL_BUILD_DIR="$root/build-asan" TL_BUILD_TARGETS="" "$root/scripts/build.sh" -DTL_CUDA=OFF \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=$sanitizer_flags" \
  "-DCMAKE_C_FLAGS_RELWITHDEBINFO=$sanitizer_flags" -DTL_SANITIZE=address,undefined
# The slow-labelled tests (the demo model's full evaluation text, GPTQ on the trained demo model) are left out here:
# they check numbers, not memory, and their code runs here on smaller inputs.
ASAN_OPTIONS=detect_leaks=1 ctest --test-dir "$root/build-asan" --output-on-failure -j"$jobs" -LE slow

# ---- Fuzzing (tests/fuzz): clang, libFuzzer + ASan + UBSan, CPU only; only the fuzz targets are built ----
# One target per parser of outside input: NAME has tests/fuzz/fuzz_NAME.cpp, its seeds in tests/fuzz/corpus/NAME/ and
# its dictionary in tests/fuzz/NAME.dict.
fuzz_targets=(model_load requests import int4_import tokenizer)
fuzz_seconds=${TL_FUZZ_SECONDS:-45}  # of fuzzing per target
echo "== fuzz: build ${fuzz_targets[*]} (clang, libFuzzer + ASan + UBSan, CPU build) =="
step_start=$SECONDS
fuzz_dir="$root/build-fuzz"
cmake -S "$root" -B "$fuzz_dir" -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DTL_FUZZ=ON \
  -DTL_BUILD_TESTS=OFF -DTL_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=$sanitizer_flags" "-DCMAKE_C_FLAGS_RELWITHDEBINFO=$sanitizer_flags" \
  -DTL_SANITIZE=fuzzer-no-link,address,undefined >/dev/null
cmake --build "$fuzz_dir" -j"$jobs" --target "${fuzz_targets[@]/#/tl_fuzz_}"
echo "fuzz build: $((SECONDS - step_start)) s"

# libFuzzer exits non-zero on a crash, leak, sanitizer report, timeout or over-limit allocation and writes the
# input to artifacts/; the log stays in the build folder and only its end is shown on failure.
# Per input: 2 GiB of RSS, 1 GiB in one allocation, 30 s; inputs up to 256 KiB (the checkpoint seeds' size).
fuzz_limits=(-rss_limit_mb=2048 -malloc_limit_mb=1024 -timeout=30 -max_len=262144)
run_fuzzer() {
  local fuzzer=$1 log=$2
  shift 2
  rm -rf "$fuzz_dir/artifacts" && mkdir -p "$fuzz_dir/artifacts"
  if ! TMPDIR="$fuzz_dir" UBSAN_OPTIONS=print_stacktrace=1 \
      "$fuzzer" "${fuzz_limits[@]}" -artifact_prefix="$fuzz_dir/artifacts/" "$@" >"$log" 2>&1; then
    # The report from its first line (the stack), not ASan's shadow-byte legend at its end.
    awk '/ERROR: |runtime error: / { on = 1 } on && n++ < 100' "$log" | grep . || tail -n 60 "$log"
    echo "FUZZ FAILURE (full log: $log). Reproducer, replay with: $fuzzer <file>"
    # Fuzzing writes the input to artifacts/; a replay of given files names the file it was running instead.
    find "$fuzz_dir/artifacts" -type f -printf '  %p\n'
    grep '^Running: ' "$log" | tail -n 1 | sed 's/^Running: /  /'
    return 1
  fi
}

for target in "${fuzz_targets[@]}"; do
  fuzzer="$fuzz_dir/bin/tl_fuzz_$target"
  echo "== fuzz $target: ${fuzz_seconds} s of libFuzzer from a copy of its seed corpus, then every seed once =="
  step_start=$SECONDS
  # A fresh copy each run: the fuzzer adds inputs to its corpus folder, and tests/ must stay untouched.
  rm -rf "$fuzz_dir/corpus-$target" && cp -r "$root/tests/fuzz/corpus/$target" "$fuzz_dir/corpus-$target"
  run_fuzzer "$fuzzer" "$fuzz_dir/fuzz-$target.log" -max_total_time="$fuzz_seconds" -print_final_stats=1 \
    -dict="$root/tests/fuzz/$target.dict" "$fuzz_dir/corpus-$target" || exit 1
  grep -E '^#[0-9]+[[:space:]]+DONE' "$fuzz_dir/fuzz-$target.log" || true
  grep -E '^stat::(number_of_executed_units|average_exec_per_sec|new_units_added)' "$fuzz_dir/fuzz-$target.log" || true
  # Files (not a folder) as arguments: libFuzzer runs each once and writes nothing.
  run_fuzzer "$fuzzer" "$fuzz_dir/replay-$target.log" "$root/tests/fuzz/corpus/$target"/* || exit 1
  echo "$target: $(grep -c '^Running: ' "$fuzz_dir/replay-$target.log") seed files ran clean;" \
    "$((SECONDS - step_start)) s"
done

# ---- ThreadSanitizer: the concurrency tests (tests/cpp/concurrency_test.cpp), CPU only, nothing else built ----
echo "== CTest -L concurrency under ThreadSanitizer (CPU build) =="
step_start=$SECONDS
tsan_dir="$root/build-tsan"
cmake -S "$root" -B "$tsan_dir" -DTL_CUDA=OFF -DTL_CAPI_TESTS=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=$sanitizer_flags" "-DCMAKE_C_FLAGS_RELWITHDEBINFO=$sanitizer_flags" \
  -DTL_SANITIZE=thread >/dev/null
cmake --build "$tsan_dir" --target tl_concurrency_tests -j"$jobs"
# halt_on_error: the first race fails its test at once, with both stacks printed.
TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" \
  ctest --test-dir "$tsan_dir" --output-on-failure -j"$jobs" -L concurrency --no-tests=error
echo "ThreadSanitizer step: $((SECONDS - step_start)) s"
