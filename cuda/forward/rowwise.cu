// The forward pass's row-wise and element-wise kernels: embedding gather, residual add + RMSNorm, RoPE, a linear's
// bias, SwiGLU and the head's log-softmax NLL. All are memory-bound and small next to the GEMMs; they are written for
// clarity (one block per row for the reductions, grid-stride loops for the rest), with FP32 math throughout.
#include <cuda_fp16.h>

#include <cmath>
#include <type_traits>

#include "../gpu_common.cuh"
#include "../int8_quant.cuh"
#include "forward_kernels.hpp"
#include "reduce.cuh"

namespace tl::gpu {

namespace {

using forward::block_reduce;

constexpr int kRowThreads = 256;   // one block per row: embedding, RMSNorm, NLL
constexpr int kFlatThreads = 256;  // grid-stride element-wise kernels
constexpr int kMaxFlatBlocks = 1 << 20;

int flat_blocks(size_t total) {
    const size_t blocks = (total + kFlatThreads - 1) / kFlatThreads;
    return static_cast<int>(blocks < kMaxFlatBlocks ? blocks : kMaxFlatBlocks);
}

// ---- Embedding --------------------------------------------------------------------------------------------------

template <TableType TYPE>
__device__ __forceinline__ float table_entry(const void *table, size_t i) {
    if constexpr (TYPE == TableType::F16) {
        return __half2float(static_cast<const __half *>(table)[i]);
    } else if constexpr (TYPE == TableType::BF16) {
        // A BF16 value is the top half of the FP32 with the same bits: exact.
        return __uint_as_float(static_cast<uint32_t>(static_cast<const uint16_t *>(table)[i]) << 16);
    } else {
        return static_cast<const float *>(table)[i];
    }
}

template <TableType TYPE>
__global__ void __launch_bounds__(kRowThreads) embed_kernel(const int32_t *tokens, const void *table, float *x, int d,
                                                            int vocab) {
    const int t = blockIdx.x;
    const int token = tokens[t];
    const bool valid = token >= 0 && token < vocab;
    float *row = x + static_cast<size_t>(t) * d;
    const size_t base = static_cast<size_t>(valid ? token : 0) * d;
    for (int i = threadIdx.x; i < d; i += kRowThreads) row[i] = valid ? table_entry<TYPE>(table, base + i) : NAN;
}

// ---- Residual add + RMSNorm -------------------------------------------------------------------------------------

// Adds row `offset` of `add` (where given) into that row of x, and returns the row's 1 / rms. Each thread reads back
// later exactly the x elements it wrote here, so its callers need no barrier between the update of x and its use.
__device__ __forceinline__ float residual_inv_rms(float *xr, const __half *add, size_t offset, int d, float eps,
                                                  float *scratch) {
    float sum_sq = 0.0f;
    for (int i = threadIdx.x; i < d; i += kRowThreads) {
        float v = xr[i];
        if (add != nullptr) {
            v += __half2float(add[offset + i]);
            xr[i] = v;
        }
        sum_sq = fmaf(v, v, sum_sq);
    }
    sum_sq = block_reduce<false>(sum_sq, scratch);
    // As the CPU reference: 1 / sqrt(mean + eps), then (x * inv_rms) * gain, IEEE division and square root.
    return 1.0f / sqrtf(sum_sq / static_cast<float>(d) + eps);
}

__global__ void __launch_bounds__(kRowThreads) rmsnorm_kernel(float *x, const __half *add, const float *gain, __half *y,
                                                              int d, float eps) {
    __shared__ float scratch[32];
    const size_t offset = static_cast<size_t>(blockIdx.x) * d;
    float *xr = x + offset;
    const float inv_rms = residual_inv_rms(xr, add, offset, d, eps, scratch);
    __half *yr = y + offset;
    for (int i = threadIdx.x; i < d; i += kRowThreads) yr[i] = __float2half_rn(xr[i] * inv_rms * gain[i]);
}

// rmsnorm_kernel whose FP16 rows are then quantized to INT8 by the rule (int8_quant.cuh) into yq, scales and (where
// given) sums: the same bits as rmsnorm_kernel followed by quantize_rows_int8. Each FP16 value is computed again by
// the same expression where it is needed (no stored copy); y keeps it where given.
__global__ void __launch_bounds__(kRowThreads) rmsnorm_int8_kernel(float *x, const __half *add, const float *gain,
                                                                   __half *y, int8_t *yq, float *scales,
                                                                   int32_t *sums, float *group_sums, int group,
                                                                   int t_count, int d, float eps) {
    __shared__ float scratch[32];
    __shared__ int int_scratch[32];
    const size_t offset = static_cast<size_t>(blockIdx.x) * d;
    float *xr = x + offset;
    const float inv_rms = residual_inv_rms(xr, add, offset, d, eps, scratch);
    auto value = [&](int i) { return __half2float(__float2half_rn(xr[i] * inv_rms * gain[i])); };
    if (y != nullptr) {
        for (int i = threadIdx.x; i < d; i += kRowThreads) y[offset + i] = __float2half_rn(value(i));
    }
    int8q::quantize_row_block<kRowThreads>(value, d, yq + offset, scales + blockIdx.x,
                                           sums != nullptr ? sums + blockIdx.x : nullptr,
                                           group_sums != nullptr ? group_sums + blockIdx.x : nullptr, group,
                                           int8_group_sums_ld(t_count), scratch, int_scratch);
}

// ---- RoPE -------------------------------------------------------------------------------------------------------

// One thread per (row, q-or-k head, VEC consecutive pairs): it alone reads and writes those pairs' elements. VEC = 2
// (half2 accesses) when head_dim / 2 is even, else 1.
template <int VEC>
__global__ void __launch_bounds__(kFlatThreads) rope_kernel(__half *qkv, const float *cos_table, const float *sin_table,
                                                            const int32_t *positions, int t_count, int qk_heads,
                                                            int head_dim, size_t row_stride) {
    const int half_dim = head_dim / 2, per_head = half_dim / VEC;
    const size_t total = static_cast<size_t>(t_count) * qk_heads * per_head;
    for (size_t idx = static_cast<size_t>(blockIdx.x) * kFlatThreads + threadIdx.x; idx < total;
         idx += static_cast<size_t>(gridDim.x) * kFlatThreads) {
        const int i = static_cast<int>(idx % per_head) * VEC;
        const size_t rest = idx / per_head;
        const int h = static_cast<int>(rest % qk_heads);
        const size_t t = rest / qk_heads;
        __half *v = qkv + t * row_stride + static_cast<size_t>(h) * head_dim;
        const size_t p = positions != nullptr ? static_cast<size_t>(positions[t]) : t;
        const float *c = cos_table + p * half_dim + i, *s = sin_table + p * half_dim + i;
        if constexpr (VEC == 2) {
            const float2 a = __half22float2(*reinterpret_cast<const __half2 *>(v + i));
            const float2 b = __half22float2(*reinterpret_cast<const __half2 *>(v + i + half_dim));
            *reinterpret_cast<__half2 *>(v + i) = __floats2half2_rn(a.x * c[0] - b.x * s[0], a.y * c[1] - b.y * s[1]);
            *reinterpret_cast<__half2 *>(v + i + half_dim) =
                __floats2half2_rn(a.x * s[0] + b.x * c[0], a.y * s[1] + b.y * c[1]);
        } else {
            const float a = __half2float(v[i]), b = __half2float(v[i + half_dim]);
            v[i] = __float2half_rn(a * c[0] - b * s[0]);
            v[i + half_dim] = __float2half_rn(a * s[0] + b * c[0]);
        }
    }
}

// ---- Bias -------------------------------------------------------------------------------------------------------

// A separate pass over the GEMM's output rather than an epilogue of each GEMM kernel (Marlin-class, native, cuBLAS):
// one small kernel serves them all. VEC = 2 (half2 accesses) when n is even and y 4-byte aligned, else 1.
template <int VEC>
__global__ void __launch_bounds__(kFlatThreads) bias_kernel(__half *y, const float *bias, int n, size_t total) {
    for (size_t idx = static_cast<size_t>(blockIdx.x) * kFlatThreads + threadIdx.x; idx < total;
         idx += static_cast<size_t>(gridDim.x) * kFlatThreads) {
        const size_t i = idx * VEC;
        const int j = static_cast<int>(i % static_cast<size_t>(n));
        if constexpr (VEC == 2) {
            const float2 v = __half22float2(*reinterpret_cast<const __half2 *>(y + i));
            *reinterpret_cast<__half2 *>(y + i) = __floats2half2_rn(v.x + bias[j], v.y + bias[j + 1]);
        } else {
            y[i] = __float2half_rn(__half2float(y[i]) + bias[j]);
        }
    }
}

// ---- SwiGLU -----------------------------------------------------------------------------------------------------

__device__ __forceinline__ float silu_times(float g, float u) {
    // expf, not __expf: the CPU reference's accuracy; e^-g overflowing to inf gives silu = -0, as it should.
    return g / (1.0f + expf(-g)) * u;
}

// VEC halves per thread and step: 8 (16-byte loads and stores) when f, ld and the pointers allow it, else 1. The
// kernel is bound by memory; the wide accesses take it from ~40% of the bandwidth to near all of it.
template <int VEC>
__global__ void __launch_bounds__(kFlatThreads) swiglu_kernel(const __half *gate, const __half *up, int ld, __half *h,
                                                              int t_count, int f) {
    using Chunk = typename std::conditional<VEC == 8, uint4, __half>::type;
    const int per_row = f / VEC;
    const size_t total = static_cast<size_t>(t_count) * per_row;
    for (size_t idx = static_cast<size_t>(blockIdx.x) * kFlatThreads + threadIdx.x; idx < total;
         idx += static_cast<size_t>(gridDim.x) * kFlatThreads) {
        const size_t t = idx / per_row, j = (idx % per_row) * VEC;
        const Chunk g = *reinterpret_cast<const Chunk *>(gate + t * ld + j);
        const Chunk u = *reinterpret_cast<const Chunk *>(up + t * ld + j);
        Chunk out;
        const __half *gh = reinterpret_cast<const __half *>(&g), *uh = reinterpret_cast<const __half *>(&u);
        __half *oh = reinterpret_cast<__half *>(&out);
#pragma unroll
        for (int v = 0; v < VEC; ++v) oh[v] = __float2half_rn(silu_times(__half2float(gh[v]), __half2float(uh[v])));
        *reinterpret_cast<Chunk *>(h + t * f + j) = out;
    }
}

// SwiGLU's row t quantized to INT8 by the rule, one block per row: the same bits as swiglu_kernel followed by
// quantize_rows_int8 (each FP16 value computed again in the second pass by the same expression).
__global__ void __launch_bounds__(kRowThreads) swiglu_int8_kernel(const __half *gate, const __half *up, int ld,
                                                                  int8_t *hq, float *scales, int32_t *sums,
                                                                  float *group_sums, int group, int t_count, int f) {
    __shared__ float scratch[32];
    __shared__ int int_scratch[32];
    const size_t t = blockIdx.x;
    const __half *g = gate + t * ld, *u = up + t * ld;
    auto value = [&](int j) {
        return __half2float(__float2half_rn(silu_times(__half2float(g[j]), __half2float(u[j]))));
    };
    int8q::quantize_row_block<kRowThreads>(value, f, hq + t * f, scales + t, sums != nullptr ? sums + t : nullptr,
                                           group_sums != nullptr ? group_sums + t : nullptr, group,
                                           int8_group_sums_ld(t_count), scratch, int_scratch);
}

// ---- Head: log-softmax NLL --------------------------------------------------------------------------------------

// One block per row: the maximum, then the sum of e^(l - max) in FP32 (each term <= 1, ~200 per thread plus a tree:
// relative error ~1e-6, far below the FP16 logits' own rounding). A NaN logit propagates through the sum.
__global__ void __launch_bounds__(kRowThreads) nll_kernel(const __half *logits, int ld, int vocab,
                                                          const int32_t *targets, float *nll, uint8_t *greedy) {
    __shared__ float scratch[32];
    const __half *row = logits + static_cast<size_t>(blockIdx.x) * ld;
    float mx = -INFINITY;
    for (int v = threadIdx.x; v < vocab; v += kRowThreads) mx = fmaxf(mx, __half2float(row[v]));
    mx = block_reduce<true>(mx, scratch);
    float sum = 0.0f;
    for (int v = threadIdx.x; v < vocab; v += kRowThreads) sum += expf(__half2float(row[v]) - mx);
    sum = block_reduce<false>(sum, scratch);
    if (threadIdx.x == 0) {
        const int target = targets[blockIdx.x];
        const bool valid = target >= 0 && target < vocab;
        const float picked = valid ? __half2float(row[target]) : NAN;
        nll[blockIdx.x] = valid ? mx + logf(sum) - picked : NAN;
        if (greedy != nullptr) greedy[blockIdx.x] = valid && picked >= mx ? 1 : 0;
    }
}

}  // namespace

int embed_gather(const int32_t *tokens, const void *table, TableType type, float *x, int t_count, int d, int vocab,
                 cudaStream_t stream) {
    if (tokens == nullptr || table == nullptr || x == nullptr || t_count < 1 || d < 1 || vocab < 1) {
        return kRcBadArgument;
    }
    switch (type) {
        case TableType::F16:
            embed_kernel<TableType::F16><<<t_count, kRowThreads, 0, stream>>>(tokens, table, x, d, vocab);
            break;
        case TableType::BF16:
            embed_kernel<TableType::BF16><<<t_count, kRowThreads, 0, stream>>>(tokens, table, x, d, vocab);
            break;
        case TableType::F32:
            embed_kernel<TableType::F32><<<t_count, kRowThreads, 0, stream>>>(tokens, table, x, d, vocab);
            break;
        default:
            return kRcBadArgument;
    }
    TL_GPU_CHECK_LAUNCH();
    return 0;
}

int rmsnorm_residual(float *x, const uint16_t *add, const float *gain, uint16_t *y, int t_count, int d, float eps,
                     cudaStream_t stream) {
    if (x == nullptr || gain == nullptr || y == nullptr || t_count < 1 || d < 1 || !(eps >= 0.0f)) {
        return kRcBadArgument;
    }
    rmsnorm_kernel<<<t_count, kRowThreads, 0, stream>>>(x, reinterpret_cast<const __half *>(add), gain,
                                                         reinterpret_cast<__half *>(y), d, eps);
    TL_GPU_CHECK_LAUNCH();
    return 0;
}

namespace {

// The group sums' arguments as quantize_rows_int8 takes them.
int check_group_sums(const int8_t *codes, int k, const float *group_sums, int group) {
    if (group_sums == nullptr) return 0;
    if (group < 16 || group % 16 != 0 || k % group != 0) return kRcBadArgument;
    return aligned16(codes) ? 0 : kRcUnsupported;
}

}  // namespace

int rmsnorm_residual_int8(float *x, const uint16_t *add, const float *gain, uint16_t *y, int8_t *yq, float *scales,
                          int32_t *sums, int t_count, int d, float eps, cudaStream_t stream, float *group_sums,
                          int group_size) {
    if (x == nullptr || gain == nullptr || yq == nullptr || scales == nullptr || t_count < 1 || d < 1 ||
        !(eps >= 0.0f)) {
        return kRcBadArgument;
    }
    if (const int rc = check_group_sums(yq, d, group_sums, group_size)) return rc;
    rmsnorm_int8_kernel<<<t_count, kRowThreads, 0, stream>>>(x, reinterpret_cast<const __half *>(add), gain,
                                                              reinterpret_cast<__half *>(y), yq, scales, sums,
                                                              group_sums, group_size, t_count, d, eps);
    TL_GPU_CHECK_LAUNCH();
    return 0;
}

int rope_qk(uint16_t *qkv, const float *cos_table, const float *sin_table, int t_count, int n_heads, int head_dim,
            cudaStream_t stream, const int32_t *positions, int n_kv_heads) {
    if (n_kv_heads == 0) n_kv_heads = n_heads;
    if (qkv == nullptr || cos_table == nullptr || sin_table == nullptr || t_count < 1 || n_heads < 1 ||
        head_dim < 2 || head_dim % 2 != 0 || n_kv_heads < 1 || n_heads % n_kv_heads != 0) {
        return kRcBadArgument;
    }
    // q and k are adjacent in each row: n_heads + n_kv_heads heads to rotate, then the values.
    const int qk_heads = n_heads + n_kv_heads;
    const size_t row_stride = static_cast<size_t>(qk_heads + n_kv_heads) * head_dim;
    const size_t pairs = static_cast<size_t>(t_count) * qk_heads * (head_dim / 2);
    __half *x = reinterpret_cast<__half *>(qkv);
    // half2 accesses need an even half_dim and a 4-byte aligned qkv (row stride and head offsets are then even).
    if (head_dim % 4 == 0 && (reinterpret_cast<uintptr_t>(qkv) & 3u) == 0) {
        rope_kernel<2><<<flat_blocks(pairs / 2), kFlatThreads, 0, stream>>>(x, cos_table, sin_table, positions,
                                                                             t_count, qk_heads, head_dim, row_stride);
    } else {
        rope_kernel<1><<<flat_blocks(pairs), kFlatThreads, 0, stream>>>(x, cos_table, sin_table, positions, t_count,
                                                                         qk_heads, head_dim, row_stride);
    }
    TL_GPU_CHECK_LAUNCH();
    return 0;
}

int add_bias(uint16_t *y, const float *bias, int rows, int n, cudaStream_t stream) {
    if (y == nullptr || bias == nullptr || rows < 1 || n < 1) return kRcBadArgument;
    const size_t total = static_cast<size_t>(rows) * n;
    __half *out = reinterpret_cast<__half *>(y);
    if (n % 2 == 0 && (reinterpret_cast<uintptr_t>(y) & 3u) == 0) {
        bias_kernel<2><<<flat_blocks(total / 2), kFlatThreads, 0, stream>>>(out, bias, n, total / 2);
    } else {
        bias_kernel<1><<<flat_blocks(total), kFlatThreads, 0, stream>>>(out, bias, n, total);
    }
    TL_GPU_CHECK_LAUNCH();
    return 0;
}

int swiglu(const uint16_t *gate, const uint16_t *up, int ld, uint16_t *h, int t_count, int f, cudaStream_t stream) {
    if (gate == nullptr || up == nullptr || h == nullptr || t_count < 1 || f < 1 || ld < f) return kRcBadArgument;
    const __half *g = reinterpret_cast<const __half *>(gate), *u = reinterpret_cast<const __half *>(up);
    __half *out = reinterpret_cast<__half *>(h);
    if (f % 8 == 0 && ld % 8 == 0 && aligned16(gate) && aligned16(up) && aligned16(h)) {
        swiglu_kernel<8><<<flat_blocks(static_cast<size_t>(t_count) * f / 8), kFlatThreads, 0, stream>>>(
            g, u, ld, out, t_count, f);
    } else {
        swiglu_kernel<1><<<flat_blocks(static_cast<size_t>(t_count) * f), kFlatThreads, 0, stream>>>(g, u, ld, out,
                                                                                                      t_count, f);
    }
    TL_GPU_CHECK_LAUNCH();
    return 0;
}

int swiglu_int8(const uint16_t *gate, const uint16_t *up, int ld, int8_t *hq, float *scales, int32_t *sums,
                int t_count, int f, cudaStream_t stream, float *group_sums, int group_size) {
    if (gate == nullptr || up == nullptr || hq == nullptr || scales == nullptr || t_count < 1 || f < 1 || ld < f) {
        return kRcBadArgument;
    }
    if (const int rc = check_group_sums(hq, f, group_sums, group_size)) return rc;
    swiglu_int8_kernel<<<t_count, kRowThreads, 0, stream>>>(reinterpret_cast<const __half *>(gate),
                                                             reinterpret_cast<const __half *>(up), ld, hq, scales,
                                                             sums, group_sums, group_size, t_count, f);
    TL_GPU_CHECK_LAUNCH();
    return 0;
}

int head_nll(const uint16_t *logits, int ld, int rows, int vocab, const int32_t *targets, float *nll,
             cudaStream_t stream, uint8_t *greedy) {
    if (logits == nullptr || targets == nullptr || nll == nullptr || rows < 1 || vocab < 1 || ld < vocab) {
        return kRcBadArgument;
    }
    nll_kernel<<<rows, kRowThreads, 0, stream>>>(reinterpret_cast<const __half *>(logits), ld, vocab, targets, nll,
                                                 greedy);
    TL_GPU_CHECK_LAUNCH();
    return 0;
}

}  // namespace tl::gpu
