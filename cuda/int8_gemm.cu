// The GEMM of INT8 activations on Hopper's INT8 tensor cores (sm_90a only: cuda/sources_sm90a.txt). X comes quantized
// per row (quantize_rows_int8: codes, scale s_x and, for INT4 weights, the sum S of the row's codes); the weight is
// INT8 codes [N][K] (W8A8) or INT4 codes packed by w4a8_pack (W4A8), with one scale s and zero z per output column.
// The sums D = Σ_k xq·q are exact in INT32; the epilogue applies the activation-precision rule of docs/quality.md for
// one group: y = fp16(fl(s_x · fma(z, S, fl(s · D)))) (z = 0 for INT8 weights).
//
// Operands swapped as in the Marlin-class kernels, Y^T = W X^T: the weight is wgmma's A (M = 64 columns a strip), the
// tile's activation rows its N. A tile is 128 weight columns (two strips) x 256 rows; k slices of 128 (one 128-byte
// swizzled row of INT8). Roles (384 threads, one block per SM):
// - warp 8, lane 0, the producer: per slice one tensor copy of X (256 x 128; rows past M and k past K arrive as
//   zeros) and, for INT8 weights, one of the tile's weights (128 x 128, likewise), or for INT4 weights one bulk copy
//   of the two strips' packed codes (8 KB; the packing pads N and K). All complete on the stage's `full` mbarrier by
//   byte count. The weights of the ring's first fill are requested before griddepcontrol.wait (programmatic
//   dependent launch), X after it.
// - warpgroups 0 and 1, the consumers, one strip each: four wgmma m64n256k32 per slice. INT8 weights: both operands
//   from shared memory (s8 x s8), one wgmma group per slice. INT4: each lane reads its 32 bytes of the slice's codes,
//   widens them to bytes with two logic operations per word (int8_gemm_layout.hpp) and gives them to wgmma as its
//   register operand (u8 x s8), one group per k32 step so that the registers of step c + 1 are built while step c
//   runs. A stage is released (256 arrivals) once the wgmma reading it have completed.
// Scheduling as the INT4 TMA kernel (marlin_tma.cu; tma_pipeline.cuh): persistent, tiles numbered rows fastest, whole
// tiles round robin where they fill the waves, else stream-K, the cut tiles' INT32 sums added by their finisher.
//
// Grouped INT4 weights (groups of 32, 64 or 128; a template variant): the rule applies each group's scale and zero
// before the next group is summed, acc = fma(z_g, S_g, fma(s_g, D_g, acc)), so the FP32 steps run in the mainloop.
// Tiles of 128 columns x 128 rows (wgmma m64n128k32: 64 INT32 sums and 64 FP32 totals a thread); a stage also brings
// the tile's group sums S_g of the slice's groups (a tensor copy of quantize_rows_int8's [group][row] FP32) and the
// groups' s and z (a bulk copy, w4a8_pack_groups's order: one 16-byte load per thread and group). Per group, once its
// k32 steps have completed (wgmma.wait_group 0), D_g is read from sums that started at the bits of 1.5 · 2^23 (one
// FADD; I2F runs at a quarter of the FP32 rate), then two FMAs per output. Whole tiles only (no stream-K): the rule's
// order would make a cut tile hand its FP32 totals on from block to block.
#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>
#include <cuda/ptx>

#include "gpu_common.cuh"
#include "gpu_kernels.hpp"
#include "int8_gemm_layout.hpp"
#include "marlin/marlin.cuh"
#include "marlin/marlin_device.cuh"
#include "marlin/marlin_plan.hpp"
#include "marlin/marlin_schedule.hpp"
#include "tensor_map.hpp"
#include "tma_pipeline.cuh"
#include "wgmma.cuh"

