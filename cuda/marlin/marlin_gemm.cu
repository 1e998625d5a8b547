// The public launcher of the Marlin-class GEMM: argument and shape checks, then the kernel and tile that
// plan_marlin (cpp/gpu/gemm_policy.hpp) chooses, with its fallbacks, dispatched to the instantiation. The kernels:
// marlin_stream.cuh and marlin_skinny.cuh (M <= 16), marlin_medium.cuh (16 < M <= 64), marlin_kernel.cuh (any M);
// on compute capability 9.0, marlin_wgmma.cu.
#include "../gpu_common.cuh"
#include "marlin.cuh"
#include "gpu/gemm_policy.hpp"
#include "gpu/marlin_pack.hpp"

namespace tl::gpu::marlin {
// The medium kernel's wide-warp mainloop (marlin_medium.cuh; instantiated in marlin_medium_{fused,symmetric}.cu):
// NB = 4, 6, 8 row tiles per warp, one warp per strip.
template <int NB, bool FUSED, int GPT>
int launch_medium_wide(Params p, const LaunchEnv &env);
}  // namespace tl::gpu::marlin

namespace tl::gpu {

namespace {

// The tuning, field by field: a launch reads it without a lock (a concurrent set_marlin_tuning may mix old and new
// fields, which changes only which kernel runs, never the result).
std::atomic<int> g_max_blocks_per_sm{2};
std::atomic<int> g_medium_max_m{kMarlinMediumMaxM};
std::atomic<int> g_wgmma_min_m{kMarlinWgmmaMinM};
std::atomic<int> g_stream_slices_per_warp{0};
std::atomic<int> g_stream_stages{0};
std::atomic<long long> g_wgmma_split_max_kn{kWgmmaSplitMaxKN};
std::atomic<bool> g_wgmma_warp_specialized{true};
std::atomic<int> g_medium_variant{static_cast<int>(MediumVariant::Auto)};
std::atomic<uint64_t> g_launches[5];  // by MarlinKernel

template <int MB, bool FUSED>
int pick_groups(int gpt, const marlin::Params &p, const marlin::LaunchEnv &env) {
    return gpt == 2 ? marlin::launch<MB, FUSED, 2>(p, env) : marlin::launch<MB, FUSED, 1>(p, env);
}
template <int NB, bool FUSED>
int pick_skinny_groups(int gpt, const marlin::Params &p, const marlin::LaunchEnv &env) {
    return gpt == 2 ? marlin::launch_skinny<NB, FUSED, 2, 4>(p, env) : marlin::launch_skinny<NB, FUSED, 1, 4>(p, env);
}

template <int NB, int WM, bool FUSED>
int pick_medium_groups(int gpt, const marlin::Params &p, const marlin::LaunchEnv &env) {
    return gpt == 2 ? marlin::launch_medium<NB, WM, FUSED, 2>(p, env) : marlin::launch_medium<NB, WM, FUSED, 1>(p, env);
}
// The split medium kernel's tile height: 24, 32 (one warp per strip), 48 or 64 rows (two).
template <bool FUSED>
int pick_medium_rows(int rows_per_tile, int gpt, const marlin::Params &p, const marlin::LaunchEnv &env) {
    switch (rows_per_tile) {
        case 24: return pick_medium_groups<3, 1, FUSED>(gpt, p, env);
        case 32: return pick_medium_groups<4, 1, FUSED>(gpt, p, env);
        case 48: return pick_medium_groups<3, 2, FUSED>(gpt, p, env);
        default: return pick_medium_groups<4, 2, FUSED>(gpt, p, env);
    }
}
template <int NB, bool FUSED>
int pick_medium_wide_groups(int gpt, const marlin::Params &p, const marlin::LaunchEnv &env) {
    return gpt == 2 ? marlin::launch_medium_wide<NB, FUSED, 2>(p, env)
                    : marlin::launch_medium_wide<NB, FUSED, 1>(p, env);
}
// The wide-warp medium kernel's tile height: 32, 48 or 64 rows, all in one warp per strip.
template <bool FUSED>
int pick_medium_wide_rows(int rows_per_tile, int gpt, const marlin::Params &p, const marlin::LaunchEnv &env) {
    switch (rows_per_tile) {
        case 32: return pick_medium_wide_groups<4, FUSED>(gpt, p, env);
        case 48: return pick_medium_wide_groups<6, FUSED>(gpt, p, env);
        default: return pick_medium_wide_groups<8, FUSED>(gpt, p, env);
    }
}

// The stream kernel for M <= 16 (NB = 1: M <= 8, 2: M <= 16); GPS from the group size (0: not one it takes).
template <bool FUSED>
int pick_stream(int m, int group_size, const marlin::Params &p, const marlin::LaunchEnv &env) {
    const int gps = group_size == 32 ? 4 : group_size == 64 ? 2 : group_size % 128 == 0 ? 1 : 0;
    if (gps == 0) return kRcUnsupported;
    if (m <= 8) {
        return gps == 4 ? marlin::launch_stream<1, FUSED, 4>(p, env)
               : gps == 2 ? marlin::launch_stream<1, FUSED, 2>(p, env)
                          : marlin::launch_stream<1, FUSED, 1>(p, env);
    }
    return gps == 4 ? marlin::launch_stream<2, FUSED, 4>(p, env)
           : gps == 2 ? marlin::launch_stream<2, FUSED, 2>(p, env)
                      : marlin::launch_stream<2, FUSED, 1>(p, env);
}

// rows_per_tile: 8 or 16 (skinny kernel), 32 or 64; slice_k: 64, or 128 (8 rows, group size a multiple of 128).
template <bool FUSED>
int pick_rows(int rows_per_tile, int slice_k, int gpt, const marlin::Params &p, const marlin::LaunchEnv &env) {
    switch (rows_per_tile) {
        case 8:
            return slice_k == 128 ? marlin::launch_skinny<1, FUSED, 1, 8>(p, env)
                                  : pick_skinny_groups<1, FUSED>(gpt, p, env);
        case 16: return pick_skinny_groups<2, FUSED>(gpt, p, env);
        case 32: return pick_groups<2, FUSED>(gpt, p, env);
        default: return pick_groups<4, FUSED>(gpt, p, env);
    }
}

}  // namespace

MarlinTuning marlin_tuning() {
    MarlinTuning t;
    t.max_blocks_per_sm = g_max_blocks_per_sm.load(std::memory_order_relaxed);
    t.medium_max_m = g_medium_max_m.load(std::memory_order_relaxed);
    t.wgmma_min_m = g_wgmma_min_m.load(std::memory_order_relaxed);
    t.stream_slices_per_warp = g_stream_slices_per_warp.load(std::memory_order_relaxed);
    t.stream_stages = g_stream_stages.load(std::memory_order_relaxed);
    t.wgmma_split_max_kn = g_wgmma_split_max_kn.load(std::memory_order_relaxed);
    t.wgmma_warp_specialized = g_wgmma_warp_specialized.load(std::memory_order_relaxed);
    t.medium_variant = static_cast<MediumVariant>(g_medium_variant.load(std::memory_order_relaxed));
    return t;
}

void set_marlin_tuning(const MarlinTuning &tuning) {
    const MarlinTuning t = clamped(tuning);
    g_max_blocks_per_sm.store(t.max_blocks_per_sm, std::memory_order_relaxed);
    g_medium_max_m.store(t.medium_max_m, std::memory_order_relaxed);
    g_wgmma_min_m.store(t.wgmma_min_m, std::memory_order_relaxed);
    g_stream_slices_per_warp.store(t.stream_slices_per_warp, std::memory_order_relaxed);
    g_stream_stages.store(t.stream_stages, std::memory_order_relaxed);
    g_wgmma_split_max_kn.store(t.wgmma_split_max_kn, std::memory_order_relaxed);
    g_wgmma_warp_specialized.store(t.wgmma_warp_specialized, std::memory_order_relaxed);
    g_medium_variant.store(static_cast<int>(t.medium_variant), std::memory_order_relaxed);
}

uint64_t marlin_launch_count(MarlinKernel kernel) {
    return g_launches[static_cast<int>(kernel)].load(std::memory_order_relaxed);
}

size_t marlin_workspace_bytes(int sm_count) {
    // Partial sums: at most 4 * SMs x 16-row blocks (two blocks per SM of <= 16 rows for M <= 16, one block of 32
    // or 64 rows above; the medium kernel: two blocks of <= 32 rows or one of <= 64; the wgmma kernel: two blocks of
    // 64 rows x 256 columns, or one of 64 or 128 rows); counters for up to two blocks per SM. The stream kernel lays
    // its per-strip sums over the same bytes (N / 64 x 2 KB, or 4 KB for M > 8: N up to ~270K columns on 132 SMs;
    // beyond, it refuses and the skinny kernel runs).
    const size_t counters = (static_cast<size_t>(2 * sm_count) * sizeof(int) + 255) / 256 * 256;
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
    if (static_cast<long long>(k) * n >= (1LL << 36)) return kRcUnsupported;  // the skinny kernel's 32-bit offsets

    DeviceInfo dev;
    if (const int rc = current_device_info(dev)) return rc;
    const int gpt = group_size == 32 ? 2 : 1;
    const MarlinTuning tuning = marlin_tuning();
    const MarlinPlan plan = plan_marlin(m, k, n, group_size, tuning);
    marlin::LaunchEnv env{};
    env.device = dev.device;
    env.compute_capability = dev.compute_capability;
    env.sm_count = dev.sm_count;
    env.max_smem_optin = dev.max_smem_optin;
    env.smem_per_sm = dev.smem_per_sm;
    env.max_blocks_per_sm = tuning.max_blocks_per_sm;
    env.stream_slices_per_warp = tuning.stream_slices_per_warp;
    env.stream_stages = tuning.stream_stages;
    env.workspace = workspace;
    env.workspace_bytes = workspace_bytes;
    env.stream = stream;
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
    if (plan.wgmma) {
        const int rc = marlin::launch_wgmma(p, env, plan, fused, gpt);
        if (rc >= 0) return counted(rc, MarlinKernel::Wgmma);  // refused: the kernel for M below runs
    }
    const int n_tiles = (n + marlin::kTileN - 1) / marlin::kTileN;
    MarlinKernel kernel = plan.kernel;
    if (kernel == MarlinKernel::Medium) {
        if (marlin::kMinStages * marlin::medium_stage_bytes(plan.rows, fused, gpt) + marlin::kStaticSmemReserve <=
            dev.max_smem_optin) {
            p.m_slices = 1;
            p.k_tiles = k / marlin::kTileK;
            p.total_iters = static_cast<long long>(n_tiles) * p.k_tiles;
            const int rc = plan.medium_split
                               ? (fused ? pick_medium_rows<true>(plan.rows, gpt, p, env)
                                        : pick_medium_rows<false>(plan.rows, gpt, p, env))
                               : (fused ? pick_medium_wide_rows<true>(plan.rows, gpt, p, env)
                                        : pick_medium_wide_rows<false>(plan.rows, gpt, p, env));
            if (rc >= 0) return counted(rc, kernel);
        }
        kernel = MarlinKernel::Wide;  // refused (shared memory): the wide kernel takes any M
    }
    if (kernel == MarlinKernel::Stream) {
        const int rc = fused ? pick_stream<true>(m, group_size, p, env) : pick_stream<false>(m, group_size, p, env);
        if (rc >= 0) return counted(rc, kernel);  // refused (K, group size, shared memory, workspace): skinny
        kernel = MarlinKernel::Skinny;
    }
    // The plan's tile height (the wide kernel's for a medium call that fell through), halved while even a 3-stage
    // pipeline would not fit (not below 32 rows).
    int rows = kernel == MarlinKernel::Wide ? wide_rows(m) : plan.rows;
    auto fits = [&](int r) {
        const int stage =
            r <= 16 ? marlin::skinny_stage_bytes(r / 8, fused, gpt, 4) : marlin::stage_bytes(r / 16, fused, gpt);
        return marlin::kMinStages * stage + marlin::kStaticSmemReserve <= dev.max_smem_optin;
    };
    while (rows > 32 && !fits(rows)) rows /= 2;
    if (!fits(rows)) return kRcUnsupported;
    const int slice_k = rows == plan.rows ? plan.slice_k : marlin::kTileK;

    p.m_slices = (m + rows - 1) / rows;
    p.k_tiles = k / slice_k;
    p.total_iters = static_cast<long long>(p.m_slices) * n_tiles * p.k_tiles;
    return counted(fused ? pick_rows<true>(rows, slice_k, gpt, p, env) : pick_rows<false>(rows, slice_k, gpt, p, env),
                   kernel);
}

}  // namespace tl::gpu
