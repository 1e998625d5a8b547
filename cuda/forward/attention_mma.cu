// Causal multi-head attention on the tensor cores (FlashAttention-2's structure with mma.sync m16n8k16: FP16
// inputs, FP32 accumulation), for head_dim 64 and 128. cuda/forward/attention.cu dispatches here and keeps the SIMT
// kernel for every other head_dim.
//
// A block of 4 warps owns one head and a tile of 64 queries, 16 per warp (the m16 of the mma); it walks the key tiles
// of 64 keys up to the diagonal. Per key tile:
//  - K and V (FP16) come into shared memory with cp.async, double-buffered: tile j + 1 loads while tile j computes;
//  - S = Q K^T: the warp's Q fragments sit in registers for the whole walk (loaded once with ldmatrix), the K
//    fragments come from ldmatrix on the key rows (K is [key][dim], i.e. already the "col" operand);
//  - online softmax in FP32, each thread owning two query rows (g and g + 8 of its warp's 16): the running max is
//    reduced across the 4 lanes of a quad every tile, the running sum stays a per-thread partial (reduced once at
//    the end: the rescaling factors are the same for the whole row). Scores are in log2 units (scale * log2(e)
//    folded into one FMA before exp2);
//  - the causal mask is applied only on the diagonal tile (64 x 64 tiles are aligned, so it is the last one and
//    fully masked tiles are never visited);
//  - O += P V: P is rounded to FP16 in registers, where the S accumulators already have the layout of the A
//    operand; V fragments come from the transposing ldmatrix (V is [key][dim], the mma wants [dim][key]).
// The output is divided by the row sum and stored FP16, head-major, exactly as the SIMT kernel stores it.
// Grouped-query attention: the block of query head h reads K/V head h / group from where it lies in each qkv row
// ([q heads | k heads | v heads]); nothing is repeated in memory.
//
// Precision: the scores and all sums are FP32; the only roundings beyond the SIMT kernel's are those of P to FP16
// (relative 2^-11, or absolute 2^-25 once P falls into FP16's subnormal range). The row sum adds the unrounded
// probabilities, so the output's error is bounded by sum_j (2^-11 p_j + 2^-25) |v_j| / sum_j p_j plus the final
// FP16 rounding (tests/gpu_score/kernels_test.cpp checks exactly that bound).
#include <cuda_fp16.h>

#include <atomic>
#include <cmath>

#include "../gpu_common.cuh"
#include "attention_common.cuh"
#include "forward_kernels.hpp"
#include "segments.cuh"

