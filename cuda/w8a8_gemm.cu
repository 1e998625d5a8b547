// W8A8 in the seed's first form: each row of X quantized to INT8 with a scale of its own (per token, symmetric), one
// cuBLAS INT8 GEMM into INT32 against INT8 weights with a scale per output channel, and an epilogue that scales the
// INT32 sums into FP16. The arithmetic is the CPU backend's activation-precision rule (docs/quality.md), so the two
// agree bit for bit on the same FP16 input.
#include <cublas_v2.h>

#include "cublas_loader.hpp"
#include "gpu_common.cuh"
#include "int8_quant.cuh"

namespace tl::gpu {

namespace {

constexpr int kQuantThreads = 256;

using int8q::max_nan;
using int8q::quantize_one;

// Eight FP16 values' codes as two words (byte j = value j) and their sum.
__device__ __forceinline__ uint2 quantize8(const uint4 &raw, float s, int &sum) {
    const __half2 *h = reinterpret_cast<const __half2 *>(&raw);
    uint32_t packed[2] = {0, 0};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const float2 f = __half22float2(h[j]);
        const int q0 = quantize_one(f.x, s), q1 = quantize_one(f.y, s);
        sum += q0 + q1;
        const uint32_t pair = (static_cast<uint32_t>(q0) & 0xFFu) | ((static_cast<uint32_t>(q1) & 0xFFu) << 8);
        packed[j / 2] |= pair << (16 * (j % 2));
    }
    return make_uint2(packed[0], packed[1]);
}

__device__ __forceinline__ float amax8(const uint4 &raw, float amax) {
    const __half2 *h = reinterpret_cast<const __half2 *>(&raw);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const float2 f = __half22float2(h[j]);
        amax = max_nan(max_nan(amax, fabsf(f.x)), fabsf(f.y));
    }
    return amax;
}

// K % 8 == 0, 16-byte aligned rows: one warp per row, eight rows a block, no block barrier (one block per row waited
// on its barriers with little else in flight). CHUNKS > 0: a lane holds its CHUNKS 16-byte chunks (K <= 256 CHUNKS)
// between the maximum and the codes, so X is read once; 0: any K, read twice.
// Group sums where `group_sums` is given (int8q::group_sums).
template <int CHUNKS>
__global__ void __launch_bounds__(kQuantThreads) quantize_rows_warp_kernel(const __half *x, int m, int k, int8_t *xq,
                                                                           float *scales, int32_t *sums,
                                                                           float *group_sums, int group) {
    const int lane = threadIdx.x % 32;
    const size_t row = static_cast<size_t>(blockIdx.x) * (kQuantThreads / 32) + threadIdx.x / 32;
    if (row >= static_cast<size_t>(m)) return;
    const __half *xr = x + row * k;
    int8_t *qr = xq + row * k;
    float amax = 0.0f;
    uint4 held[CHUNKS > 0 ? CHUNKS : 1];
    if constexpr (CHUNKS > 0) {
#pragma unroll
        for (int c = 0; c < CHUNKS; ++c) {
            const int i = (c * 32 + lane) * 8;
            held[c] = i < k ? *reinterpret_cast<const uint4 *>(xr + i) : make_uint4(0, 0, 0, 0);
            amax = amax8(held[c], amax);
        }
    } else {
        for (int i = lane * 8; i < k; i += 256) amax = amax8(*reinterpret_cast<const uint4 *>(xr + i), amax);
    }
    amax = int8q::warp_max_nan(amax);
    const float s = int8q::row_scale(amax);
    int sum = 0;
    if constexpr (CHUNKS > 0) {
#pragma unroll
        for (int c = 0; c < CHUNKS; ++c) {
            const int i = (c * 32 + lane) * 8;
            if (i < k) *reinterpret_cast<uint2 *>(qr + i) = quantize8(held[c], s, sum);
        }
    } else {
        for (int i = lane * 8; i < k; i += 256) {
            *reinterpret_cast<uint2 *>(qr + i) = quantize8(*reinterpret_cast<const uint4 *>(xr + i), s, sum);
        }
    }
    if (lane == 0) scales[row] = s;
    if (group_sums != nullptr) {
        __syncwarp();
        int8q::group_sums(qr, k, group, group_sums + row, int8_group_sums_ld(m), lane, 32);
    }
    if (sums == nullptr) return;
    sum = int8q::warp_sum(sum);
    if (lane == 0) sums[row] = sum;
}

