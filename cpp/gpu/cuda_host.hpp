// Host-side CUDA helpers shared by the GPU backend files (compiled only with TL_WITH_CUDA).
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "util/error.hpp"

namespace tl {

// A failed CUDA call becomes TL_ERR_OUT_OF_MEMORY or TL_ERR_CUDA naming the call and the CUDA error; a non-sticky
// error is cleared first so the next call starts clean.
inline void check_cuda(cudaError_t err, const std::string &what) {
    if (err == cudaSuccess) return;
    cudaGetLastError();
    fail(err == cudaErrorMemoryAllocation ? TL_ERR_OUT_OF_MEMORY : TL_ERR_CUDA,
         what + ": " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")");
}

// Makes `device` current for a scope and restores the caller's device after.
class DeviceScope {
public:
    explicit DeviceScope(int device) {
        check_cuda(cudaGetDevice(&previous_), "cudaGetDevice");
        if (previous_ != device) check_cuda(cudaSetDevice(device), "cudaSetDevice");
    }
    ~DeviceScope() { cudaSetDevice(previous_); }
    DeviceScope(const DeviceScope &) = delete;
    DeviceScope &operator=(const DeviceScope &) = delete;

private:
    int previous_ = 0;
};

}  // namespace tl
