// The Marlin-class INT4 x FP16/BF16 GEMM for many rows on Hopper: TMA copies, warp specialization, and each weight
// dequantized once per tile into shared memory, where both wgmma operands are read (sm_90a only: compiled for that
// target alone, cuda/sources_sm90a.txt). Same packed weights as the other kernels (marlin_layout.hpp).
//
// Why a second wgmma kernel: marlin_wgmma.cu dequantizes the weights into wgmma's register operand, once per 128-row
// tile, and at large M its energy per FLOP (the dequantization's ALU work, 13 instructions per 8 weights) holds the
// card at its power cap below dense cuBLAS's clock. Here a tile is 128 columns x 256 activation rows (ROWS): the
// weights are dequantized once per tile into an FP16/BF16 copy in shared memory and both operands of wgmma m64n256k16
// come from shared memory, so each weight's dequantization serves twice as many FLOPs. (128-row tiles of this kernel
// were measured too and lost to the wgmma kernel's wherever the policy could use them.)
//
// Operands swapped, as in the other kernels: Y^T = W^T X^T, the weight (64 columns of a strip) is wgmma's A (M = 64),
// the tile's activation rows its N. Roles (384 threads, one block per SM):
// - warp 8, lane 0, the producer: per 64-deep slice, one tensor copy of X (ROWS x 64, 128-byte swizzle, rows past M
//   zero-filled; the tensor map is encoded per call on the host) and bulk copies of each strip's packed codes (2 KB)
//   and its scales and zeros (128 bytes per group), all completing on the stage's `full` mbarrier by transaction
//   count. Programmatic dependent launch: the weights of the ring's first fill are requested before the previous
//   kernel on the stream has finished; the activations only after griddepcontrol.wait.
// - warpgroups 0 and 1, the consumers, one 64-column strip each: warp j dequantizes the strip's k16 cell j (one
//   16-byte load per lane, as in marlin_wgmma.cu) and stores the four 16 x 16 tiles with stmatrix into the strip's A
//   buffer ([64 columns][64 k], 128-byte swizzle, K-major); after a proxy fence and the warpgroup's named barrier,
//   four wgmma (one per k16) run on the A buffer and the stage's X. A buffers are double-buffered: slice i + 1 is
//   dequantized while the tensor cores run slice i. A stage is released on `empty` (256 arrivals) once the wgmma
//   reading it have completed (after the next slice's wait_group 1).
// - Registers (setmaxnreg): the producer warpgroup runs on 40, the consumers on 232 (ROWS / 2 FP32 accumulators).
// Scheduling, persistent (one block per SM at most), tiles numbered rows fastest so that the blocks running at once
// share a weight panel through L2: whole tiles round robin (block b: tiles b, b + grid, ...) where they fill the waves
// (wgmma_whole_tiles), else stream-K, each block an equal range of all (tile, k slice) pairs (TmaWork in
// marlin_schedule.hpp). A tile cut between blocks is reduced inside the kernel: the block holding its last slice (the
// finisher) waits until the others have added their FP32 sums into its workspace slot and counted their slices, adds
// its own, writes the tile, and leaves slot and counter zeroed. The finisher waits only on blocks of lower index, which
// run before or beside it.
#include <cuda/ptx>

#include "../tensor_map.hpp"
#include "../tma_pipeline.cuh"
#include "../wgmma.cuh"
#include "marlin_device.cuh"
#include "marlin_schedule.hpp"

