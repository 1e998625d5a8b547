// The C API's GPU functions: devices, packing weights onto one, the quantized GEMM and its dispatcher settings,
// device memory and streams.
#include "tinyloop.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "barrier.hpp"
#include "gpu/device.hpp"
#include "gpu/device_weight.hpp"
#include "gpu/gemm_dispatch.hpp"
#include "handles.hpp"
#include "util/log.hpp"

using namespace tl::capi;

namespace {

// The device forms of TL_FORM_* flags (checked by pack_options_or_defaults).
tl::PackForms pack_forms(uint32_t forms) {
    tl::PackForms f;
    f.marlin_fused = (forms & TL_FORM_MARLIN_FUSED) != 0;
    f.marlin_correction = (forms & TL_FORM_MARLIN_CORRECTION) != 0;
    f.fp16_body = (forms & TL_FORM_FP16_BODY) != 0;
    return f;
}

// The dispatcher setting a TL_DISPATCH_* value names; TL_ERR_INVALID_ARGUMENT for any other value.
tl::DispatchSetting dispatch_setting(int32_t setting) {
    switch (setting) {
        case TL_DISPATCH_USE_MARLIN: return tl::DispatchSetting::UseMarlin;
        case TL_DISPATCH_FP16_BODY: return tl::DispatchSetting::Fp16Body;
        case TL_DISPATCH_CROSS_ITER_ROUND: return tl::DispatchSetting::CrossIterRound;
        case TL_DISPATCH_MARLIN_MODE: return tl::DispatchSetting::MarlinMode;
        case TL_DISPATCH_CUBLAS_MIN_M: return tl::DispatchSetting::CublasMinM;
        case TL_DISPATCH_ATTENTION: return tl::DispatchSetting::Attention;
        default:
            tl::fail(TL_ERR_INVALID_ARGUMENT, "setting " + std::to_string(setting) + " is not a TL_DISPATCH_* value");
    }
}

tl_pack_options pack_options_or_defaults(const tl_pack_options *options) {
    const tl_pack_options opts = read_input_struct(options, "options", tl_pack_options_init, true);
    const uint32_t known = TL_FORM_MARLIN_FUSED | TL_FORM_MARLIN_CORRECTION | TL_FORM_FP16_BODY;
    require((opts.forms & ~known) == 0, "options->forms has unknown bits: " + std::to_string(opts.forms & ~known));
    return opts;
}

// Packs `weights` all-or-nothing: the new device forms replace the old ones only once every weight succeeded.
void pack_weights(const std::vector<tl_weight *> &weights, const tl_pack_options &opts, tl_pack_report *out_report) {
    if (out_report != nullptr) require_output_struct(out_report, "out_report");
    tl_pack_report report;
    tl_pack_report_init(&report, sizeof report);
    std::vector<std::shared_ptr<tl::DeviceWeight>> packed;
    const tl::PackForms forms = pack_forms(opts.forms);
    for (const tl_weight *w : weights) {
        tl::PackOutcome outcome;
        packed.push_back(tl::pack_weight(w->linear, opts.device, opts.stream, forms, &outcome));
        ++report.weights_uploaded;
        report.weights_packed += outcome.packed;
        report.weights_not_packable += !outcome.packable;
        report.device_bytes += outcome.device_bytes;
        report.extra_device_bytes += outcome.extra_device_bytes;
    }
    for (size_t i = 0; i < weights.size(); ++i) weights[i]->device = std::move(packed[i]);
    tl::log(TL_LOG_INFO, "[pack] " + std::to_string(report.weights_packed) + " of " +
                             std::to_string(report.weights_uploaded) + " weights packed for the Marlin-class kernel, " +
                             std::to_string(report.extra_device_bytes) + " extra device bytes");
    if (out_report != nullptr) write_output_struct(out_report, report);
}

const tl::DeviceWeight &packed_weight(const tl_weight *weight) {
    require_not_null(weight, "weight");
    if (weight->linear.bits == 8) {
        tl::fail(TL_ERR_UNSUPPORTED, "weight '" + weight->linear.name + "' is INT8: tl_quant_gemm runs INT4 weights; "
                                     "INT8 ones run on the GPU inside a model's scoring (as dense FP16)");
    }
    if (!weight->device) {
        if (tl::device_count() == 0) tl::fail(TL_ERR_NO_DEVICE, "no usable CUDA device (or no CUDA in this build)");
        tl::fail(TL_ERR_INVALID_ARGUMENT, "weight '" + weight->linear.name +
                                              "' is not on a device: call tl_pack_marlin / tl_weight_pack_marlin first");
    }
    return *weight->device;
}

}  // namespace

