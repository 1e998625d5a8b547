// Shared-memory mbarriers (sm_90 and up) for the kernels that hand pipeline stages between warps: a stage is "full"
// once its copies have landed and "empty" once its readers are done. Include only from sources listed in
// cuda/sources_sm90a.txt.
#pragma once

#include <cstdint>

namespace tl::gpu::mbar {

__device__ __forceinline__ void init(uint32_t bar, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// The arrival fires when all of this thread's earlier cp.async copies have landed (counted in the init count).
__device__ __forceinline__ void arrive_cp_async(uint32_t bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
// Waits until the barrier's phase of this parity has completed.
__device__ __forceinline__ void wait(uint32_t bar, uint32_t parity) {
    uint32_t done = 0;
    while (!done) {
        asm volatile(
            "{\n"
            ".reg .pred p;\n"
            "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
            "selp.u32 %0, 1, 0, p;\n"
            "}\n"
            : "=r"(done)
            : "r"(bar), "r"(parity)
            : "memory");
    }
}

}  // namespace tl::gpu::mbar
