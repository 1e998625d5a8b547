#!/usr/bin/env bash
# What the next GPU command owes (notes/gpu-notes.md, "The folds, scoring with the TMA attention ..."): from the
# repository root on the GPU machine, with .devdeps carried, OUT set. About 8 minutes.
#   1. build (device_check.sh, no tests), the three Nsight Compute profiles of the missed targets;
#   2. racecheck on the attention tests (cut at 45 s last time);
#   3. the grouped W4A8 turn-taking patch: w8a8_bench --group 128 / 64 on two layers before, then the patch, its
#      bit-for-bit tests, synccheck and racecheck on them, and the same benches after.
set -u
export PATH=/usr/local/cuda/bin:$PATH LD_LIBRARY_PATH=$PWD/.devdeps/usr/lib/x86_64-linux-gnu
BUILD=/tmp/tl-device-build B=/tmp/tl-device-build/bin
SKIP_CTEST=1 SKIP_SANITIZER=1 SKIP_BENCH=1 OUT=$OUT bash tools/gpu/device_check.sh 2>&1 | tail -4
export SECTIONS="SpeedOfLight WarpStateStats SchedulerStats ComputeWorkloadAnalysis InstructionStats LaunchStats
  Occupancy"
export OUT NCU_TIMEOUT=60
KERNEL_BASE=demangled KERNEL='int8_gemm_kernel<\(bool\)1, \(int\)128>' NAME=w4a8-g128 \
  bash tools/gpu/profile_kernel.sh -- \
  $B/w8a8_bench /tmp/w.csv --layer "Llama-8B gate+up" --m 4096 --group 128
KERNEL_BASE=demangled KERNEL='int8_gemm_kernel<\(bool\)0, \(int\)0>' NAME=int8-down \
  bash tools/gpu/profile_kernel.sh -- \
  $B/w8a8_bench /tmp/w.csv --layer "TinyLoop down" --m 1024
KERNEL=attention_wgmma_kernel SKIP=3 NAME=attention bash tools/gpu/profile_kernel.sh -- \
  $B/tl_gpu_score_tests --gtest_filter=Kernels.AttentionLong   # check its grid: (16, 32, 1)
timeout 300 compute-sanitizer --tool racecheck --error-exitcode 9 $B/tl_gpu_score_tests \
  --gtest_filter='Kernels.Attention*-Kernels.AttentionLong' >"$OUT/racecheck-attention.log" 2>&1
echo "racecheck attention: rc=$?"
bench() {
  for g in 128 64; do
    for layer in "Llama-8B gate+up" "TinyLoop gate+up"; do
      timeout 60 $B/w8a8_bench /tmp/w.csv --layer "$layer" --m 1024,4096 --group $g | grep '^| [A-Z]'
    done
  done
}
echo "== before"; bench | tee "$OUT/turns-before.md"
git apply notes/patches/w4a8-grouped-turns.patch && cmake --build "$BUILD" -j "$(nproc)" >/dev/null 2>&1 || exit 1
timeout 120 $B/tl_gpu_tests --gtest_filter='Shapes/Int8Gemm*:Int8GemmLauncher.*' | tail -3
for tool in synccheck racecheck; do
  timeout 120 compute-sanitizer --tool $tool --error-exitcode 9 $B/tl_gpu_tests --quick \
    --gtest_filter='Shapes/Int8GemmGrouped.*' | grep -E "SUMMARY|PASSED|FAILED"
done
echo "== after"; bench | tee "$OUT/turns-after.md"
git apply -R notes/patches/w4a8-grouped-turns.patch
