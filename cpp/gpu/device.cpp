#include "gpu/device.hpp"

#include <string>

#include "util/error.hpp"

#if defined(TL_WITH_CUDA)
#include <cuda_runtime_api.h>

#include "gpu/cuda_host.hpp"
#endif

namespace tl {

void fail_without_cuda() { fail(TL_ERR_NO_DEVICE, "this build of the library has no CUDA support"); }

void require_device(int32_t device) {
    const int32_t count = device_count();
    if (count == 0) fail(TL_ERR_NO_DEVICE, "no usable CUDA device on this machine");
    if (device < 0 || device >= count) {
        fail(TL_ERR_INVALID_ARGUMENT,
             "device " + std::to_string(device) + " does not exist (" + std::to_string(count) + " devices)");
    }
}

#if !defined(TL_WITH_CUDA)

// ---- A build without CUDA -------------------------------------------------------------------------------------

int32_t device_count() noexcept { return 0; }
DeviceProperties device_info(int32_t) { fail_without_cuda(); }
void *device_malloc(int32_t, size_t) { fail_without_cuda(); }
void device_free(void *ptr, void *) {
    if (ptr != nullptr) fail_without_cuda();
}
void memcpy_any(void *, const void *, size_t, void *) { fail_without_cuda(); }
void memset_device(void *, int32_t, size_t, void *) { fail_without_cuda(); }
void *stream_create(int32_t) { fail_without_cuda(); }
void stream_destroy(void *stream) {
    if (stream != nullptr) fail_without_cuda();
}
void stream_synchronize(void *) { fail_without_cuda(); }

#else

// ---- CUDA -------------------------------------------------------------------------------------------------------

int32_t device_count() noexcept {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return count;
}

DeviceProperties device_info(int32_t device) {
    require_device(device);
    cudaDeviceProp prop{};
    check_cuda(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
    size_t free_bytes = 0, total_bytes = 0;
    {
        DeviceScope scope(device);
        check_cuda(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
    }
    DeviceProperties p;
    p.name = prop.name;
    p.sm_major = prop.major;
    p.sm_minor = prop.minor;
    p.sm_count = prop.multiProcessorCount;
    p.total_memory = total_bytes;
    p.free_memory = free_bytes;
    p.marlin_supported = prop.major >= 8;
    return p;
}

void *device_malloc(int32_t device, size_t bytes) {
    require_device(device);
    if (bytes == 0) fail(TL_ERR_INVALID_ARGUMENT, "bytes must be > 0");
    DeviceScope scope(device);
    void *p = nullptr;
    check_cuda(cudaMalloc(&p, bytes), ("cudaMalloc of " + std::to_string(bytes) + " bytes").c_str());
    return p;
}

void device_free(void *ptr, void *stream) {
    if (ptr == nullptr) return;
    if (device_count() == 0) fail(TL_ERR_NO_DEVICE, "no usable CUDA device");
    if (stream != nullptr) {
        check_cuda(cudaFreeAsync(ptr, static_cast<cudaStream_t>(stream)), "cudaFreeAsync");
    } else {
        check_cuda(cudaFree(ptr), "cudaFree");
    }
}

void memcpy_any(void *dst, const void *src, size_t bytes, void *stream) {
    if (device_count() == 0) fail(TL_ERR_NO_DEVICE, "no usable CUDA device");
    if (bytes == 0) return;
    if (dst == nullptr || src == nullptr) fail(TL_ERR_INVALID_ARGUMENT, dst == nullptr ? "dst is NULL" : "src is NULL");
    auto s = static_cast<cudaStream_t>(stream);
    check_cuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s), "cudaMemcpyAsync");
    check_cuda(cudaStreamSynchronize(s), "cudaStreamSynchronize (memcpy)");
}

void memset_device(void *dst, int32_t value, size_t bytes, void *stream) {
    if (device_count() == 0) fail(TL_ERR_NO_DEVICE, "no usable CUDA device");
    if (value < 0 || value > 255) fail(TL_ERR_INVALID_ARGUMENT, "value must be in [0, 255], got " + std::to_string(value));
    if (bytes == 0) return;
    if (dst == nullptr) fail(TL_ERR_INVALID_ARGUMENT, "dst is NULL");
    check_cuda(cudaMemsetAsync(dst, value, bytes, static_cast<cudaStream_t>(stream)), "cudaMemsetAsync");
}

void *stream_create(int32_t device) {
    require_device(device);
    DeviceScope scope(device);
    cudaStream_t s = nullptr;
    check_cuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    return s;
}

void stream_destroy(void *stream) {
    if (stream == nullptr) return;
    if (device_count() == 0) fail(TL_ERR_NO_DEVICE, "no usable CUDA device");
    check_cuda(cudaStreamDestroy(static_cast<cudaStream_t>(stream)), "cudaStreamDestroy");
}

void stream_synchronize(void *stream) {
    if (device_count() == 0) fail(TL_ERR_NO_DEVICE, "no usable CUDA device");
    check_cuda(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)), "cudaStreamSynchronize");
}
#endif  // TL_WITH_CUDA

}  // namespace tl
