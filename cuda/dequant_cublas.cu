// The large-M path: dequantize the INT4 weight to an FP16 or BF16 scratch [N][K] (the activations' type), then one
// cuBLAS GEMM (FP32 compute). It pays a full extra pass over the weights, so it only wins where the GEMM is
// compute-bound. Also the INT8 weights' dequantization, which a model does once at load into its dense FP16 form, and
// the looped INT4 weights' per-iteration dequantization under cross-iteration rounding.
#include <cublas_v2.h>

#include "cross_iter_rule.hpp"
#include "cublas_loader.hpp"
#include "gpu_common.cuh"

namespace tl::gpu {

namespace {

constexpr int kDequantThreads = 256;

// Thread t of block (n, b) writes w[n][8(256b + t) ..][8 values]: one 32-bit code load, one 16-byte store.
// W = q*s + z in FP32, rounded once to D. kRounding: q is first replaced by its code on rounding.iteration
// (cross-iteration rounding), from the channels of the same 8 cells (a 32-bit frac4 load, one sign byte).
template <Dtype D, bool kRounding>
__global__ void __launch_bounds__(kDequantThreads) dequant_kernel(const uint8_t *codes, const __half *scales,
                                                                  const __half *zeros, typename Element<D>::T *w,
                                                                  int k, int gs, int groups,
                                                                  RoundingChannels rounding) {
    using E = Element<D>;
    const int n = blockIdx.x;
    const int k0 = (blockIdx.y * kDequantThreads + threadIdx.x) * 8;
    if (k0 >= k) return;
    const size_t at = static_cast<size_t>(n) * k + k0;
    uint32_t q8 = *reinterpret_cast<const uint32_t *>(codes + at / 2);
    if constexpr (kRounding) {
        const uint32_t f8 = rounding.frac4 ? *reinterpret_cast<const uint32_t *>(rounding.frac4 + at / 2) : 0u;
        const uint32_t signs = rounding.sign_bit ? rounding.sign_bit[at / 8] : 0u;
        const int nn = rounding.row_split > 0 && n >= rounding.row_split ? n - rounding.row_split : n;
        uint32_t moved = 0;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            uint32_t q = (q8 >> (4 * j)) & 0xFu;
            const int kk = k0 + j;
            if (kk < rounding.k_real) {  // padding columns keep their code 0: their inputs are zero
                const int32_t r32 = cross_iter_residual32(static_cast<int32_t>((f8 >> (4 * j)) & 0xFu),
                                                          rounding.frac4 != nullptr, ((signs >> j) & 1u) != 0);
                const int32_t input = rounding.k_perm ? rounding.k_perm[kk] : kk;
                q = cross_iter_code(q, r32, nn, input, rounding.iteration, rounding.loops);
            }
            moved |= q << (4 * j);
        }
        q8 = moved;
    }
    const __half *srow = scales + static_cast<size_t>(n) * groups;
    const __half *zrow = zeros + static_cast<size_t>(n) * groups;
    __align__(16) typename E::T out[8];
    if (gs % 8 == 0) {  // the 8 values share one group
        const float s = __half2float(srow[k0 / gs]), z = __half2float(zrow[k0 / gs]);
#pragma unroll
        for (int j = 0; j < 8; ++j) out[j] = E::from_float(fmaf(static_cast<float>((q8 >> (4 * j)) & 0xFu), s, z));
    } else {
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            const int g = (k0 + j) / gs;
            out[j] = E::from_float(
                fmaf(static_cast<float>((q8 >> (4 * j)) & 0xFu), __half2float(srow[g]), __half2float(zrow[g])));
        }
    }
    *reinterpret_cast<uint4 *>(w + at) = *reinterpret_cast<const uint4 *>(out);
}

