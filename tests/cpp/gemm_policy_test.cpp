// The GEMM dispatcher's policy (cpp/gpu/gemm_policy.hpp) on a table of cases: the row count from which dequantize +
// cuBLAS runs, and the Marlin-class kernel and tile for each M, with the default tuning and with the knobs moved.
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
using tl::MarlinTuning;

TEST(GemmPolicy, CublasMinM) {
    struct Case {
        int32_t k, n, setting;
        int64_t min_m;
    };
    // 2048 x 6144 (2B qkv, 12.6M) and 4096 x 6144 (8B qkv, 25.2M) are small; 4096 x 28672 (8B gate+up, 117M) is
    // neither; 8192 x 57344 (70B gate+up, 470M) and 8192 x 16384 (exactly 2^27) are large.
    const Case cases[] = {{2048, 6144, 512, 128},   {4096, 6144, 512, 128},    {8192, 4096, 512, 128},
                          {8192, 4160, 512, 512},   {4096, 28672, 512, 512},   {8192, 16384, 512, 1024},
                          {8192, 57344, 512, 1024}, {2048, 6144, 100, 100},    {4096, 28672, 100, 100},
                          {8192, 57344, 100, 200},  {2048, 6144, 0, 0},        {8192, 57344, 0, 0},
                          {2048, 6144, INT32_MAX, 128}, {4096, 28672, INT32_MAX, INT32_MAX}};
    for (const Case &c : cases) {
        EXPECT_EQ(tl::cublas_min_m_for(c.k, c.n, c.setting), c.min_m)
            << "K " << c.k << ", N " << c.n << ", setting " << c.setting;
    }
}

TEST(GemmPolicy, WgmmaBound) {
    const MarlinTuning defaults;
    EXPECT_EQ(tl::wgmma_min_m_for(2048, 16384, defaults), 17);   // 2^25: small
    EXPECT_EQ(tl::wgmma_min_m_for(2048, 16448, defaults), 33);   // just above
    EXPECT_EQ(tl::wgmma_min_m_for(8192, 57344, defaults), 33);
    MarlinTuning t;
    t.wgmma_min_m = 48;
    EXPECT_EQ(tl::wgmma_min_m_for(2048, 6144, t), 17);
    EXPECT_EQ(tl::wgmma_min_m_for(4096, 28672, t), 48);
    t.wgmma_min_m = INT_MAX;  // never, whatever the weight
    EXPECT_EQ(tl::wgmma_min_m_for(2048, 6144, t), INT_MAX);
    EXPECT_EQ(tl::wgmma_min_m_for(4096, 28672, t), INT_MAX);
}

// One row of the table: the call and the tuning, then the expected plan.
struct PlanCase {
    int64_t m;
    int32_t k, n, group_size;
    MarlinTuning tuning;
    bool wgmma;
    int wgmma_rows, wgmma_warpgroups;
    bool warp_specialized;
    MarlinKernel kernel;
    int rows;
    bool medium_split;
    int slice_k;
};

MarlinTuning tuned(void (*edit)(MarlinTuning &)) {
    MarlinTuning t;
    edit(t);
    return t;
}

std::string describe(const PlanCase &c) {
    return "M " + std::to_string(c.m) + ", K " + std::to_string(c.k) + ", N " + std::to_string(c.n) + ", group " +
           std::to_string(c.group_size);
}

