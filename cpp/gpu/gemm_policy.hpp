// The INT4 GEMM dispatcher's policy in one place: for a call's shape and settings, which path runs first and, on the
// Marlin-class path, which kernel and tile. Pure functions of their arguments (no device, no CUDA, in every build):
// tests/cpp/gemm_policy_test.cpp checks them on a table of cases, and docs/architecture.md quotes the thresholds.
// Every threshold the dispatcher and the Marlin-class launcher use is here, measured on the H200 (docs/benchmarks.md).
//
// What is only known at launch stays with the launchers, as fallbacks: a path or kernel that refuses a call (no
// Marlin-class form for the shape, sm_90a code on another device, shared memory, workspace) hands it to the next one,
// in the order given below.
#pragma once

#include <cstdint>

namespace tl {

// The element type of a call's activations and output (x and y), and so of the tensor cores' operands: TL_DTYPE_FP16
// or TL_DTYPE_BF16 of the C API. The paths that hold FP16 weights (the FP16 body, the seed's correction form) take
// FP16 alone; the others take both, with the same policy.
enum class Dtype : int { F16 = 0, BF16 = 1 };

// ---- Paths: tl_quant_gemm tries the FP16 body (when enabled and packed), then dequantize + cuBLAS (from the row
// count below), then the Marlin-class kernel, then the native kernel, which takes every call. ----

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

// ---- The Marlin-class kernels: three mainloops ----

// Stream (M <= 16: marlin_stream.cuh, every warp streaming its own k slices, no block barriers), Wgmma (M > 16 on
// compute capability 9.0: marlin_wgmma.cu, built for sm_90a), Classic (mma.sync, any M: marlin_kernel.cuh; M > 16
// on other GPUs, and where the other two refuse a call). The values index the launch counters.
enum class MarlinKernel : int { Stream = 0, Classic = 1, Wgmma = 2 };
constexpr int kMarlinKernels = 3;
const char *marlin_kernel_name(MarlinKernel kernel);

// Measured on the H200 (2026-12-02, tl_bench's layers, group 128). The wgmma kernel from 17 rows beat the mma.sync
// kernels on every layer but Llama-70B gate+up and down at 17-24 rows (1-3% slower), so they are gone from Hopper.
// Weights of at most this many elements run 33-64 rows with every warp copying, larger ones with a copying warpgroup:
// at M = 40-64 that is 2-13% faster on the Llama and Qwen2 down and qkv layers above 2^25, 1-6% slower below it (the
// TinyLoop layers, Qwen2-7B qkv).
constexpr long long kWgmmaSmallKN = 1LL << 25;
// Up to 32 rows, weights of at most this many elements split a tile's words over two warpgroups (one block per SM);
// larger ones run one warpgroup per block, two blocks per SM. Against two warpgroups with a copying third, at
// M = 17-32: one warpgroup 3-10% faster on every gate+up layer, Llama-70B down and qkv and Llama-2-13B qkv, 1-2%
// slower on Llama-2-13B and Qwen2-7B down; two warpgroups with every warp copying level or up to 4% faster on the
// weights up to 2^26.
constexpr long long kWgmmaSplitMaxKN = 1LL << 26;

// What marlin_gemm runs for an M x K x N call.
struct MarlinPlan {
    MarlinKernel kernel = MarlinKernel::Stream;
    // Tile height in activation rows. Stream: 8 or 16; Wgmma: 32, 64 or 128; Classic: 32 or 64 (halved to 32 where
    // the 64-row pipeline does not fit shared memory).
    int rows = 0;
    // Wgmma: the tile's four 16-column words per warp on two warpgroups (one block per SM) or all on one (two blocks
    // per SM: 32-row tiles only); with warp_specialized, a third warpgroup issues the copies and the two only compute.
    int wgmma_warpgroups = 2;
    bool wgmma_warp_specialized = false;
};
// The wgmma kernel's scheduling of `tiles` tiles on `slots` resident blocks: whole tiles, round robin (true), where
// every wave keeps at least kWholeTileFill of the slots busy; else stream-K (each block an equal share of all k
// slices, the tiles cut between blocks summed in FP32 and written by a fix-up grid). Whole tiles read each weight
// panel once (the blocks running at once hold neighbouring tiles, rows fastest, and share it through L2) and need no
// reduction. Measured on the H200 (2026-12-02, whole tiles against stream-K): Llama-8B gate+up (112 256-column
// tiles a row slice, 132 slots) 59.8 vs 70.3 us at M = 128 and 117.7 vs 156.4 at M = 256, Llama-2-7B qkv 58.4 vs
// 70.9 at M = 256 (96 tiles); stream-K ahead with fewer tiles: 37.1 vs 57.9 (48 tiles), Llama-70B down 240 vs 352
// (64 tiles). Two waves are less clear: Qwen2-7B gate+up at M = 256 (296 tiles) took 171.6 us whole against 145.0
// stream-K, in two runs whose other cells moved by up to 15%.
constexpr double kWholeTileFill = 0.7;
bool wgmma_whole_tiles(long long tiles, long long slots);

// The policy. wgmma_runs: the library holds the sm_90a kernel and the device is compute capability 9.0.
MarlinPlan plan_marlin(int64_t m, int32_t k, int32_t n, bool wgmma_runs);
// The classic kernel's plan for M rows: the fallback of the other two, and their form on GPUs without wgmma.
MarlinPlan classic_plan(int64_t m);

}  // namespace tl
