// Devices, device memory and streams for the C API's callers. Compiled in every build; in a build without CUDA
// device_count gives 0 and the others throw TL_ERR_NO_DEVICE (fail_without_cuda), but device_free and
// stream_destroy accept NULL.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace tl {

int32_t device_count() noexcept;
// TL_ERR_NO_DEVICE without any device, TL_ERR_INVALID_ARGUMENT when `device` is not one of them.
void require_device(int32_t device);
struct DeviceProperties {
    std::string name;
    int32_t sm_major = 0, sm_minor = 0, sm_count = 0;
    uint64_t total_memory = 0, free_memory = 0;
    bool marlin_supported = false;  // our Marlin-class kernels run on it (SM 8.0 or newer)
};
DeviceProperties device_info(int32_t device);

// Device memory and streams for the C API's callers (throw TL_ERR_NO_DEVICE / TL_ERR_CUDA / TL_ERR_INVALID_ARGUMENT).
void *device_malloc(int32_t device, size_t bytes);
void device_free(void *ptr, void *stream);
void memcpy_any(void *dst, const void *src, size_t bytes, void *stream);
void memset_device(void *dst, int32_t value, size_t bytes, void *stream);
void *stream_create(int32_t device);
void stream_destroy(void *stream);
void stream_synchronize(void *stream);

// What the GPU layer's functions do in a build without CUDA: TL_ERR_NO_DEVICE, "this build of the library has no CUDA
// support".
[[noreturn]] void fail_without_cuda();

}  // namespace tl
