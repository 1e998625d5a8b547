// The Marlin-class launcher's policy: for an M x K x N call, which of the three mainloops runs and in which tile form.
// Pure functions (no device, no CUDA headers, in every build), checked by tests/cpp/gemm_policy_test.cpp and quoted in
// docs/architecture.md. The thresholds were measured on the H200 (notes/gpu-notes.md, "The GEMM policy's
// thresholds"). The dispatcher's half of the policy (which path runs first) is cpp/gpu/gemm_policy.hpp.
//
// What is only known at launch stays with the launchers, as fallbacks: a kernel that refuses a call (sm_90a code on
// another device, shared memory, workspace) hands it to the classic kernel.
#pragma once

#include <cstdint>

namespace tl {

// ---- The Marlin-class kernels: four mainloops ----

// Stream (M <= 16: marlin_stream.cuh, every warp streaming its own k slices, no block barriers), Wgmma (M > 16 on
// compute capability 9.0: marlin_wgmma.cu, built for sm_90a), Tma (many rows on compute capability 9.0: marlin_tma.cu,
// TMA-fed and warp-specialized, each weight tile dequantized once into shared memory), Classic (mma.sync, any M:
// marlin_kernel.cuh; M > 16 on other GPUs, and where the others refuse a call). The values index the launch counters.
enum class MarlinKernel : int { Stream = 0, Classic = 1, Wgmma = 2, Tma = 3 };
constexpr int kMarlinKernels = 4;
inline const char *marlin_kernel_name(MarlinKernel kernel) {
    switch (kernel) {
        case MarlinKernel::Stream: return "stream";
        case MarlinKernel::Classic: return "classic";
        case MarlinKernel::Wgmma: return "wgmma";
        case MarlinKernel::Tma: return "tma";
    }
    return "?";
}

// On compute capability 9.0 the wgmma kernel runs every M > 16: it beat the mma.sync kernels there. From 33 rows,
// weights of at most this many elements run with every warp copying; larger ones stream enough weight per tile that a
// copying warpgroup pays for itself.
constexpr long long kWgmmaSmallKN = 1LL << 25;
// Up to 32 rows, weights of at most this many elements split a tile's words over two warpgroups (one block per SM);
// larger ones run one warpgroup per block and two blocks per SM, which keeps more tiles in flight.
constexpr long long kWgmmaSplitMaxKN = 1LL << 26;

// What marlin_gemm runs for an M x K x N call.
struct MarlinPlan {
    MarlinKernel kernel = MarlinKernel::Stream;
    // Tile height in activation rows. Stream: 8 or 16; Wgmma: 32, 64 or 128; Tma: 256; Classic: 32 or 64
    // (halved to 32 where the 64-row pipeline does not fit shared memory).
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
// reduction; with too few tiles to fill a wave, stream-K's balance wins.
constexpr double kWholeTileFill = 0.7;
inline bool wgmma_whole_tiles(long long tiles, long long slots) {
    if (tiles <= 0 || slots <= 0) return false;
    const long long waves = (tiles + slots - 1) / slots;
    return static_cast<double>(tiles) >= kWholeTileFill * static_cast<double>(waves * slots);
}

// The TMA kernel (marlin_tma.cu): 256-row tiles of 128 columns. It runs from kTmaMinRows where those tiles fill the
// waves of one block per SM (wgmma_whole_tiles); there it beat the wgmma kernel's 128-row tiles on every layer measured
// at 256-2048 rows and was level at 4096 (H100, tl_bench, notes/gpu-notes.md "The TMA kernel"). With fewer tiles the
// wgmma kernel keeps its forms.
constexpr int64_t kTmaMinRows = 129;
constexpr int kTmaRows = 256;
constexpr int kTmaColumns = 128;
inline long long tma_tiles(int64_t m, int32_t n) {
    return static_cast<long long>((m + kTmaRows - 1) / kTmaRows) * ((static_cast<long long>(n) + kTmaColumns - 1) /
                                                                    kTmaColumns);
}

// The classic kernel's plan for M rows: the fallback of the others, and their form on GPUs without wgmma.
inline MarlinPlan classic_plan(int64_t m) {
    MarlinPlan plan;
    plan.kernel = MarlinKernel::Classic;
    plan.rows = m <= 32 ? 32 : 64;
    return plan;
}

// The policy. wgmma_runs: the library holds the sm_90a kernels and the device is compute capability 9.0; sm_count: the
// device's multiprocessors.
inline MarlinPlan plan_marlin(int64_t m, int32_t k, int32_t n, bool wgmma_runs, int sm_count) {
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
    } else if (m >= kTmaMinRows && wgmma_whole_tiles(tma_tiles(m, n), sm_count)) {
        plan.kernel = MarlinKernel::Tma;
        plan.rows = kTmaRows;
    } else {
        plan.rows = 128;
        plan.wgmma_warp_specialized = true;
    }
    return plan;
}

}  // namespace tl