// Any K and alignment: block r, one value a thread at a time.
__global__ void __launch_bounds__(kQuantThreads) quantize_rows_kernel(const __half *x, int m, int k, int8_t *xq,
                                                                      float *scales, int32_t *sums,
                                                                      float *group_sums, int group) {
    __shared__ float scratch[32];
    __shared__ int int_scratch[32];
    const size_t row = blockIdx.x;
    const __half *xr = x + row * k;
    int8q::quantize_row_block<kQuantThreads>([&](int i) { return __half2float(xr[i]); }, k, xq + row * k,
                                             scales + row, sums != nullptr ? sums + row : nullptr,
                                             group_sums != nullptr ? group_sums + row : nullptr, group,
                                             int8_group_sums_ld(m), scratch, int_scratch);
}

// y[r][c] = fp16(fl(s_x[r] · fl(s_w[c] · fl(acc[r][c])))): the rule's order for a weight with one group. Thread t of
// block (b, ·) owns columns 4(256b + t) .. + 3 and walks the rows; kVec: N % 4 == 0, 16-byte loads.
template <bool kVec>
__global__ void __launch_bounds__(256) w8a8_epilogue_kernel(const int32_t *acc, const float *x_scales,
                                                            const float *w_scales, __half *y, int m, int n) {
    const int c0 = (blockIdx.x * 256 + threadIdx.x) * 4;
    if (c0 >= n) return;
    float sw[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) sw[j] = c0 + j < n ? w_scales[c0 + j] : 0.0f;
    for (int r = blockIdx.y; r < m; r += gridDim.y) {
        const float sx = x_scales[r];
        const size_t at = static_cast<size_t>(r) * n + c0;
        if constexpr (kVec) {
            const int4 a = *reinterpret_cast<const int4 *>(acc + at);
            const int32_t v[4] = {a.x, a.y, a.z, a.w};
            __align__(8) __half out[4];
#pragma unroll
            for (int j = 0; j < 4; ++j) out[j] = __float2half_rn(__fmul_rn(sx, __fmul_rn(sw[j], __int2float_rn(v[j]))));
            *reinterpret_cast<uint2 *>(y + at) = *reinterpret_cast<const uint2 *>(out);
        } else {
            for (int j = 0; j < 4 && c0 + j < n; ++j) {
                y[at + j] = __float2half_rn(__fmul_rn(sx, __fmul_rn(sw[j], __int2float_rn(acc[at + j]))));
            }
        }
    }
}

}  // namespace

size_t w8a8_scratch_bytes(int m, int n, int k) {
    auto up = [](size_t v) { return (v + 255) / 256 * 256; };
    return up(static_cast<size_t>(m) * k) + up(static_cast<size_t>(m) * sizeof(float)) +
           up(static_cast<size_t>(m) * n * sizeof(int32_t));
}

