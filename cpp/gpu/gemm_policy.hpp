// The INT4 GEMM dispatcher's policy: for a call's shape and settings, which path runs first. Pure functions of their
// arguments (no device, no CUDA, in every build): tests/cpp/gemm_policy_test.cpp checks them on a table of cases, and
// docs/architecture.md quotes the thresholds. Every threshold the dispatcher uses is here, measured on the H200
// (docs/benchmarks.md); the Marlin-class launcher's half of the policy (which kernel and tile, for a call on that
// path) lives with the launcher, in cuda/marlin/marlin_plan.hpp, and is included here so that this header shows the
// whole policy.
//
// What is only known at launch stays with the launchers, as fallbacks: a path or kernel that refuses a call (no
// Marlin-class form for the shape, sm_90a code on another device, shared memory, workspace) hands it to the next one,
// in the order given below.
#pragma once

#include <cstdint>

#include "dtype.hpp"
#include "marlin/marlin_plan.hpp"

namespace tl {

// ---- Paths: tl_quant_gemm tries the FP16 body (when enabled and packed), then dequantize + cuBLAS (from the row
// count below), then the Marlin-class kernel, then the native kernel, which takes every call. The paths that hold
// FP16 weights (the FP16 body, the seed's correction form) take FP16 calls alone (Dtype); the others take both, with
// the same policy. ----

// TL_DISPATCH_CUBLAS_MIN_M's default. With the wgmma kernel above 32 rows, it beats dequantize + cuBLAS at
// M <= 256 on the Llama 8B gate+up/down and 70B layers and, at M = 1024, loses on every layer but 8B gate+up
// (2026-12-01): one threshold between the two. (Before the wgmma kernel the crossover was 128; on a GPU without it,
// set 128.)
constexpr int32_t kDefaultCublasMinM = 512;
// A small weight (K·N <= 2^25: the 2B TinyLoop shape's layers, Llama-8B qkv) gives the Marlin-class kernels too few
// 256-column tiles to fill the GPU at M >= 128, where dequantize + cuBLAS already beats them on every such layer.
constexpr int64_t kSmallWeightElements = int64_t{1} << 25;
constexpr int64_t kSmallWeightCublasMinM = 128;
// A large weight (K·N >= 2^27: the Llama-70B layers) still runs faster on the wgmma kernel than dequantized through
// cuBLAS at 512 rows (70B gate+up 831-902 vs 1032-1042 us, 70B down 465-471 vs 501-511 us): it switches at twice the
// setting.
constexpr int64_t kLargeWeightElements = int64_t{1} << 27;

// The smallest M at which a K x N weight takes dequantize + cuBLAS under TL_DISPATCH_CUBLAS_MIN_M = `setting`
// (0: never, and then 0 is returned): the setting, lowered to kSmallWeightCublasMinM for a small weight and doubled
// for a large one.
int64_t cublas_min_m_for(int32_t k, int32_t n, int32_t setting);

}  // namespace tl
