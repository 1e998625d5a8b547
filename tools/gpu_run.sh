#!/usr/bin/env bash
# The one script the GPU machine runs: configure + build (Release, Ninja, sm_90), the GPU and packer tests, the
# GPU tests again under compute-sanitizer (memcheck, racecheck; small shapes), then the benchmark. Logs go to $OUT
# (default ./gpu-out): ctest.log, checks.log (precision of the worst case, spills in the SASS), sass.txt (the M <= 8
# kernel), sanitizer.log, bench.csv, bench.md, bench.log, build.log (removed when the build succeeds), and ncu.txt
# with PROFILE=1 (Nsight Compute sections and stall reasons of the Marlin-class kernels). Ends with a summary.
#
#   OUT=/path tools/gpu_run.sh            # everything
#   SKIP_BENCH=1 SKIP_SANITIZER=1 SANITIZER_TOOLS=memcheck BENCH_ARGS=--quick tools/gpu_run.sh
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
BUILD=${BUILD:-/tmp/tl-gpu-build}
ARCH=${CUDA_ARCH:-90}
mkdir -p "$OUT"
export PATH=/usr/local/cuda/bin:$PATH
step() { echo "== $* ($(date +%T))"; }
summary=()

# Configure from a scratch copy whose tests/ lists only the GPU and packer suites: the other suites need host
# packages (criterion, ...) the GPU machine may lack, and this run needs none of them.
step configure
SRC=${SRC:-/tmp/tl-gpu-src}
rm -rf "$SRC" && mkdir -p "$SRC"
tar --exclude='./build*' --exclude='./rust/target' --exclude='./gpu-out' -cf - . | tar -xf - -C "$SRC"
printf 'foreach(suite gpu pack)\n  add_subdirectory(${suite})\nendforeach()\n' >"$SRC/tests/CMakeLists.txt"
cmake -S "$SRC" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTL_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$ARCH" \
  >"$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; echo "configure failed"; exit 1; }
step build
# Only this work's targets: a colleague's half-finished file elsewhere must not stop the GPU run.
if ! timeout "${BUILD_TIMEOUT:-300}" cmake --build "$BUILD" -j "$(nproc)" --target tl_gpu_tests tl_pack_tests tl_bench \
  >>"$OUT/build.log" 2>&1; then
  grep -E "error|FAILED" "$OUT/build.log" | head -30
  echo "build failed"
  exit 1
fi
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader || true
summary+=("build: $(grep -c 'warning' "$OUT/build.log") warning lines")
rm -f "$OUT/build.log"  # kept only when the build fails: $OUT returns at most 8 files

step ctest
timeout "${CTEST_TIMEOUT:-300}" ctest --test-dir "$BUILD" -R 'gpu\.|pack\.' --output-on-failure -j 4 >"$OUT/ctest.log" 2>&1
summary+=("ctest: $(grep -E 'tests passed|tests failed' "$OUT/ctest.log" | tail -1)")
grep -E "\*\*\*Failed|Timeout|Exception|FAILED" "$OUT/ctest.log" | head -20

# The precision lines of the worst case (per-row scales, K = 28672) and the local-memory traffic of the kernels' SASS
# (spills show as LDL/STL; this machine has cuobjdump, the build machine may not).
"$BUILD/bin/tl_gpu_tests" --gtest_filter='MarlinPrecision.*' 2>&1 | grep -E '^\[precision\]' >"$OUT/checks.log"
for obj in "$BUILD"/CMakeFiles/tinyloop_core.dir/cuda/marlin/marlin_*.cu.o; do
  cuobjdump -sass "$obj" 2>/dev/null | awk -v f="$(basename "$obj")" '/Function :/ {name=$3} /LDL|STL/ {n[name]++}
    END {for (k in n) printf "%s %s: %d LDL/STL\n", f, k, n[k]}'
done >>"$OUT/checks.log"
cat "$OUT/checks.log"
# The SASS of the M <= 8 kernel (fused, group >= 128, 128-deep slices): what the hot loop really issues.
cuobjdump -sass -fun '_ZN2tl3gpu6marlin20marlin_skinny_kernelILi1ELb1ELi1ELi8EEEvNS1_6ParamsE' \
  "$BUILD"/CMakeFiles/tinyloop_core.dir/cuda/marlin/marlin_skinny_fused.cu.o >"$OUT/sass.txt" 2>&1