int quantize_rows_int8(const uint16_t *x, int m, int k, int8_t *xq, float *scales, cudaStream_t stream,
                       int32_t *sums, float *group_sums, int group_size) {
    if (x == nullptr || xq == nullptr || scales == nullptr || m < 1 || k < 1) return kRcBadArgument;
    if (group_sums != nullptr) {
        if (group_size < 16 || group_size % 16 != 0 || k % group_size != 0) return kRcBadArgument;
        if ((reinterpret_cast<uintptr_t>(xq) & 15u) != 0) return kRcUnsupported;
    }
    const auto *xh = reinterpret_cast<const __half *>(x);
    if (k % 8 == 0 && (reinterpret_cast<uintptr_t>(x) & 15u) == 0 && (reinterpret_cast<uintptr_t>(xq) & 7u) == 0) {
        const unsigned blocks = static_cast<unsigned>((m + kQuantThreads / 32 - 1) / (kQuantThreads / 32));
        auto launch = [&](auto kernel) {
            kernel<<<blocks, kQuantThreads, 0, stream>>>(xh, m, k, xq, scales, sums, group_sums, group_size);
        };
        if (k <= 512) {
            launch(quantize_rows_warp_kernel<2>);
        } else if (k <= 1024) {
            launch(quantize_rows_warp_kernel<4>);
        } else if (k <= 2048) {
            launch(quantize_rows_warp_kernel<8>);
        } else if (k <= 4096) {
            launch(quantize_rows_warp_kernel<16>);
        } else {
            launch(quantize_rows_warp_kernel<0>);
        }
    } else {
        quantize_rows_kernel<<<m, kQuantThreads, 0, stream>>>(xh, m, k, xq, scales, sums, group_sums, group_size);
    }
    TL_GPU_CHECK_LAUNCH();
    return 0;
}

int w8a8_gemm(cublasHandle_t handle, const uint16_t *x, const int8_t *w, const float *w_scales, uint16_t *y, int m,
              int n, int k, void *scratch, size_t scratch_bytes, cudaStream_t stream, void *cublas_workspace,
              size_t cublas_workspace_bytes) {
    if (handle == nullptr || x == nullptr || w == nullptr || w_scales == nullptr || y == nullptr ||
        scratch == nullptr || m < 1 || n < 1 || k < 1) {
        return kRcBadArgument;
    }
    // cuBLAS's INT8 GEMM wants leading dimensions (K for both operands) in multiples of 4.
    if (k % 4 != 0 || (reinterpret_cast<uintptr_t>(w) & 15u) != 0) return kRcUnsupported;
    if (scratch_bytes < w8a8_scratch_bytes(m, n, k)) return kRcWorkspace;
    auto up = [](size_t v) { return (v + 255) / 256 * 256; };
    auto *xq = static_cast<int8_t *>(scratch);
    auto *x_scales = reinterpret_cast<float *>(static_cast<char *>(scratch) + up(static_cast<size_t>(m) * k));
    auto *acc = reinterpret_cast<int32_t *>(reinterpret_cast<char *>(x_scales) + up(static_cast<size_t>(m) * 4));
    if (const int rc = quantize_rows_int8(x, m, k, xq, x_scales, stream)) return rc;

    const CublasApi *cublas = cublas_api();
    if (cublas == nullptr) return kRcCublas;
    if (cublas->set_stream(handle, stream) != CUBLAS_STATUS_SUCCESS) return kRcCublas;
    if (cublas_workspace != nullptr &&
        cublas->set_workspace(handle, cublas_workspace, cublas_workspace_bytes) != CUBLAS_STATUS_SUCCESS) {
        return kRcCublas;
    }
    // Column-major view, as cublas_gemm: ACC^T [N x M] = W^T (op T of the [K x N] column-major W) * XQ^T [K x M].
    const int32_t alpha = 1, beta = 0;
    if (cublas->gemm_ex(handle, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &alpha, w, CUDA_R_8I, k, xq, CUDA_R_8I, k, &beta,
                        acc, CUDA_R_32I, n, CUBLAS_COMPUTE_32I, CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS) {
        return kRcCublas;
    }
    const dim3 grid((n + 1023) / 1024, m < 65535 ? m : 65535);
    const float *sw = w_scales;
    auto *yh = reinterpret_cast<__half *>(y);
    if (n % 4 == 0 && (reinterpret_cast<uintptr_t>(y) & 7u) == 0) {
        w8a8_epilogue_kernel<true><<<grid, 256, 0, stream>>>(acc, x_scales, sw, yh, m, n);
    } else {
        w8a8_epilogue_kernel<false><<<grid, 256, 0, stream>>>(acc, x_scales, sw, yh, m, n);
    }
    TL_GPU_CHECK_LAUNCH();
    return 0;
}

}  // namespace tl::gpu