TEST(GemmPolicy, MarlinPlanTable) {
    const MarlinTuning d;  // the policy as shipped
    const MarlinKernel S = MarlinKernel::Stream, K = MarlinKernel::Skinny, Md = MarlinKernel::Medium,
                       W = MarlinKernel::Wide;
    // Llama-8B gate+up (4096 x 28672, 117M: not small, two blocks per SM up to 64 rows) and 2B qkv (2048 x 6144,
    // small: wgmma from 17 rows, split over two warpgroups).
    const PlanCase cases[] = {
        // M <= 16: the stream kernel; 128-deep slices at 8 rows when 128 divides K and the group size.
        {1, 4096, 28672, 128, d, false, 0, 0, false, S, 8, false, 128},
        {8, 4096, 28672, 32, d, false, 0, 0, false, S, 8, false, 64},
        {9, 4096, 28672, 128, d, false, 0, 0, false, S, 16, false, 64},
        {16, 2048, 6144, 2048, d, false, 0, 0, false, S, 16, false, 64},
        {1, 4096, 28672, 4096, d, false, 0, 0, false, S, 8, false, 128},  // per column
        {1, 4160, 1024, 4160, d, false, 0, 0, false, S, 8, false, 64},    // 128 does not divide K
        // 16 < M < 33 on a weight that is not small: the medium kernel, split up to 24 rows, then wide-warp.
        {17, 4096, 28672, 128, d, false, 0, 0, false, Md, 24, true, 64},
        {24, 4096, 28672, 128, d, false, 0, 0, false, Md, 24, true, 64},
        {25, 4096, 28672, 128, d, false, 0, 0, false, Md, 32, false, 64},
        {32, 4096, 28672, 128, d, false, 0, 0, false, Md, 32, false, 64},
        // From 33 rows: wgmma first (64-row tiles, one warpgroup: K·N > 2^26), the medium kernel if it refuses.
        {33, 4096, 28672, 128, d, true, 64, 1, false, Md, 48, false, 64},
        {64, 4096, 28672, 128, d, true, 64, 1, false, Md, 64, false, 64},
        // Above 64 rows: 128-row warp-specialized wgmma tiles, then the wide kernel (64-row tiles).
        {65, 4096, 28672, 128, d, true, 128, 2, true, W, 64, false, 64},
        {4096, 4096, 28672, 128, d, true, 128, 2, true, W, 64, false, 64},
        // A small weight: wgmma from 17 rows, its 64-row tiles split over two warpgroups.
        {17, 2048, 6144, 128, d, true, 64, 2, false, Md, 24, true, 64},
        {40, 2048, 6144, 2048, d, true, 64, 2, false, Md, 48, false, 64},
        // 8B down (14336 x 4096 = 58.7M <= 2^26): split, from 33 rows.
        {32, 14336, 4096, 128, d, false, 0, 0, false, Md, 32, false, 64},
        {48, 14336, 4096, 128, d, true, 64, 2, false, Md, 48, false, 64},
        // The knobs: never the stream kernel; never the medium kernel; never wgmma; the medium variants forced; the
        // wgmma split and warp specialization turned off.
        {4, 4096, 28672, 128, tuned([](MarlinTuning &t) { t.stream_slices_per_warp = -1; }), false, 0, 0, false, K, 8,
         false, 128},
        {40, 4096, 28672, 128, tuned([](MarlinTuning &t) { t.medium_max_m = 16; }), true, 64, 1, false, W, 64, false,
         64},
        {20, 4096, 28672, 128, tuned([](MarlinTuning &t) { t.medium_max_m = 16; }), false, 0, 0, false, W, 32, false,
         64},
        {40, 2048, 6144, 128, tuned([](MarlinTuning &t) { t.wgmma_min_m = INT_MAX; }), false, 0, 0, false, Md, 48,
         false, 64},
        {20, 4096, 28672, 128, tuned([](MarlinTuning &t) { t.medium_variant = tl::MediumVariant::Wide; }), false, 0, 0,
         false, Md, 32, false, 64},
        {40, 4096, 28672, 128, tuned([](MarlinTuning &t) {
             t.medium_variant = tl::MediumVariant::Split;
             t.wgmma_min_m = INT_MAX;
         }),
         false, 0, 0, false, Md, 48, true, 64},
        {40, 2048, 6144, 128, tuned([](MarlinTuning &t) { t.wgmma_split_max_kn = 0; }), true, 64, 1, false, Md, 48,
         false, 64},
        {200, 2048, 6144, 128, tuned([](MarlinTuning &t) { t.wgmma_warp_specialized = false; }), true, 128, 2, false,
         W, 64, false, 64},
    };
    for (const PlanCase &c : cases) {
        SCOPED_TRACE(describe(c));
        const MarlinPlan p = tl::plan_marlin(c.m, c.k, c.n, c.group_size, c.tuning);
        EXPECT_EQ(p.wgmma, c.wgmma);
        EXPECT_EQ(p.wgmma_rows, c.wgmma_rows);
        EXPECT_EQ(p.wgmma_warpgroups, c.wgmma_warpgroups);
        EXPECT_EQ(p.wgmma_warp_specialized, c.warp_specialized);
        EXPECT_EQ(p.kernel, c.kernel) << tl::marlin_kernel_name(p.kernel);
        EXPECT_EQ(p.rows, c.rows);
        EXPECT_EQ(p.medium_split, c.medium_split);
        EXPECT_EQ(p.slice_k, c.slice_k);
    }
}

// Tiles cover M: every plan's kernel tile (and the wgmma tile) holds at least min(M, 64) rows, so a medium call reads
// the weights once and larger calls use the largest tiles.
TEST(GemmPolicy, TilesCoverTheRows) {
    const MarlinTuning d;
    for (int64_t m = 1; m <= 300; ++m) {
        for (const int32_t k : {2048, 4096}) {
            const MarlinPlan p = tl::plan_marlin(m, k, 28672, 128, d);
            EXPECT_GE(p.rows, std::min<int64_t>(m, 64)) << "M " << m;
            if (p.wgmma) {
                EXPECT_GE(p.wgmma_rows, std::min<int64_t>(m, 128)) << "M " << m;
            }
            EXPECT_EQ(p.kernel == MarlinKernel::Medium, m > 16 && m <= 64) << "M " << m;
        }
    }
}

TEST(GemmPolicy, TuningIsClampedIntoItsRanges) {
    MarlinTuning t;
    t.medium_max_m = 200;
    t.wgmma_min_m = 3;
    t.wgmma_split_max_kn = -5;
    t.stream_slices_per_warp = -9;
    t.stream_stages = 1;
    t.max_blocks_per_sm = 7;
    const MarlinTuning c = tl::clamped(t);
    EXPECT_EQ(c.medium_max_m, 64);
    EXPECT_EQ(c.wgmma_min_m, 17);
    EXPECT_EQ(c.wgmma_split_max_kn, 0);
    EXPECT_EQ(c.stream_slices_per_warp, -1);
    EXPECT_EQ(c.stream_stages, 2);
    EXPECT_EQ(c.max_blocks_per_sm, 2);
    t.medium_max_m = 3;
    t.stream_stages = 0;
    t.max_blocks_per_sm = 0;
    EXPECT_EQ(tl::clamped(t).medium_max_m, 16);
    EXPECT_EQ(tl::clamped(t).stream_stages, 0);
    EXPECT_EQ(tl::clamped(t).max_blocks_per_sm, 1);
}

}  // namespace