namespace tl::gpu::marlin {

#if defined(TL_HAVE_SM90A)
namespace {

namespace ptx = cuda::ptx;

constexpr int kTmaTileN = 128;                 // weight columns per tile: one 64-column strip per consumer warpgroup
constexpr int kStripBytes = kTileK * 64 / 2;   // a strip's packed codes of one 64-deep slice (4 k16 cells)
constexpr int kABytes = 64 * kTileK * 2;       // a strip's slice dequantized: 64 rows of 128 bytes
constexpr int kProducerRegs = 40, kConsumerRegs = 232;

template <int ROWS, bool FUSED, int GPT, Dtype D>
struct TmaLayout {
    static constexpr int kX = ROWS * 128;                  // [row][64 k], swizzled, first: 1024-aligned
    static constexpr int kW = 2 * kStripBytes;             // [strip][k16][lane][16 B], as in global memory
    static constexpr int kS = 2 * GPT * 128;               // [strip][group][64] scales (permuted), then zeros
    static constexpr int kStage = (kX + kW + kS * (FUSED ? 2 : 1) + 1023) / 1024 * 1024;
    static constexpr int kA = 2 * 2 * kABytes;             // [buffer][strip] dequantized slices
    // As deep as 227 KB hold after the A buffers and the alignment slack (checked at launch), at most 8.
    static constexpr int kStages = (227 * 1024 - 1024 - kA) / kStage < 8 ? (227 * 1024 - 1024 - kA) / kStage : 8;
    static constexpr int kSmem = kA + kStages * kStage + 1024;
    static constexpr int kAcc = ROWS / 2;                  // FP32 accumulators a thread (wgmma m64 x ROWS)
};

__device__ __forceinline__ void stmatrix_x4(uint32_t addr, const uint32_t (&r)[4]) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r[0]),
                 "r"(r[1]), "r"(r[2]), "r"(r[3])
                 : "memory");
}

// Whether warpgroup wg's strip of column tile n_tile lies past N (N % 128 == 64: a last tile of one strip).
__device__ __forceinline__ bool strip_past_n(const Params &p, int n_tile, int wg) {
    return 2 * n_tile + wg >= p.n / 64;
}

// Bytes one stage receives for a tile of n_tile: X whole (rows past M arrive as zeros and count), and per strip inside
// N its codes, scales and zeros.
template <class L, bool FUSED, int GPT>
__device__ __forceinline__ uint32_t stage_tx_bytes(int valid_strips) {
    return L::kX + valid_strips * (kStripBytes + GPT * 128 * (FUSED ? 2 : 1));
}

// The end of a tile's slices [kt_begin, kt_end) in this block. Thread (warpgroup wg, warp wj, lane) holds columns c and
// c + 8 (c = strip column 16 wj + lane / 4) of rows 8i + 2 (lane % 4) + {0, 1}: acc[4i .. 4i + 3] = (r, c), (r + 1, c),
// (r, c + 8), (r + 1, c + 8). Whole tile: written. Cut, without its last slice: the sums added into the finisher's
// workspace slot ([warp][i][lane][4] FP32), then the slices counted. Cut, with it: the others' slices awaited, their
// sums added (and the slot zeroed), the tile written.
template <class L, Dtype D>
__device__ __forceinline__ void finish_tile(const Params &p, float (&acc)[L::kAcc], int tile, int kt_begin, int kt_end,
                                            int wg, int wj, int lane) {
    constexpr int kRows = L::kAcc * 2;
    const int n_tile = tile / p.m_slices, m_slice = tile - n_tile * p.m_slices;
    const int row0 = m_slice * kRows + 2 * (lane % 4);
    const bool whole = kt_begin == 0 && kt_end == p.k_tiles;
    if (!whole) {
        const long long slot = share_owner(static_cast<long long>(tile) * p.k_tiles + p.k_tiles - 1, gridDim.x,
                                           p.total_iters);
        float *part = p.partials + slot * (kRows * kTmaTileN) + (wg * 4 + wj) * (kRows / 8) * 128 + lane * 4;
        int *counter = p.counters + slot;
        if (kt_end < p.k_tiles) {  // a contributor
#pragma unroll
            for (int i = 0; i < kRows / 8; ++i) {
                if (row0 + 8 * i < p.m) {
                    add_partial4(part + i * 128, acc[4 * i], acc[4 * i + 1], acc[4 * i + 2], acc[4 * i + 3]);
                }
            }
            tma::signal_contribution(counter, kt_end - kt_begin, wg == 0 && wj == 0 && lane == 0);
            return;
        }
        // The finisher: slices [0, kt_begin) come from the others.
        tma::await_contributions(counter, kt_begin, wg == 0 && wj == 0 && lane == 0);
#pragma unroll
        for (int i = 0; i < kRows / 8; ++i) {
            if (row0 + 8 * i < p.m) {
                float4 *at = reinterpret_cast<float4 *>(part + i * 128);
                const float4 v = __ldcg(at);
                __stcg(at, make_float4(0.0f, 0.0f, 0.0f, 0.0f));
                acc[4 * i] += v.x;
                acc[4 * i + 1] += v.y;
                acc[4 * i + 2] += v.z;
                acc[4 * i + 3] += v.w;
            }
        }
    }
    if (strip_past_n(p, n_tile, wg)) return;
    const int col = (2 * n_tile + wg) * 64 + 16 * wj + lane / 4;
    uint16_t *y0 = p.y + static_cast<size_t>(row0) * p.n + col;
#pragma unroll
    for (int i = 0; i < kRows / 8; ++i) {
        const int row = row0 + 8 * i;
        if (row < p.m) {
            store_quad<D>(y0 + static_cast<size_t>(8 * i) * p.n, p.n, acc[4 * i], acc[4 * i + 2], acc[4 * i + 1],
                          acc[4 * i + 3], quad_rows(row, p.m));
        }
    }
}

