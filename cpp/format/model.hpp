// The in-memory model: configuration, linear layers (quantized or dense) and blocks. Tensor data are views
// into the memory-mapped file (or into buffers owned through `keepalive`); a loaded Model is read-only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "text/tokenizer.hpp"

namespace tl {

enum class DType : uint8_t { F16, F32, BF16, U8, I32, I8 };

const char *dtype_name(DType dtype);
size_t dtype_size(DType dtype);

// RoPE's frequency scaling, as transformers' rope_scaling gives it (docs/format.md, "config"; the rotation itself:
// score/rope.hpp). The fields each type reads:
//   Linear   factor: every inverse frequency divided by it
//   Dynamic  factor, original_max_positions: dynamic NTK, which is plain RoPE for windows of at most
//            original_max_positions tokens; a config's max_seq may not exceed it (the frequencies would change)
//   Llama3   factor, low_freq_factor, high_freq_factor, original_max_positions (Llama 3.1's smoothed scaling)
//   Yarn     factor, original_max_positions, beta_fast, beta_slow, truncate, attention_factor (which multiplies
//            cos and sin, resolved from mscale / mscale_all_dim by the importer)
enum class RopeScalingType : int32_t { None = 0, Linear = 1, Dynamic = 2, Llama3 = 3, Yarn = 4 };

struct RopeScaling {
    RopeScalingType type = RopeScalingType::None;
    double factor = 1.0;
    int32_t original_max_positions = 0;
    double low_freq_factor = 1.0;
    double high_freq_factor = 4.0;
    double beta_fast = 32.0;
    double beta_slow = 1.0;
    double attention_factor = 1.0;
    bool truncate = true;
};

// "linear", "dynamic", "llama3", "yarn" (the names of the config and of transformers), "none".
const char *rope_scaling_name(RopeScalingType type);

struct ModelConfig {
    int32_t d_model = 0;
    int32_t n_heads = 0;
    // Key/value heads (grouped-query attention): query head h reads K/V head h / (n_heads / kv_heads()). 0 means
    // n_heads (one K/V head per query head, the version-1 layout).
    int32_t n_kv_heads = 0;
    int32_t head_dim = 0;
    int32_t ffn = 0;
    int32_t vocab = 0;
    int32_t pre = 0;    // unique blocks before the looped block
    int32_t loops = 0;  // applications of the looped block
    int32_t max_seq = 0;
    int32_t group_size = 0;  // 0 = per row
    // 4 or 8: the widest code width among the quantized linears (each Linear carries its own, docs/format.md).
    int32_t bits = 4;
    float rope_theta = 10000.0f;
    float norm_eps = 1e-5f;
    RopeScaling rope_scaling;  // type None: plain RoPE
    // The beginning-of-text token the checkpoint names (config.json's bos_token_id), or -1: none. Scoring never adds
    // it; the tool and the bindings put it before an empty context (score-batch, lm-eval).
    int32_t bos_token_id = -1;

    int32_t attn_dim() const { return n_heads * head_dim; }
    int32_t kv_heads() const { return n_kv_heads > 0 ? n_kv_heads : n_heads; }
    int32_t kv_dim() const { return kv_heads() * head_dim; }
    // attn_qkv's N: the queries' attn_dim, then the keys' and the values' kv_dim each.
    int32_t qkv_dim() const { return attn_dim() + 2 * kv_dim(); }
};

// Y[m, n] = sum_k X[m, k] * W[k, n]. Storage is out-major ("[N, K]", like a PyTorch Linear weight):
//   quantized, bits 4: codes [n][k/2] (low nibble = even k), scales/zeros [n][groups] FP16, W = q*s + z;
//   quantized, bits 8: codes [n][k] int8 (any value; the quantizers write [-127, 127]), scales [n][groups] FP16, no zeros, W = q*s;
//   dense:     values [n][k] in F16, BF16 or F32.
struct Linear {
    std::string name;  // e.g. "pre.0.attn_qkv", "loop.mlp_down", "head"
    int32_t k = 0;
    int32_t n = 0;
    bool quantized = false;

