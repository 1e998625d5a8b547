// The structs behind the C API's opaque handles tl_model and tl_weight, shared by the C API's sources (capi/src/*.cpp);
// the layers below see only what the structs hold (tl::Model, tl::Linear, tl::DeviceWeight, tl::GpuModel).
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "gpu/device_weight.hpp"
#include "gpu/gpu_model.hpp"
#include "format/model.hpp"
#include "score/dispatch_settings.hpp"

struct tl_weight {
    tl::Linear linear;  // views share ownership of their storage through linear.keepalive
    bool borrowed = false;
    // The weight's device forms once packed (tl_pack_marlin / tl_weight_pack_marlin); null before.
    std::shared_ptr<tl::DeviceWeight> device;
    // An owned weight's dispatcher settings; a borrowed weight uses its model's (`dispatch` points at them).
    tl::DispatchOverrides own_dispatch;
    const tl::DispatchOverrides *dispatch = &own_dispatch;
};

struct tl_model {
    std::unique_ptr<tl::Model> model;
    tl::DispatchOverrides dispatch;  // for its scoring and its weights' GEMMs
    std::vector<std::unique_ptr<tl_weight>> weights;  // the quantized linears, canonical order
    std::map<std::string, size_t> weight_index;
    // The model on each device tl_score's CUDA backend used, created on first use (under gpu_mutex). A GpuModel
    // serializes its own calls, and points at `model` (declared above, so destroyed after these): it builds its
    // forms for INT8 activations from it on the first call that asks for them.
    mutable std::mutex gpu_mutex;
    mutable std::map<int32_t, std::unique_ptr<tl::GpuModel>> gpu_models;
};