extern "C" {

TL_API tl_status tl_device_count(int32_t *out_count) {
    return guarded([&] {
        require_not_null(out_count, "out_count");
        *out_count = tl::device_count();
    });
}

TL_API tl_status tl_device_info(int32_t device, tl_device_properties *out) {
    return guarded([&] {
        require_output_struct(out, "out");
        const tl::DeviceProperties d = tl::device_info(device);
        tl_device_properties p;
        std::memset(&p, 0, sizeof p);
        std::memcpy(p.name, d.name.data(), std::min(sizeof p.name - 1, d.name.size()));
        p.sm_major = d.sm_major;
        p.sm_minor = d.sm_minor;
        p.sm_count = d.sm_count;
        p.total_memory = d.total_memory;
        p.free_memory = d.free_memory;
        p.marlin_supported = d.marlin_supported;
        write_output_struct(out, p);
    });
}

TL_API tl_status tl_pack_options_init(tl_pack_options *options, uint32_t struct_size) {
    return init_struct(options, struct_size, "options",
                       [](tl_pack_options &o) { o.forms = TL_FORM_MARLIN_FUSED | TL_FORM_MARLIN_CORRECTION; });
}

TL_API tl_status tl_pack_report_init(tl_pack_report *report, uint32_t struct_size) {
    return init_struct(report, struct_size, "report", [](tl_pack_report &) {});
}

TL_API tl_status tl_pack_marlin(tl_model *model, const tl_pack_options *options, tl_pack_report *out_report) {
    return guarded([&] {
        require_not_null(model, "model");
        const tl_pack_options opts = pack_options_or_defaults(options);
        std::vector<tl_weight *> weights;
        for (auto &w : model->weights) {
            if (w->linear.bits == 4) weights.push_back(w.get());  // INT8 weights have no device form of their own
        }
        pack_weights(weights, opts, out_report);
    });
}

TL_API tl_status tl_weight_pack_marlin(tl_weight *weight, const tl_pack_options *options,
                                       tl_pack_report *out_report) {
    return guarded([&] {
        require_not_null(weight, "weight");
        require(!weight->borrowed, "weight '" + weight->linear.name +
                                       "' belongs to a model: pack the model with tl_pack_marlin instead");
        pack_weights({weight}, pack_options_or_defaults(options), out_report);
    });
}

TL_API tl_status tl_set_dispatch(int32_t setting, int32_t value) {
    return guarded([&] { tl::set_dispatch(dispatch_setting(setting), value); });
}

TL_API tl_status tl_get_dispatch(int32_t setting, int32_t *out_value) {
    return guarded([&] {
        require_not_null(out_value, "out_value");
        *out_value = tl::get_dispatch(dispatch_setting(setting));
    });
}

TL_API tl_status tl_model_set_dispatch(tl_model *model, int32_t setting, int32_t value) {
    return guarded([&] {
        require_not_null(model, "model");
        model->dispatch.set(dispatch_setting(setting), value);
    });
}

TL_API tl_status tl_model_get_dispatch(const tl_model *model, int32_t setting, int32_t *out_value) {
    return guarded([&] {
        require_not_null(model, "model");
        require_not_null(out_value, "out_value");
        *out_value = model->dispatch.get(dispatch_setting(setting));
    });
}

TL_API tl_status tl_weight_set_dispatch(tl_weight *weight, int32_t setting, int32_t value) {
    return guarded([&] {
        require_not_null(weight, "weight");
        require(!weight->borrowed, "weight '" + weight->linear.name +
                                       "' belongs to a model: set the model's settings with tl_model_set_dispatch");
        weight->own_dispatch.set(dispatch_setting(setting), value);
    });
}

TL_API tl_status tl_weight_get_dispatch(const tl_weight *weight, int32_t setting, int32_t *out_value) {
    return guarded([&] {
        require_not_null(weight, "weight");
        require_not_null(out_value, "out_value");
        *out_value = weight->dispatch->get(dispatch_setting(setting));
    });
}

TL_API tl_status tl_device_malloc(int32_t device, size_t bytes, void **out_ptr) {
    return guarded([&] {
        require_not_null(out_ptr, "out_ptr");
        *out_ptr = tl::device_malloc(device, bytes);
    });
}

TL_API tl_status tl_device_free(void *ptr, void *stream) {
    return guarded([&] { tl::device_free(ptr, stream); });
}

TL_API tl_status tl_memcpy(void *dst, const void *src, size_t bytes, void *stream) {
    return guarded([&] { tl::memcpy_any(dst, src, bytes, stream); });
}

TL_API tl_status tl_memset_device(void *dst, int32_t value, size_t bytes, void *stream) {
    return guarded([&] { tl::memset_device(dst, value, bytes, stream); });
}

TL_API tl_status tl_stream_create(int32_t device, void **out_stream) {
    return guarded([&] {
        require_not_null(out_stream, "out_stream");
        *out_stream = tl::stream_create(device);
    });
}

TL_API tl_status tl_stream_destroy(void *stream) {
    return guarded([&] { tl::stream_destroy(stream); });
}

TL_API tl_status tl_stream_synchronize(void *stream) {
    return guarded([&] { tl::stream_synchronize(stream); });
}

TL_API tl_status tl_quant_gemm_workspace_size(const tl_weight *weight, int64_t m, size_t *out_bytes) {
    return guarded([&] {
        require_not_null(out_bytes, "out_bytes");
        const tl::DeviceWeight &dw = packed_weight(weight);
        *out_bytes = tl::quant_gemm_workspace_size(dw, m, weight->dispatch->resolve());
    });
}

TL_API tl_status tl_quant_gemm(const tl_weight *weight, const void *x, void *y, int64_t m, void *stream,
                               void *workspace, size_t workspace_bytes) {
    return tl_quant_gemm_dtype(weight, TL_DTYPE_FP16, x, y, m, stream, workspace, workspace_bytes);
}

TL_API tl_status tl_quant_gemm_dtype(const tl_weight *weight, int32_t dtype, const void *x, void *y, int64_t m,
                                     void *stream, void *workspace, size_t workspace_bytes) {
    return guarded([&] {
        // Checked here, not cast blindly: an out-of-range value must not become an enum value the backend assumes.
        if (dtype != TL_DTYPE_FP16 && dtype != TL_DTYPE_BF16) {
            tl::fail(TL_ERR_INVALID_ARGUMENT,
                     "dtype must be TL_DTYPE_FP16 (0) or TL_DTYPE_BF16 (1), got " + std::to_string(dtype));
        }
        const tl::DeviceWeight &dw = packed_weight(weight);
        tl::quant_gemm(dw, x, y, m, dtype == TL_DTYPE_BF16 ? tl::Dtype::BF16 : tl::Dtype::F16,
                       weight->dispatch->resolve(), stream, workspace, workspace_bytes);
    });
}

TL_API tl_status tl_weight_dispatch_counts(const tl_weight *weight, tl_dispatch_counts *out) {
    return guarded([&] {
        require_output_struct(out, "out");
        const tl::DispatchCounts d = tl::dispatch_counts(packed_weight(weight));
        tl_dispatch_counts c;
        std::memset(&c, 0, sizeof c);
        c.fp16_body = d.fp16_body;
        c.marlin_fused = d.marlin_fused;
        c.marlin_correction = d.marlin_correction;
        c.dequant_cublas = d.dequant_cublas;
        c.native = d.native;
        c.fallbacks = d.fallbacks;
        write_output_struct(out, c);
    });
}

}  // extern "C"