namespace tl::gpu {

namespace {

int check_int8_gemm_args(const Int8GemmArgs &a, Int8Weights weights) {
    if (a.xq == nullptr || a.x_scales == nullptr || a.w == nullptr || a.y == nullptr || a.m < 1 || a.n < 1 ||
        a.k < 1 || a.group_size < 0) {
        return kRcBadArgument;
    }
    if (a.group_size == 0) {
        if (a.w_scales == nullptr || a.w_groups != nullptr || a.x_group_sums != nullptr) return kRcBadArgument;
        if (weights == Int8Weights::Int8 && a.w_zeros != nullptr) return kRcBadArgument;
        if (a.w_zeros != nullptr && a.x_sums == nullptr) return kRcBadArgument;
    } else {
        if (a.w_groups == nullptr || a.x_group_sums == nullptr || a.w_scales != nullptr || a.w_zeros != nullptr ||
            a.x_sums != nullptr) {
            return kRcBadArgument;
        }
        if (weights != Int8Weights::Int4Packed || (a.group_size != 32 && a.group_size != 64 && a.group_size != 128) ||
            a.k % a.group_size != 0 || (reinterpret_cast<uintptr_t>(a.x_group_sums) & 15u) != 0) {
            return kRcUnsupported;
        }
    }
    // The tensor maps: row strides in multiples of 16 bytes, 16-byte aligned bases.
    if (a.k % 16 != 0 || (reinterpret_cast<uintptr_t>(a.xq) & 15u) != 0 ||
        (reinterpret_cast<uintptr_t>(a.w) & 15u) != 0) {
        return kRcUnsupported;
    }
    return 0;
}

}  // namespace

#if defined(TL_HAVE_SM90A)
namespace {

namespace ptx = cuda::ptx;
using w4a8::kSliceK;
using w4a8::kStripBytes;
using w4a8::kTileColumns;

constexpr int kTileRows = 256;
constexpr int kProducerRegs = 40, kConsumerRegs = 232;
// A group's INT32 sums start from the bits of this float (1.5 · 2^23): wgmma's integer additions then leave the float
// 12582912 + D exactly (|D| < 2^22), and one FADD gives D, where I2F would run at a quarter of the FP32 rate.
constexpr int32_t kMagicBits = 0x4B400000;
constexpr float kMagic = 12582912.0f;

// GROUP 0: one group per row (tiles of 256 rows, INT32 sums scaled at the end). GROUP 32, 64, 128 (INT4 only): tiles
// of 128 rows, so that a thread's INT32 sums of one group and its FP32 totals (64 + 64 registers) fit beside each
// other; a stage also holds the tile's group sums S of the slice's groups ([group][128 rows] FP32) and their scales
// and zeros (w4a8_pack_groups's order).
template <bool INT4, int GROUP>
struct Int8Layout {
    static constexpr int kRows = GROUP > 0 ? 128 : kTileRows;
    static constexpr int kX = kRows * kSliceK;                           // [row][128 k], swizzled; first: 1024-aligned
    static constexpr int kW = INT4 ? 2 * kStripBytes : kTileColumns * kSliceK;  // packed words, or [column][128 k]
    static constexpr int kGroups = GROUP > 0 ? kSliceK / GROUP : 0;      // per slice
    static constexpr int kSums = kGroups * kRows * 4;
    static constexpr int kParams = kGroups * w4a8::kGroupFloats * 4;
    static constexpr int kBytes = kX + kW + kSums + kParams;            // the copies of a stage
    static constexpr int kStage = (kBytes + 1023) / 1024 * 1024;
    static constexpr int kStages = (227 * 1024 - 1024) / kStage < 8 ? (227 * 1024 - 1024) / kStage : 8;
    static constexpr int kSmem = kStages * kStage + 1024;
};

struct Int8Params {
    const uint32_t *w4;      // INT4 weights, packed
    const float *x_scales;   // [M]
    const int32_t *x_sums;   // [M], or null where z is (zeros null)
    const float *w_scales;   // [N]
    const float *w_zeros;    // [N], or null
    const float *w_groups;   // grouped: s and z, w4a8_pack_groups's order
    uint16_t *y;             // [M][N] FP16
    int32_t *partials;       // stream-K: [grid][256 x 128] INT32, zero between calls
    int *counters;           // stream-K: [grid], zero between calls
    int m, n, k;
    int m_slices, k_tiles, strips;  // strips: of the packed INT4 weight (N rounded up to 128, over 64)
    int padded_groups;              // grouped: groups of K rounded up to 128
    long long total_iters;
    int whole_tiles;
};

// A lane's 32 bytes of its warp's packed INT4 codes in a stage's strip: the words of the slice's four k32 steps.
__device__ __forceinline__ void load_codes(const uint8_t *strip, int wj, int lane, uint32_t (&words)[8]) {
    const uint8_t *codes = strip + wj * 1024 + lane * 16;
    const uint4 h0 = *reinterpret_cast<const uint4 *>(codes);
    const uint4 h1 = *reinterpret_cast<const uint4 *>(codes + 512);
    words[0] = h0.x, words[1] = h0.y, words[2] = h0.z, words[3] = h0.w;
    words[4] = h1.x, words[5] = h1.y, words[6] = h1.z, words[7] = h1.w;
}

// k32 step c's register operand: the codes of rows r and r + 8 widened to bytes (int8_gemm_layout.hpp).
__device__ __forceinline__ void widen_codes(const uint32_t (&words)[8], int c, uint32_t (&f)[4]) {
    const uint32_t lo = words[2 * c], hi = words[2 * c + 1];
    f[0] = lo & 0x0F0F0F0Fu;
    f[1] = hi & 0x0F0F0F0Fu;
    f[2] = (lo >> 4) & 0x0F0F0F0Fu;
    f[3] = (hi >> 4) & 0x0F0F0F0Fu;
}

// One output of one group: the rule's FP32 steps (fl(s · D) is its first fma from acc = -0).
__device__ __forceinline__ __half scale_out(int32_t d, float s, float z, float sx, float sum) {
    return __float2half_rn(__fmul_rn(sx, __fmaf_rn(z, sum, __fmul_rn(s, __int2float_rn(d)))));
}

// The end of a tile's slices [kt_begin, kt_end) in this block. Thread (warpgroup wg, warp wj, lane) holds weight
// columns c and c + 8 (c = 64 wg + 16 wj + lane / 4 of the tile) of rows 8i + 2 (lane % 4) + {0, 1}: acc[4i .. 4i + 3]
// = (r, c), (r + 1, c), (r, c + 8), (r + 1, c + 8). Whole tile: written. Cut, without its last slice: the sums stored
// in this block's own workspace slot ([warp][i][lane][4] INT32; there is no vector atomic add for INT32, and a block
// contributes to one tile at most), then its slices counted on the finisher's counter. Cut, with it: the slots of the
// blocks before it that hold the tile's other slices added (and zeroed), the tile written.
__device__ __forceinline__ void finish_tile(const Int8Params &p, int32_t (&acc)[128], int tile, int kt_begin,
                                            int kt_end, int wg, int wj, int lane) {
    const int n_tile = tile / p.m_slices, m_slice = tile - n_tile * p.m_slices;
    const int row0 = m_slice * kTileRows + 2 * (lane % 4);
    if (kt_begin != 0 || kt_end != p.k_tiles) {
        const bool leader = wg == 0 && wj == 0 && lane == 0;
        const size_t in_slot = static_cast<size_t>(wg * 4 + wj) * 32 * 128 + lane * 4;
        constexpr size_t kSlot = static_cast<size_t>(kTileRows) * kTileColumns;
        const long long first_slice = static_cast<long long>(tile) * p.k_tiles;
        if (kt_end < p.k_tiles) {  // a contributor
            int32_t *part = p.partials + blockIdx.x * kSlot + in_slot;
#pragma unroll
            for (int i = 0; i < 32; ++i) {
                if (row0 + 8 * i < p.m) {
                    __stcg(reinterpret_cast<int4 *>(part + i * 128),
                           make_int4(acc[4 * i], acc[4 * i + 1], acc[4 * i + 2], acc[4 * i + 3]));
                }
            }
            const long long finisher = marlin::share_owner(first_slice + p.k_tiles - 1, gridDim.x, p.total_iters);
            tma::signal_contribution(p.counters + finisher, kt_end - kt_begin, leader);
            return;
        }
        tma::await_contributions(p.counters + blockIdx.x, kt_begin, leader);
        const int first = static_cast<int>(marlin::share_owner(first_slice, gridDim.x, p.total_iters));
        for (int b = first; b < static_cast<int>(blockIdx.x); ++b) {
            int32_t *part = p.partials + b * kSlot + in_slot;
#pragma unroll
            for (int i = 0; i < 32; ++i) {
                if (row0 + 8 * i < p.m) {
                    int4 *at = reinterpret_cast<int4 *>(part + i * 128);
                    const int4 v = __ldcg(at);
                    __stcg(at, make_int4(0, 0, 0, 0));
                    acc[4 * i] += v.x;
                    acc[4 * i + 1] += v.y;
                    acc[4 * i + 2] += v.z;
                    acc[4 * i + 3] += v.w;
                }
            }
        }
    }
    const int col = n_tile * kTileColumns + 64 * wg + 16 * wj + lane / 4;
    float s[2], z[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const bool in = col + 8 * h < p.n;
        s[h] = in ? p.w_scales[col + 8 * h] : 0.0f;
        z[h] = in && p.w_zeros != nullptr ? p.w_zeros[col + 8 * h] : 0.0f;
    }
    // The rows' scales and code sums are loaded in batches of 8 rows ahead of their stores: the compiler cannot tell
    // them from Y, so a load after a store waits for it, and one row at a time each row paid a load's latency.
    __half *y = reinterpret_cast<__half *>(p.y);
    constexpr int kBatch = 4;  // i per batch: 2 kBatch rows
#pragma unroll
    for (int i0 = 0; i0 < 32; i0 += kBatch) {
        float sx[2 * kBatch], sum[2 * kBatch];
#pragma unroll
        for (int b = 0; b < 2 * kBatch; ++b) {
            const int row = row0 + 8 * (i0 + b / 2) + b % 2;
            sx[b] = row < p.m ? p.x_scales[row] : 0.0f;
            sum[b] = row < p.m && p.x_sums != nullptr ? static_cast<float>(p.x_sums[row]) : 0.0f;
        }
#pragma unroll
        for (int b = 0; b < 2 * kBatch; ++b) {
            const int i = i0 + b / 2, rr = b % 2, row = row0 + 8 * i + rr;
            if (row >= p.m) continue;
            __half *yr = y + static_cast<size_t>(row) * p.n + col;
            if (col < p.n) yr[0] = scale_out(acc[4 * i + rr], s[0], z[0], sx[b], sum[b]);
            if (col + 8 < p.n) yr[8] = scale_out(acc[4 * i + 2 + rr], s[1], z[1], sx[b], sum[b]);
        }
    }
}

// A grouped tile's outputs, y = fp16(fl(s_x · acc)): thread (wg, wj, lane) holds acc[4i .. 4i + 3] = (r, c),
// (r + 1, c), (r, c + 8), (r + 1, c + 8) for rows r = 8i + 2 (lane % 4) of the tile's 128 and column
// c = 64 wg + 16 wj + lane / 4.
__device__ __forceinline__ void store_grouped_tile(const Int8Params &p, const float (&acc)[64], int tile, int wg,
                                                   int wj, int lane) {
    const int n_tile = tile / p.m_slices, m_slice = tile - n_tile * p.m_slices;
    const int row0 = m_slice * 128 + 2 * (lane % 4);
    const int col = n_tile * kTileColumns + 64 * wg + 16 * wj + lane / 4;
    __half *y = reinterpret_cast<__half *>(p.y);
    constexpr int kBatch = 4;  // as finish_tile: the row scales of 8 rows loaded ahead of their stores
#pragma unroll
    for (int i0 = 0; i0 < 16; i0 += kBatch) {
        float sx[2 * kBatch];
#pragma unroll
        for (int b = 0; b < 2 * kBatch; ++b) {
            const int row = row0 + 8 * (i0 + b / 2) + b % 2;
            sx[b] = row < p.m ? p.x_scales[row] : 0.0f;
        }
#pragma unroll
        for (int b = 0; b < 2 * kBatch; ++b) {
            const int i = i0 + b / 2, rr = b % 2, row = row0 + 8 * i + rr;
            if (row >= p.m) continue;
            __half *yr = y + static_cast<size_t>(row) * p.n + col;
            if (col < p.n) yr[0] = __float2half_rn(__fmul_rn(sx[b], acc[4 * i + rr]));
            if (col + 8 < p.n) yr[8] = __float2half_rn(__fmul_rn(sx[b], acc[4 * i + 2 + rr]));
        }
    }
}

// The consumers of grouped INT4 weights: whole tiles, each group's k32 steps into INT32 sums that start from
// kMagicBits, then, once they have completed, the rule's two FMAs per output into the FP32 totals. A warpgroup's
// tensor work stops while it does its FP32 steps; the other warpgroup's wgmma keep the tensor cores busy meanwhile
// (one INT32 set a thread: a second would not fit beside the FP32 totals in 232 registers without spills).
template <int GROUP, class L>
__device__ __forceinline__ void consume_grouped(const Int8Params &p, const marlin::TmaWork &work, uint8_t *ring,
                                                uint32_t ring_base, uint64_t *full_bar, uint64_t *empty_bar, int wg,
                                                int wj, int lane) {
    constexpr int kSteps = GROUP / 32;  // k32 steps per group
    int32_t d[64];
    float acc[64];
    uint32_t a[2][4];
    int stage = 0;
    uint32_t phase = 0;
#pragma unroll 1
    for (int j = 0; j < work.tiles; ++j) {
        const int tile = work.tile(j);
#pragma unroll
        for (int i = 0; i < 64; ++i) acc[i] = -0.0f;  // the rule's start: the sum's identity
#pragma unroll 1
        for (int kt = 0; kt < p.k_tiles; ++kt) {
            tma::wait_parity(&full_bar[stage], phase);
            const uint32_t x_addr = ring_base + stage * L::kStage;
            const uint8_t *at = ring + stage * L::kStage;
            uint32_t words[8];
            load_codes(at + L::kX + wg * kStripBytes, wj, lane, words);
            const float *sums = reinterpret_cast<const float *>(at + L::kX + L::kW) + 2 * (lane % 4);
            const float4 *params = reinterpret_cast<const float4 *>(at + L::kX + L::kW + L::kSums) + wg * 32 +
                                   wj * 8 + lane / 4;
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                const int q = c / kSteps;
                if (c % kSteps == 0) {
                    if (kt * kSliceK + c * 32 >= p.k) break;  // the groups that pad the last slice past K
#pragma unroll
                    for (int i = 0; i < 64; ++i) d[i] = kMagicBits;
                }
                widen_codes(words, c, a[c % 2]);
                wgmma::fence();
                wgmma::mma_u8s8(d, a[c % 2], wgmma::desc_sw128(x_addr + c * 32), true);
                wgmma::commit();
                if (c % kSteps != kSteps - 1) {  // more steps in this group: step c - 1's registers may be rebuilt
                    wgmma::wait<1>();
                    wgmma::pin(a[(c + 1) % 2]);
                    continue;
                }
                wgmma::wait<0>();
                wgmma::pin(d);
                wgmma::pin(a[c % 2]);
                const float4 sz = params[q * (w4a8::kGroupFloats / 4)];  // s(c), s(c + 8), z(c), z(c + 8)
#pragma unroll
                for (int i = 0; i < 16; ++i) {
                    const float2 sum = *reinterpret_cast<const float2 *>(sums + q * L::kRows + 8 * i);
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const int at_e = 4 * i + e;
                        const float dg = __fsub_rn(__int_as_float(d[at_e]), kMagic);  // exact
                        acc[at_e] = __fmaf_rn(e < 2 ? sz.x : sz.y, dg, acc[at_e]);
                        acc[at_e] = __fmaf_rn(e < 2 ? sz.z : sz.w, e % 2 == 0 ? sum.x : sum.y, acc[at_e]);
                    }
                }
            }
            ptx::mbarrier_arrive(&empty_bar[stage]);  // its sums, scales and zeros read too
            tma::next_stage<L::kStages>(stage, phase);
        }
        store_grouped_tile(p, acc, tile, wg, wj, lane);
    }
}

