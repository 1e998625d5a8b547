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

// The newest format_version this library reads and writes. A file is written with the oldest version that describes
// it (required_format_version), so that a model without version 2's features stays readable by version-1 readers.
//   1: the first version.
//   2: adds linear biases (<name>.bias), the config's rope_scaling, which a version-1 reader would not apply, and
//      n_kv_heads (grouped-query attention: attn_qkv's K/V heads stored once each, not once per query head).
constexpr int32_t kFormatVersion = 2;

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
// no temporary behind. A writer holds its temporary locked (flock); one killed midway leaves it behind unlocked, and
// the next write to the same path removes every such `.NAME.XXXXXX` that no live writer holds. Throws TL_ERR_IO.
void write_safetensors(const std::string &path, const std::map<std::string, std::string> &metadata,
                       const std::vector<TensorView> &tensors);

// One tensor of a safetensors file read by read_safetensors: a view into the file's bytes, which need not be aligned
// for the dtype (other writers do not align tensors): copy before a typed read, or read through memcpy.
struct SafetensorsTensor {
    std::string name;
    DType dtype = DType::U8;
    std::vector<int64_t> shape;
    const uint8_t *data = nullptr;
    uint64_t bytes = 0;  // dtype_size(dtype) * prod(shape), checked against the file
};

// Any safetensors file (another writer's checkpoint, for importers), with the loader's checks of the byte layout:
// header length and JSON, __metadata__ strings (optional here), dtypes among DType's five, shapes, data_offsets
// within the data section, no overlaps. No tensor names or values are checked. The bytes stay mapped (use_mmap)
// or read into one buffer as long as `keepalive` lives, so a multi-GB checkpoint is never copied whole.
struct SafetensorsFile {
    std::string path;
    std::map<std::string, std::string> metadata;  // empty when the file has no __metadata__
    std::map<std::string, SafetensorsTensor> tensors;
    std::shared_ptr<const void> keepalive;
};

// Throws TL_ERR_IO (open/map/read, not a regular file) or TL_ERR_FORMAT; messages start with the path.
SafetensorsFile read_safetensors(const std::string &path, bool use_mmap = true);

// Index of the first NaN/Inf among `count` F16/BF16/F32 values at `data` (any alignment), or `count`.
size_t first_nonfinite(DType dtype, const void *data, size_t count);

// The format_version a file of `model` needs: 2 when it uses a feature version 1 lacks (a bias, rope_scaling,
// n_kv_heads below n_heads), else 1.
int32_t required_format_version(const Model &model);

// Serializes a model with the documented tensor names (quantized or dense linears, tied or separate head), as the
// format_version required_format_version gives.
void save_model(const std::string &path, const Model &model);

// Gives `model` a tokenizer (null or byte-level: none, the model reads bytes), which save_model then stores. Throws
// TL_ERR_FORMAT when the tokenizer has ids outside the model's vocabulary [0, config.vocab).
void set_tokenizer(Model &model, std::shared_ptr<const text::Tokenizer> tokenizer);

// The config as the JSON text stored in __metadata__["config"], and back (throws TL_ERR_FORMAT).
std::string config_to_json(const ModelConfig &config);
ModelConfig config_from_json(const std::string &text);

// Sanity limits checked on every config (TL_ERR_FORMAT with the field name when violated).
void validate_config(const ModelConfig &config);

}  // namespace tl
