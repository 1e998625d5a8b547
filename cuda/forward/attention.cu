// Causal multi-head attention, tiled with an online softmax (FlashAttention's recurrence) in FP32 on the SIMT cores.
//
// A block of 4 warps owns one head and a tile of 32 queries (8 per warp); it walks the key tiles of 32 keys up to
// the diagonal. Per key tile:
//  - the block stages K and V (FP16) in shared memory; the queries sit there in FP32, pre-scaled by
//    log2(e)/sqrt(head_dim) so that the softmax is a plain exp2;
//  - scores: lane j owns key j of the tile and computes its dot product with the warp's 8 queries (each K element
//    read from shared memory once feeds 8 FMAs);
//  - the running max m, the per-lane partial sum l and the output accumulators are rescaled by exp2(m_old - m_new);
//  - P x V: each lane owns head_dim/32 output dimensions (pairs 2p, 2p + 1 for p = lane + 32i) of all 8 queries and
//    walks the tile's 32 keys, reading the probabilities from shared memory (broadcast) and one V pair per key.
// Memory per block is O(tile), never O(T^2). Grouped-query attention: the block of query head h stages the K/V head
// h / group in place (qkv rows are [q heads | k heads | v heads]); nothing is repeated in memory. This is the
// fallback: head_dim 64 and 128 go to the tensor-core kernel of attention_mma.cu (see causal_attention at the end).
#include <cuda_fp16.h>

#include <cmath>

#include "../gpu_common.cuh"
#include "forward_kernels.hpp"
#include "segments.cuh"
#include "reduce.cuh"

namespace tl::gpu {

namespace {

using forward::warp_max;
using forward::warp_sum;

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kRowsPerWarp = 8;                      // queries per warp: the register blocking of the scores
constexpr int kQueryTile = kWarps * kRowsPerWarp;    // 32 queries per block
constexpr int kKeyTile = 32;                         // one key per lane
constexpr float kLog2e = 1.4426950408889634f;
// The running max starts finite, so exp2(m_old - m_new) is never (-inf) - (-inf) = NaN, even for a tile whose keys
// are all masked.
constexpr float kInitialMax = -1e30f;

static_assert(kRowsPerWarp % 4 == 0, "probabilities are read as float4");
static_assert(kQueryTile == kKeyTile, "the diagonal tile is the last one: every query sees >= 1 key per tile");

// Dimensions padded to a multiple of 4 (float4 query reads, 8-byte K reads); the padding is zero-filled.
__host__ __device__ constexpr int padded_dim(int head_dim) { return (head_dim + 3) & ~3; }
// K/V rows in shared memory: padded_dim + 4 halves, so that the 8-byte K reads of 16 consecutive lanes (one key
// row each) land in distinct bank pairs when head_dim % 8 == 0.
__host__ __device__ constexpr int kv_row(int head_dim) { return padded_dim(head_dim) + 4; }

size_t smem_bytes(int head_dim) {
    return sizeof(float) * kQueryTile * padded_dim(head_dim)              // queries
           + 2 * sizeof(__half) * kKeyTile * kv_row(head_dim)             // K and V
           + sizeof(float) * kWarps * kKeyTile * kRowsPerWarp;            // probabilities
}

// PAIRS = ceil(head_dim / 64): dimension pairs per lane in the output accumulators.
// Block z works on sequence z of seg_offsets (as attention_mma_kernel), or on all t_count rows when it is nullptr.
template <int PAIRS>
__global__ void __launch_bounds__(kThreads) attention_kernel(const __half *qkv, __half *out, int t_count,
                                                             const int32_t *seg_offsets, int n_heads, int n_kv_heads,
                                                             int head_dim, float q_scale) {
    extern __shared__ float4 smem[];
    const int d4 = padded_dim(head_dim), ldkv = kv_row(head_dim);
    // Every region's size is a multiple of 16 bytes, so each starts 16-byte aligned.
    float *q_s = reinterpret_cast<float *>(smem);                  // [kQueryTile][d4]
    __half *k_s = reinterpret_cast<__half *>(q_s + kQueryTile * d4);  // [kKeyTile][ldkv]
    __half *v_s = k_s + kKeyTile * ldkv;                             // [kKeyTile][ldkv]
    float *p_s = reinterpret_cast<float *>(v_s + kKeyTile * ldkv);  // [kWarps][kKeyTile][kRowsPerWarp]

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int head = blockIdx.y;
    const int q0 = (gridDim.x - 1 - blockIdx.x) * kQueryTile;  // the longest (latest) query tiles start first
    const size_t attn_dim = static_cast<size_t>(n_heads) * head_dim;
    const size_t kv_dim = static_cast<size_t>(n_kv_heads) * head_dim;
    const size_t row_stride = attn_dim + 2 * kv_dim;
    const int kv_head = head / (n_heads / n_kv_heads);  // the K/V head this query head reads
    const forward::SegmentRows rows = forward::segment_rows(seg_offsets, t_count);
    t_count = rows.count;
    qkv += rows.first * row_stride;
    out += rows.first * attn_dim;
    if (q0 >= t_count) return;  // the whole block: before any barrier
    const __half *q_base = qkv + static_cast<size_t>(head) * head_dim;
    const __half *k_base = qkv + attn_dim + static_cast<size_t>(kv_head) * head_dim;
    const __half *v_base = k_base + kv_dim;

    for (int i = threadIdx.x; i < kQueryTile * d4; i += kThreads) {
        const int r = i / d4, d = i - r * d4, t = q0 + r;
        q_s[i] = t < t_count && d < head_dim ? __half2float(q_base[t * row_stride + d]) * q_scale : 0.0f;
    }

    float m[kRowsPerWarp], l[kRowsPerWarp], o[kRowsPerWarp][PAIRS][2];
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
        m[r] = kInitialMax;
        l[r] = 0.0f;
#pragma unroll
        for (int p = 0; p < PAIRS; ++p) o[r][p][0] = o[r][p][1] = 0.0f;
    }

