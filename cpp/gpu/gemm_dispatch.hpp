// The quantized-GEMM dispatcher (FP16 body -> Marlin-class (or dequantize + cuBLAS at large M) -> native INT4) over a
// weight's device forms (device_weight.hpp), under the settings a call passes (dispatch_settings.hpp). Compiled in every
// build; in a build without CUDA every function throws TL_ERR_NO_DEVICE.
#pragma once

#include <cstddef>
#include <cstdint>

#include "dtype.hpp"
#include "gpu/device_weight.hpp"
#include "score/dispatch_settings.hpp"

namespace tl {

// Calls per dispatcher path since the weight was packed; `fallbacks` counts calls in which a path refused.
struct DispatchCounts {
    uint64_t fp16_body = 0, marlin_fused = 0, marlin_correction = 0, dequant_cublas = 0, native = 0, fallbacks = 0;
};

// Every call takes the dispatcher settings it runs under (resolved from its handle: dispatch_settings.hpp).
size_t quant_gemm_workspace_size(const DeviceWeight &dw, int64_t m, const DispatchSettings &settings);
// cublas_handle: a cuBLAS handle the caller owns and uses from one thread at a time (cublasHandle_t), or nullptr
// for one borrowed from the library's pool for this call. Callers that capture CUDA graphs pass their own: a
// captured cuBLAS GEMM keeps using its handle's workspace at every replay, so that handle must not serve anyone
// else concurrently.
// dtype: the type of x and y. The FP16 body and the correction form take FP16 alone; a BF16 call skips them.
// dequantized: dw's FP16 form [N][K] (dequantize_weight) that the caller keeps for several calls, or nullptr; with it
// an FP16 call runs cuBLAS on it instead of any other path (falling through to them only if cuBLAS refuses, unless
// dequantized_only: the form differs from dw's codes, as an iteration's weight under cross-iteration rounding does,
// and the call fails instead).
void quant_gemm(const DeviceWeight &dw, const void *x, void *y, int64_t m, Dtype dtype, const DispatchSettings &settings,
                void *stream, void *workspace, size_t workspace_bytes, void *cublas_handle = nullptr,
                const uint16_t *dequantized = nullptr, bool dequantized_only = false);
// The workspace quant_gemm needs at m rows with a `dequantized` form: the input as dw reads it, the padded output and
// cuBLAS's workspace.
size_t dequantized_gemm_workspace_size(const DeviceWeight &dw, int64_t m);
// Whether quant_gemm, for m rows under `settings`, would dequantize dw to FP16 and call cuBLAS: then a
// caller running dw many times at that M can dequantize it once (dequantize_weight) and pass the result.
bool dequant_cublas_wanted(const DeviceWeight &dw, int64_t m, const DispatchSettings &settings);
DispatchCounts dispatch_counts(const DeviceWeight &dw);


}  // namespace tl