template <bool INT4, int GROUP>
__global__ void __launch_bounds__(384, 1)
    int8_gemm_kernel(const __grid_constant__ CUtensorMap x_map, const __grid_constant__ CUtensorMap w_map,
                     const __grid_constant__ CUtensorMap sums_map, const Int8Params p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using L = Int8Layout<INT4, GROUP>;
    extern __shared__ uint8_t smem_raw[];
    __shared__ __align__(8) uint64_t full_bar[L::kStages], empty_bar[L::kStages];
    const uint32_t raw_base = marlin::smem_addr(smem_raw);
    const uint32_t ring_base = (raw_base + 1023u) & ~1023u;  // the launch adds 1024 bytes of slack
    uint8_t *const ring = smem_raw + (ring_base - raw_base);

    marlin::launch_dependents();
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int n_tiles = (p.n + kTileColumns - 1) / kTileColumns;
    const marlin::TmaWork work =
        marlin::tma_work(p.whole_tiles != 0, static_cast<long long>(p.m_slices) * n_tiles, p.k_tiles,
                         static_cast<int>(blockIdx.x), static_cast<int>(gridDim.x));
    if (work.tiles <= 0) return;
    if (tid == 0) {
        for (int s = 0; s < L::kStages; ++s) {
            ptx::mbarrier_init(&full_bar[s], 1);
            ptx::mbarrier_init(&empty_bar[s], 256);
        }
        ptx::fence_proxy_async(ptx::space_shared);  // the barriers, visible to the copy engine
    }
    __syncthreads();
    const int total = static_cast<int>(work.slices(p.k_tiles));

    if (warp >= 8) {  // the producer warpgroup: one thread issues every copy
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegs));
        if (warp != 8 || lane != 0) return;
        auto copy_weights = [&](int stage, const tma::SliceCursor &c) {
            const int n_tile = c.tile / p.m_slices;
            uint64_t *bar = &full_bar[stage];
            ptx::mbarrier_arrive_expect_tx(ptx::sem_release, ptx::scope_cta, ptx::space_shared, bar, L::kBytes);
            uint8_t *dst = ring + stage * L::kStage + L::kX;
            if constexpr (INT4) {
                const uint32_t *src = p.w4 + (static_cast<size_t>(c.kt) * p.strips + 2 * n_tile) * (kStripBytes / 4);
                ptx::cp_async_bulk(ptx::space_cluster, ptx::space_global, dst, src, 2 * kStripBytes, bar);
                if constexpr (GROUP > 0) {  // the slice's groups of this tile: one contiguous run
                    const float *params =
                        p.w_groups + (static_cast<size_t>(n_tile) * p.padded_groups + c.kt * L::kGroups) *
                                         w4a8::kGroupFloats;
                    ptx::cp_async_bulk(ptx::space_cluster, ptx::space_global, dst + L::kW + L::kSums, params,
                                       L::kParams, bar);
                }
            } else {
                const int32_t coords[2] = {c.kt * kSliceK, n_tile * kTileColumns};
                ptx::cp_async_bulk_tensor(ptx::space_cluster, ptx::space_global, dst, &w_map, coords, bar);
            }
        };
        auto copy_x = [&](int stage, const tma::SliceCursor &c) {
            const int m_slice = c.tile - c.tile / p.m_slices * p.m_slices;
            const int32_t coords[2] = {c.kt * kSliceK, m_slice * L::kRows};
            ptx::cp_async_bulk_tensor(ptx::space_cluster, ptx::space_global, ring + stage * L::kStage, &x_map,
                                      coords, &full_bar[stage]);
            if constexpr (GROUP > 0) {  // the group sums of the tile's rows (rows past M arrive as zeros)
                const int32_t at[2] = {m_slice * L::kRows, c.kt * L::kGroups};
                ptx::cp_async_bulk_tensor(ptx::space_cluster, ptx::space_global,
                                          ring + stage * L::kStage + L::kX + L::kW, &sums_map, at, &full_bar[stage]);
            }
        };
        tma::produce<L::kStages>(work, p.k_tiles, total, empty_bar, copy_weights, copy_x);
        return;
    }

    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kConsumerRegs));
    marlin::wait_for_primary();  // the epilogue reads the row scales and sums the previous kernel wrote
    const int wg = warp / 4, wj = warp % 4;
    if constexpr (GROUP > 0) {
        consume_grouped<GROUP, L>(p, work, ring, ring_base, full_bar, empty_bar, wg, wj, lane);
        return;
    }
    int32_t acc[128];
    uint32_t a[2][4];  // INT4: the register operand of two k32 steps (the running one's must stay unchanged)
    int stage = 0, prev = -1;
    uint32_t phase = 0;
