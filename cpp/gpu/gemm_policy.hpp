// The INT4 GEMM dispatcher's policy in one place: for a call's shape and settings, which path runs first and, on the
// Marlin-class path, which kernel and tile. Pure functions of their arguments (no device, no CUDA, in every build):
// tests/cpp/gemm_policy_test.cpp checks them on a table of cases, and docs/architecture.md quotes the thresholds.
// Every threshold the dispatcher and the Marlin-class launcher use is here, measured on the H200 (docs/benchmarks.md).
//
// What is only known at launch stays with the launchers, as fallbacks: a path or kernel that refuses a call (no
// Marlin-class form for the shape, sm_90a code on another device, shared memory, workspace) hands it to the next one,
// in the order given below.
#pragma once

#include <climits>
#include <cstdint>

namespace tl {

// ---- Paths: tl_quant_gemm tries the FP16 body (when enabled and packed), then dequantize + cuBLAS (from the row
// count below), then the Marlin-class kernel, then the native kernel, which takes every call. ----

// TL_DISPATCH_CUBLAS_MIN_M's default. With the wgmma kernel taking M >= 33, it beats dequantize + cuBLAS at
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

// ---- The Marlin-class kernels ----

// Skinny (M <= 16, block barriers), Stream (M <= 16, no block barriers: marlin_stream.cuh), Medium (16 < M <= 64,
// one tile covers every row), Wide (any M, 32- or 64-row tiles: the first-generation mainloop), Wgmma (M > 16 on
// compute capability 9.0, built for sm_90a). The values index the launch counters.
enum class MarlinKernel : int { Skinny = 0, Medium = 1, Wide = 2, Wgmma = 3, Stream = 4 };
const char *marlin_kernel_name(MarlinKernel kernel);

// The medium kernel's two mainloops: split (one or two warps per 64-column strip, 24/32/48/64-row tiles) and wide-warp
// (one warp per strip, 32/48/64 rows). Auto: split at M <= kMediumSplitMaxM, where its 24-row tile (no spills) wins,
// the wide-warp kernel above (the split kernel's 32-row tile spills).
enum class MediumVariant { Auto, Split, Wide };
constexpr int kMediumSplitMaxM = 24;

// Defaults of MarlinTuning (the policy as shipped).
constexpr int kMarlinMediumMaxM = 64;
constexpr int kMarlinWgmmaMinM = 33;
// Weights of at most this many elements (K·N: Llama-8B qkv and every layer of the 2B model) take the wgmma kernel from
// 17 rows: there its 64-row tile on two warpgroups beat the medium kernel by 7-19% at M = 17-32 on four of those five
// layers and lost 4-5% on the fifth at 17-24 rows, while on larger weights the medium kernel wins below 33 rows.
constexpr long long kWgmmaSmallKN = 1LL << 25;
// Up to M = 64 the wgmma kernel splits a 64-row tile's words over two warpgroups (one block per SM) for a weight of at
// most this many elements: 6-22% faster at M = 33-64 on weights up to Llama-8B down (58.7M), 3-17% slower on 8B
// gate+up and the 70B layers, where two independent one-warpgroup blocks per SM keep more in flight.
constexpr long long kWgmmaSplitMaxKN = 1LL << 26;

// The knobs of the kernel choice. The defaults are the policy; tests and bench/ change them for A/B runs through
// set_marlin_tuning (cuda/gpu_kernels.hpp); results never depend on them beyond FP32 summation order.
struct MarlinTuning {
    int medium_max_m = kMarlinMediumMaxM;  // the largest M on the medium kernel, in [16, 64] (16: never)
    int wgmma_min_m = kMarlinWgmmaMinM;    // the smallest M that tries the wgmma kernel, >= 17 (INT_MAX: never)
    long long wgmma_split_max_kn = kWgmmaSplitMaxKN;  // >= 0 (0: never split)
    bool wgmma_warp_specialized = true;  // M > 64 on wgmma: a third warpgroup copies, the tile's two only compute
    int stream_slices_per_warp = 0;      // M <= 16: 0 = spread over every warp slot, n = at least n slices per
                                         // warp, -1 = never the stream kernel
    int stream_stages = 0;               // the stream kernel's ring depth per warp: 0 = as deep as fits, else >= 2
    int max_blocks_per_sm = 2;           // resident blocks per SM for M <= 16: 2, or 1 (a deeper ring)
    MediumVariant medium_variant = MediumVariant::Auto;
};

// The tuning with every field clamped into its range (the setters' rule).
MarlinTuning clamped(MarlinTuning tuning);

// The smallest M that tries the wgmma kernel on a K x N weight: tuning.wgmma_min_m, lowered to 17 for a weight of at
// most kWgmmaSmallKN elements unless it is INT_MAX (never).
int wgmma_min_m_for(int32_t k, int32_t n, const MarlinTuning &tuning);

// What marlin_gemm runs for an M x K x N call with group size `group_size` (K for per column).
struct MarlinPlan {
    // First, where it runs: the wgmma kernel, with tiles of wgmma_rows (64: M <= 64, else 128) and, for 64-row tiles,
    // wgmma_warpgroups (2: the tile's words split over two, 1: two blocks per SM); 128-row tiles have two
    // warpgroups, plus a copying one when warp-specialized.
    bool wgmma = false;
    int wgmma_rows = 0;
    int wgmma_warpgroups = 0;
    bool wgmma_warp_specialized = false;
    // Then (or first): the kernel for M, and its tile height in rows. Stream and Skinny: 8 or 16; Medium: 24, 32, 48
    // or 64; Wide: 32 or 64. The stream kernel refuses a K that is not a multiple of 128 or a group size other than
    // 32, 64 or a multiple of 128, and then the skinny kernel runs with the same rows; a medium or wide tile whose
    // pipeline does not fit shared memory falls to the wide kernel / half the rows (not below 32).
    MarlinKernel kernel = MarlinKernel::Skinny;
    int rows = 0;
    bool medium_split = false;  // Medium: the split mainloop, else the wide-warp one
    int slice_k = 64;           // Skinny: 128-deep slices at 8 rows when 128 divides K and the group size
};
MarlinPlan plan_marlin(int64_t m, int32_t k, int32_t n, int32_t group_size, const MarlinTuning &tuning);

// The wide kernel's tile height for M rows (also its fallback from the medium kernel): 32 or 64 (8 or 16 for M <= 16,
// the skinny kernel's).
int wide_rows(int64_t m);

}  // namespace tl
