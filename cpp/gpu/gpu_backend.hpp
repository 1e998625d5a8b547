// The GPU side of the C API: devices, packing weights onto a device, and the quantized-GEMM dispatcher
// (FP16 body -> Marlin-class (or dequantize + cuBLAS at large M) -> native INT4). Compiled in every build; in a
// build without CUDA every function but device_count throws TL_ERR_NO_DEVICE.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "format/model.hpp"
#include "dtype.hpp"
#include "util/error.hpp"

namespace tl {

// A weight's device forms and its per-path call counters. Opaque outside gpu_backend.cpp.
struct DeviceWeight;

int32_t device_count() noexcept;
struct DeviceProperties {
    std::string name;
    int32_t sm_major = 0, sm_minor = 0, sm_count = 0;
    uint64_t total_memory = 0, free_memory = 0;
    bool marlin_supported = false;  // our Marlin-class kernels run on it (SM 8.0 or newer)
};
DeviceProperties device_info(int32_t device);

// Calls per dispatcher path since the weight was packed; `fallbacks` counts calls in which a path refused.
struct DispatchCounts {
    uint64_t fp16_body = 0, marlin_fused = 0, marlin_correction = 0, dequant_cublas = 0, native = 0, fallbacks = 0;
};

// The device forms pack_weight makes of an INT4 weight besides the native kernel's upload (capi/ translates the C
// API's TL_FORM_* flags into these). The defaults are what a model's weights get.
struct PackForms {
    bool marlin_fused = true;       // Marlin-class tiles, zero point applied in registers
    bool marlin_correction = true;  // the seed's form: symmetric tiles + delta correction
    bool fp16_body = false;         // a dequantized FP16 copy (memory for speed)
};

struct PackOutcome {
    bool packed = false;    // received a Marlin-class form
    bool packable = false;  // the Marlin-class kernel takes its shape
    uint64_t device_bytes = 0;
    uint64_t extra_device_bytes = 0;  // beyond the native upload
};

// Uploads `w` (quantized) to `device` with the requested forms, packing on the host.
std::shared_ptr<DeviceWeight> pack_weight(const Linear &w, int32_t device, void *stream, const PackForms &forms,
                                          PackOutcome *outcome);

size_t quant_gemm_workspace_size(const DeviceWeight &dw, int64_t m);
// cublas_handle: a cuBLAS handle the caller owns and uses from one thread at a time (cublasHandle_t), or nullptr
// for one borrowed from the library's pool for this call. Callers that capture CUDA graphs pass their own: a
// captured cuBLAS GEMM keeps using its handle's workspace at every replay, so that handle must not serve anyone
// else concurrently.
// dtype: the type of x and y. The FP16 body and the correction form take FP16 alone; a BF16 call skips them.
// dequantized: dw's FP16 form [N][K] (dequantize_weight) that the caller keeps for several calls, or nullptr; with it
// an FP16 call runs cuBLAS on it instead of any other path (falling through to them only if cuBLAS refuses).
void quant_gemm(const DeviceWeight &dw, const void *x, void *y, int64_t m, Dtype dtype, void *stream, void *workspace,
                size_t workspace_bytes, void *cublas_handle = nullptr, const uint16_t *dequantized = nullptr);
// Whether quant_gemm, for m rows under the current settings, would dequantize dw to FP16 and call cuBLAS: then a
// caller running dw many times at that M can dequantize it once (dequantize_weight) and pass the result.
bool dequant_cublas_wanted(const DeviceWeight &dw, int64_t m);
// dw as FP16 [N][K] (its stored K order) into dst (device memory of dequantized_bytes(dw)), enqueued on `stream`.
size_t dequantized_bytes(const DeviceWeight &dw);
void dequantize_weight(const DeviceWeight &dw, uint16_t *dst, void *stream);
DispatchCounts dispatch_counts(const DeviceWeight &dw);

// Device memory and streams for the C API's callers (throw TL_ERR_NO_DEVICE / TL_ERR_CUDA / TL_ERR_INVALID_ARGUMENT).
void *device_malloc(int32_t device, size_t bytes);
void device_free(void *ptr, void *stream);
void memcpy_any(void *dst, const void *src, size_t bytes, void *stream);
void memset_device(void *dst, int32_t value, size_t bytes, void *stream);
void *stream_create(int32_t device);
void stream_destroy(void *stream);
void stream_synchronize(void *stream);

// The dispatcher settings: process-wide, initialised from the environment (TINYLOOP_USE_MARLIN, ...). capi/ translates
// the C API's TL_DISPATCH_* values into these; the numbers are the same, so a message names a setting by the number
// the caller passed.
enum class DispatchSetting : int32_t {
    UseMarlin = 0,
    Fp16Body = 1,
    CrossIterRound = 2,
    MarlinMode = 3,
    CublasMinM = 4,
};
constexpr int32_t kDispatchSettings = 5;
// TL_ERR_INVALID_ARGUMENT for a value out of the setting's range (MarlinMode 0-2, CublasMinM >= 0, the others 0 or 1).
void set_dispatch(DispatchSetting setting, int32_t value);
int32_t get_dispatch(DispatchSetting setting);

}  // namespace tl
