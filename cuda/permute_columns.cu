// The input permutation of a weight imported from an act-order checkpoint: its K rows are stored group by group, so
// its GEMMs read X with the columns in that stored order.
#include "gpu_common.cuh"

namespace tl::gpu {

namespace {

constexpr int kPermuteThreads = 256;
constexpr int kMaxRowBlocks = 65535;  // gridDim.y

// Thread (column j, block row) writes out[r][j] = x[r][perm[j]] for r = blockIdx.y, blockIdx.y + gridDim.y, ...:
// coalesced stores; the loads gather inside one row, which L1/L2 holds.
__global__ void __launch_bounds__(kPermuteThreads) permute_columns_kernel(const uint16_t *x, const int32_t *perm,
                                                                          uint16_t *out, int m, int k) {
    const int j = blockIdx.x * kPermuteThreads + threadIdx.x;
    if (j >= k) return;
    const size_t from = static_cast<size_t>(perm[j]);
    for (int r = blockIdx.y; r < m; r += gridDim.y) {
        out[static_cast<size_t>(r) * k + j] = x[static_cast<size_t>(r) * k + from];
    }
}

}  // namespace

int permute_columns(const uint16_t *x, const int32_t *perm, uint16_t *out, int m, int k, cudaStream_t stream) {
    if (x == nullptr || perm == nullptr || out == nullptr || m < 1 || k < 1) return kRcBadArgument;
    const dim3 grid((k + kPermuteThreads - 1) / kPermuteThreads, m < kMaxRowBlocks ? m : kMaxRowBlocks);
    permute_columns_kernel<<<grid, kPermuteThreads, 0, stream>>>(x, perm, out, m, k);
    TL_GPU_CHECK_LAUNCH();
    return 0;
}

}  // namespace tl::gpu
