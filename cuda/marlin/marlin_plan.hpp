// The Marlin-class launcher's policy: for an M x K x N call, which of the three mainloops runs and in which tile form.
// Pure functions of their arguments (no device, no CUDA headers, in every build): tests/cpp/gemm_policy_test.cpp
// checks them on a table of cases, and docs/architecture.md quotes the thresholds. The dispatcher's half of the
// policy (which path runs first) is cpp/gpu/gemm_policy.hpp.
//
// What is only known at launch stays with the launchers, as fallbacks: a kernel that refuses a call (sm_90a code on
// another device, shared memory, workspace) hands it to the classic kernel.
#pragma once

#include <cstdint>

namespace tl {

// ---- The Marlin-class kernels: three mainloops ----

// Stream (M <= 16: marlin_stream.cuh, every warp streaming its own k slices, no block barriers), Wgmma (M > 16 on
// compute capability 9.0: marlin_wgmma.cu, built for sm_90a), Classic (mma.sync, any M: marlin_kernel.cuh; M > 16
// on other GPUs, and where the other two refuse a call). The values index the launch counters.
enum class MarlinKernel : int { Stream = 0, Classic = 1, Wgmma = 2 };
constexpr int kMarlinKernels = 3;
inline const char *marlin_kernel_name(MarlinKernel kernel) {
    switch (kernel) {
        case MarlinKernel::Stream: return "stream";
        case MarlinKernel::Classic: return "classic";
        case MarlinKernel::Wgmma: return "wgmma";
    }
    return "?";
}

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
inline bool wgmma_whole_tiles(long long tiles, long long slots) {
    if (tiles <= 0 || slots <= 0) return false;
    const long long waves = (tiles + slots - 1) / slots;
    return static_cast<double>(tiles) >= kWholeTileFill * static_cast<double>(waves * slots);
}

// The classic kernel's plan for M rows: the fallback of the other two, and their form on GPUs without wgmma.
inline MarlinPlan classic_plan(int64_t m) {
    MarlinPlan plan;
    plan.kernel = MarlinKernel::Classic;
    plan.rows = m <= 32 ? 32 : 64;
    return plan;
}

// The policy. wgmma_runs: the library holds the sm_90a kernel and the device is compute capability 9.0.
inline MarlinPlan plan_marlin(int64_t m, int32_t k, int32_t n, bool wgmma_runs) {
    MarlinPlan plan;
    if (m <= 16) {
        plan.kernel = MarlinKernel::Stream;
        plan.rows = m <= 8 ? 8 : 16;
        return plan;
    }
    if (!wgmma_runs) return classic_plan(m);
    const long long elements = static_cast<long long>(k) * n;
    plan.kernel = MarlinKernel::Wgmma;
    if (m <= 32) {
        plan.rows = 32;
        plan.wgmma_warpgroups = elements <= kWgmmaSplitMaxKN ? 2 : 1;
    } else if (m <= 64) {
        plan.rows = 64;
        plan.wgmma_warp_specialized = elements > kWgmmaSmallKN;
    } else {
        plan.rows = 128;
        plan.wgmma_warp_specialized = true;
    }
    return plan;
}

}  // namespace tl
