// The INT4 GEMM dispatcher's policy: for a call's shape and settings, which path runs first. Pure functions (no device,
// no CUDA, in every build), checked by tests/cpp/gemm_policy_test.cpp and quoted in docs/architecture.md. The
// thresholds were measured on the H200 (the measurements: notes/gpu-notes.md, "The GEMM policy's thresholds"). The
// Marlin-class launcher's half (which kernel and tile) lives with the launcher, cuda/marlin/marlin_plan.hpp, and is
// included here so that this header shows the whole policy.
//
// What is only known at launch stays with the launchers, as fallbacks: a path or kernel that refuses a call (no
// Marlin-class form for the shape, sm_90a code on another device, shared memory, workspace) hands it to the next one.
#pragma once

#include <cstdint>

#include "dtype.hpp"
#include "marlin/marlin_plan.hpp"
#include "score/dispatch_settings.hpp"  // kDefaultCublasMinM, the setting's default

namespace tl {

// ---- Paths: tl_quant_gemm tries the FP16 body (when enabled and packed), then dequantize + cuBLAS (from the row
// count below), then the Marlin-class kernel, then the native kernel, which takes every call. The paths that hold
// FP16 weights (the FP16 body, the seed's correction form) take FP16 calls alone (Dtype); the others take both, with
// the same policy. ----

// A small weight gives the Marlin-class kernels too few tiles to fill the GPU from 128 rows: K·N <= 2^25, or 2^24
// where the Hopper kernels run (the TMA kernel's 128-column tiles fill it from 2^25).
constexpr int64_t kSmallWeightElements = int64_t{1} << 25;
constexpr int64_t kHopperSmallWeightElements = int64_t{1} << 24;
constexpr int64_t kSmallWeightCublasMinM = 128;
// Where the Hopper kernels run, a weight that is not small switches at this multiple of the setting: the TMA kernel
// beat dequantize + cuBLAS at 1024 rows and lost at 4096 on most layers (H100).
constexpr int64_t kHopperCublasFactor = 4;
// A large weight (K·N >= 2^27) stays faster on the Marlin-class kernels: it switches at twice the row count.
constexpr int64_t kLargeWeightElements = int64_t{1} << 27;

// The smallest M at which a K x N weight takes dequantize + cuBLAS under TL_DISPATCH_CUBLAS_MIN_M = `setting`
// (0: never, and then 0 is returned): the setting, lowered to kSmallWeightCublasMinM for a small weight, else
// multiplied by kHopperCublasFactor where `hopper` (the sm_90a kernels run), and doubled for a large weight.
int64_t cublas_min_m_for(int32_t k, int32_t n, int32_t setting, bool hopper);

}  // namespace tl