// INT8 weights (W = q * s, no zero) for the dense path: thread t of block (n, b) writes w[n][k_perm[kk]] for
// kk = 256b + t, one element each. It runs once per weight when a model loads, so a plain, always-correct kernel (any
// K, any group size, act-order scatter) is worth more than a vectorized one. q * s is exact in FP32 (a 7-bit integer
// times an 11-bit significand), so the result is rounded once, to D.
template <Dtype D>
__global__ void __launch_bounds__(kDequantThreads) dequant_int8_kernel(const int8_t *codes, const __half *scales,
                                                                       const int32_t *k_perm,
                                                                       typename Element<D>::T *w, int k, int gs,
                                                                       int groups) {
    using E = Element<D>;
    const int n = blockIdx.x;
    const int kk = blockIdx.y * kDequantThreads + threadIdx.x;
    if (kk >= k) return;
    const float s = __half2float(scales[static_cast<size_t>(n) * groups + kk / gs]);
    const float q = static_cast<float>(codes[static_cast<size_t>(n) * k + kk]);
    const int column = k_perm != nullptr ? k_perm[kk] : kk;
    w[static_cast<size_t>(n) * k + column] = E::from_float(q * s);
}

// The checks dequant_int4 and dequant_int4_iteration share: 0, or the rc to return.
int dequant_shape_rc(const uint8_t *codes, const uint16_t *scales, const uint16_t *zeros, const uint16_t *w, int n,
                     int k, int group_size) {
    if (codes == nullptr || scales == nullptr || zeros == nullptr || w == nullptr) return kRcBadArgument;
    if (n < 1 || k < 1 || group_size < 1 || k % group_size != 0) return kRcBadArgument;
    // 8 codes per thread: 4-byte code loads and 16-byte stores need K % 8 == 0 and aligned rows.
    if (k % 8 != 0 || k / 8 / kDequantThreads >= 65535 || !aligned16(w) ||
        (reinterpret_cast<uintptr_t>(codes) & 3u) != 0) {
        return kRcUnsupported;
    }
    return 0;
}

}  // namespace

int dequant_int8(const int8_t *codes, const uint16_t *scales, const int32_t *k_perm, uint16_t *w, int n, int k,
                 int group_size, Dtype dtype, cudaStream_t stream) {
    if (codes == nullptr || scales == nullptr || w == nullptr) return kRcBadArgument;
    if (n < 1 || k < 1 || group_size < 1 || k % group_size != 0) return kRcBadArgument;
    if ((k + kDequantThreads - 1) / kDequantThreads > 65535) return kRcUnsupported;  // gridDim.y's limit
    const dim3 grid(n, (k + kDequantThreads - 1) / kDequantThreads);
    const auto *s = reinterpret_cast<const __half *>(scales);
    if (dtype == Dtype::BF16) {
        dequant_int8_kernel<Dtype::BF16><<<grid, kDequantThreads, 0, stream>>>(
            codes, s, k_perm, reinterpret_cast<__nv_bfloat16 *>(w), k, group_size, k / group_size);
    } else {
        dequant_int8_kernel<Dtype::F16><<<grid, kDequantThreads, 0, stream>>>(
            codes, s, k_perm, reinterpret_cast<__half *>(w), k, group_size, k / group_size);
    }
    TL_GPU_CHECK_LAUNCH();
    return 0;
}

int dequant_int4(const uint8_t *codes, const uint16_t *scales, const uint16_t *zeros, uint16_t *w, int n, int k,
                 int group_size, Dtype dtype, cudaStream_t stream) {
    if (const int rc = dequant_shape_rc(codes, scales, zeros, w, n, k, group_size)) return rc;
    const dim3 grid(n, (k / 8 + kDequantThreads - 1) / kDequantThreads);
    const auto *s = reinterpret_cast<const __half *>(scales);
    const auto *z = reinterpret_cast<const __half *>(zeros);
    if (dtype == Dtype::BF16) {
        dequant_kernel<Dtype::BF16, false><<<grid, kDequantThreads, 0, stream>>>(
            codes, s, z, reinterpret_cast<__nv_bfloat16 *>(w), k, group_size, k / group_size, RoundingChannels{});
    } else {
        dequant_kernel<Dtype::F16, false><<<grid, kDequantThreads, 0, stream>>>(
            codes, s, z, reinterpret_cast<__half *>(w), k, group_size, k / group_size, RoundingChannels{});
    }
    TL_GPU_CHECK_LAUNCH();
    return 0;
}

