// Helpers shared by the launchers in cuda/: device facts (cached per device) and the launch-check macro.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "gpu_kernels.hpp"

namespace tl::gpu {

// After a kernel launch: any launch error becomes the launcher's rc (a positive cudaError_t).
#define TL_GPU_CHECK_LAUNCH()                                  \
    do {                                                       \
        const cudaError_t tl_launch_err = cudaGetLastError();  \
        if (tl_launch_err != cudaSuccess) return static_cast<int>(tl_launch_err); \
    } while (0)

#define TL_GPU_CHECK(call)                                     \
    do {                                                       \
        const cudaError_t tl_call_err = (call);                \
        if (tl_call_err != cudaSuccess) return static_cast<int>(tl_call_err); \
    } while (0)

struct DeviceInfo {
    int device = 0;
    int sm_count = 0;
    int max_smem_optin = 0;  // bytes of dynamic shared memory one block may opt in to
    int smem_per_sm = 0;     // bytes of shared memory per SM
    int compute_capability = 0;  // major * 10 + minor
};

// Facts of the current device; rc 0 or a cudaError_t. Cached: the attributes never change for a device.
inline int current_device_info(DeviceInfo &info) {
    constexpr int kMaxDevices = 64;
    static std::atomic<int> sm_cache[kMaxDevices];
    static std::atomic<int> smem_cache[kMaxDevices];
    static std::atomic<int> smem_sm_cache[kMaxDevices];
    static std::atomic<int> cc_cache[kMaxDevices];
    TL_GPU_CHECK(cudaGetDevice(&info.device));
    if (info.device < 0 || info.device >= kMaxDevices) return static_cast<int>(cudaErrorInvalidDevice);
    info.sm_count = sm_cache[info.device].load(std::memory_order_relaxed);
    info.max_smem_optin = smem_cache[info.device].load(std::memory_order_relaxed);
    info.smem_per_sm = smem_sm_cache[info.device].load(std::memory_order_relaxed);
    info.compute_capability = cc_cache[info.device].load(std::memory_order_relaxed);
    if (info.sm_count == 0 || info.max_smem_optin == 0 || info.smem_per_sm == 0 || info.compute_capability == 0) {
        int major = 0, minor = 0;
        TL_GPU_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, info.device));
        TL_GPU_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, info.device));
        info.compute_capability = major * 10 + minor;
        TL_GPU_CHECK(cudaDeviceGetAttribute(&info.sm_count, cudaDevAttrMultiProcessorCount, info.device));
        TL_GPU_CHECK(cudaDeviceGetAttribute(&info.max_smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, info.device));
        TL_GPU_CHECK(
            cudaDeviceGetAttribute(&info.smem_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, info.device));
        sm_cache[info.device].store(info.sm_count, std::memory_order_relaxed);
        smem_sm_cache[info.device].store(info.smem_per_sm, std::memory_order_relaxed);
        smem_cache[info.device].store(info.max_smem_optin, std::memory_order_relaxed);
        cc_cache[info.device].store(info.compute_capability, std::memory_order_relaxed);
    }
    return 0;
}

inline bool aligned16(const void *p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// Lets the kernel launched with `config` (cudaLaunchKernelEx) start before the previous kernel on the stream has
// finished: a programmatic dependent launch (compute capability 9.0), in which the kernel waits (griddepcontrol.wait)
// before it reads what that kernel wrote. `attr` must outlive the launch; `allowed` false leaves an ordinary launch.
inline void allow_early_start(cudaLaunchConfig_t &config, cudaLaunchAttribute &attr, bool allowed = true) {
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    config.attrs = &attr;
    config.numAttrs = allowed ? 1 : 0;
}

// The device type of a Dtype's elements, with its conversions from and to FP32 (round to nearest even).
template <Dtype D>
struct Element;
template <>
struct Element<Dtype::F16> {
    using T = __half;
    static __device__ __forceinline__ float to_float(T v) { return __half2float(v); }
    static __device__ __forceinline__ T from_float(float v) { return __float2half_rn(v); }
};
template <>
struct Element<Dtype::BF16> {
    using T = __nv_bfloat16;
    static __device__ __forceinline__ float to_float(T v) { return __bfloat162float(v); }
    static __device__ __forceinline__ T from_float(float v) { return __float2bfloat16_rn(v); }
};

}  // namespace tl::gpu
