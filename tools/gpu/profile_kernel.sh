#!/usr/bin/env bash
# On the GPU machine, after tools/gpu/device_check.sh built everything: one kernel launch under Nsight Compute, and the
# kernel's SASS lines matching a pattern (e.g. SASS_GREP='LDL|STL' for spills), for kernel work. The launch is a
# tl_bench cell, or the SKIP-th launch matching KERNEL of any command given after `--`:
#
#   OUT=$OUT KERNEL=regex LAYER=name M=m [KERNELS=tl_bench kernel] [SECTIONS="..."] [SASS_GREP=regex] \
#     [NCU_CLOCK=base] bash tools/gpu/profile_kernel.sh
#   OUT=$OUT KERNEL=regex [NAME=label] [SKIP=5] [KERNEL_BASE=function] bash tools/gpu/profile_kernel.sh -- CMD ARGS...
#
# KERNEL is matched against the kernel's bare name (KERNEL_BASE=function), or with KERNEL_BASE=demangled against the
# full demangled name, whose template arguments read `<(int)128>` and `<(bool)1, (int)128>`, e.g.
#   OUT=$OUT KERNEL_BASE=demangled KERNEL='int8_gemm_kernel<\(bool\)1, \(int\)128>' NAME=w4a8-g128 \
#     bash tools/gpu/profile_kernel.sh -- $BUILD/bin/w8a8_bench /tmp/w.csv --layer "Llama-8B gate+up" --m 4096 \
#     --group 128
#   OUT=$OUT KERNEL=attention_wgmma_kernel SKIP=3 NAME=attention \
#     bash tools/gpu/profile_kernel.sh -- $BUILD/bin/tl_gpu_score_tests --gtest_filter=Kernels.AttentionLong
# (the 4th launch there: head_dim 128, 4096 tokens x 16 heads). Writes $OUT/ncu-<M>.txt, or $OUT/ncu-<NAME>.txt for a
# command (the sections' details), and $OUT/sass.txt (the kernel's SASS lines matching SASS_GREP, from tl_bench).
set -u
cd "$(dirname "$0")/../.." || exit 1
BUILD=${BUILD:-/tmp/tl-device-build}
OUT=${OUT:?set OUT}
export PATH=/usr/local/cuda/bin:$PATH
sections=${SECTIONS:-SpeedOfLight WarpStateStats ComputeWorkloadAnalysis MemoryWorkloadAnalysis Occupancy LaunchStats}
args=()
for s in $sections; do args+=(--section "$s"); done
# --clock-control none: profile at the clocks the benchmark sees. ncu's default locks the base clock (1.3 GHz here,
# 1.98 under tl_bench), where the stream kernel looked issue-bound though fewer instructions did not make it faster
# at the real clock. NCU_CLOCK=base restores the default.
ncu_on() {
  timeout "${NCU_TIMEOUT:-200}" ncu --clock-control "${NCU_CLOCK:-none}" --kernel-name-base "${KERNEL_BASE:-function}" \
    --kernel-name "regex:${KERNEL}" "${args[@]}" "$@"
}
if [ "${1:-}" = "--" ]; then
  shift
  name=${NAME:-cmd}
  log=$OUT/ncu-$name.txt
  ncu_on --launch-skip "${SKIP:-5}" --launch-count 1 "$@" >"$log" 2>&1
  rc=$?
  # A filter that matches nothing still exits 0: say so.
  if grep -q "No kernels were profiled" "$log"; then
    echo "ncu $name: no launch matched KERNEL (the names it saw are in ncu-$name.txt)"
    exit 1
  fi
  echo "ncu $name: rc=$rc ($(grep -c . "$log") lines)"
  exit "$rc"
fi
for m in ${M//,/ }; do
  # --stream-loop: plain launches (no graphs), so that --launch-skip counts calls of this cell.
  ncu_on --launch-skip 5 --launch-count 1 \
    "$BUILD/bin/tl_bench" /tmp/ncu.csv /tmp/ncu.md --stream-loop --layer "$LAYER" --m "$m" \
    --kernels "${KERNELS:-marlin_fused}" --group 128 >"$OUT/ncu-$m.txt" 2>&1
  echo "ncu M=$m: rc=$? ($(grep -c . "$OUT/ncu-$m.txt") lines)"
done
if [ -n "${SASS_GREP:-}" ]; then
  cuobjdump -sass "$BUILD/bin/tl_bench" 2>/dev/null |
    awk -v k="$KERNEL" '/Function :/ {on = ($0 ~ k)} on' | grep -E "Function :|${SASS_GREP}" >"$OUT/sass.txt"
  echo "sass: $(grep -c . "$OUT/sass.txt") lines"
fi
