// X as a weight reads it: in the stored order of a weight imported from an act-order checkpoint (its K rows stored
// group by group), and zero-padded to a K the Marlin-class kernels take.
#include "gpu_common.cuh"

namespace tl::gpu {

namespace {

constexpr int kGatherThreads = 256;
constexpr int kMaxRowBlocks = 65535;  // gridDim.y

// Thread (column j, block row) writes out[r][j] for r = blockIdx.y, blockIdx.y + gridDim.y, ...: coalesced stores;
// the loads gather inside one row, which L1/L2 holds.
__global__ void __launch_bounds__(kGatherThreads) gather_columns_kernel(const uint16_t *x, int k_in,
                                                                        const int32_t *index, uint16_t *out,
                                                                        int k_out, int m) {
    const int j = blockIdx.x * kGatherThreads + threadIdx.x;
    if (j >= k_out) return;
    const int from = index != nullptr ? index[j] : j;
    for (int r = blockIdx.y; r < m; r += gridDim.y) {
        out[static_cast<size_t>(r) * k_out + j] = from < k_in ? x[static_cast<size_t>(r) * k_in + from] : 0;
    }
}

}  // namespace

int gather_columns(const uint16_t *x, int k_in, const int32_t *index, uint16_t *out, int k_out, int m,
                   cudaStream_t stream) {
    if (x == nullptr || out == nullptr || m < 1 || k_in < 1 || k_out < k_in) return kRcBadArgument;
    const dim3 grid((k_out + kGatherThreads - 1) / kGatherThreads, m < kMaxRowBlocks ? m : kMaxRowBlocks);
    gather_columns_kernel<<<grid, kGatherThreads, 0, stream>>>(x, k_in, index, out, k_out, m);
    TL_GPU_CHECK_LAUNCH();
    return 0;
}

}  // namespace tl::gpu