namespace tl::gpu {

namespace {

using attention::cp_async16_zfill;
using attention::pack_half2;
using attention::quad_max;
using attention::quad_sum;
using attention::smem_addr;

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kQueryTile = kWarps * 16;  // one m16 row block per warp
constexpr int kKeyTile = 64;
constexpr float kLog2e = 1.4426950408889634f;
// Finite, so that exp2(m_old - m_new) is never (-inf) - (-inf) = NaN.
constexpr float kInitialMax = -1e30f;

static_assert(kQueryTile == kKeyTile, "the diagonal tile is the last one the block visits");

// Shared-memory rows are head_dim + 8 halves: the 8 rows one ldmatrix matrix reads then start 16 bytes apart modulo
// 128, i.e. in distinct bank quads (no conflicts), and every row stays 16-byte aligned for cp.async.
template <int HD>
struct Layout {
    static constexpr int kRow = HD + 8;                  // halves per shared row
    static constexpr int kQHalves = kQueryTile * kRow;   // the query tile
    static constexpr int kKvHalves = kKeyTile * kRow;    // one K or V stage
    static constexpr size_t kSmemBytes = sizeof(__half) * (kQHalves + 4 * kKvHalves);  // Q, K x 2, V x 2
};

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// d += a * b, m16n8k16, FP16 inputs, FP32 accumulators.
__device__ __forceinline__ void mma_f16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// 64 rows x HD halves of one q/k/v part into shared memory (row stride Layout<HD>::kRow); rows at or past t_count
// are zero-filled, so that masked keys have finite scores and zero values (0 * NaN would poison the P V product).
template <int HD>
__device__ __forceinline__ void load_tile(__half *dst, const __half *src, int row0, int t_count, size_t row_stride) {
    constexpr int kChunks = HD / 8;  // 16-byte chunks per row
    constexpr int kRow = Layout<HD>::kRow;
#pragma unroll
    for (int i = 0; i < kKeyTile * kChunks / kThreads; ++i) {
        const int c = threadIdx.x + i * kThreads;
        const int r = c / kChunks, chunk = c % kChunks, t = row0 + r;
        const bool valid = t < t_count;
        const __half *from = src + static_cast<size_t>(valid ? t : 0) * row_stride + chunk * 8;
        cp_async16_zfill(smem_addr(dst + r * kRow + chunk * 8), from, valid);
    }
}

// Block z works on sequence z of seg_offsets (rows [seg_offsets[z], seg_offsets[z + 1])), or on all t_count rows
// when seg_offsets is nullptr; query tiles past its sequence's end exit at once.
template <int HD>
__global__ void __launch_bounds__(kThreads) attention_mma_kernel(const __half *__restrict__ qkv,
                                                                  __half *__restrict__ out, int t_count,
                                                                  const int32_t *__restrict__ seg_offsets,
                                                                  int n_heads, int n_kv_heads, float scale_log2) {
    using L = Layout<HD>;
    constexpr int kRow = L::kRow;
    constexpr int kDimSteps = HD / 16;      // k16 steps of Q K^T
    constexpr int kOutTiles = HD / 8;       // n8 tiles of O
    constexpr int kKeyTiles = kKeyTile / 8; // n8 tiles of S
    static_assert(kKeyTile * (HD / 8) % kThreads == 0, "every thread copies the same number of chunks");

    extern __shared__ __align__(16) unsigned char smem_raw[];
    __half *q_s = reinterpret_cast<__half *>(smem_raw);  // [kQueryTile][kRow]
    __half *k_s = q_s + L::kQHalves;                     // [2][kKeyTile][kRow]
    __half *v_s = k_s + 2 * L::kKvHalves;                // [2][kKeyTile][kRow]

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, tq = lane & 3;  // the accumulator layout: rows g, g + 8; columns 2 tq, 2 tq + 1
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

    load_tile<HD>(q_s, q_base, q0, t_count, row_stride);
    load_tile<HD>(k_s, k_base, 0, t_count, row_stride);
    load_tile<HD>(v_s, v_base, 0, t_count, row_stride);
    cp_async_commit();
    cp_async_wait_all();
    __syncthreads();

    // A fragments of the warp's 16 queries: matrix i of the x4 is rows (i & 1) * 8.., dims (i >> 1) * 8.. of the step.
    uint32_t q_frag[kDimSteps][4];
#pragma unroll
    for (int ds = 0; ds < kDimSteps; ++ds) {
        ldmatrix_x4(q_frag[ds], smem_addr(q_s + (warp * 16 + (lane & 15)) * kRow + ds * 16 + (lane >> 4) * 8));
    }

    float o[kOutTiles][4];
#pragma unroll
    for (int dt = 0; dt < kOutTiles; ++dt) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.0f;
    float m[2] = {kInitialMax, kInitialMax}, l[2] = {0.0f, 0.0f};
    const int row0 = q0 + warp * 16 + g;  // the query of accumulator elements 0, 1; row0 + 8 for elements 2, 3

    const int n_tiles = q_tile + 1;
    for (int j = 0; j < n_tiles; ++j) {
        // Stage (j + 1) & 1 was last read in iteration j - 1, which every warp finished before the barrier that
        // ended it (or the one before the loop).
        if (j + 1 < n_tiles) {
            const int stage = (j + 1) & 1;
            load_tile<HD>(k_s + stage * L::kKvHalves, k_base, (j + 1) * kKeyTile, t_count, row_stride);
            load_tile<HD>(v_s + stage * L::kKvHalves, v_base, (j + 1) * kKeyTile, t_count, row_stride);
            cp_async_commit();
        }
        const __half *ks = k_s + (j & 1) * L::kKvHalves;
        const __half *vs = v_s + (j & 1) * L::kKvHalves;

        // S = Q K^T. Matrix i of a K x4: keys (i >> 1) * 8.. (two n8 tiles), dims (i & 1) * 8.. (b0, b1).
        float s[kKeyTiles][4];
#pragma unroll
        for (int nt = 0; nt < kKeyTiles; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
        for (int ds = 0; ds < kDimSteps; ++ds) {
#pragma unroll
            for (int np = 0; np < kKeyTiles / 2; ++np) {
                uint32_t b[4];
                const int key = np * 16 + (lane & 7) + ((lane >> 4) << 3);
                const int dim = ds * 16 + (((lane >> 3) & 1) << 3);
                ldmatrix_x4(b, smem_addr(ks + key * kRow + dim));
                mma_f16(s[2 * np], q_frag[ds], b[0], b[1]);
                mma_f16(s[2 * np + 1], q_frag[ds], b[2], b[3]);
            }
        }

        if (j == q_tile) {  // the diagonal tile: key > query is masked (this also masks every key >= t_count)
#pragma unroll
            for (int nt = 0; nt < kKeyTiles; ++nt) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int key = j * kKeyTile + nt * 8 + 2 * tq + (e & 1);
                    if (key > row0 + (e >> 1) * 8) s[nt][e] = -INFINITY;
                }
            }
        }

        // Online softmax, rows r = 0 (g) and 1 (g + 8): elements 2r, 2r + 1 of every n8 tile.
        float alpha[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            float mx = -INFINITY;
#pragma unroll
            for (int nt = 0; nt < kKeyTiles; ++nt) mx = fmaxf(mx, fmaxf(s[nt][2 * r], s[nt][2 * r + 1]));
            const float m_new = fmaxf(m[r], quad_max(mx) * scale_log2);  // scale_log2 > 0: max and scaling commute
            alpha[r] = exp2f(m[r] - m_new);
            m[r] = m_new;
            float sum = 0.0f;
#pragma unroll
            for (int nt = 0; nt < kKeyTiles; ++nt) {
#pragma unroll
                for (int e = 2 * r; e < 2 * r + 2; ++e) {
                    s[nt][e] = exp2f(fmaf(s[nt][e], scale_log2, -m_new));  // masked: exp2(-inf) = 0
                    sum += s[nt][e];
                }
            }
            l[r] = fmaf(l[r], alpha[r], sum);
        }
#pragma unroll
        for (int dt = 0; dt < kOutTiles; ++dt) {
            o[dt][0] *= alpha[0];
            o[dt][1] *= alpha[0];
            o[dt][2] *= alpha[1];
            o[dt][3] *= alpha[1];
        }

        // O += P V, one k16 step per 16 keys. P's A fragment is the S accumulators of n8 tiles 2 kstep and 2 kstep + 1.
        // Matrix i of a V x4 (transposed): keys (i & 1) * 8.. (b0, b1), dims (i >> 1) * 8.. (two n8 tiles).
#pragma unroll
        for (int kstep = 0; kstep < kKeyTile / 16; ++kstep) {
            const uint32_t a[4] = {pack_half2(s[2 * kstep][0], s[2 * kstep][1]),
                                   pack_half2(s[2 * kstep][2], s[2 * kstep][3]),
                                   pack_half2(s[2 * kstep + 1][0], s[2 * kstep + 1][1]),
                                   pack_half2(s[2 * kstep + 1][2], s[2 * kstep + 1][3])};
#pragma unroll
            for (int dp = 0; dp < kOutTiles / 2; ++dp) {
                uint32_t b[4];
                const int key = kstep * 16 + (lane & 7) + (((lane >> 3) & 1) << 3);
                const int dim = dp * 16 + ((lane >> 4) << 3);
                ldmatrix_x4_trans(b, smem_addr(vs + key * kRow + dim));
                mma_f16(o[2 * dp], a, b[0], b[1]);
                mma_f16(o[2 * dp + 1], a, b[2], b[3]);
            }
        }

        if (j + 1 < n_tiles) {
            cp_async_wait_all();  // this thread's copies of tile j + 1 have landed ...
            __syncthreads();      // ... everyone's have, and every warp is done reading stage j & 1
        }
    }

#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const float total = quad_sum(l[r]);
        const float inv = 1.0f / total;  // total >= ~1: the row's maximum contributed exp2(0) when it was reached
        const int t = row0 + r * 8;
        if (t >= t_count) continue;
        __half *o_row = out + static_cast<size_t>(t) * attn_dim + static_cast<size_t>(head) * HD + 2 * tq;
#pragma unroll
        for (int dt = 0; dt < kOutTiles; ++dt) {
            *reinterpret_cast<__half2 *>(o_row + dt * 8) =
                __floats2half2_rn(o[dt][2 * r] * inv, o[dt][2 * r + 1] * inv);
        }
    }
}