    const int last_key = min(q0 + kQueryTile, t_count) - 1;  // keys 0..last_key are seen by some query of the tile
    const int n_tiles = last_key / kKeyTile + 1;
    const int pairs_per_row = d4 / 2;
    float *p_warp = p_s + warp * kKeyTile * kRowsPerWarp;
    for (int tile = 0; tile < n_tiles; ++tile) {
        const int k0 = tile * kKeyTile;
        __syncthreads();  // every warp is done with the previous tile's K and V (and, for tile 0, q_s is written)
        for (int i = threadIdx.x; i < kKeyTile * pairs_per_row; i += kThreads) {
            const int j = i / pairs_per_row, d = 2 * (i - j * pairs_per_row), key = k0 + j;
            __half2 kv = __float2half2_rn(0.0f), vv = kv;
            if (key < t_count && d < head_dim) {
                kv = *reinterpret_cast<const __half2 *>(k_base + key * row_stride + d);
                vv = *reinterpret_cast<const __half2 *>(v_base + key * row_stride + d);
            }
            *reinterpret_cast<__half2 *>(k_s + j * ldkv + d) = kv;
            *reinterpret_cast<__half2 *>(v_s + j * ldkv + d) = vv;
        }
        __syncthreads();

        // Scores of this lane's key against the warp's queries (log2 units).
        float s[kRowsPerWarp];
#pragma unroll
        for (int r = 0; r < kRowsPerWarp; ++r) s[r] = 0.0f;
        const __half *k_row = k_s + lane * ldkv;
        const float *q_warp = q_s + warp * kRowsPerWarp * d4;
        for (int c = 0; c < d4; c += 4) {
            const uint2 raw = *reinterpret_cast<const uint2 *>(k_row + c);
            const float2 k01 = __half22float2(*reinterpret_cast<const __half2 *>(&raw.x));
            const float2 k23 = __half22float2(*reinterpret_cast<const __half2 *>(&raw.y));
#pragma unroll
            for (int r = 0; r < kRowsPerWarp; ++r) {
                const float4 q = *reinterpret_cast<const float4 *>(q_warp + r * d4 + c);
                s[r] = fmaf(q.x, k01.x, s[r]);
                s[r] = fmaf(q.y, k01.y, s[r]);
                s[r] = fmaf(q.z, k23.x, s[r]);
                s[r] = fmaf(q.w, k23.y, s[r]);
            }
        }

        // Online softmax update; masked keys get probability exactly 0.
        const int key = k0 + lane;
#pragma unroll
        for (int r = 0; r < kRowsPerWarp; ++r) {
            const int t = q0 + warp * kRowsPerWarp + r;
            const float score = key <= t ? s[r] : -INFINITY;
            const float m_new = fmaxf(m[r], warp_max(score));
            const float alpha = exp2f(m[r] - m_new);
            const float p = exp2f(score - m_new);
            m[r] = m_new;
            l[r] = fmaf(l[r], alpha, p);
#pragma unroll
            for (int pp = 0; pp < PAIRS; ++pp) {
                o[r][pp][0] *= alpha;
                o[r][pp][1] *= alpha;
            }
            p_warp[lane * kRowsPerWarp + r] = p;
        }
        __syncwarp();

        // Output += P x V over the tile's keys.
        for (int j = 0; j < kKeyTile; ++j) {
            float pj[kRowsPerWarp];
#pragma unroll
            for (int r = 0; r < kRowsPerWarp; r += 4) {
                const float4 p4 = *reinterpret_cast<const float4 *>(p_warp + j * kRowsPerWarp + r);
                pj[r] = p4.x;
                pj[r + 1] = p4.y;
                pj[r + 2] = p4.z;
                pj[r + 3] = p4.w;
            }
            const __half *v_row = v_s + j * ldkv;
#pragma unroll
            for (int pp = 0; pp < PAIRS; ++pp) {
                const int d = 2 * (lane + 32 * pp);
                if (d < head_dim) {
                    const float2 v = __half22float2(*reinterpret_cast<const __half2 *>(v_row + d));
#pragma unroll
                    for (int r = 0; r < kRowsPerWarp; ++r) {
                        o[r][pp][0] = fmaf(pj[r], v.x, o[r][pp][0]);
                        o[r][pp][1] = fmaf(pj[r], v.y, o[r][pp][1]);
                    }
                }
            }
        }
        __syncwarp();  // the probabilities are read before the next tile overwrites them
    }

#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
        const float total = warp_sum(l[r]);
        const int t = q0 + warp * kRowsPerWarp + r;
        if (t >= t_count) continue;
        __half *o_row = out + static_cast<size_t>(t) * attn_dim + static_cast<size_t>(head) * head_dim;
#pragma unroll
        for (int pp = 0; pp < PAIRS; ++pp) {
            const int d = 2 * (lane + 32 * pp);
            if (d < head_dim) {
                *reinterpret_cast<__half2 *>(o_row + d) =
                    __floats2half2_rn(o[r][pp][0] / total, o[r][pp][1] / total);
            }
        }
    }
}