    // Quantized storage.
    int32_t bits = 4;
    int32_t group_size = 0;  // actual group size along K (== k for per-row)
    const uint8_t *codes = nullptr;
    const uint16_t *scales = nullptr;
    const uint16_t *zeros = nullptr;
    const uint8_t *frac4 = nullptr;     // optional [n][k/2]
    const uint8_t *sign_bit = nullptr;  // optional [n][k/8]
    // Optional [k], a permutation of [0, k) (act-order checkpoints): stored row kk of W multiplies input column
    // k_perm[kk], so Y[m, n] = sum_kk X[m, k_perm[kk]] * W_stored[kk, n]. It lets groups that an act-order quantizer
    // formed over scattered inputs be contiguous in storage.
    const int32_t *k_perm = nullptr;

    // Dense storage.
    DType dense_dtype = DType::F32;
    const void *dense = nullptr;

    // Optional [n], quantized or dense: Y[m, n] = sum_k X[m, k] * W[k, n] + bias[n] (Qwen2's q/k/v, Llama's
    // attention_bias / mlp_bias). Small, so held as F32 of its own (a file's F16 / BF16 bias converted at load).
    std::shared_ptr<const std::vector<float>> bias;

    // Keeps owned storage (or the mapped file) alive as long as this Linear is.
    std::shared_ptr<const void> keepalive;

    int32_t n_groups() const { return quantized ? k / group_size : 0; }
    // Bytes of one output column's codes: K/2 for INT4 (two per byte), K for INT8.
    size_t code_row_bytes() const { return bits == 8 ? static_cast<size_t>(k) : static_cast<size_t>(k) / 2; }
    const float *bias_values() const { return bias ? bias->data() : nullptr; }
    size_t quant_bytes() const;  // codes + scales + zeros + optional channels
};

struct Block {
    std::vector<float> attn_norm;  // [d_model]
    std::vector<float> mlp_norm;   // [d_model]
    Linear attn_qkv;  // K = d_model, N = qkv_dim(); output columns [q | k | v], head-major, k and v of kv_heads()
    Linear attn_out;  // K = n_heads * head_dim, N = d_model
    Linear mlp_gate;  // K = d_model, N = ffn
    Linear mlp_up;    // K = d_model, N = ffn
    Linear mlp_down;  // K = ffn, N = d_model

    static constexpr const char *kLinearNames[5] = {"attn_qkv", "attn_out", "mlp_gate", "mlp_up", "mlp_down"};
    Linear *linear(int i);
    const Linear *linear(int i) const;
};

enum class HeadKind : int32_t { Quantized = 1, Dense = 2, Tied = 3 };

struct Model {
    ModelConfig config;
    int32_t format_version = 1;

    // Token embedding [vocab][d_model], F16, BF16 or F32.
    DType embed_dtype = DType::F32;
    const void *embed = nullptr;

    std::vector<Block> pre;  // config.pre unique blocks
    Block loop;              // applied config.loops times
    std::vector<float> final_norm;  // [d_model]

    // Head [vocab][d_model]: quantized, dense, or tied to the embedding (then head.dense == embed).
    HeadKind head_kind = HeadKind::Tied;
    Linear head;

    // Facts about the file, for tl_model_info.
    uint64_t file_bytes = 0;
    uint64_t tensor_bytes = 0;
    uint32_t n_tensors = 0;

    std::shared_ptr<const void> keepalive;  // the mapping or the buffer the views point into

    // The tokenizer stored with the model (docs/format.md, "The tokenizer"); null: byte-level, one token per byte.
    // Its ids fit the vocabulary (set it with set_tokenizer, which checks).
    std::shared_ptr<const text::Tokenizer> tokenizer;

    // Every Linear in canonical order: pre.0.attn_qkv … pre.{P-1}.mlp_down, loop.attn_qkv … loop.mlp_down,
    // head (the head only when it is not tied).
    std::vector<const Linear *> linears() const;

    // Makes the head the embedding table itself ([K = d_model, N = vocab], the table's dtype), kept alive by
    // `storage`.
    void tie_head(std::shared_ptr<const void> storage);
};

// The first of the model's quantized linears with the widest code width (config.bits must be its width), or null
// when none is quantized.
const Linear *widest_quantized(const Model &model);

// Why `perm` ([k]) is not a permutation of [0, k) ("k_perm[5] = 9 is out of range [0, 8)", "k_perm[6] = 2 repeats
// k_perm[1]"), or "" when it is.
std::string k_perm_error(const int32_t *perm, int32_t k);

// Whether a and b permute their inputs the same way (both not at all, or the same k_perm).
bool same_k_perm(const Linear &a, const Linear &b);

// Reads element i of an F16/F32/BF16 array as float.
float load_float(DType dtype, const void *data, size_t i);

}  // namespace tl
