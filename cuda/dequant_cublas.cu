// The large-M path: dequantize the INT4 weight to an FP16 scratch [N][K], then one cuBLAS GEMM (FP16 in, FP32
// compute). It pays a full extra pass over the weights, so it only wins where the GEMM is compute-bound.
#include <cublas_v2.h>
#include <cuda_fp16.h>

#include "gpu/cublas_loader.hpp"
#include "gpu_common.cuh"

namespace tl::gpu {

namespace {

constexpr int kDequantThreads = 256;

// Thread t of block (n, b) writes w[n][8(256b + t) ..][8 values]: one 32-bit code load, one 16-byte store.
// W = q*s + z in FP32, rounded once to FP16.
__global__ void __launch_bounds__(kDequantThreads) dequant_kernel(const uint8_t *codes, const __half *scales,
                                                                  const __half *zeros, __half *w, int k, int gs,
                                                                  int groups) {
    const int n = blockIdx.x;
    const int k0 = (blockIdx.y * kDequantThreads + threadIdx.x) * 8;
    if (k0 >= k) return;
    const uint32_t q8 = *reinterpret_cast<const uint32_t *>(codes + static_cast<size_t>(n) * (k / 2) + k0 / 2);
    const __half *srow = scales + static_cast<size_t>(n) * groups;
    const __half *zrow = zeros + static_cast<size_t>(n) * groups;
    __align__(16) __half out[8];
    if (gs % 8 == 0) {  // the 8 values share one group
        const float s = __half2float(srow[k0 / gs]), z = __half2float(zrow[k0 / gs]);
#pragma unroll
        for (int j = 0; j < 8; ++j) out[j] = __float2half_rn(fmaf(static_cast<float>((q8 >> (4 * j)) & 0xFu), s, z));
    } else {
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            const int g = (k0 + j) / gs;
            out[j] = __float2half_rn(
                fmaf(static_cast<float>((q8 >> (4 * j)) & 0xFu), __half2float(srow[g]), __half2float(zrow[g])));
        }
    }
    *reinterpret_cast<uint4 *>(w + static_cast<size_t>(n) * k + k0) = *reinterpret_cast<const uint4 *>(out);
}

}  // namespace

int dequant_int4_fp16(const uint8_t *codes, const uint16_t *scales, const uint16_t *zeros, uint16_t *w_fp16, int n,
                      int k, int group_size, cudaStream_t stream) {
    if (codes == nullptr || scales == nullptr || zeros == nullptr || w_fp16 == nullptr) return kRcBadArgument;
    if (n < 1 || k < 1 || group_size < 1 || k % group_size != 0) return kRcBadArgument;
    // 8 codes per thread: 4-byte code loads and 16-byte stores need K % 8 == 0 and aligned rows.
    if (k % 8 != 0 || k / 8 / kDequantThreads >= 65535 || !aligned16(w_fp16) || (reinterpret_cast<uintptr_t>(codes) & 3u) != 0) {
        return kRcUnsupported;
    }
    const dim3 grid(n, (k / 8 + kDequantThreads - 1) / kDequantThreads);
    dequant_kernel<<<grid, kDequantThreads, 0, stream>>>(codes, reinterpret_cast<const __half *>(scales),
                                                         reinterpret_cast<const __half *>(zeros),
                                                         reinterpret_cast<__half *>(w_fp16), k, group_size,
                                                         k / group_size);
    TL_GPU_CHECK_LAUNCH();
    return 0;
}

int cublas_gemm_fp16(cublasHandle_t handle, const uint16_t *x, const uint16_t *w_fp16, uint16_t *y, int m, int n,
                     int k, cudaStream_t stream, void *cublas_workspace, size_t cublas_workspace_bytes) {
    if (handle == nullptr || x == nullptr || w_fp16 == nullptr || y == nullptr || m < 1 || n < 1 || k < 1) {
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
    const cublasStatus_t st = cublas->gemm_ex(handle, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &alpha, w_fp16, CUDA_R_16F, k,
                                           x, CUDA_R_16F, k, &beta, y, CUDA_R_16F, n, CUBLAS_COMPUTE_32F,
                                           CUBLAS_GEMM_DEFAULT);
    return st == CUBLAS_STATUS_SUCCESS ? 0 : kRcCublas;
}

int dequant_cublas_gemm(cublasHandle_t handle, const uint16_t *x, const uint8_t *codes, const uint16_t *scales,
                        const uint16_t *zeros, uint16_t *y, int m, int n, int k, int group_size, void *scratch,
                        size_t scratch_bytes, cudaStream_t stream, void *cublas_workspace,
                        size_t cublas_workspace_bytes) {
    if (scratch == nullptr) return kRcBadArgument;
    if (scratch_bytes < static_cast<size_t>(n) * k * sizeof(uint16_t)) return kRcWorkspace;
    uint16_t *w = static_cast<uint16_t *>(scratch);
    if (const int rc = dequant_int4_fp16(codes, scales, zeros, w, n, k, group_size, stream)) return rc;
    return cublas_gemm_fp16(handle, x, w, y, m, n, k, stream, cublas_workspace, cublas_workspace_bytes);
}

}  // namespace tl::gpu
