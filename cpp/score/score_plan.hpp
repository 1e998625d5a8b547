// What both scoring backends share: the request's options and result, the plan of windows a request is split into,
// the model checks run before any pointer is followed, and the working-memory budget.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "format/model.hpp"
#include "score/dispatch_settings.hpp"

namespace tl {

// The precision of the transformer blocks' linear-layer inputs (docs/quality.md, "Activation precision"): as computed
// (FP32 on the CPU, FP16 on the GPU), or quantized per token to INT8 or FP8 e4m3 with integer / exact group sums.
// The values are the C API's TL_ACTIVATIONS_*.
enum class ActivationMode : int32_t { Fp16 = 0, Int8 = 1, Fp8 = 2 };

// "fp16", "int8", "fp8".
const char *activation_mode_name(ActivationMode mode);

struct ScoreOptions {
    int32_t n_threads = 0;  // 0 = hardware concurrency
    int32_t window = 0;     // 0 = max_seq; windows overlap by one token
    // Called with (tokens done, total); returning false cancels (TL_ERR_CANCELLED).
    std::function<bool(uint64_t, uint64_t)> progress;
    float *token_nll = nullptr;  // optional [n_tokens - 1]
    // Optional top-k log-probabilities (1 <= top_k <= kMaxTopK, score/compare.hpp; 0 = none): position i's k most
    // likely tokens, most likely first, at top_ids[i * top_k ..] and their log-probabilities at top_logprobs[i *
    // top_k ..], laid out per position as token_nll (both arrays must be set when top_k > 0).
    int32_t top_k = 0;
    int32_t *top_ids = nullptr;
    float *top_logprobs = nullptr;
    // The activation precision of the blocks' linears (the head's input is never quantized). Only the CPU backend
    // implements INT8 and FP8; the CUDA backend declines them (TL_ERR_UNSUPPORTED).
    ActivationMode activations = ActivationMode::Fp16;
    // The dispatcher settings of the call's model: on the CUDA backend its GEMM paths and attention kernel; on both,
    // CrossIterRound (cross_iter_round()).
    DispatchSettings dispatch = default_dispatch_settings();
    // Cross-iteration rounding: the looped block's linears that carry frac4 or sign_bit channels use different codes
    // on each loop iteration (cross_iter.hpp, docs/quality.md).
    bool cross_iter_round() const { return dispatch[DispatchSetting::CrossIterRound] != 0; }
    // Optional: called on the calling thread with each linear layer's input x [rows][w.k] just before the layer
    // runs, the looped block's linears once per loop iteration and the head with the rows it scores. For
    // collecting calibration activations.
    std::function<void(const Linear &w, const float *x, int32_t rows)> linear_input;
    // The most bytes of working memory (activations, scratch, logits; not the weights) the call may use: host memory
    // on the CPU, device memory on the GPU. 0 = no budget beyond the machine's. Past it: TL_ERR_OUT_OF_MEMORY, before
    // anything is allocated, naming the size needed.
    uint64_t max_memory_bytes = 0;
    // CUDA backend: capture each pass shape's forward pass in a CUDA graph and replay it (score_cuda).
    bool use_graphs = false;
    // CUDA backend: the most tokens one forward pass packs (windows or sequences), raised to the longest one; 0 = the
    // default (gpu_model.cpp, kPassTokens).
    int32_t pass_tokens = 0;
};

struct ScoreResult {
    double nll_sum = 0.0;
    uint64_t tokens_scored = 0;
    int32_t n_windows = 0;
};

// The windows a score request is split into, after checking it (shared by the CPU and GPU backends):
// tokens non-NULL, n >= 2, each token in [0, vocab) (TL_ERR_INVALID_ARGUMENT naming the index), window 0 or in
// [2, max_seq].
struct ScorePlan {
    int32_t window;    // window length L (max_seq when the request says 0)
    size_t n_windows;  // windows of L tokens overlapping by one
};
ScorePlan plan_score(const ModelConfig &config, const int32_t *tokens, size_t n_tokens, int32_t window);

// One independent sequence of a batch request: tokens[0, n_tokens), of which the first max(n_context, 1) are context
// only; each later token is scored given every token before it in the sequence.
struct Sequence {
    const int32_t *tokens = nullptr;
    size_t n_tokens = 0;
    size_t n_context = 0;
    size_t first_scored() const { return n_context > 0 ? n_context : 1; }
};

// A sequence's result: the NLL sum and count of its scored tokens, and whether each scored token is the argmax of
// its prediction (ties count as greedy).
struct SequenceScore {
    double nll_sum = 0.0;
    uint64_t tokens_scored = 0;
    bool greedy = true;
};

// Checks a batch request (shared by both backends): sequences non-NULL when n > 0; per sequence tokens non-NULL,
// 2 <= n_tokens <= max_seq, n_context < n_tokens, each token in [0, vocab); options.window 0. TL_ERR_INVALID_ARGUMENT
// naming the sequence (and token index). Returns the sum of n_tokens - 1 (token_nll's length).
size_t check_sequences(const ModelConfig &config, const Sequence *sequences, size_t n_sequences, int32_t window);

// The shape checks of a Model shared by the CPU and GPU backends, run before any pointer is followed (a Model may
// be assembled by hand); the caller checks the config's own dimensions first. TL_ERR_INVALID_ARGUMENT when the
// embedding is NULL or the final norm or the number of pre blocks does not match the config, when a block's norm
// gains are not [d_model], or when a linear is not [K, N] ("model: loop.mlp_up is [K=.., N=..], expected [...]").
// Each linear that has its shape is then passed to `check_storage` with its name ("pre.0.attn_qkv", "loop.mlp_up",
// "head"), which fails when the backend cannot use its storage.
void check_model_shapes(const Model &model, void (*check_storage)(const Linear &w, const std::string &name));

// Checks a Model's config (positive dimensions, an even head_dim) and then its shapes (check_model_shapes): what both
// backends need before they follow any pointer. `check_storage` is the backend's test of one linear's storage.
void check_model(const Model &model, void (*check_storage)(const Linear &w, const std::string &name));

// Fails with TL_ERR_OUT_OF_MEMORY when `needed` exceeds `budget` (or, with no budget, `machine`); `what` names the
// memory ("host memory", "device memory").
void check_memory_budget(uint64_t needed, uint64_t budget, uint64_t machine, const char *what);
// Bytes of physical memory of this machine (UINT64_MAX when the system does not say).
uint64_t host_memory_bytes();

}  // namespace tl
