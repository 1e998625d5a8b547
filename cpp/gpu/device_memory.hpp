// The GPU layer's one owner of device memory, DeviceBuffer: a weight's device forms (device_weight.cpp) and a
// GpuModel's weights and buffers (gpu_model.cpp) are made of them. Compiled only with TL_WITH_CUDA.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "gpu/cuda_host.hpp"

namespace tl {

// Owned device memory on one device, allocated with that device current; freed on destruction with that device
// current again (errors there are ignored: nothing to report to).
class DeviceBuffer {
public:
    DeviceBuffer() = default;
    DeviceBuffer(int device, size_t bytes) : device_(device), bytes_(bytes) {
        check_cuda(cudaMalloc(&ptr_, bytes), ("cudaMalloc of " + std::to_string(bytes) + " bytes").c_str());
    }
    ~DeviceBuffer() {
        if (ptr_ == nullptr) return;
        int previous = 0;
        cudaGetDevice(&previous);
        cudaSetDevice(device_);
        cudaFree(ptr_);
        cudaSetDevice(previous);
    }
    DeviceBuffer(DeviceBuffer &&o) noexcept { swap(o); }
    DeviceBuffer &operator=(DeviceBuffer &&o) noexcept {
        swap(o);
        return *this;
    }
    DeviceBuffer(const DeviceBuffer &) = delete;
    DeviceBuffer &operator=(const DeviceBuffer &) = delete;

    // A copy of host memory, enqueued on `stream`.
    template <class T>
    static DeviceBuffer upload(int device, const std::vector<T> &host, cudaStream_t stream) {
        return upload(device, host.data(), host.size() * sizeof(T), stream);
    }
    static DeviceBuffer upload(int device, const void *host, size_t bytes, cudaStream_t stream) {
        DeviceBuffer b(device, bytes);
        check_cuda(cudaMemcpyAsync(b.ptr_, host, bytes, cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync (upload)");
        return b;
    }
    // A copy of host memory, done when this returns (cudaMemcpy).
    static DeviceBuffer upload_sync(int device, const void *host, size_t bytes) {
        DeviceBuffer b(device, bytes);
        check_cuda(cudaMemcpy(b.ptr_, host, bytes, cudaMemcpyHostToDevice), "cudaMemcpy (upload)");
        return b;
    }

    template <class T = void>
    T *get() const {
        return static_cast<T *>(ptr_);
    }
    size_t bytes() const { return bytes_; }
    explicit operator bool() const { return ptr_ != nullptr; }

private:
    void swap(DeviceBuffer &o) noexcept {
        std::swap(device_, o.device_);
        std::swap(ptr_, o.ptr_);
        std::swap(bytes_, o.bytes_);
    }
    int device_ = 0;
    void *ptr_ = nullptr;
    size_t bytes_ = 0;
};

}  // namespace tl