if [ -z "${SKIP_SANITIZER:-}" ]; then
  step sanitizer
  : >"$OUT/sanitizer.log"
  for tool in ${SANITIZER_TOOLS:-memcheck racecheck}; do
    echo "---- compute-sanitizer --tool $tool" >>"$OUT/sanitizer.log"
    timeout "${SANITIZER_TIMEOUT:-240}" compute-sanitizer --tool "$tool" --error-exitcode 99 \
      "$BUILD/bin/tl_gpu_tests" --quick ${SANITIZER_FILTER:+--gtest_filter=$SANITIZER_FILTER} >>"$OUT/sanitizer.log" 2>&1
    rc=$?
    summary+=("sanitizer $tool: rc=$rc; $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitizer.log" | tail -1); $(grep -E '^\[  (PASSED|FAILED)  \]' "$OUT/sanitizer.log" | tail -1)")
  done
fi

if [ -z "${SKIP_BENCH:-}" ]; then
  step bench
  timeout "${BENCH_TIMEOUT:-300}" "$BUILD/bin/tl_bench" "$OUT/bench.csv" "$OUT/bench.md" ${BENCH_ARGS:-} >"$OUT/bench.log" 2>&1
  summary+=("bench: rc=$? rows=$(($(wc -l <"$OUT/bench.csv" 2>/dev/null || echo 1) - 1))")
fi

if [ -n "${PROFILE:-}" ]; then
  # ncu on the Marlin-class kernels of one layer at M = 1 and 16 (the third launch: an ordinary launch, not a graph node).
  step profile
  : >"$OUT/ncu.txt"
  for config in "${PROFILE_LAYER:-Llama-70B gate+up}|1|marlin_fused" "${PROFILE_LAYER:-Llama-70B gate+up}|16|marlin_fused"; do
    IFS='|' read -r layer m kernels <<<"$config"
    echo "---- $layer M=$m $kernels" >>"$OUT/ncu.txt"
    timeout "${PROFILE_TIMEOUT:-120}" ncu --clock-control none --kernel-name regex:marlin_ --launch-skip 2 \
      --launch-count 1 --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy \
      --section LaunchStats --section MemoryWorkloadAnalysis \
      "$BUILD/bin/tl_bench" /tmp/ncu.csv /tmp/ncu.md --layer "$layer" --m "$m" --group 128 --kernels "$kernels" \
      >>"$OUT/ncu.txt" 2>&1
    summary+=("ncu $layer M=$m $kernels: rc=$?")
  done
  # Stall reasons (warps per issue cycle stalled on each), M = 1; a separate run so that a metric this ncu lacks
  # costs only this part.
  stalls=""
  for r in barrier long_scoreboard short_scoreboard wait math_pipe_throttle mio_throttle lg_throttle not_selected \
           selected dispatch_stall no_instruction drain membar branch_resolving sleeping misc; do
    stalls+="${stalls:+,}smsp__average_warps_issue_stalled_${r}_per_issue_active.ratio"
  done
  echo "---- stall reasons, ${PROFILE_LAYER:-Llama-70B gate+up} M=1" >>"$OUT/ncu.txt"
  timeout "${PROFILE_TIMEOUT:-120}" ncu --clock-control none --kernel-name regex:marlin_ --launch-skip 2 --launch-count 1 \
    --metrics "$stalls,smsp__inst_executed.sum,sm__cycles_elapsed.avg" \
    "$BUILD/bin/tl_bench" /tmp/ncu.csv /tmp/ncu.md --layer "${PROFILE_LAYER:-Llama-70B gate+up}" --m 1 --group 128 \
    --kernels marlin_fused >>"$OUT/ncu.txt" 2>&1
  summary+=("ncu stall reasons: rc=$?")
fi

step summary
printf '%s\n' "${summary[@]}"
[ -f "$OUT/bench.md" ] && cat "$OUT/bench.md"
exit 0
