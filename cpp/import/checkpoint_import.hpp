// Conversion of a Hugging Face-style checkpoint folder into a .tinyloop model: config.json (a Llama, Mistral or Qwen2
// config, or a looped model's with num_pre_layers / num_loops), optionally AutoGPTQ's quantize_config.json, and
// model.safetensors or a sharded model.safetensors.index.json, with dense linears or GPTQ v1 / AWQ GEMM INT4 ones
// (docs/import.md).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "format/model.hpp"

namespace tl {

struct CheckpointImportOptions {
    int32_t max_seq = 0;          // the .tinyloop max_seq; 0 = config.json's max_position_embeddings
    bool use_mmap = true;         // map the .safetensors files (false: read each one into memory)
    bool validate_values = true;  // NaN/Inf scan of the embedding, norms and dense linears (scales: always)
};

// Reads the checkpoint in `dir` into a Model. The embedding and the dense linears other than q|k|v are views into
// the mapped files (kept alive by the model's keepalive, copied only when a file leaves a tensor misaligned), so a
// multi-GB checkpoint is read once, when the model is written. q|k|v become one attn_qkv (rows concatenated; K/V heads
// stored once each, n_kv_heads, for grouped-query attention); quantized linears go through import_int4. Throws
// tl::Error:
//   TL_ERR_IO           a file cannot be opened or read (no model.safetensors, a missing shard, ...);
//   TL_ERR_FORMAT       a missing or mistyped config field or tensor, a wrong shape or dtype, an unexpected tensor,
//                       a non-finite value, a tied head that differs from the embedding;
//   TL_ERR_UNSUPPORTED  a well-formed checkpoint this library cannot represent (bits != 4, rope_scaling, biases,
//                       an activation other than SiLU, another family (Gemma, ...), sliding-window attention narrower
//                       than max_seq, a config field it does not know, another quantization method or packing).
// A plain config (no num_pre_layers / num_loops) has its last layer looped once, or its repeated last layers stored
// once as the looped block.
// Messages name the file and the config field or tensor.
std::unique_ptr<Model> import_checkpoint(const std::string &dir, const CheckpointImportOptions &options);

// import_checkpoint, then save_model(out_path) (atomic; dense linears stay dense, `tinyloop quantize` makes them
// INT4). TL_ERR_IO also for the output.
void import_checkpoint_to_file(const std::string &dir, const std::string &out_path,
                               const CheckpointImportOptions &options);

}  // namespace tl
