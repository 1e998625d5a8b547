// The public launcher of the Marlin-class GEMM: argument and shape checks, kernel and tile-height choice, dispatch
// to the instantiation. The kernels: marlin_stream.cuh (M <= 16, where it applies; else marlin_skinny.cuh),
// marlin_medium.cuh (16 < M <= 64, see marlin_set_medium_max_m), marlin_kernel.cuh (above); on compute capability
// 9.0, marlin_wgmma.cu from marlin_wgmma_min_m_for(K, N) rows.
#include <climits>
#include <cstdlib>
#include <cstring>

#include "../gpu_common.cuh"
#include "marlin.cuh"
#include "gpu/marlin_pack.hpp"

namespace tl::gpu::marlin {
// The medium kernel's wide-warp mainloop (marlin_medium.cuh; instantiated in marlin_medium_{fused,symmetric}.cu):
// NB = 4, 6, 8 row tiles per warp, one warp per strip.
template <int NB, bool FUSED, int GPT>
int launch_medium_wide(Params p, const LaunchEnv &env);
}  // namespace tl::gpu::marlin

namespace tl::gpu {

namespace {

std::atomic<int> g_max_blocks_per_sm{2};
std::atomic<int> g_medium_max_m{kMarlinMediumMaxM};
std::atomic<int> g_wgmma_min_m{kMarlinWgmmaMinM};
std::atomic<int> g_stream_slices_per_warp{0};
std::atomic<int> g_stream_stages{0};
std::atomic<long long> g_wgmma_split_max_kn{kMarlinWgmmaSplitMaxKN};
std::atomic<bool> g_wgmma_producer{true};
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

// Which medium mainloop runs. Measured on the H200 (same-run A/B): the split kernel's 24-row
// tile (NB = 3, no spills) wins at M <= 24, the wide-warp kernel from 25 rows (the split kernel's NB = 4 spills).
// TINYLOOP_MEDIUM_VARIANT=split or =wide (read once) forces one of them everywhere, for A/B timing.
enum class MediumVariant { Auto, Split, Wide };
MediumVariant medium_variant() {
    static const MediumVariant variant = [] {
        const char *v = std::getenv("TINYLOOP_MEDIUM_VARIANT");
        if (v != nullptr && std::strcmp(v, "split") == 0) return MediumVariant::Split;
        if (v != nullptr && std::strcmp(v, "wide") == 0) return MediumVariant::Wide;
        return MediumVariant::Auto;
    }();
    return variant;
}
constexpr int kMediumSplitMaxM = 24;

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

void marlin_set_max_blocks_per_sm(int blocks) {
    g_max_blocks_per_sm.store(blocks >= 2 ? 2 : 1, std::memory_order_relaxed);
}

void marlin_set_medium_max_m(int m) {
    g_medium_max_m.store(std::min(64, std::max(16, m)), std::memory_order_relaxed);
}

void marlin_set_stream_stages(int stages) {
    g_stream_stages.store(stages <= 0 ? 0 : std::max(2, stages), std::memory_order_relaxed);
}

void marlin_set_stream_slices_per_warp(int slices) {
    g_stream_slices_per_warp.store(std::max(-1, slices), std::memory_order_relaxed);
}

void marlin_set_wgmma_split_max_kn(long long kn) {
    g_wgmma_split_max_kn.store(std::max(0LL, kn), std::memory_order_relaxed);
}

void marlin_set_wgmma_producer(bool on) { g_wgmma_producer.store(on, std::memory_order_relaxed); }

void marlin_set_wgmma_min_m(int m) { g_wgmma_min_m.store(std::max(17, m), std::memory_order_relaxed); }

int marlin_wgmma_min_m_for(int k, int n) {
    const int bound = g_wgmma_min_m.load(std::memory_order_relaxed);
    const bool small = static_cast<long long>(k) * n <= kMarlinWgmmaSmallKN;
    return small && bound != INT_MAX ? std::min(bound, 17) : bound;
}

MarlinKernel marlin_kernel_for(int m) {
    if (m <= 16) return MarlinKernel::Skinny;
    return m <= g_medium_max_m.load(std::memory_order_relaxed) ? MarlinKernel::Medium : MarlinKernel::Wide;
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
    MarlinKernel kernel = marlin_kernel_for(m);
    marlin::LaunchEnv env{};
    env.device = dev.device;
    env.compute_capability = dev.compute_capability;
    env.sm_count = dev.sm_count;
    env.max_smem_optin = dev.max_smem_optin;
    env.smem_per_sm = dev.smem_per_sm;
    env.max_blocks_per_sm = g_max_blocks_per_sm.load(std::memory_order_relaxed);
    env.stream_slices_per_warp = g_stream_slices_per_warp.load(std::memory_order_relaxed);
    env.stream_stages = g_stream_stages.load(std::memory_order_relaxed);
    env.wgmma_split_max_kn = g_wgmma_split_max_kn.load(std::memory_order_relaxed);
    env.wgmma_producer = g_wgmma_producer.load(std::memory_order_relaxed);
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
    if (m >= marlin_wgmma_min_m_for(k, n)) {  // the bound is at least 17
        const int rc = marlin::launch_wgmma(p, env, fused, gpt);
        if (rc == 0) g_launches[static_cast<int>(MarlinKernel::Wgmma)].fetch_add(1, std::memory_order_relaxed);
        if (rc >= 0) return rc;  // refused (not sm_90a, shared memory, workspace): the kernel for M below runs
    }
    const int n_tiles = (n + marlin::kTileN - 1) / marlin::kTileN;
    if (kernel == MarlinKernel::Medium) {
        // One tile covers every row, so the weights are read once: the smallest tile that covers M. Wide-warp
        // kernel: 32 / 48 / 64 rows (NB = 4, 6, 8 n8 activation tiles in one warp per strip); split kernel: 24 / 32
        // / 48 / 64 rows (NB = 3 or 4 per warp, one or two warps per strip).
        const MediumVariant variant = medium_variant();
        const bool split =
            variant == MediumVariant::Split || (variant == MediumVariant::Auto && m <= kMediumSplitMaxM);
        const int rows =
            split ? (m <= 24 ? 24 : m <= 32 ? 32 : m <= 48 ? 48 : 64) : (m <= 32 ? 32 : m <= 48 ? 48 : 64);
        if (marlin::kMinStages * marlin::medium_stage_bytes(rows, fused, gpt) + marlin::kStaticSmemReserve <=
            dev.max_smem_optin) {
            p.m_slices = 1;
            p.k_tiles = k / marlin::kTileK;
            p.total_iters = static_cast<long long>(n_tiles) * p.k_tiles;
            int rc;
            if (split) {
                rc = fused ? pick_medium_rows<true>(rows, gpt, p, env) : pick_medium_rows<false>(rows, gpt, p, env);
            } else {
                rc = fused ? pick_medium_wide_rows<true>(rows, gpt, p, env)
                           : pick_medium_wide_rows<false>(rows, gpt, p, env);
            }
            if (rc == 0) g_launches[static_cast<int>(kernel)].fetch_add(1, std::memory_order_relaxed);
            if (rc >= 0) return rc;
        }
        kernel = MarlinKernel::Wide;  // refused (shared memory): the M > 16 kernel takes any M
    }
    if (kernel == MarlinKernel::Skinny && env.stream_slices_per_warp >= 0) {
        const int rc = fused ? pick_stream<true>(m, group_size, p, env) : pick_stream<false>(m, group_size, p, env);
        if (rc == 0) g_launches[static_cast<int>(MarlinKernel::Stream)].fetch_add(1, std::memory_order_relaxed);
        if (rc >= 0) return rc;  // refused (K, group size, shared memory, workspace): the skinny kernel runs
    }
    // Tile height: the smallest that covers M (8, 16, 32, 64 rows), lowered if even a 3-stage pipeline would not fit.
    int rows = m <= 8 ? 8 : m <= 16 ? 16 : m <= 32 ? 32 : 64;
    auto fits = [&](int r) {
        const int stage =
            r <= 16 ? marlin::skinny_stage_bytes(r / 8, fused, gpt, 4) : marlin::stage_bytes(r / 16, fused, gpt);
        return marlin::kMinStages * stage + marlin::kStaticSmemReserve <= dev.max_smem_optin;
    };
    while (rows > 32 && !fits(rows)) rows /= 2;
    if (!fits(rows)) return kRcUnsupported;
    // 128-deep slices halve the per-slice overhead of the M <= 8 kernel; two 16-row blocks of three such stages
    // would not fit an SM's shared memory, so M <= 16 keeps 64.
    const int slice_k = rows == 8 && k % 128 == 0 && group_size % 128 == 0 ? 128 : marlin::kTileK;

    p.m_slices = (m + rows - 1) / rows;
    p.k_tiles = k / slice_k;
    p.total_iters = static_cast<long long>(p.m_slices) * n_tiles * p.k_tiles;
    const int rc = fused ? pick_rows<true>(rows, slice_k, gpt, p, env) : pick_rows<false>(rows, slice_k, gpt, p, env);
    if (rc == 0) g_launches[static_cast<int>(kernel)].fetch_add(1, std::memory_order_relaxed);
    return rc;
}

}  // namespace tl::gpu
