// Warp and block reductions shared by the forward-pass kernels.
#pragma once

#include <cuda_runtime.h>

#include <cmath>

namespace tl::gpu::forward {

// Every lane of the (fully active) warp gets the result.
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
    return v;
}

// Sum (MAX = false) or maximum (MAX = true) over the block; every thread gets the result. blockDim.x must be a
// multiple of 32 and every thread must call it. `scratch` holds 32 floats; the trailing barrier lets the caller
// reuse it for the next reduction.
template <bool MAX>
__device__ __forceinline__ float block_reduce(float v, float *scratch) {
    v = MAX ? warp_max(v) : warp_sum(v);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    const int n_warps = blockDim.x >> 5;
    const float identity = MAX ? -INFINITY : 0.0f;
    float t = lane < n_warps ? scratch[lane] : identity;
    t = MAX ? warp_max(t) : warp_sum(t);
    __syncthreads();
    return t;
}

// The larger (value, index) pair over the warp, ties to the lower index; every lane gets the result (the order is
// total, so the butterfly gives all lanes the same pair).
__device__ __forceinline__ void warp_argmax(float &v, int &i) {
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) {
        const float ov = __shfl_xor_sync(0xffffffffu, v, offset);
        const int oi = __shfl_xor_sync(0xffffffffu, i, offset);
        if (ov > v || (ov == v && oi < i)) {
            v = ov;
            i = oi;
        }
    }
}

// warp_argmax over the block, as block_reduce: every thread gets the pair; `scratch` and `index_scratch` hold 32
// entries each and may be reused once it returns.
__device__ __forceinline__ void block_argmax(float &v, int &i, float *scratch, int *index_scratch) {
    warp_argmax(v, i);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) {
        scratch[warp] = v;
        index_scratch[warp] = i;
    }
    __syncthreads();
    const int n_warps = blockDim.x >> 5;
    v = lane < n_warps ? scratch[lane] : -INFINITY;
    i = lane < n_warps ? index_scratch[lane] : 0x7fffffff;
    warp_argmax(v, i);
    __syncthreads();
}

}  // namespace tl::gpu::forward
