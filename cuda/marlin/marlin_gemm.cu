// The public launcher of the Marlin-class GEMM: argument and shape checks, then the kernel and tile that
// plan_marlin (marlin_plan.hpp) chooses, with its fallbacks, dispatched to the instantiation. The kernels:
// marlin_stream.cuh (M <= 16), marlin_wgmma.cu (M > 16 on compute capability 9.0), marlin_kernel.cuh (the classic
// kernel: any M, and the others' fallback).
#include "../gpu_common.cuh"
#include "marlin.cuh"
#include "marlin_layout.hpp"
#include "marlin_plan.hpp"

namespace tl::gpu {

namespace {

std::atomic<uint64_t> g_launches[kMarlinKernels];  // by MarlinKernel

template <int MB, bool FUSED, Dtype D>
int pick_groups(int gpt, const marlin::Params &p, const marlin::LaunchEnv &env) {
    return gpt == 2 ? marlin::launch<MB, FUSED, 2, D>(p, env) : marlin::launch<MB, FUSED, 1, D>(p, env);
}
template <int MB>
int pick_classic(bool fused, Dtype dtype, int gpt, const marlin::Params &p, const marlin::LaunchEnv &env) {
    if (dtype == Dtype::BF16) return pick_groups<MB, true, Dtype::BF16>(gpt, p, env);  // fused (checked by the caller)
    return fused ? pick_groups<MB, true, Dtype::F16>(gpt, p, env) : pick_groups<MB, false, Dtype::F16>(gpt, p, env);
}

// The stream kernel for M <= 16 (NB = 1: M <= 8, 2: M <= 16); GPS from the group size (0: not one it takes).
template <bool FUSED, Dtype D>
int pick_stream(int m, int group_size, const marlin::Params &p, const marlin::LaunchEnv &env) {
    const int gps = group_size == 32 ? 4 : group_size == 64 ? 2 : group_size % 128 == 0 ? 1 : 0;
    if (gps == 0) return kRcUnsupported;
    if (m <= 8) {
        return gps == 4 ? marlin::launch_stream<1, FUSED, 4, D>(p, env)
               : gps == 2 ? marlin::launch_stream<1, FUSED, 2, D>(p, env)
                          : marlin::launch_stream<1, FUSED, 1, D>(p, env);
    }
    return gps == 4 ? marlin::launch_stream<2, FUSED, 4, D>(p, env)
           : gps == 2 ? marlin::launch_stream<2, FUSED, 2, D>(p, env)
                      : marlin::launch_stream<2, FUSED, 1, D>(p, env);
}

}  // namespace

uint64_t marlin_launch_count(MarlinKernel kernel) {
    return g_launches[static_cast<int>(kernel)].load(std::memory_order_relaxed);
}

size_t marlin_workspace_bytes(int sm_count) {
    // Partial sums: at most 4 * SMs x 16-row blocks (the classic kernel: one block of 32 or 64 rows per SM; the wgmma
    // kernel: two blocks of 32 rows x 256 columns, or one of 32, 64 or 128 rows); counters for up to two blocks per
    // SM. The stream kernel lays its per-strip sums over the same bytes (N / 64 x 2 KB, or 4 KB for M > 8: N up to
    // ~270K columns on 132 SMs; beyond, it refuses and the classic kernel runs).
    const size_t counters = (static_cast<size_t>(2 * sm_count) * sizeof(int) + 255) / 256 * 256;
    return counters + static_cast<size_t>(4 * sm_count) * marlin::kPartialFloats * sizeof(float);
}

int marlin_gemm(const uint16_t *x, const uint32_t *words, const uint16_t *scales, const uint16_t *zeros, uint16_t *y,
                int m, int n, int k, int gs, bool fused, Dtype dtype, void *workspace, size_t workspace_bytes,
                cudaStream_t stream, const MarlinPlan *forced) {
    if (dtype == Dtype::BF16 && !fused) return kRcUnsupported;  // the correction form is FP16 alone
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
    if (static_cast<long long>(k) * n >= (1LL << 36)) return kRcUnsupported;  // 32-bit offsets of uint4 words

    DeviceInfo dev;
    if (const int rc = current_device_info(dev)) return rc;
    const int gpt = group_size == 32 ? 2 : 1;
    const bool wgmma_runs = marlin_wgmma_built() && dev.compute_capability == 90;
    const MarlinPlan plan = forced != nullptr ? *forced : plan_marlin(m, k, n, wgmma_runs, dev.sm_count);
    const marlin::LaunchEnv env = marlin::launch_env(dev, workspace, workspace_bytes, stream);
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
    auto counted = [](int rc, MarlinKernel kernel) {
        if (rc == 0) g_launches[static_cast<int>(kernel)].fetch_add(1, std::memory_order_relaxed);
        return rc;
    };
    if (plan.kernel == MarlinKernel::Wgmma) {
        const int rc = marlin::launch_wgmma(p, env, plan, fused, gpt, dtype);
        if (rc >= 0) return counted(rc, MarlinKernel::Wgmma);  // refused: the classic kernel runs
    } else if (plan.kernel == MarlinKernel::Tma) {
        const int rc = marlin::launch_tma(p, env, plan, fused, gpt, dtype);
        if (rc >= 0) return counted(rc, MarlinKernel::Tma);  // refused: the classic kernel runs
    } else if (plan.kernel == MarlinKernel::Stream) {
        const int rc = dtype == Dtype::BF16 ? pick_stream<true, Dtype::BF16>(m, group_size, p, env)
                       : fused               ? pick_stream<true, Dtype::F16>(m, group_size, p, env)
                                             : pick_stream<false, Dtype::F16>(m, group_size, p, env);
        if (rc >= 0) return counted(rc, MarlinKernel::Stream);  // refused (M, K, group size, shared memory, workspace)
    }
    // The classic kernel: the plan's tile height (or, as a fallback, the one for M), halved while even a 3-stage
    // pipeline would not fit (not below 32 rows).
    int rows = plan.kernel == MarlinKernel::Classic ? plan.rows : classic_plan(m).rows;
    auto fits = [&](int r) {
        return marlin::kMinStages * marlin::stage_bytes(r / 16, fused, gpt) + marlin::kStaticSmemReserve <=
               dev.max_smem_optin;
    };
    if (rows != 32 && rows != 64) return kRcUnsupported;
    while (rows > 32 && !fits(rows)) rows /= 2;
    if (!fits(rows)) return kRcUnsupported;
    const int n_tiles = (n + marlin::kTileN - 1) / marlin::kTileN;
    p.m_slices = (m + rows - 1) / rows;
    p.k_tiles = k / marlin::kTileK;
    p.total_iters = static_cast<long long>(p.m_slices) * n_tiles * p.k_tiles;
    const int rc = rows == 32 ? pick_classic<2>(fused, dtype, gpt, p, env) : pick_classic<4>(fused, dtype, gpt, p, env);
    return counted(rc, MarlinKernel::Classic);
}

}  // namespace tl::gpu
