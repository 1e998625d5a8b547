// Native INT4 x FP16/BF16 GEMM: one thread per output element (the seed's design). No tensor cores and no weight
// reuse across rows, so it is slow at large M, but it takes any M, N, K and group size: it is the fallback that
// always works and a second GPU reference for the fast kernels.
#include "gpu_common.cuh"

namespace tl::gpu {

namespace {

constexpr int kNativeThreads = 128;  // outputs (columns) per block
constexpr int kNativeChunk = 1024;   // k values of the X row staged in shared memory at a time

// Y[m, n] for m = blockIdx.x, n = blockIdx.y * 128 + threadIdx.x; x and y of type D. The block stages X[m, k0:k0+1024]
// in shared memory as FP32; each thread walks its own weight row. `vector_path` (K and the group size multiples of 32,
// rows 16-byte aligned): 16-byte code loads and one group lookup per 32 codes; otherwise one code at a time.
template <Dtype D>
__global__ void __launch_bounds__(kNativeThreads) native_int4_kernel(const typename Element<D>::T *x,
                                                                     const uint8_t *codes, const __half *scales,
                                                                     const __half *zeros, typename Element<D>::T *y,
                                                                     int m, int n, int k, int gs, int groups,
                                                                     int row_bytes, bool vector_path) {
    __shared__ float xs[kNativeChunk];
    const int row = blockIdx.x;
    const int col = blockIdx.y * kNativeThreads + threadIdx.x;
    const bool active = col < n;
    const uint8_t *wrow = codes + static_cast<size_t>(active ? col : 0) * row_bytes;
    const __half *srow = scales + static_cast<size_t>(active ? col : 0) * groups;
    const __half *zrow = zeros + static_cast<size_t>(active ? col : 0) * groups;
    float acc = 0.0f;
    for (int k0 = 0; k0 < k; k0 += kNativeChunk) {
        const int len = min(kNativeChunk, k - k0);
        __syncthreads();  // the previous chunk is consumed
        for (int i = threadIdx.x; i < len; i += kNativeThreads) {
            xs[i] = Element<D>::to_float(x[static_cast<size_t>(row) * k + k0 + i]);
        }
        __syncthreads();
        if (!active) continue;
        if (vector_path) {
            for (int kk = 0; kk < len; kk += 32) {
                const int g = (k0 + kk) / gs;
                const float s = __half2float(srow[g]), z = __half2float(zrow[g]);
                const uint4 v = *reinterpret_cast<const uint4 *>(wrow + (k0 + kk) / 2);
                const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
                for (int i = 0; i < 4; ++i) {
#pragma unroll
                    for (int j = 0; j < 8; ++j) {
                        const float q = static_cast<float>((w[i] >> (4 * j)) & 0xFu);
                        acc = fmaf(xs[kk + 8 * i + j], fmaf(q, s, z), acc);
                    }
                }
            }
        } else {
            for (int kk = 0; kk < len; ++kk) {
                const int kg = k0 + kk, g = kg / gs;
                const float q = static_cast<float>((wrow[kg / 2] >> ((kg & 1) * 4)) & 0xFu);
                acc = fmaf(xs[kk], fmaf(q, __half2float(srow[g]), __half2float(zrow[g])), acc);
            }
        }
    }
    if (active) y[static_cast<size_t>(row) * n + col] = Element<D>::from_float(acc);
}

}  // namespace

int native_int4_gemm(const uint16_t *x, const uint8_t *codes, const uint16_t *scales, const uint16_t *zeros,
                     uint16_t *y, int m, int n, int k, int group_size, Dtype dtype, cudaStream_t stream) {
    if (x == nullptr || codes == nullptr || scales == nullptr || zeros == nullptr || y == nullptr) {
        return kRcBadArgument;
    }
    if (m < 1 || n < 1 || k < 1 || group_size < 1) return kRcBadArgument;
    if ((n + kNativeThreads - 1) / kNativeThreads > 65535) return kRcUnsupported;  // grid.y limit: N > 8.3M
    const int groups = (k + group_size - 1) / group_size;
    const int row_bytes = (k + 1) / 2;
    const bool vector_path = k % 32 == 0 && group_size % 32 == 0 && aligned16(codes);
    const dim3 grid(m, (n + kNativeThreads - 1) / kNativeThreads);
    auto launch = [&](auto kernel, auto element) {
        using T = typename decltype(element)::T;
        kernel<<<grid, kNativeThreads, 0, stream>>>(reinterpret_cast<const T *>(x), codes,
                                                    reinterpret_cast<const __half *>(scales),
                                                    reinterpret_cast<const __half *>(zeros), reinterpret_cast<T *>(y),
                                                    m, n, k, group_size, groups, row_bytes, vector_path);
    };
    if (dtype == Dtype::BF16) {
        launch(native_int4_kernel<Dtype::BF16>, Element<Dtype::BF16>{});
    } else {
        launch(native_int4_kernel<Dtype::F16>, Element<Dtype::F16>{});
    }
    TL_GPU_CHECK_LAUNCH();
    return 0;
}

}  // namespace tl::gpu