template <int PAIRS>
int launch(const uint16_t *qkv, uint16_t *out, int t_count, int n_heads, int n_kv_heads, int head_dim,
           Segments segments, cudaStream_t stream) {
    const size_t smem = smem_bytes(head_dim);
    // Above the 48 KB default (head_dim > ~170) the block must opt in to more dynamic shared memory.
    if (smem > 48 * 1024) {
        TL_GPU_CHECK(cudaFuncSetAttribute(attention_kernel<PAIRS>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(smem)));
    }
    const int longest = segments.offsets != nullptr ? segments.max_len : t_count;
    const dim3 grid((longest + kQueryTile - 1) / kQueryTile, n_heads, segments.count);
    const float q_scale = kLog2e / sqrtf(static_cast<float>(head_dim));
    attention_kernel<PAIRS><<<grid, kThreads, smem, stream>>>(reinterpret_cast<const __half *>(qkv),
                                                               reinterpret_cast<__half *>(out), t_count,
                                                               segments.offsets, n_heads, n_kv_heads, head_dim,
                                                               q_scale);
    TL_GPU_CHECK_LAUNCH();
    return 0;
}

}  // namespace

// attention_wgmma.cu
int causal_attention_wgmma(const uint16_t *qkv, uint16_t *out, int t_count, int n_heads, int n_kv_heads, int head_dim,
                           Segments segments, cudaStream_t stream);
