#!/usr/bin/env bash
# What the next GPU commands owe (notes/gpu-notes.md, "The folds, scoring with the TMA attention ..."): from the
# repository root on the GPU machine, with .devdeps carried, OUT set. Two parts, one device command each:
#   profile (about 8 minutes): build, the three Nsight Compute profiles of the missed targets, scoring's kernel-time
#     breakdown, CTest (device_check.sh; most needed first, in case the time runs out);
#   turns (about 8 minutes): racecheck on the attention tests (cut at 45 s last time); W4A8 against W4A16 at M = 16
#     and 64; the grouped W4A8 turn-taking patch: w8a8_bench --group 128 / 64 on two layers before,
#     then the patch, its bit-for-bit tests, synccheck and racecheck on them, and the same benches after.
set -u
export PATH=/usr/local/cuda/bin:$PATH LD_LIBRARY_PATH=$PWD/.devdeps/usr/lib/x86_64-linux-gnu
BUILD=/tmp/tl-device-build B=/tmp/tl-device-build/bin
if [ "${1:-}" = profile ]; then
  BUILD_TARGETS="tinyloop tinyloop_cli w8a8_bench tl_gpu_score_tests" SKIP_CTEST=1 SKIP_SANITIZER=1 SKIP_BENCH=1 \
    OUT=$OUT bash tools/gpu/device_check.sh 2>&1 | tail -3
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
  # Where scoring's time goes (CUPTI), FP16 and INT8 activations, one 4096-token window and 16-token windows.
  timeout 60 $B/tinyloop make-model --preset 2b --group-size 0 --out /tmp/2b-row.tinyloop >/dev/null 2>&1
  for spec in "4096 0 fp16" "4096 0 int8" "1024 16 fp16" "1024 16 int8"; do
    set -- $spec
    timeout 90 python3 tools/gpu/score_profile.py $BUILD/lib/libtinyloop.so /tmp/2b-row.tinyloop --tokens $1 \
      --window $2 --activations $3 --top 8
  done >"$OUT/score-profile.md" 2>&1
  grep -E "^tl_score|^\| (FP16|INT8|attention|INT4|dequant)" "$OUT/score-profile.md"
  SKIP_SANITIZER=1 SKIP_BENCH=1 OUT=$OUT bash tools/gpu/device_check.sh 2>&1 | tail -4   # CTest
  exit 0
fi
# Everything built (a no-op after a whole profile run; the profile part builds only its targets first).
SKIP_CTEST=1 SKIP_SANITIZER=1 SKIP_BENCH=1 OUT=$OUT bash tools/gpu/device_check.sh 2>&1 | tail -3
# The tests of the tensor-core attention kernels (the SIMT ones and Long left out: 15 s of the 45 s cut last time).
timeout 150 compute-sanitizer --tool racecheck --error-exitcode 9 $B/tl_gpu_score_tests \
  --gtest_filter='Kernels.AttentionTensorCore:Kernels.AttentionGrouped:Kernels.AttentionSegments*' \
  >"$OUT/racecheck-attention.log" 2>&1
echo "racecheck attention: rc=$?"
grep -E "OK \]|FAILED|SUMMARY" "$OUT/racecheck-attention.log" | tail -8
bench() {
  for g in 128 64; do
    for layer in "Llama-8B gate+up" "TinyLoop gate+up"; do
      timeout 60 $B/w8a8_bench /tmp/w.csv --layer "$layer" --m 1024,4096 --group $g | grep '^| [A-Z]'
    done
  done
}
# The target "at M <= 64, W4A8 at least as fast as W4A16": layers far larger than L2, since w8a8_bench does not
# rotate its weights and tl_bench does.
echo "== small M"
for g in 0 128; do
  timeout 60 $B/w8a8_bench /tmp/s.csv --layer "Llama-70B gate+up" --m 16,64 $([ $g = 0 ] || echo --group $g) |
    grep '^| [A-Z]'
done | tee "$OUT/small-m-w4a8.md"
for g in row 128; do
  timeout 90 $B/tl_bench /tmp/t.csv /tmp/t.md --layer "Llama-70B gate+up" --m 16,64 --group $g \
    --kernels marlin_fused,cublas_fp16 >/dev/null 2>&1
  grep -E '^\|' /tmp/t.md
done | tee "$OUT/small-m-w4a16.md"
echo "== before"; bench | tee "$OUT/turns-before.md"
# The epilogue fold alone (bit for bit against the CPU rule), then the turns on top of it.
git apply notes/patches/int8-epilogue-fold.patch && cmake --build "$BUILD" -j "$(nproc)" >/dev/null 2>&1 || exit 1
echo "== fold"; timeout 120 $B/tl_gpu_tests --gtest_filter='Shapes/Int8Gemm*:Int8GemmLauncher.*:QuantizeGroupSums*' |
  tail -3
git apply notes/patches/w4a8-grouped-turns.patch && cmake --build "$BUILD" -j "$(nproc)" >/dev/null 2>&1 || exit 1
echo "== turns"; timeout 120 $B/tl_gpu_tests --gtest_filter='Shapes/Int8Gemm*:Int8GemmLauncher.*' | tail -3
for tool in synccheck racecheck; do
  timeout 120 compute-sanitizer --tool $tool --error-exitcode 9 $B/tl_gpu_tests --quick \
    --gtest_filter='Shapes/Int8GemmGrouped.*' | grep -E "SUMMARY|PASSED|FAILED"
done
echo "== after"; bench | tee "$OUT/turns-after.md"
git apply -R notes/patches/w4a8-grouped-turns.patch && git apply -R notes/patches/int8-epilogue-fold.patch
