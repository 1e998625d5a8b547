// Device helpers both tensor-core attention kernels use (attention_mma.cu, attention_wgmma.cu).
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

namespace tl::gpu::attention {

__device__ __forceinline__ uint32_t smem_addr(const void *p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared, or 16 zero bytes when !valid (src is then not read, but must still be a valid address).
// No L2 cache-policy hint: .L2::cache_hint faults with an illegal instruction on the project's H200.
__device__ __forceinline__ void cp_async16_zfill(uint32_t dst, const void *src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0)
                 : "memory");
}

// Two FP32 probabilities as the FP16 pair of an A fragment: lo in the low 16 bits (the lower column).
__device__ __forceinline__ uint32_t pack_half2(float lo, float hi) {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t *>(&h);
}

// The maximum and the sum over the four lanes of a quad (lanes 4g .. 4g + 3), which hold one accumulator row between
// them in both the mma.sync and the wgmma fragment layouts.
__device__ __forceinline__ float quad_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

}  // namespace tl::gpu::attention
