// Causal multi-head attention on Hopper's warpgroup MMA (wgmma.mma_async; sm_90a only, so this file is compiled for
// that target alone: cuda/sources_sm90a.txt), head_dim 64 and 128, FP16. cuda/forward/attention.cu runs it on compute
// capability 9.0 and keeps the mma.sync kernel (attention_mma.cu) for other GPUs.
//
// A block of two warpgroups owns one head and 128 queries, 64 per warpgroup (the M of the wgmma); it walks the key
// tiles of 128 keys up to the diagonal.
//  - K and V come into shared memory with cp.async, in a ring of three stages handed over by mbarriers (a stage is
//    full once every thread's copies have landed, empty once both warpgroups' products have read it), in the layout
//    the tensor cores read through a descriptor: 128-byte rows (64 head dims of one key) whose 16-byte chunks are
//    XOR-ed with row % 8 (the 128-byte swizzle), one panel of rows per 64 dims. Q is loaded the same way once.
//  - S = Q K^T: wgmma m64n128k16 with both operands in shared memory (Q and K are both K-major: dims contiguous);
//  - the causal mask (the diagonal tile only: 128 x 128 tiles are aligned, so it is the last one) and the online
//    softmax in FP32, each thread owning two query rows (g and g + 8 of its warp's 16), in log2 units;
//  - O += P V: P rounded to FP16 in registers, where the S accumulator of every 16 keys already has the layout of a
//    wgmma A fragment; V is the B operand read MN-major (dims contiguous) from the same swizzled rows, so that
//    nothing is transposed in memory.
// Scheduling ("ping-pong"): a warpgroup's phase j issues tile j - 1's P V and tile j's Q K^T together, then runs tile
// j's softmax. The two warpgroups take turns at issuing, so that one's softmax overlaps the other's products. Measured
// on an H100 at T = 4096, 16 heads, head_dim 128: 405 TFLOPS, against 321 for the same kernel with a block barrier
// per tile (both warpgroups' softmax at once) and 212 for the mma.sync kernel (docs/benchmarks.md).
// The output is divided by the row sum and stored FP16, head-major, as the other kernels store it.
// Grouped-query attention and packed sequences (Segments) as in attention_mma.cu.
//
// Precision: as attention_mma.cu (FP32 scores and sums, P rounded to FP16 for the P V product), and checked against
// the same bound (tests/gpu_score/kernels_test.cpp).
#include <cuda_fp16.h>

#include <atomic>
#include <cmath>
#include <type_traits>

#include "../gpu_common.cuh"
#include "attention_common.cuh"
#include "../mbarrier.cuh"
#include "../wgmma.cuh"
#include "forward_kernels.hpp"
#include "segments.cuh"

namespace tl::gpu {

#if defined(TL_HAVE_SM90A)
namespace {

using attention::cp_async16_zfill;
using attention::pack_half2;
using attention::smem_addr;

constexpr int kWarpgroups = 2;
constexpr int kThreads = 128 * kWarpgroups;
constexpr int kQueryTile = 64 * kWarpgroups;
constexpr int kKeyTile = 128;
constexpr int kKeyBlocks = kKeyTile / 8;  // n8 blocks of the S accumulator
constexpr float kLog2e = 1.4426950408889634f;
// Finite, so that exp2(m_old - m_new) is never (-inf) - (-inf) = NaN.
constexpr float kInitialMax = -1e30f;

static_assert(kQueryTile == kKeyTile, "the diagonal tile is the last one the block visits");
// K/V stages in the ring: a tile is in use from its Q K^T to its P V one phase later, while the next one loads.
constexpr int kStages = 3;

// Shared memory: Q [panel][kQueryTile][128 B], then kStages stages of K and V [panel][kKeyTile][128 B] each; a panel
// holds 64 head dims. Every panel starts on a 1024-byte boundary (the swizzle repeats every 8 rows).
template <int HD>
struct WgLayout {
    static constexpr int kPanels = HD / 64;
    static constexpr int kQPanel = kQueryTile * 128;
    static constexpr int kKvPanel = kKeyTile * 128;
    static constexpr int kQBytes = kPanels * kQPanel;
    static constexpr int kKvBytes = kPanels * kKvPanel;  // one K or V tile
    static constexpr int kSmemBytes = kQBytes + kStages * 2 * kKvBytes + 1024;  // + slack to align the start
};

// Named barriers 1 and 2 among the block's threads: one warpgroup syncs, the other arrives without waiting.
__device__ __forceinline__ void named_barrier_sync(int id) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "n"(kThreads) : "memory");
}
__device__ __forceinline__ void named_barrier_arrive(int id) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "n"(kThreads) : "memory");
}

