#!/usr/bin/env bash
# The next GPU command (one device call, about 6 minutes; from the repository root with .devdeps carried, OUT set):
# applies the three patches beside this script, builds, runs CTest, the attention timings with SDPA beside them, the
# INT8 scoring breakdown, and memcheck / racecheck on the changed kernels' tests. Land each patch whose tests pass:
# int8-epilogue-fold.patch (finish_tile and store_grouped_tile through one store_rows helper; its own GPU tests
# passed bit for bit, gpu.int8_gemm in CTest is what it still needs), swiglu-int8-held.patch (expected: swiglu_int8_kernel 1.54 -> ~0.5 ms per 4096-token call of the 2B
# model, INT8 scoring ~10%), attention-hd64-three-consumers.patch (hd 64 on 192-query tiles where they fill the SMs;
# AttentionTensorCoreManyHeads and the 16-head segments exercise that form).
set -u
export PATH=/usr/local/cuda/bin:$PATH LD_LIBRARY_PATH=$PWD/.devdeps/usr/lib/x86_64-linux-gnu
BUILD=/tmp/tl-device-build B=/tmp/tl-device-build/bin
patches="notes/patches/int8-epilogue-fold.patch notes/patches/swiglu-int8-held.patch
  notes/patches/attention-hd64-three-consumers.patch"
git apply $patches || exit 1
SKIP_SANITIZER=1 SKIP_BENCH=1 OUT=$OUT bash tools/gpu/device_check.sh 2>&1 | tail -6
echo "== attention $(date +%T)"
timeout 60 $B/tl_gpu_score_tests --gtest_filter='Kernels.AttentionLong:Kernels.AttentionTensorCoreManyHeads' \
  >"$OUT/attention.log" 2>&1; echo "rc=$?"
grep -E "wgmma|largest|OK \]|FAILED" "$OUT/attention.log" | grep -v "SIMT:" | cut -c1-110
timeout 60 python3 tools/gpu/attention_peer.py --shapes 4096:16:128,2048:16:128,1024:16:128,4096:4:64,\
1024:16:128:16,2048:16:128:8,4096:16:128:4,1024:32:64:16,2048:32:64:8,4096:32:64:4 2>&1 | tee "$OUT/sdpa.log" |
  cut -c1-100
echo "== score profile $(date +%T)"
timeout 60 $B/tinyloop make-model --preset 2b --group-size 0 --out /tmp/2b-row.tinyloop >/dev/null 2>&1
for spec in "4096 0 int8" "4096 0 fp16" "1024 16 int8"; do
  set -- $spec
  timeout 90 python3 tools/gpu/score_profile.py $BUILD/lib/libtinyloop.so /tmp/2b-row.tinyloop --tokens $1 \
    --window $2 --activations $3 --top 8 2>/dev/null
done >"$OUT/score-profile.md"
grep -E "^tl_score|^\| (SwiGLU|INT8|attention|RMSNorm)" "$OUT/score-profile.md"
echo "== sanitizers $(date +%T)"
filter='Kernels.SwigluInt8*:Kernels.RmsNorm*:Kernels.AttentionTensorCoreManyHeads:Kernels.AttentionSegments*'
timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 $B/tl_gpu_score_tests --gtest_filter="$filter" \
  >"$OUT/memcheck.log" 2>&1
echo "memcheck rc=$?"; grep -E "SUMMARY|PASSED|FAILED" "$OUT/memcheck.log" | tail -3
# racecheck on the whole AttentionTensorCore test runs past 150 s: the segments tests cover both wgmma forms.
timeout 120 compute-sanitizer --tool racecheck --error-exitcode 9 $B/tl_gpu_score_tests \
  --gtest_filter='Kernels.AttentionSegments*:Kernels.SwigluInt8*' >"$OUT/racecheck.log" 2>&1
echo "racecheck rc=$?"; grep -E "SUMMARY|PASSED|FAILED" "$OUT/racecheck.log" | tail -3
git apply -R $patches
