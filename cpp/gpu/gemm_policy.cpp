#include "gpu/gemm_policy.hpp"

#include <algorithm>

namespace tl {

int64_t cublas_min_m_for(int32_t k, int32_t n, int32_t setting) {
    if (setting <= 0) return 0;
    const int64_t elements = static_cast<int64_t>(k) * n;
    int64_t min_m = setting;
    if (elements <= kSmallWeightElements) min_m = std::min(min_m, kSmallWeightCublasMinM);
    if (elements >= kLargeWeightElements) min_m *= 2;
    return min_m;
}

const char *marlin_kernel_name(MarlinKernel kernel) {
    switch (kernel) {
        case MarlinKernel::Skinny: return "skinny";
        case MarlinKernel::Medium: return "medium";
        case MarlinKernel::Wide: return "wide";
        case MarlinKernel::Wgmma: return "wgmma";
        case MarlinKernel::Stream: return "stream";
    }
    return "?";
}

MarlinTuning clamped(MarlinTuning t) {
    t.medium_max_m = std::clamp(t.medium_max_m, 16, 64);
    t.wgmma_min_m = std::max(17, t.wgmma_min_m);
    t.wgmma_split_max_kn = std::max(0LL, t.wgmma_split_max_kn);
    t.stream_slices_per_warp = std::max(-1, t.stream_slices_per_warp);
    t.stream_stages = t.stream_stages <= 0 ? 0 : std::max(2, t.stream_stages);
    t.max_blocks_per_sm = t.max_blocks_per_sm >= 2 ? 2 : 1;
    return t;
}

int wgmma_min_m_for(int32_t k, int32_t n, const MarlinTuning &tuning) {
    const bool small = static_cast<long long>(k) * n <= kWgmmaSmallKN;
    return small && tuning.wgmma_min_m != INT_MAX ? std::min(tuning.wgmma_min_m, 17) : tuning.wgmma_min_m;
}

int wide_rows(int64_t m) { return m <= 8 ? 8 : m <= 16 ? 16 : m <= 32 ? 32 : 64; }

MarlinPlan plan_marlin(int64_t m, int32_t k, int32_t n, int32_t group_size, const MarlinTuning &tuning) {
    MarlinPlan plan;
    if (m >= wgmma_min_m_for(k, n, tuning)) {  // at least 17 rows
        plan.wgmma = true;
        plan.wgmma_rows = m <= 64 ? 64 : 128;
        plan.wgmma_warpgroups = m > 64 || static_cast<long long>(k) * n <= tuning.wgmma_split_max_kn ? 2 : 1;
        plan.wgmma_warp_specialized = m > 64 && tuning.wgmma_warp_specialized;
    }
    if (m <= 16) {
        plan.kernel = tuning.stream_slices_per_warp >= 0 ? MarlinKernel::Stream : MarlinKernel::Skinny;
        plan.rows = wide_rows(m);
        // 128-deep slices halve the per-slice overhead of the 8-row kernel; two 16-row blocks of three such stages
        // would not fit an SM's shared memory, so 16 rows keep 64.
        plan.slice_k = plan.rows == 8 && k % 128 == 0 && group_size % 128 == 0 ? 128 : 64;
    } else if (m <= tuning.medium_max_m) {
        // One tile covers every row, so the weights are read once: the smallest tile that covers M.
        plan.kernel = MarlinKernel::Medium;
        const bool split = tuning.medium_variant == MediumVariant::Split ||
                           (tuning.medium_variant == MediumVariant::Auto && m <= kMediumSplitMaxM);
        plan.medium_split = split;
        plan.rows = split ? (m <= 24 ? 24 : m <= 32 ? 32 : m <= 48 ? 48 : 64) : (m <= 32 ? 32 : m <= 48 ? 48 : 64);
    } else {
        plan.kernel = MarlinKernel::Wide;
        plan.rows = wide_rows(m);
    }
    return plan;
}

}  // namespace tl
