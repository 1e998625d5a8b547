#include "gpu/gemm_policy.hpp"

#include <algorithm>

namespace tl {

int64_t cublas_min_m_for(int32_t k, int32_t n, int32_t setting, bool hopper) {
    if (setting <= 0) return 0;
    const int64_t elements = static_cast<int64_t>(k) * n;
    int64_t min_m = setting;
    if (elements <= (hopper ? kHopperSmallWeightElements : kSmallWeightElements)) {
        min_m = std::min(min_m, kSmallWeightCublasMinM);
    } else if (hopper) {
        min_m *= kHopperCublasFactor;
    }
    if (elements >= kLargeWeightElements) min_m *= 2;
    return min_m;
}

}  // namespace tl