#pragma unroll 1
    for (int j = 0; j < work.tiles; ++j) {
        const int tile = work.tile(j);
        const int kt_begin = work.lo(tile, p.k_tiles), kt_end = work.hi(tile, p.k_tiles);
#pragma unroll 1
        for (int kt = kt_begin; kt < kt_end; ++kt) {
            tma::wait_parity(&full_bar[stage], phase);
            const uint32_t x_addr = ring_base + stage * L::kStage;
            if constexpr (INT4) {
                uint32_t words[8];
                load_codes(ring + stage * L::kStage + L::kX + wg * kStripBytes, wj, lane, words);
#pragma unroll
                for (int c = 0; c < 4; ++c) {
                    widen_codes(words, c, a[c % 2]);
                    wgmma::fence();
                    wgmma::mma_u8s8(acc, a[c % 2], wgmma::desc_sw128(x_addr + c * 32), kt != kt_begin || c != 0);
                    wgmma::commit();
                    // Step c - 1 is done: its registers may be rebuilt, and after step 0 the previous slice's last
                    // step, so its stage may be released.
                    wgmma::wait<1>();
                    wgmma::pin(a[(c + 1) % 2]);  // step c - 1's registers live until here
                    if (c == 0 && prev >= 0) ptx::mbarrier_arrive(&empty_bar[prev]);
                }
            } else {
                wgmma::fence();
                const uint32_t w_addr = x_addr + L::kX + wg * (64 * kSliceK);
#pragma unroll
                for (int c = 0; c < 4; ++c) {
                    wgmma::mma_s8(acc, wgmma::desc_sw128(w_addr + c * 32), wgmma::desc_sw128(x_addr + c * 32),
                                  kt != kt_begin || c != 0);
                }
                wgmma::commit();
                wgmma::wait<1>();  // the previous slice's group is done: its stage may be released
                if (prev >= 0) ptx::mbarrier_arrive(&empty_bar[prev]);
            }
            prev = stage;
            tma::next_stage<L::kStages>(stage, phase);
        }
        wgmma::wait<0>();
        wgmma::pin(acc);
        ptx::mbarrier_arrive(&empty_bar[prev]);
        prev = -1;
        finish_tile(p, acc, tile, kt_begin, kt_end, wg, wj, lane);
    }
