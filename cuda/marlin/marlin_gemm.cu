// The public launcher of the Marlin-class GEMM: argument and shape checks, tile-height choice, dispatch to the
// instantiation. The kernel is in marlin_kernel.cuh.
#include "../gpu_common.cuh"
#include "marlin.cuh"
#include "marlin_pack.hpp"

namespace tl::gpu {

namespace {

std::atomic<int> g_max_blocks_per_sm{2};

template <int MB, bool FUSED>
int pick_groups(int gpt, const marlin::Params &p, const marlin::LaunchEnv &env) {
    return gpt == 2 ? marlin::launch<MB, FUSED, 2>(p, env) : marlin::launch<MB, FUSED, 1>(p, env);
}

template <bool FUSED>
int pick_rows(int mb, int gpt, const marlin::Params &p, const marlin::LaunchEnv &env) {
    switch (mb) {
        case 1: return pick_groups<1, FUSED>(gpt, p, env);
        case 2: return pick_groups<2, FUSED>(gpt, p, env);
        default: return pick_groups<4, FUSED>(gpt, p, env);
    }
}

}  // namespace

void marlin_set_max_blocks_per_sm(int blocks) {
    g_max_blocks_per_sm.store(blocks >= 2 ? 2 : 1, std::memory_order_relaxed);
}

size_t marlin_workspace_bytes(int sm_count) {
    // grid * MB <= 4 * SMs: two blocks per SM for MB = 1, one for MB = 2 and 4 (partial sums of MB row blocks each).
    const size_t counters = (static_cast<size_t>(sm_count) * sizeof(int) + 255) / 256 * 256;
    return counters + static_cast<size_t>(4 * sm_count) * marlin::kPartialFloats * sizeof(float);
}

int marlin_gemm(const uint16_t *x, const uint32_t *words, const uint16_t *scales, const uint16_t *zeros, uint16_t *y,
                int m, int n, int k, int gs, bool fused, void *workspace, size_t workspace_bytes, cudaStream_t stream) {
    if (x == nullptr || words == nullptr || scales == nullptr || y == nullptr || workspace == nullptr ||
        (fused && zeros == nullptr)) {
        return kRcBadArgument;
    }
    if (m < 1 || n < 1 || k < 1 || !aligned16(x) || !aligned16(words) || !aligned16(scales) || !aligned16(y) ||
        (fused && !aligned16(zeros)) || !aligned16(workspace)) {
        return kRcBadArgument;
    }
    const int group_size = gs == -1 ? k : gs;
    if (group_size < 1 || marlin_shape_error(k, n, group_size) != nullptr) return kRcUnsupported;

    DeviceInfo dev;
    if (const int rc = current_device_info(dev)) return rc;
    const int gpt = group_size == 32 ? 2 : 1;
    // Tile height: the smallest that covers M (up to 64 rows), lowered if even a 3-stage pipeline would not fit.
    int mb = m <= 16 ? 1 : m <= 32 ? 2 : 4;
    auto fits = [&](int rows) {
        return marlin::kMinStages * marlin::stage_bytes(rows, fused, gpt) + marlin::kStaticSmemReserve <=
               dev.max_smem_optin;
    };
    while (mb > 1 && !fits(mb)) mb /= 2;
    if (!fits(mb)) return kRcUnsupported;

    marlin::Params p{};
    p.x = x;
    p.words = words;
    p.scales = scales;
    p.zeros = fused ? zeros : nullptr;
    p.y = y;
    p.m = m;
    p.n = n;
    p.k = k;
    p.group_size = group_size;
    p.m_slices = (m + mb * 16 - 1) / (mb * 16);
    p.k_tiles = k / marlin::kTileK;
    const int n_tiles = (n + marlin::kTileN - 1) / marlin::kTileN;
    p.total_iters = static_cast<long long>(p.m_slices) * n_tiles * p.k_tiles;
    const marlin::LaunchEnv env{dev.device,        dev.sm_count,
                                dev.max_smem_optin, dev.smem_per_sm,
                                g_max_blocks_per_sm.load(std::memory_order_relaxed),
                                workspace,          workspace_bytes,
                                stream};
    return fused ? pick_rows<true>(mb, gpt, p, env) : pick_rows<false>(mb, gpt, p, env);
}

}  // namespace tl::gpu
