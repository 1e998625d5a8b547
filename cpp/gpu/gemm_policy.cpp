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
        case MarlinKernel::Stream: return "stream";
        case MarlinKernel::Classic: return "classic";
        case MarlinKernel::Wgmma: return "wgmma";
    }
    return "?";
}

bool wgmma_whole_tiles(long long tiles, long long slots) {
    if (tiles <= 0 || slots <= 0) return false;
    const long long waves = (tiles + slots - 1) / slots;
    return static_cast<double>(tiles) >= kWholeTileFill * static_cast<double>(waves * slots);
}

MarlinPlan classic_plan(int64_t m) {
    MarlinPlan plan;
    plan.kernel = MarlinKernel::Classic;
    plan.rows = m <= 32 ? 32 : 64;
    return plan;
}

MarlinPlan plan_marlin(int64_t m, int32_t k, int32_t n, bool wgmma_runs) {
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
