// The seed's asymmetric correction for the symmetric Marlin-class GEMM: C += (A group sums) @ delta, with
// delta[g, n] = z + 8s, as two small kernels (a fused one would re-reduce A for every N tile), and the wrapper the
// dispatcher calls. The group sums live in the caller's scratch, so concurrent calls never share one.
#include <cuda_fp16.h>

#include "gpu_common.cuh"

namespace tl::gpu {

namespace {

constexpr int kSumThreads = 128;
constexpr int kAccumThreads = 128;

// a_sum[m, g] = sum_{k in group g} A[m, k]; one block per (m, g), a fixed-order tree, accumulated in FP64 (FP16
// inputs: the FP64 sum is exact for any realistic activations, so the FP32 result is the correctly rounded sum).
__global__ void __launch_bounds__(kSumThreads) a_group_sum_kernel(const __half *a, float *a_sum, int k, int gs,
                                                                  int groups) {
    __shared__ double partial[kSumThreads];
    const int row = blockIdx.x, g = blockIdx.y;
    const __half *src = a + static_cast<size_t>(row) * k + static_cast<size_t>(g) * gs;
    double acc = 0.0;
    for (int i = threadIdx.x; i < gs; i += kSumThreads) acc += static_cast<double>(__half2float(src[i]));
    partial[threadIdx.x] = acc;
    __syncthreads();
    for (int width = kSumThreads / 2; width > 0; width /= 2) {
        if (threadIdx.x < width) partial[threadIdx.x] += partial[threadIdx.x + width];
        __syncthreads();
    }
    if (threadIdx.x == 0) a_sum[static_cast<size_t>(row) * groups + g] = static_cast<float>(partial[0]);
}

// One thread per output: C[m, n] = fp16(C[m, n] + sum_g a_sum[m, g] * delta[g, n]), FP32 accumulation.
__global__ void __launch_bounds__(kAccumThreads) correction_accum_kernel(__half *c, const float *a_sum,
                                                                         const float *delta, int n, int groups) {
    const int row = blockIdx.x;
    const int col = blockIdx.y * kAccumThreads + threadIdx.x;
    if (col >= n) return;
    const float *sums = a_sum + static_cast<size_t>(row) * groups;
    float acc = 0.0f;
    for (int g = 0; g < groups; ++g) acc = fmaf(sums[g], delta[static_cast<size_t>(g) * n + col], acc);
    __half *out = c + static_cast<size_t>(row) * n + col;
    *out = __float2half_rn(__half2float(*out) + acc);
}

}  // namespace

int a_group_sum(const uint16_t *a, float *a_sum, int m, int k, int group_size, cudaStream_t stream) {
    if (a == nullptr || a_sum == nullptr) return kRcBadArgument;
    if (m < 1 || k < 1 || group_size < 1 || k % group_size != 0 || k / group_size > 65535) return kRcBadArgument;
    const int groups = k / group_size;
    a_group_sum_kernel<<<dim3(m, groups), kSumThreads, 0, stream>>>(reinterpret_cast<const __half *>(a), a_sum, k,
                                                                     group_size, groups);
    TL_GPU_CHECK_LAUNCH();
    return 0;
}

int correction_accum(uint16_t *c, const float *a_sum, const float *delta, int m, int n, int groups,
                     cudaStream_t stream) {
    if (c == nullptr || a_sum == nullptr || delta == nullptr) return kRcBadArgument;
    if (m < 1 || n < 1 || groups < 1 || (n + kAccumThreads - 1) / kAccumThreads > 65535) return kRcBadArgument;
    correction_accum_kernel<<<dim3(m, (n + kAccumThreads - 1) / kAccumThreads), kAccumThreads, 0, stream>>>(
        reinterpret_cast<__half *>(c), a_sum, delta, n, groups);
    TL_GPU_CHECK_LAUNCH();
    return 0;
}

size_t correction_scratch_bytes(int m, int k, int gs) {
    const int group_size = gs == -1 ? k : gs;
    return group_size < 1 ? 0 : static_cast<size_t>(m) * (k / group_size) * sizeof(float);
}

int marlin_gemm_corrected(const uint16_t *x, const uint32_t *words, const uint16_t *scales, const float *delta,
                          uint16_t *y, int m, int n, int k, int gs, void *workspace, size_t workspace_bytes,
                          float *a_sum, size_t a_sum_bytes, cudaStream_t stream, const MarlinPlan *forced) {
    if (delta == nullptr || y == nullptr || m < 1 || n < 1) return kRcBadArgument;
    const int group_size = gs == -1 ? k : gs;
    if (group_size < 1 || k % group_size != 0) return kRcUnsupported;
    if (a_sum == nullptr || a_sum_bytes < correction_scratch_bytes(m, k, gs)) return kRcWorkspace;
    TL_GPU_CHECK(cudaMemsetAsync(y, 0, static_cast<size_t>(m) * n * sizeof(uint16_t), stream));
    if (const int rc = marlin_gemm(x, words, scales, nullptr, y, m, n, k, gs, false, Dtype::F16, workspace,
                                   workspace_bytes, stream, forced)) {
        return rc;
    }
    const int groups = k / group_size;
    if (const int rc = a_group_sum(x, a_sum, m, k, group_size, stream)) return rc;
    return correction_accum(y, a_sum, delta, m, n, groups, stream);
}

}  // namespace tl::gpu