template <int ROWS, bool FUSED, int GPT, Dtype D>
__global__ void __launch_bounds__(384, 1) marlin_tma_kernel(const __grid_constant__ CUtensorMap x_map, const Params p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using L = TmaLayout<ROWS, FUSED, GPT, D>;
    extern __shared__ uint8_t smem_raw[];
    __shared__ __align__(8) uint64_t full_bar[L::kStages], empty_bar[L::kStages];
    const uint32_t raw_base = smem_addr(smem_raw);
    const uint32_t smem_base = (raw_base + 1023u) & ~1023u;  // the launch adds 1024 bytes of slack
    uint8_t *const smem = smem_raw + (smem_base - raw_base);
    const uint32_t a_base = smem_base, ring_base = smem_base + L::kA;
    uint8_t *const ring = smem + L::kA;

    launch_dependents();  // the next kernel may start its own weight loads; it waits for this grid before reading Y
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int strips = p.n / 64, n_tiles = (p.n + kTmaTileN - 1) / kTmaTileN;
    const TmaWork work = tma_work(p.whole_tiles != 0, static_cast<long long>(p.m_slices) * n_tiles, p.k_tiles,
                                  static_cast<int>(blockIdx.x), static_cast<int>(gridDim.x));
    if (work.tiles <= 0) return;
    if (tid == 0) {
        for (int s = 0; s < L::kStages; ++s) {
            ptx::mbarrier_init(&full_bar[s], 1);
            ptx::mbarrier_init(&empty_bar[s], 256);
        }
        // Make the initialized barriers visible to the async proxy (the copy engine completes on them).
        ptx::fence_proxy_async(ptx::space_shared);
    }
    __syncthreads();
    const int total = static_cast<int>(work.slices(p.k_tiles));  // k slices of this block

    if (warp >= 8) {  // the producer warpgroup: one thread issues every copy
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegs));
        if (warp != 8 || lane != 0) return;
        const uint32_t k16s = static_cast<uint32_t>(p.k / 16);
        auto copy_weights = [&](int stage, const tma::SliceCursor &c) {
            const int n_tile = c.tile / p.m_slices;
            const int valid = strips - 2 * n_tile >= 2 ? 2 : 1;
            uint64_t *bar = &full_bar[stage];
            ptx::mbarrier_arrive_expect_tx(ptx::sem_release, ptx::scope_cta, ptx::space_shared, bar,
                                           stage_tx_bytes<L, FUSED, GPT>(valid));
            uint8_t *st = ring + stage * L::kStage;
            for (int s = 0; s < valid; ++s) {
                const int strip = 2 * n_tile + s;
                const uint32_t *src = p.words + (static_cast<size_t>(strip) * k16s + c.kt * 4u) * 128u;
                ptx::cp_async_bulk(ptx::space_cluster, ptx::space_global, st + L::kX + s * kStripBytes, src,
                                   kStripBytes, bar);
                for (int r = 0; r < GPT; ++r) {
                    const int group = GPT == 2 ? c.kt * 2 + r : c.kt * kTileK / p.group_size;
                    const size_t at = static_cast<size_t>(group) * p.n + strip * 64;
                    uint8_t *dst = st + L::kX + L::kW + (s * GPT + r) * 128;
                    ptx::cp_async_bulk(ptx::space_cluster, ptx::space_global, dst, p.scales + at, 128u, bar);
                    if constexpr (FUSED) {
                        ptx::cp_async_bulk(ptx::space_cluster, ptx::space_global, dst + L::kS, p.zeros + at, 128u,
                                           bar);
                    }
                }
            }
        };
        auto copy_x = [&](int stage, const tma::SliceCursor &c) {
            const int m_slice = c.tile - c.tile / p.m_slices * p.m_slices;
            const int32_t coords[2] = {c.kt * kTileK, m_slice * ROWS};
            ptx::cp_async_bulk_tensor(ptx::space_cluster, ptx::space_global, ring + stage * L::kStage, &x_map,
                                      coords, &full_bar[stage]);
        };
        tma::produce<L::kStages>(work, p.k_tiles, total, empty_bar, copy_weights, copy_x);
        return;
    }

    // The consumers: warpgroup wg computes strip wg of the tile.
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kConsumerRegs));
    const int wg = warp / 4, wj = warp % 4, g = lane / 4;
    // stmatrix: lane t gives row t % 8 of 8 x 8 matrix t / 8 (the fragment's a0..a3: rows +0 / +8, k chunk +0 / +1) of
    // word w's 16 x 16 tile, rows 16 w .. 16 w + 15 (strip columns) and k 16 wj .. 16 wj + 15 of the slice.
    const int st_row = 8 * ((lane / 8) & 1) + lane % 8, st_chunk = 2 * wj + lane / 16;
    const uint32_t st_off = st_row * 128 + ((st_chunk ^ (lane % 8)) << 4);
    const uint32_t a_wg = a_base + wg * kABytes;  // buffer b of this strip: a_wg + b * 2 * kABytes
    float acc[L::kAcc];
    int stage = 0, prev = -1;
    uint32_t phase = 0, buf = 0;