template <int HD>
int launch(const uint16_t *qkv, uint16_t *out, int t_count, int n_heads, int n_kv_heads, Segments segments,
           cudaStream_t stream) {
    constexpr size_t smem = Layout<HD>::kSmemBytes;
    if (smem > 48 * 1024) {  // above the default the block must opt in (87 KB for head_dim 128), once per device
        constexpr int kMaxDevices = 64;
        static std::atomic<bool> opted_in[kMaxDevices];
        DeviceInfo info;
        if (const int rc = current_device_info(info); rc != 0) return rc;
        if (static_cast<size_t>(info.max_smem_optin) < smem) return kRcUnsupported;
        if (!opted_in[info.device].load(std::memory_order_relaxed)) {
            TL_GPU_CHECK(cudaFuncSetAttribute(attention_mma_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                              static_cast<int>(smem)));
            opted_in[info.device].store(true, std::memory_order_relaxed);
        }
    }
    const int longest = segments.offsets != nullptr ? segments.max_len : t_count;
    const dim3 grid((longest + kQueryTile - 1) / kQueryTile, n_heads, segments.count);
    const float scale_log2 = kLog2e / sqrtf(static_cast<float>(HD));
    attention_mma_kernel<HD><<<grid, kThreads, smem, stream>>>(reinterpret_cast<const __half *>(qkv),
                                                               reinterpret_cast<__half *>(out), t_count,
                                                               segments.offsets, n_heads, n_kv_heads, scale_log2);
    TL_GPU_CHECK_LAUNCH();
    return 0;
}

}  // namespace

bool attention_tensor_core_supported(const uint16_t *qkv, const uint16_t *out, int head_dim) {
    // 16-byte cp.async from every row start: qkv 16-byte aligned and head_dim % 8 == 0 (row stride and head offsets);
    // the stores are half2, so out needs 4 bytes.
    return (head_dim == 64 || head_dim == 128) && aligned16(qkv) && (reinterpret_cast<uintptr_t>(out) & 3u) == 0;
}

int causal_attention_tensor_core(const uint16_t *qkv, uint16_t *out, int t_count, int n_heads, int n_kv_heads,
                                 int head_dim, Segments segments, cudaStream_t stream) {
    if (!attention_tensor_core_supported(qkv, out, head_dim)) return kRcUnsupported;
    return head_dim == 64 ? launch<64>(qkv, out, t_count, n_heads, n_kv_heads, segments, stream)
                          : launch<128>(qkv, out, t_count, n_heads, n_kv_heads, segments, stream);
}

}  // namespace tl::gpu
