#!/usr/bin/env bash
# On the GPU machine, after tools/gpu/device_check.sh built everything: one tl_bench cell under Nsight Compute, and the
# kernel's SASS lines matching a pattern (e.g. SASS_GREP='LDL|STL' for spills), for kernel work.
#
#   OUT=$OUT KERNEL=regex LAYER=name M=m [KERNELS=tl_bench kernel] [SECTIONS="..."] [SASS_GREP=regex] \
#     [NCU_CLOCK=base] bash tools/gpu/profile_kernel.sh
# Writes $OUT/ncu-<M>.txt (the sections' details) and $OUT/sass.txt (the kernel's SASS lines matching SASS_GREP).
set -u
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-/tmp/tl-device-build}
OUT=${OUT:?set OUT}
export PATH=/usr/local/cuda/bin:$PATH
sections=${SECTIONS:-SpeedOfLight WarpStateStats ComputeWorkloadAnalysis MemoryWorkloadAnalysis Occupancy LaunchStats}
args=()
for s in $sections; do args+=(--section "$s"); done
for m in ${M//,/ }; do
  # --stream-loop: plain launches (no graphs), so that --launch-skip counts calls of this cell.
  # --clock-control none: profile at the clocks the benchmark sees. ncu's default locks the base clock (1.3 GHz here,
  # 1.98 under tl_bench), where the stream kernel looked issue-bound though fewer instructions did not make it faster
  # at the real clock. NCU_CLOCK=base restores the default.
  timeout "${NCU_TIMEOUT:-200}" ncu --clock-control "${NCU_CLOCK:-none}" --kernel-name "regex:${KERNEL}" \
    --launch-skip 5 --launch-count 1 "${args[@]}" \
    "$BUILD/bin/tl_bench" /tmp/ncu.csv /tmp/ncu.md --stream-loop --layer "$LAYER" --m "$m" \
    --kernels "${KERNELS:-marlin_fused}" --group 128 >"$OUT/ncu-$m.txt" 2>&1
  echo "ncu M=$m: rc=$? ($(grep -c . "$OUT/ncu-$m.txt") lines)"
done
if [ -n "${SASS_GREP:-}" ]; then
  cuobjdump -sass "$BUILD/bin/tl_bench" 2>/dev/null |
    awk -v k="$KERNEL" '/Function :/ {on = ($0 ~ k)} on' | grep -E "Function :|${SASS_GREP}" >"$OUT/sass.txt"
  echo "sass: $(grep -c . "$OUT/sass.txt") lines"
fi