#pragma unroll 1
    for (int j = 0; j < work.tiles; ++j) {
        const int tile = work.tile(j);
        const int kt_begin = work.lo(tile, p.k_tiles), kt_end = work.hi(tile, p.k_tiles);
#pragma unroll
        for (int i = 0; i < L::kAcc; ++i) acc[i] = 0.0f;
        wgmma::pin(acc);
        if (strip_past_n(p, tile / p.m_slices, wg)) {
            // A strip past N (N % 128 == 64): the producer copied none of its weights. Release each stage at once
            // (the other warpgroup's arrivals still hold it until its wgmma are done); the sums stay zero.
            for (int kt = kt_begin; kt < kt_end; ++kt) {
                tma::wait_parity(&full_bar[stage], phase);
                ptx::mbarrier_arrive(&empty_bar[stage]);
                tma::next_stage<L::kStages>(stage, phase);
            }
            finish_tile<L, D>(p, acc, tile, kt_begin, kt_end, wg, wj, lane);
            continue;
        }
#pragma unroll 1
        for (int kt = kt_begin; kt < kt_end; ++kt) {
            tma::wait_parity(&full_bar[stage], phase);
            const uint8_t *st = ring + stage * L::kStage;
            const uint32_t a_buf = a_wg + buf * (2 * kABytes);
            {
                const uint4 wq = *reinterpret_cast<const uint4 *>(st + L::kX + wg * kStripBytes + wj * 512 + lane * 16);
                const uint32_t words[4] = {wq.x, wq.y, wq.z, wq.w};
                const int row = GPT == 2 ? wj / 2 : 0;  // group 32: cells 0-1 and 2-3 have their own scales
                const uint16_t *s_src =
                    reinterpret_cast<const uint16_t *>(st + L::kX + L::kW + (wg * GPT + row) * 128) + g * 8;
                uint32_t s8[8], z8[8];
                load_group<4, FUSED, D>(s_src, s_src + L::kS / 2, s8, z8);
#pragma unroll
                for (int w = 0; w < 4; ++w) {
                    uint32_t frag[4];
                    dequant_word<FUSED, D>(words[w], s8[2 * w], s8[2 * w + 1], z8[2 * w], z8[2 * w + 1], frag);
                    stmatrix_x4(a_buf + w * 16 * 128 + st_off, frag);
                }
            }
            // The generic-proxy stores must be visible to wgmma (async proxy) and every warp's tiles stored.
            ptx::fence_proxy_async(ptx::space_shared);
            tma::named_sync(1 + wg, 128);
            wgmma::fence();
            const uint32_t x_addr = ring_base + stage * L::kStage;
#pragma unroll
            for (int k16 = 0; k16 < 4; ++k16) {
                wgmma::mma_ss<D>(acc, wgmma::desc_sw128(a_buf + k16 * 32), wgmma::desc_sw128(x_addr + k16 * 32), true);
            }
            wgmma::commit();
            // The previous slice's wgmma are done: its stage and its A buffer may be reused. (A wgmma group is one
            // operation of the warpgroup: once this warp's wait sees it complete, no warp's part still reads the buffer
            // the next slice's stmatrix of any warp overwrites.)
            wgmma::wait<1>();
            if (prev >= 0) ptx::mbarrier_arrive(&empty_bar[prev]);
            prev = stage;
            buf ^= 1u;
            tma::next_stage<L::kStages>(stage, phase);
        }
        wgmma::wait<0>();
        wgmma::pin(acc);
        ptx::mbarrier_arrive(&empty_bar[prev]);
        prev = -1;
        finish_tile<L, D>(p, acc, tile, kt_begin, kt_end, wg, wj, lane);
    }
