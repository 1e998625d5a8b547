// A weight's device forms (DeviceWeight): pack_weight uploads an INT4 weight to a device in the forms the dispatcher's
// paths read (gemm_dispatch.hpp), packing the Marlin-class tiles on the host (marlin_pack.hpp). Compiled in every
// build; in a build without CUDA these throw TL_ERR_NO_DEVICE.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "format/model.hpp"

namespace tl {

// A weight's device forms and its per-path call counters. Opaque outside cpp/gpu (device_weight_layout.hpp).
struct DeviceWeight;

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

// dw as FP16 [N][K] (its stored K order) into dst (device memory of dequantized_bytes(dw)), enqueued on `stream`.
size_t dequantized_bytes(const DeviceWeight &dw);
void dequantize_weight(const DeviceWeight &dw, uint16_t *dst, void *stream);

// Cross-iteration rounding on the device: uploads the frac4 / sign_bit channels of the weight dw was packed from
// (`first`, or `first` and `second` when dw holds their rows one after the other, as gate|up does), which must carry
// the same kinds of channel. Then dequantize_weight_iteration writes dw as FP16 with the codes of one iteration of
// `loops` (cpp/quant/cross_iter.hpp's rule, computed as the codes are dequantized).
// Returns the device bytes the channels take.
uint64_t attach_rounding_channels(DeviceWeight &dw, const Linear &first, const Linear *second, void *stream);
bool has_rounding_channels(const DeviceWeight &dw);
void dequantize_weight_iteration(const DeviceWeight &dw, int32_t iteration, int32_t loops, uint16_t *dst,
                                 void *stream);

}  // namespace tl