// 2^x on the special-function unit alone (denormal results flushed to zero: probabilities below 2^-126 vanish in
// the FP16 P anyway, and the row sum they would join is at least 1). exp2f's denormal handling costs several more
// instructions per score, and the softmax is what each warpgroup runs while the other's products use the tensor cores.
__device__ __forceinline__ float exp2_ftz(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

template <int R>
__device__ __forceinline__ void pin_regs(uint32_t (&r)[R][4]) {
#pragma unroll
    for (int i = 0; i < R; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) asm volatile("" : "+r"(r[i][j])::"memory");
}

// ROWS rows x HD halves of one q/k/v part into the swizzled panels at dst; rows at or past t_count are zero-filled,
// so that masked keys have finite scores and zero values (0 * NaN would poison the P V product). Consecutive threads
// copy consecutive 16-byte chunks of a row.
template <int HD, int ROWS>
__device__ __forceinline__ void load_tile(uint32_t dst, const __half *src, int row0, int t_count, size_t row_stride) {
    constexpr int kChunks = HD / 8;
    static_assert(ROWS * kChunks % kThreads == 0, "every thread copies the same number of chunks");
#pragma unroll
    for (int i = 0; i < ROWS * kChunks / kThreads; ++i) {
        const int c = threadIdx.x + i * kThreads;
        const int r = c / kChunks, chunk = c % kChunks, t = row0 + r;
        const bool valid = t < t_count;
        const __half *from = src + static_cast<size_t>(valid ? t : 0) * row_stride + chunk * 8;
        const uint32_t to = dst + (chunk / 8) * (ROWS * 128) + r * 128 + (((chunk % 8) ^ (r % 8)) << 4);
        cp_async16_zfill(to, from, valid);
    }
}

template <int HD>
__global__ void __launch_bounds__(kThreads, 1)
    attention_wgmma_kernel(const __half *__restrict__ qkv, __half *__restrict__ out, int t_count,
                           const int32_t *__restrict__ seg_offsets, int n_heads, int n_kv_heads, float scale_log2) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using L = WgLayout<HD>;
    constexpr int kDimSteps = HD / 16;        // k16 steps of Q K^T
    constexpr int kKeySteps = kKeyTile / 16;  // k16 steps of P V
    constexpr int kOutBlocks = HD / 8;        // n8 blocks of the O accumulator

    extern __shared__ uint8_t smem_raw[];
    __shared__ __align__(8) uint64_t bars[1 + 2 * kStages];  // Q landed; per stage: full, empty
    const uint32_t raw_base = smem_addr(smem_raw);
    const uint32_t q_s = (raw_base + 1023u) & ~1023u;
    const uint32_t kv_s = q_s + L::kQBytes;  // stage s: K at kv_s + 2 s kKvBytes, V kKvBytes further
    const uint32_t q_full = smem_addr(bars), full0 = q_full + 8, empty0 = full0 + 8 * kStages;

    const int tid = threadIdx.x, wg = tid / 128, warp = (tid / 32) % 4, lane = tid % 32;
    const int g = lane / 4, tq = lane % 4;  // the accumulator layout: rows g, g + 8; columns 2 tq, 2 tq + 1
    const int head = blockIdx.y;
    const int q_tile = gridDim.x - 1 - blockIdx.x;  // the longest (latest) query tiles start first
    const int q0 = q_tile * kQueryTile;
    const size_t attn_dim = static_cast<size_t>(n_heads) * HD, kv_dim = static_cast<size_t>(n_kv_heads) * HD;
    const size_t row_stride = attn_dim + 2 * kv_dim;  // a multiple of 8 halves: every row start is 16-byte aligned
    const int kv_head = head / (n_heads / n_kv_heads);
    const forward::SegmentRows rows = forward::segment_rows(seg_offsets, t_count);
    t_count = rows.count;
    qkv += rows.first * row_stride;
    out += rows.first * attn_dim;
    if (q0 >= t_count) return;  // the whole block: before any barrier
    const __half *q_base = qkv + static_cast<size_t>(head) * HD;
    const __half *k_base = qkv + attn_dim + static_cast<size_t>(kv_head) * HD;
    const __half *v_base = k_base + kv_dim;
    const int n_tiles = q_tile + 1;

    if (tid == 0) {
        mbar::init(q_full, kThreads);
        for (int st = 0; st < kStages; ++st) {
            mbar::init(full0 + 8 * st, kThreads);
            mbar::init(empty0 + 8 * st, kThreads);
        }
    }
    __syncthreads();

    // Every thread copies its share of key tile t into stage t % kStages and arrives on the stage's full barrier
    // when those copies have landed.
    auto copy_tile = [&](int t) {
        const uint32_t st = kv_s + (t % kStages) * 2 * L::kKvBytes;
        load_tile<HD, kKeyTile>(st, k_base, t * kKeyTile, t_count, row_stride);
        load_tile<HD, kKeyTile>(st + L::kKvBytes, v_base, t * kKeyTile, t_count, row_stride);
        mbar::arrive_cp_async(full0 + 8 * (t % kStages));
    };
    load_tile<HD, kQueryTile>(q_s, q_base, q0, t_count, row_stride);
    mbar::arrive_cp_async(q_full);
    for (int t = 0; t < kStages - 1 && t < n_tiles; ++t) copy_tile(t);

    float o[HD / 2];
#pragma unroll
    for (int i = 0; i < HD / 2; ++i) o[i] = 0.0f;
    float s[kKeyBlocks * 4];
    uint32_t p[kKeySteps][4];
    float m[2] = {kInitialMax, kInitialMax}, l[2] = {0.0f, 0.0f};
    const int row0 = q0 + wg * 64 + warp * 16 + g;  // the query of accumulator elements 0, 1; row0 + 8 for 2, 3
    const uint32_t q_wg = q_s + wg * 64 * 128;     // this warpgroup's 64 query rows in each Q panel
    mbar::wait(q_full, 0);

    // Phase j issues this warpgroup's tensor-core work for tile j - 1's P V and tile j's Q K^T together; the two
    // warpgroups take turns at issuing (named barriers 1 and 2: "warpgroup 0's turn", "warpgroup 1's turn"), so that
    // one's softmax runs while the other's products keep the tensor cores busy. Warpgroup 0 goes first.
    if (wg == 1) named_barrier_arrive(1);
    // One phase, with the products it issues known at compile time (PV: tile j - 1's P V; QK: tile j's Q K^T), so
    // that no wgmma sits behind a run-time branch.
    auto phase = [&](int j, auto pv, auto qk) {
        constexpr bool kPv = decltype(pv)::value, kQk = decltype(qk)::value;
        if constexpr (kQk) {
            mbar::wait(full0 + 8 * (j % kStages), (j / kStages) & 1);
            // The copies were generic-proxy writes; the tensor cores read the stage through the async proxy.
            asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        }
        named_barrier_sync(1 + wg);
        wgmma::fence();
        if constexpr (kPv) {  // V's step ks starts 16 keys into the stage, its panels kKvPanel bytes apart
            const uint32_t v_st = kv_s + ((j - 1) % kStages) * 2 * L::kKvBytes + L::kKvBytes;
#pragma unroll
            for (int ks = 0; ks < kKeySteps; ++ks) {
                wgmma::mma_rs<Dtype::F16, true>(o, p[ks], wgmma::desc_sw128(v_st + ks * 16 * 128, L::kKvPanel), true);
            }
        }
        if constexpr (kQk) {  // the first step overwrites the accumulator
            const uint32_t k_st = kv_s + (j % kStages) * 2 * L::kKvBytes;
#pragma unroll
            for (int ds = 0; ds < kDimSteps; ++ds) {
                const uint32_t in_panel = (ds % 4) * 32;  // 16 dims = 32 bytes into the panel's rows
                const uint64_t desc_q = wgmma::desc_sw128(q_wg + (ds / 4) * L::kQPanel + in_panel);
                const uint64_t desc_k = wgmma::desc_sw128(k_st + (ds / 4) * L::kKvPanel + in_panel);
                wgmma::mma_ss<Dtype::F16>(s, desc_q, desc_k, ds > 0);
            }
        }
        wgmma::commit();
        // The other warpgroup's turn (warpgroup 1's last phase has no successor).
        if (wg == 0 || kQk) named_barrier_arrive(2 - wg);
        wgmma::wait<0>();
        if constexpr (kQk) wgmma::pin(s);
        if constexpr (kPv) {
            wgmma::pin(o);
            pin_regs(p);  // the fragments stay allocated until the tensor cores have read them
            mbar::arrive(empty0 + 8 * ((j - 1) % kStages));
        }
    };
    // After tile j's Q K^T: its mask and online softmax, P for the next phase, and the copy of tile j + 2.
    auto softmax = [&](int j) {
        if (j == q_tile) {  // the diagonal tile: key > query is masked (this also masks every key >= t_count)
#pragma unroll
            for (int nb = 0; nb < kKeyBlocks; ++nb) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int key = j * kKeyTile + nb * 8 + 2 * tq + (e & 1);
                    if (key > row0 + (e >> 1) * 8) s[4 * nb + e] = -INFINITY;
                }
            }
        }
        // Rows r = 0 (g) and 1 (g + 8): elements 2r, 2r + 1 of every n8 block. O holds the products up to tile
        // j - 1 (its P V has completed).
        float alpha[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            float mx = -INFINITY;
#pragma unroll
            for (int nb = 0; nb < kKeyBlocks; ++nb) mx = fmaxf(mx, fmaxf(s[4 * nb + 2 * r], s[4 * nb + 2 * r + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            const float m_new = fmaxf(m[r], mx * scale_log2);  // scale_log2 > 0: max and scaling commute
            alpha[r] = exp2_ftz(m[r] - m_new);
            m[r] = m_new;
            float sum = 0.0f;
#pragma unroll
            for (int nb = 0; nb < kKeyBlocks; ++nb) {
#pragma unroll
                for (int e = 2 * r; e < 2 * r + 2; ++e) {
                    s[4 * nb + e] = exp2_ftz(fmaf(s[4 * nb + e], scale_log2, -m_new));  // masked: exp2(-inf) = 0
                    sum += s[4 * nb + e];
                }
            }
            l[r] = fmaf(l[r], alpha[r], sum);
        }
        // Once the rows' maxima have settled (most tiles of a long row), no row of the warp moves: skip the rescale.
        if (__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) {
#pragma unroll
            for (int nb = 0; nb < kOutBlocks; ++nb) {
                o[4 * nb + 0] *= alpha[0];
                o[4 * nb + 1] *= alpha[0];
                o[4 * nb + 2] *= alpha[1];
                o[4 * nb + 3] *= alpha[1];
            }
        }
        // P's A fragment for 16 keys is the S accumulator of n8 blocks 2 ks and 2 ks + 1.
#pragma unroll
        for (int ks = 0; ks < kKeySteps; ++ks) {
            p[ks][0] = pack_half2(s[8 * ks + 0], s[8 * ks + 1]);
            p[ks][1] = pack_half2(s[8 * ks + 2], s[8 * ks + 3]);
            p[ks][2] = pack_half2(s[8 * ks + 4], s[8 * ks + 5]);
            p[ks][3] = pack_half2(s[8 * ks + 6], s[8 * ks + 7]);
        }
        // Tile j + 2 goes into the stage of tile j - 1, once both warpgroups' P V of it are done.
        const int t = j + kStages - 1;
        if (t < n_tiles) {
            if (t >= kStages) mbar::wait(empty0 + 8 * (t % kStages), ((t / kStages) - 1) & 1);
            copy_tile(t);
        }
    };
    using std::false_type, std::true_type;
    phase(0, false_type{}, true_type{});
    softmax(0);
    for (int j = 1; j < n_tiles; ++j) {
        phase(j, true_type{}, true_type{});
        softmax(j);
    }
    phase(n_tiles, true_type{}, false_type{});

#pragma unroll
    for (int r = 0; r < 2; ++r) {
        float total = l[r];
        total += __shfl_xor_sync(0xffffffffu, total, 1);
        total += __shfl_xor_sync(0xffffffffu, total, 2);
        const float inv = 1.0f / total;  // total >= ~1: the row's maximum contributed exp2(0) when it was reached
        const int t = row0 + r * 8;
        if (t >= t_count) continue;
        __half *o_row = out + static_cast<size_t>(t) * attn_dim + static_cast<size_t>(head) * HD + 2 * tq;
#pragma unroll
        for (int nb = 0; nb < kOutBlocks; ++nb) {
            *reinterpret_cast<__half2 *>(o_row + nb * 8) =
                __floats2half2_rn(o[4 * nb + 2 * r] * inv, o[4 * nb + 2 * r + 1] * inv);
        }
    }
#endif
}

template <int HD>
int launch(const uint16_t *qkv, uint16_t *out, int t_count, int n_heads, int n_kv_heads, Segments segments,
           cudaStream_t stream) {
    constexpr int smem = WgLayout<HD>::kSmemBytes;
    constexpr int kMaxDevices = 64;
    static std::atomic<bool> opted_in[kMaxDevices];
    DeviceInfo info;
    if (const int rc = current_device_info(info); rc != 0) return rc;
    if (info.compute_capability != 90 || info.max_smem_optin < smem) return kRcUnsupported;
    if (!opted_in[info.device].load(std::memory_order_relaxed)) {
        TL_GPU_CHECK(cudaFuncSetAttribute(attention_wgmma_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          smem));
        opted_in[info.device].store(true, std::memory_order_relaxed);
    }
    const int longest = segments.offsets != nullptr ? segments.max_len : t_count;
    const dim3 grid((longest + kQueryTile - 1) / kQueryTile, n_heads, segments.count);
    const float scale_log2 = kLog2e / sqrtf(static_cast<float>(HD));
    attention_wgmma_kernel<HD><<<grid, kThreads, smem, stream>>>(reinterpret_cast<const __half *>(qkv),
                                                                 reinterpret_cast<__half *>(out), t_count,
                                                                 segments.offsets, n_heads, n_kv_heads, scale_log2);
    TL_GPU_CHECK_LAUNCH();
    return 0;
}

}  // namespace

bool attention_wgmma_built() { return true; }

int causal_attention_wgmma(const uint16_t *qkv, uint16_t *out, int t_count, int n_heads, int n_kv_heads, int head_dim,
                           Segments segments, cudaStream_t stream) {
    // 16-byte cp.async from every row start (as the mma.sync kernel); half2 stores.
    if ((head_dim != 64 && head_dim != 128) || !aligned16(qkv) || (reinterpret_cast<uintptr_t>(out) & 3u) != 0) {
        return kRcUnsupported;
    }
    return head_dim == 64 ? launch<64>(qkv, out, t_count, n_heads, n_kv_heads, segments, stream)
                          : launch<128>(qkv, out, t_count, n_heads, n_kv_heads, segments, stream);
}

#else  // built without sm_90a: the dispatcher uses the mma.sync kernel

bool attention_wgmma_built() { return false; }
int causal_attention_wgmma(const uint16_t *, uint16_t *, int, int, int, int, Segments, cudaStream_t) {
    return kRcUnsupported;
}

#endif

}  // namespace tl::gpu
