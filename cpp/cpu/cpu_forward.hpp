// The CPU reference backend: exact dequantization, FP32 activations and accumulation, NLL in double.
// It is the ground truth every GPU path is compared with.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "format/model.hpp"
#include "score/compare.hpp"
#include "score/score_plan.hpp"

namespace tl {

// Bytes of host working memory score_cpu needs for windows of `rows` tokens on `workers` threads.
// Makes the CPU backend use its portable matrix kernel instead of the widest one this CPU runs (AVX2), so that a
// test can check both on one machine. Process-wide; for tests and benchmarks, not a setting of the API.
void use_portable_cpu_kernel(bool portable);

// `activations`: the blocks' linears' input precision (quantized activations need their own scratch).
uint64_t cpu_score_bytes(const Model &model, int32_t rows, int32_t workers, bool cross_iter_round,
                         ActivationMode activations = ActivationMode::Fp16);
// Validates tokens (each in [0, vocab), n >= 2; TL_ERR_INVALID_ARGUMENT naming the index) and scores them.
ScoreResult score_cpu(const Model &model, const int32_t *tokens, size_t n_tokens, const ScoreOptions &options);

// The CPU twin of score_batch_cuda (gpu_forward.hpp): each sequence scored as one window, same results and token_nll
// layout; progress after each sequence.
ScoreResult score_batch_cpu(const Model &model, const Sequence *sequences, size_t n_sequences,
                            const ScoreOptions &options, SequenceScore *scores);

// Compares two models on one text (plan_compare's windows, both models on the same tokens): each predicted position's
// KL(P_reference || P_test), both NLLs and whether the argmaxes agree, into out's arrays of n_tokens - 1. Both
// models' logits exist a chunk of positions at a time (head_chunk: ~2^20 floats per worker and model), never for the
// whole text. Checks both models and that they share a vocabulary; `reference` and `test` may be the same model.
// options: n_threads, window, progress, max_memory_bytes (both models' working memory), cross_iter_round() and
// activations (the reference's; the test's are test_dispatch's CrossIterRound and test_activations, so a model may be
// compared with itself run at another activation precision); result: tokens_scored, n_windows and the reference's
// nll_sum.
ScoreResult compare_cpu(const Model &reference, const Model &test, const int32_t *tokens, size_t n_tokens,
                        const ScoreOptions &options, const DispatchSettings &test_dispatch,
                        const CompareOutputs &out, ActivationMode test_activations = ActivationMode::Fp16);

// ---- Forward pieces, exposed for the unit tests. Row-major; T = sequence length. ----

// y[t][i] = x[t][i] / sqrt(mean(x[t]^2) + eps) * gain[i]
void rmsnorm(const float *x, const float *gain, float *y, int32_t T, int32_t d, float eps);

// Rotary embedding in place on q or k laid out [T][n_heads][head_dim], rotate-half convention:
// pairs (i, i + head_dim/2) rotated by angle pos * theta^(-2i/head_dim).
void rope_inplace(float *x, int32_t T, int32_t n_heads, int32_t head_dim, float theta, int32_t pos0);

// Causal multi-head attention: qkv [T][n_heads + 2 n_kv_heads][head_dim] (q heads, then k and v heads; after RoPE
// on q and k) -> out [T][n_heads*head_dim]; query head h reads K/V head h / (n_heads / n_kv_heads). n_kv_heads 0
// means n_heads.
void causal_attention(const float *qkv, float *out, int32_t T, int32_t n_heads, int32_t head_dim, int32_t n_threads,
                      int32_t n_kv_heads = 0);

// y[m][n] = sum_k x[m][k] * W[k][n] with W from a Linear (dequantized exactly), FP32 accumulation; with activations
// INT8 or FP8, x quantized per row and the integer path of cpu/act_quant.hpp (docs/quality.md).
void linear_forward(const Linear &w, const float *x, float *y, int32_t M, int32_t n_threads,
                    ActivationMode activations = ActivationMode::Fp16);

}  // namespace tl