#endif
}

template <int ROWS, bool FUSED, int GPT, Dtype D>
int launch_tma_kernel(Params p, const LaunchEnv &env) {
    using L = TmaLayout<ROWS, FUSED, GPT, D>;
    static_assert(L::kStages >= 3, "the ring needs three stages");
    static std::atomic<int> ready[64];
    const auto kernel = marlin_tma_kernel<ROWS, FUSED, GPT, D>;
    if (const int rc = tma::prepare_persistent(kernel, L::kSmem, env, ready)) return rc;
    CUtensorMap x_map;
    if (!encode_rows_map(x_map, CU_TENSOR_MAP_DATA_TYPE_UINT16, p.x, p.m, p.k, static_cast<uint64_t>(p.k) * 2, ROWS,
                         kTileK)) {
        return kRcUnsupported;
    }
    p.m_slices = (p.m + ROWS - 1) / ROWS;
    p.k_tiles = p.k / kTileK;
    const long long tiles = static_cast<long long>(p.m_slices) * ((p.n + kTmaTileN - 1) / kTmaTileN);
    p.total_iters = tiles * p.k_tiles;
    if (p.total_iters >= (1LL << 31)) return kRcUnsupported;
    const tma::PersistentGrid grid =
        tma::persistent_grid(tiles, p.k_tiles, env, static_cast<size_t>(ROWS) * kTmaTileN * sizeof(float));
    if (grid.rc != 0) return grid.rc;
    p.whole_tiles = grid.whole_tiles ? 1 : 0;
    p.counters = grid.counters;
    p.partials = static_cast<float *>(grid.slots);
    return tma::launch_persistent(kernel, grid, L::kSmem, env.stream, x_map, static_cast<const Params>(p));
}

template <int ROWS, bool FUSED, Dtype D>
int launch_for_groups(int gpt, const Params &p, const LaunchEnv &env) {
    return gpt == 2 ? launch_tma_kernel<ROWS, FUSED, 2, D>(p, env) : launch_tma_kernel<ROWS, FUSED, 1, D>(p, env);
}

template <bool FUSED, Dtype D>
int pick_rows(int rows, int gpt, const Params &p, const LaunchEnv &env) {
    return rows == 256 ? launch_for_groups<256, FUSED, D>(gpt, p, env) : kRcUnsupported;
}

}  // namespace

int launch_tma(Params p, const LaunchEnv &env, const MarlinPlan &plan, bool fused, int gpt, Dtype dtype) {
    if (env.compute_capability != 90) return kRcUnsupported;  // sm_90a code runs on 9.0 alone
    if (dtype == Dtype::BF16) return fused ? pick_rows<true, Dtype::BF16>(plan.rows, gpt, p, env) : kRcUnsupported;
    return fused ? pick_rows<true, Dtype::F16>(plan.rows, gpt, p, env)
                 : pick_rows<false, Dtype::F16>(plan.rows, gpt, p, env);
}

#else  // built without sm_90a: the dispatcher falls through to the other kernels

int launch_tma(Params, const LaunchEnv &, const MarlinPlan &, bool, int, Dtype) { return kRcUnsupported; }

#endif

}  // namespace tl::gpu::marlin