#endif
}

template <bool INT4, int GROUP>
int launch_int8_gemm(const Int8GemmArgs &a, const marlin::LaunchEnv &env) {
    using L = Int8Layout<INT4, GROUP>;
    static_assert(L::kStages >= 3, "the ring needs three stages");
    static std::atomic<int> ready[64];
    const auto kernel = int8_gemm_kernel<INT4, GROUP>;
    if (const int rc = tma::prepare_persistent(kernel, L::kSmem, env, ready)) return rc;
    // [rows][k] INT8 matrices in 128 x box_rows boxes.
    CUtensorMap x_map, w_map, sums_map;
    if (!encode_rows_map(x_map, CU_TENSOR_MAP_DATA_TYPE_UINT8, a.xq, a.m, a.k, a.k, L::kRows, kSliceK)) {
        return kRcUnsupported;
    }
    if constexpr (INT4) {
        w_map = x_map;  // unused
    } else if (!encode_rows_map(w_map, CU_TENSOR_MAP_DATA_TYPE_UINT8, a.w, a.n, a.k, a.k, kTileColumns, kSliceK)) {
        return kRcUnsupported;
    }
    if constexpr (GROUP > 0) {  // [group][row] FP32, boxes of the slice's groups x the tile's rows, unswizzled
        const uint64_t ld_bytes = static_cast<uint64_t>(int8_group_sums_ld(a.m)) * sizeof(float);
        if (!encode_rows_map(sums_map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, a.x_group_sums, a.k / GROUP, a.m, ld_bytes,
                             L::kGroups, L::kRows, CU_TENSOR_MAP_SWIZZLE_NONE)) {
            return kRcUnsupported;
        }
    } else {
        sums_map = x_map;  // unused
    }
    Int8Params p{};
    p.w4 = INT4 ? static_cast<const uint32_t *>(a.w) : nullptr;
    p.x_scales = a.x_scales;
    p.x_sums = a.x_sums;
    p.w_scales = a.w_scales;
    p.w_zeros = a.w_zeros;
    p.w_groups = a.w_groups;
    p.y = a.y;
    p.m = a.m;
    p.n = a.n;
    p.k = a.k;
    p.m_slices = (a.m + L::kRows - 1) / L::kRows;
    p.k_tiles = (a.k + kSliceK - 1) / kSliceK;
    p.strips = static_cast<int>(w4a8::padded_n(a.n) / 64);
    p.padded_groups = GROUP > 0 ? static_cast<int>(w4a8::padded_groups(a.k, GROUP)) : 0;
    const long long tiles = static_cast<long long>(p.m_slices) * ((a.n + kTileColumns - 1) / kTileColumns);
    p.total_iters = tiles * p.k_tiles;
    if (p.total_iters >= (1LL << 31)) return kRcUnsupported;
    tma::PersistentGrid grid;
    if constexpr (GROUP > 0) {
        // Whole tiles only: a cut tile's FP32 totals would have to pass from block to block in k order to keep the
        // rule's order, and with few tiles the GPU is not filled anyway (small M, where the FP32 steps cost least).
        grid.blocks = std::min<long long>(tiles, env.sm_count);
        grid.whole_tiles = true;
    } else {
        grid = tma::persistent_grid(tiles, p.k_tiles, env,
                                    static_cast<size_t>(kTileRows) * kTileColumns * sizeof(int32_t));
        if (grid.rc != 0) return grid.rc;
    }
    p.whole_tiles = grid.whole_tiles ? 1 : 0;
    p.counters = grid.counters;
    p.partials = static_cast<int32_t *>(grid.slots);
    return tma::launch_persistent(kernel, grid, L::kSmem, env.stream, x_map, w_map, sums_map,
                                  static_cast<const Int8Params>(p));
}

}  // namespace