int dequant_int4_iteration(const uint8_t *codes, const uint16_t *scales, const uint16_t *zeros,
                           const RoundingChannels &rounding, uint16_t *w, int n, int k, int group_size,
                           cudaStream_t stream) {
    if (const int rc = dequant_shape_rc(codes, scales, zeros, w, n, k, group_size)) return rc;
    if ((rounding.frac4 == nullptr && rounding.sign_bit == nullptr) || rounding.loops < 1 || rounding.iteration < 0 ||
        rounding.iteration >= rounding.loops || rounding.k_real < 1 || rounding.k_real > k || rounding.row_split < 0 ||
        rounding.row_split >= n || (reinterpret_cast<uintptr_t>(rounding.frac4) & 3u) != 0) {
        return kRcBadArgument;
    }
    const dim3 grid(n, (k / 8 + kDequantThreads - 1) / kDequantThreads);
    dequant_kernel<Dtype::F16, true><<<grid, kDequantThreads, 0, stream>>>(
        codes, reinterpret_cast<const __half *>(scales), reinterpret_cast<const __half *>(zeros),
        reinterpret_cast<__half *>(w), k, group_size, k / group_size, rounding);
    TL_GPU_CHECK_LAUNCH();
    return 0;
}

int cublas_gemm(cublasHandle_t handle, const uint16_t *x, const uint16_t *w, uint16_t *y, int m, int n, int k,
                Dtype dtype, cudaStream_t stream, void *cublas_workspace, size_t cublas_workspace_bytes) {
    if (handle == nullptr || x == nullptr || w == nullptr || y == nullptr || m < 1 || n < 1 || k < 1) {
        return kRcBadArgument;
    }
    const CublasApi *cublas = cublas_api();
    if (cublas == nullptr) return kRcCublas;
    if (cublas->set_stream(handle, stream) != CUBLAS_STATUS_SUCCESS) return kRcCublas;  // resets the workspace too
    if (cublas_workspace != nullptr &&
        cublas->set_workspace(handle, cublas_workspace, cublas_workspace_bytes) != CUBLAS_STATUS_SUCCESS) {
        return kRcCublas;
    }
    // Column-major view: Y^T [N x M] = W^T (op T of the [K x N] column-major W) * X^T [K x M]; ld = row lengths.
    const float alpha = 1.0f, beta = 0.0f;
    const cudaDataType_t type = dtype == Dtype::BF16 ? CUDA_R_16BF : CUDA_R_16F;
    const cublasStatus_t st = cublas->gemm_ex(handle, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &alpha, w, type, k, x, type, k,
                                              &beta, y, type, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    return st == CUBLAS_STATUS_SUCCESS ? 0 : kRcCublas;
}

int dequant_cublas_gemm(cublasHandle_t handle, const uint16_t *x, const uint8_t *codes, const uint16_t *scales,
                        const uint16_t *zeros, uint16_t *y, int m, int n, int k, int group_size, Dtype dtype,
                        void *scratch, size_t scratch_bytes, cudaStream_t stream, void *cublas_workspace,
                        size_t cublas_workspace_bytes) {
    if (scratch == nullptr) return kRcBadArgument;
    if (scratch_bytes < static_cast<size_t>(n) * k * sizeof(uint16_t)) return kRcWorkspace;
    uint16_t *w = static_cast<uint16_t *>(scratch);
    if (const int rc = dequant_int4(codes, scales, zeros, w, n, k, group_size, dtype, stream)) return rc;
    return cublas_gemm(handle, x, w, y, m, n, k, dtype, stream, cublas_workspace, cublas_workspace_bytes);
}

}  // namespace tl::gpu
