// The activation-precision rule's INT8 quantization of a row (docs/quality.md), as device functions for the kernels
// that quantize rows: quantize_rows_int8 (w8a8_gemm.cu) and the forward pass's RMSNorm and SwiGLU that write INT8
// (forward/rowwise.cu). s = fl(max |x| / 127) by a true division; codes clamp(rne(fl(x / s)), -127, 127), 0 where s is
// 0 or NaN (a NaN scale makes the outputs NaN); the code sums per row or per group.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace tl::gpu::int8q {

// max that keeps a NaN (fmaxf drops it): a row holding one must get a NaN scale.
__device__ __forceinline__ float max_nan(float a, float b) { return (a > b || a != a) ? a : b; }

__device__ __forceinline__ float row_scale(float amax) { return __fdiv_rn(amax, 127.0f); }

__device__ __forceinline__ int quantize_one(float x, float s) {
    if (!(s > 0.0f)) return 0;
    const int q = __float2int_rn(__fdiv_rn(x, s));
    return q < -127 ? -127 : q > 127 ? 127 : q;
}

__device__ __forceinline__ float warp_max_nan(float v) {
    for (int offset = 16; offset > 0; offset /= 2) v = max_nan(v, __shfl_xor_sync(0xffffffffu, v, offset));
    return v;
}

__device__ __forceinline__ int warp_sum(int v) {
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

// Over the block (blockDim.x a multiple of 32): every thread gets the result. `scratch` holds 32 entries and may be
// reused once it returns.
__device__ __forceinline__ float block_max_nan(float v, float *scratch) {
    v = warp_max_nan(v);
    if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = v;
    __syncthreads();
    float t = scratch[0];
    for (int w = 1; w < static_cast<int>(blockDim.x / 32); ++w) t = max_nan(t, scratch[w]);
    __syncthreads();
    return t;
}
__device__ __forceinline__ int block_sum(int v, int *scratch) {
    v = warp_sum(v);
    if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = v;
    __syncthreads();
    int t = 0;
    for (int w = 0; w < static_cast<int>(blockDim.x / 32); ++w) t += scratch[w];
    __syncthreads();
    return t;
}

// The sums of a row's codes in groups of `group` (a multiple of 16 dividing k; codes 16-byte aligned) as FP32 (exact:
// |sum| <= 127 group), out[g * ld] for group g; thread t of `threads` takes groups t, t + threads, ... Call once the
// row's codes are stored and the threads that stored them have synchronized (__syncwarp, __syncthreads): reading them
// back from L2 costs less than carrying a sum per group through the quantizing loop, whose groups run across lanes.
__device__ __forceinline__ void group_sums(const int8_t *codes, int k, int group, float *out, size_t ld, int t,
                                           int threads) {
    for (int g = t; g < k / group; g += threads) {
        const int4 *at = reinterpret_cast<const int4 *>(codes + static_cast<size_t>(g) * group);
        int sum = 0;
        for (int c = 0; c < group / 16; ++c) {
            const int4 v = __ldcg(at + c);  // from L2: other threads stored them
            sum = __dp4a(v.x, 0x01010101, sum);
            sum = __dp4a(v.y, 0x01010101, sum);
            sum = __dp4a(v.z, 0x01010101, sum);
            sum = __dp4a(v.w, 0x01010101, sum);
        }
        out[static_cast<size_t>(g) * ld] = static_cast<float>(sum);
    }
}

// One block of THREADS threads quantizes a row of n values, value(i) for i < n (the same FP32 value on each call: it is
// called twice per element, for the maximum and for the codes), into codes[0..n), *scale, *code_sum (where given)
// and the group sums (where given, group_ld apart; codes 16-byte aligned). The scratch arrays hold 32 entries each.
template <int THREADS, class Value>
__device__ __forceinline__ void quantize_row_block(Value value, int n, int8_t *codes, float *scale, int32_t *code_sum,
                                                   float *group_sums_out, int group, size_t group_ld,
                                                   float *scratch, int *int_scratch) {
    float amax = 0.0f;
    for (int i = threadIdx.x; i < n; i += THREADS) amax = max_nan(amax, fabsf(value(i)));
    const float s = row_scale(block_max_nan(amax, scratch));
    int sum = 0;
    for (int i = threadIdx.x; i < n; i += THREADS) {
        const int q = quantize_one(value(i), s);
        codes[i] = static_cast<int8_t>(q);
        sum += q;
    }
    if (threadIdx.x == 0) *scale = s;
    if (group_sums_out != nullptr) {
        __syncthreads();
        group_sums(codes, n, group, group_sums_out, group_ld, threadIdx.x, THREADS);
    }
    if (code_sum == nullptr) return;
    sum = block_sum(sum, int_scratch);
    if (threadIdx.x == 0) *code_sum = sum;
}

}  // namespace tl::gpu::int8q