int int8_gemm(const Int8GemmArgs &a, Int8Weights weights, void *workspace, size_t workspace_bytes,
              cudaStream_t stream) {
    if (const int rc = check_int8_gemm_args(a, weights)) return rc;
    DeviceInfo dev;
    if (const int rc = current_device_info(dev)) return rc;
    if (dev.compute_capability != 90) return kRcUnsupported;  // sm_90a code runs on 9.0 alone
    const marlin::LaunchEnv env = marlin::launch_env(dev, workspace, workspace_bytes, stream);
    switch (a.group_size) {  // check_int8_gemm_args took the others out
        case 32:
            return launch_int8_gemm<true, 32>(a, env);
        case 64:
            return launch_int8_gemm<true, 64>(a, env);
        case 128:
            return launch_int8_gemm<true, 128>(a, env);
        default:
            break;
    }
    return weights == Int8Weights::Int4Packed ? launch_int8_gemm<true, 0>(a, env) : launch_int8_gemm<false, 0>(a, env);
}

#else  // built without sm_90a

int int8_gemm(const Int8GemmArgs &a, Int8Weights weights, void *, size_t, cudaStream_t) {
    if (const int rc = check_int8_gemm_args(a, weights)) return rc;
    return kRcUnsupported;
}

#endif

}  // namespace tl::gpu
