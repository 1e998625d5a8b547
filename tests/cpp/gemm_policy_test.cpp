// The GEMM dispatcher's policy (cpp/gpu/gemm_policy.hpp) on a table of cases: the row count from which dequantize +
// cuBLAS runs, and the Marlin-class kernel and tile for each M, with and without the wgmma kernel.
// Pure functions: these run on every machine, GPU or not. (Which kernel really ran on a GPU is checked by the launch
// counters in tests/gpu/marlin_test.cpp.)
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <string>

#include "gpu/gemm_policy.hpp"

namespace {

using tl::MarlinKernel;
using tl::MarlinPlan;

TEST(GemmPolicy, CublasMinM) {
    struct Case {
        int32_t k, n, setting;
        bool hopper;
        int64_t min_m;
    };
    // Without the Hopper kernels: 2048 x 6144 (2B qkv, 12.6M) and 4096 x 6144 (8B qkv, 25.2M) are small; 4096 x 28672
    // (8B gate+up, 117M) is neither; 8192 x 57344 (70B gate+up, 470M) and 8192 x 16384 (exactly 2^27) are large.
    // With them, small ends at 2^24 (8192 x 2048) and the others switch at 4x the setting (8x when large).
    const Case cases[] = {{2048, 6144, 512, false, 128},   {4096, 6144, 512, false, 128},
                          {8192, 4096, 512, false, 128},   {8192, 4160, 512, false, 512},
                          {4096, 28672, 512, false, 512},  {8192, 16384, 512, false, 1024},
                          {8192, 57344, 512, false, 1024}, {2048, 6144, 100, false, 100},
                          {4096, 28672, 100, false, 100},  {8192, 57344, 100, false, 200},
                          {2048, 6144, 0, false, 0},       {8192, 57344, 0, false, 0},
                          {2048, 6144, INT32_MAX, false, 128}, {4096, 28672, INT32_MAX, false, INT32_MAX},
                          {2048, 6144, 512, true, 128},    {8192, 2048, 512, true, 128},
                          {4096, 6144, 512, true, 2048},   {2048, 16384, 512, true, 2048},
                          {4096, 28672, 512, true, 2048},  {8192, 16384, 512, true, 4096},
                          {8192, 57344, 512, true, 4096},  {8192, 57344, 0, true, 0},
                          {4096, 28672, INT32_MAX, true, 4LL * INT32_MAX}};
    for (const Case &c : cases) {
        EXPECT_EQ(tl::cublas_min_m_for(c.k, c.n, c.setting, c.hopper), c.min_m)
            << "K " << c.k << ", N " << c.n << ", setting " << c.setting << (c.hopper ? ", Hopper" : "");
    }
}

// One row of the table: the call, then the expected plan.
struct PlanCase {
    int64_t m;
    int32_t k, n;
    bool wgmma_runs;
    MarlinKernel kernel;
    int rows, warpgroups;
    bool warp_specialized;
};

TEST(GemmPolicy, MarlinPlanTable) {
    const MarlinKernel S = MarlinKernel::Stream, C = MarlinKernel::Classic, W = MarlinKernel::Wgmma,
                       T = MarlinKernel::Tma;
    // Llama-8B gate+up (4096 x 28672, 117M > 2^26), 8B down (14336 x 4096, 58.7M: between 2^25 and 2^26), 2B qkv
    // (2048 x 6144, 12.6M <= 2^25), and exactly 2^25 / 2^26 (2048 x 16384, 4096 x 16384).
    const PlanCase cases[] = {
        // M <= 16: the stream kernel, 8 or 16 rows, on every GPU.
        {1, 4096, 28672, true, S, 8, 2, false},
        {8, 2048, 6144, true, S, 8, 2, false},
        {9, 4096, 28672, false, S, 16, 2, false},
        {16, 14336, 4096, true, S, 16, 2, false},
        // 17-32: 32-row wgmma tiles, one warpgroup above 2^26, two up to it; every warp copies.
        {17, 4096, 28672, true, W, 32, 1, false},
        {32, 4096, 28672, true, W, 32, 1, false},
        {17, 14336, 4096, true, W, 32, 2, false},
        {32, 4096, 16384, true, W, 32, 2, false},
        {32, 4096, 16448, true, W, 32, 1, false},
        // 33-64: 64-row tiles on two warpgroups, the copying warpgroup above 2^25.
        {33, 4096, 28672, true, W, 64, 2, true},
        {64, 14336, 4096, true, W, 64, 2, true},
        {64, 2048, 16384, true, W, 64, 2, false},
        {40, 2048, 16448, true, W, 64, 2, true},
        {48, 2048, 6144, true, W, 64, 2, false},
        // Above: 128-row tiles with the copying warpgroup, up to 128 rows and wherever the TMA kernel's tiles would not
        // fill the waves of 132 SMs.
        {65, 2048, 6144, true, W, 128, 2, true},
        {128, 4096, 28672, true, W, 128, 2, true},
        {256, 4096, 6144, true, W, 128, 2, true},      // 48 tiles
        {500, 2048, 4096, true, W, 128, 2, true},      // 64 tiles
        // From 129 rows: the TMA kernel's 256-row tiles where they fill the waves.
        {129, 2048, 16384, true, T, 256, 2, false},    // 128 tiles
        {256, 4096, 28672, true, T, 256, 2, false},    // 224 tiles, two waves at 0.85
        {1024, 4096, 6144, true, T, 256, 2, false},    // 192 tiles, two waves at 0.73
        {4096, 4096, 28672, true, T, 256, 2, false},
        // Without the wgmma kernel: the classic kernel, 32 rows up to M = 32, then 64.
        {17, 4096, 28672, false, C, 32, 2, false},
        {32, 2048, 6144, false, C, 32, 2, false},
        {33, 2048, 6144, false, C, 64, 2, false},
        {4096, 4096, 28672, false, C, 64, 2, false},
    };
    for (const PlanCase &c : cases) {
        SCOPED_TRACE("M " + std::to_string(c.m) + ", K " + std::to_string(c.k) + ", N " + std::to_string(c.n) +
                     (c.wgmma_runs ? ", wgmma" : ", no wgmma"));
        const MarlinPlan p = tl::plan_marlin(c.m, c.k, c.n, c.wgmma_runs, 132);
        EXPECT_EQ(p.kernel, c.kernel) << tl::marlin_kernel_name(p.kernel);
        EXPECT_EQ(p.rows, c.rows);
        if (p.kernel == MarlinKernel::Wgmma) {
            EXPECT_EQ(p.wgmma_warpgroups, c.warpgroups);
            EXPECT_EQ(p.wgmma_warp_specialized, c.warp_specialized);
        }
    }
}

// Whole tiles where every wave keeps 70% of the slots busy, stream-K below.
TEST(GemmPolicy, WgmmaWholeTiles) {
    EXPECT_TRUE(tl::wgmma_whole_tiles(112, 132));   // 0.85
    EXPECT_TRUE(tl::wgmma_whole_tiles(96, 132));    // 0.73
    EXPECT_FALSE(tl::wgmma_whole_tiles(86, 132));   // 0.65
    EXPECT_FALSE(tl::wgmma_whole_tiles(148, 132));  // two waves, 0.56
    EXPECT_TRUE(tl::wgmma_whole_tiles(224, 132));   // two waves, 0.85
    EXPECT_TRUE(tl::wgmma_whole_tiles(397, 132));   // four waves, 0.75
    EXPECT_TRUE(tl::wgmma_whole_tiles(132, 132));
    EXPECT_FALSE(tl::wgmma_whole_tiles(48, 264));
    EXPECT_FALSE(tl::wgmma_whole_tiles(0, 132));
    EXPECT_FALSE(tl::wgmma_whole_tiles(10, 0));
}

// Tiles cover M (up to 128 rows), so that calls up to that size read the weights once, and the classic kernel's
// plan (the fallback) never has a tile it lacks.
TEST(GemmPolicy, TilesCoverTheRows) {
    for (int64_t m = 1; m <= 300; ++m) {
        for (const bool wgmma : {false, true}) {
            for (const int32_t k : {2048, 4096}) {
                const MarlinPlan p = tl::plan_marlin(m, k, 28672, wgmma, 132);
                EXPECT_GE(p.rows, std::min<int64_t>(m, p.kernel == MarlinKernel::Classic ? 64 : 128)) << "M " << m;
                EXPECT_EQ(p.kernel == MarlinKernel::Stream, m <= 16) << "M " << m;
            }
        }
        const MarlinPlan fallback = tl::classic_plan(m);
        EXPECT_EQ(fallback.kernel, MarlinKernel::Classic);
        EXPECT_TRUE(fallback.rows == 32 || fallback.rows == 64) << "M " << m;
    }
}

}  // namespace
