// The .tinyloop file format: a safetensors file whose __metadata__ carries the model config
// (docs/format.md). Loading validates everything before any tensor is used; writing is used by the CLI's
// quantize/make-model commands and by tests.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "format/model.hpp"

namespace tl {

constexpr int32_t kFormatVersion = 1;

struct LoadOptions {
    bool use_mmap = true;
    bool validate_values = true;  // NaN/Inf scan of scales, zeros, norms, embedding, dense weights
};

// Loads and validates a .tinyloop file. Throws tl::Error: TL_ERR_IO (open/map/read, or not a regular file: a FIFO is
// refused at once, not waited on) or TL_ERR_FORMAT (message names the tensor and the problem).
std::unique_ptr<Model> load_model(const std::string &path, const LoadOptions &options);

// One tensor to write: `data` holds `dtype_size(dtype) * prod(shape)` bytes.
struct TensorView {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    const void *data;
};

// Writes a safetensors file (wider dtypes first so every tensor is aligned, no holes) atomically: to a new, uniquely
// named temporary file next to `path` (`.NAME.XXXXXX`, created exclusively), synced, renamed over `path`, then the
// directory synced. Concurrent writers of one path each publish a whole file; a failure leaves `path` as it was and
// no temporary behind. Throws TL_ERR_IO.
void write_safetensors(const std::string &path, const std::map<std::string, std::string> &metadata,
                       const std::vector<TensorView> &tensors);

// Serializes a model with the documented tensor names (quantized or dense linears, tied or separate head).
void save_model(const std::string &path, const Model &model);

// The config as the JSON text stored in __metadata__["config"], and back (throws TL_ERR_FORMAT).
std::string config_to_json(const ModelConfig &config);
ModelConfig config_from_json(const std::string &text);

// Sanity limits checked on every config (TL_ERR_FORMAT with the field name when violated).
void validate_config(const ModelConfig &config);

}  // namespace tl