// attention_mma.cu
bool attention_tensor_core_supported(const uint16_t *qkv, const uint16_t *out, int head_dim);
int causal_attention_tensor_core(const uint16_t *qkv, uint16_t *out, int t_count, int n_heads, int n_kv_heads,
                                 int head_dim, Segments segments, cudaStream_t stream);

int causal_attention(const uint16_t *qkv, uint16_t *out, int t_count, int n_heads, int head_dim,
                     cudaStream_t stream, AttentionKernel kernel, Segments segments, int n_kv_heads) {
    if (n_kv_heads == 0) n_kv_heads = n_heads;
    if (qkv == nullptr || out == nullptr || t_count < 1 || n_heads < 1 || head_dim < 2 || head_dim % 2 != 0 ||
        n_kv_heads < 1 || n_heads % n_kv_heads != 0) {
        return kRcBadArgument;
    }
    if (segments.offsets == nullptr) {
        if (segments.count != 1) return kRcBadArgument;
    } else if (segments.count < 1 || segments.count > kMaxSegments || segments.max_len < 1 ||
               segments.max_len > t_count) {
        return kRcBadArgument;
    }
    if (head_dim > kAttentionMaxHeadDim || n_heads > 65535) return kRcUnsupported;
    // qkv rows are read as half2: the row stride and head offsets are even, so 4-byte alignment of qkv suffices.
    if ((reinterpret_cast<uintptr_t>(qkv) & 3u) != 0 || (reinterpret_cast<uintptr_t>(out) & 3u) != 0) {
        return kRcBadArgument;
    }
    // Auto leaves sequences of at most 64 rows to the mma.sync kernel, whose 64-query tile they fill; the wgmma
    // kernel's 128 x 128 tiles would be mostly padding there (H100, 16 heads, hd 128: 64 windows of 16 rows took
    // 0.035 ms on the wgmma kernel and 0.017 on mma.sync; 8 x 512 rows 0.048 against 0.061).
    const int longest = segments.offsets != nullptr ? segments.max_len : t_count;
    if (kernel == AttentionKernel::Wgmma || (kernel == AttentionKernel::Auto && longest > 64)) {
        const int rc = causal_attention_wgmma(qkv, out, t_count, n_heads, n_kv_heads, head_dim, segments, stream);
        // Auto goes on to the mma.sync kernel where this one does not run (not compute capability 9.0, or the shape).
        if (rc != kRcUnsupported || kernel == AttentionKernel::Wgmma) return rc;
    }
    if (kernel == AttentionKernel::TensorCore ||
        (kernel == AttentionKernel::Auto && attention_tensor_core_supported(qkv, out, head_dim))) {
        const int rc = causal_attention_tensor_core(qkv, out, t_count, n_heads, n_kv_heads, head_dim, segments, stream);
        // Auto falls back where the device cannot give the kernel its shared memory (none of the GPUs we build for).
        if (rc != kRcUnsupported || kernel == AttentionKernel::TensorCore) return rc;
    }
    if (kernel != AttentionKernel::Simt && kernel != AttentionKernel::Auto) return kRcBadArgument;
    if (head_dim <= 64) return launch<1>(qkv, out, t_count, n_heads, n_kv_heads, head_dim, segments, stream);
    if (head_dim <= 128) return launch<2>(qkv, out, t_count, n_heads, n_kv_heads, head_dim, segments, stream);
    return launch<4>(qkv, out, t_count, n_heads, n_kv_heads, head_dim, segments, stream);
}

}  // namespace tl::gpu
