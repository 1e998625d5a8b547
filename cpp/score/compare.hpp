// What both backends share for comparing two models on one text and for top-k log-probabilities: the per-position
// reductions of two logits rows (KL divergence, both NLLs, whether the argmaxes agree) and of one row (its k most
// likely tokens), done by the CPU backend in double and mirrored by the CUDA kernels (cuda/forward/compare.cu), and
// the summary statistics of a comparison, computed on the host from one value per scored position.
#pragma once

#include <cstddef>
#include <cstdint>

#include "format/model.hpp"
#include "score/score_plan.hpp"

namespace tl {

// The most top-k log-probabilities a call may ask for per position: enough for every evaluation harness we know of
// (OpenAI-style logprobs stop at 20), and small enough to keep one row's candidates in registers on the GPU.
constexpr int32_t kMaxTopK = 20;

// Where a comparison writes its per-position values, each [n_tokens - 1] (position i predicts token i + 1).
struct CompareOutputs {
    float *kl = nullptr;        // KL(P_reference || P_test), nats
    float *nll_reference = nullptr;
    float *nll_test = nullptr;
    uint8_t *top1_match = nullptr;  // 1 when both argmaxes are the same token (the lowest index among ties)
};

// One position of a comparison.
struct CompareRow {
    double kl = 0.0, nll_reference = 0.0, nll_test = 0.0;
    bool top1_match = false;
};

// Compares two logits rows of `vocab` values, the target being the token predicted there. Computed in double:
// KL = sum_v p_ref(v) (l_ref(v) - l_test(v)) - lse_ref + lse_test, which is exactly 0 for identical rows.
CompareRow compare_row(const float *reference, const float *test, int32_t vocab, int32_t target);

// The k most likely tokens of a logits row (by logit, descending; ties by lower id) and their log-probabilities
// l(v) - logsumexp(l), into ids[0, k) and logprobs[0, k). 1 <= k <= min(kMaxTopK, vocab).
void top_k_row(const float *logits, int32_t vocab, int32_t k, double logsumexp, int32_t *ids, float *logprobs);

// The checks of a comparison's two models: the same vocabulary size and the same tokenizer kind
// (TL_ERR_INVALID_ARGUMENT naming both otherwise).
void check_same_vocabulary(const Model &reference, const Model &test);

// The windows of a comparison: plan_score's checks and windows with the shorter max_seq of the two models (their
// vocabularies are the same, check_same_vocabulary).
ScorePlan plan_compare(const ModelConfig &reference, const ModelConfig &test, const int32_t *tokens, size_t n_tokens,
                       int32_t window);

// The summary of a comparison over n positions.
struct CompareStats {
    uint64_t n = 0;
    double kl_mean = 0, kl_stderr = 0;  // stderr: sample standard deviation / sqrt(n); NaN below 2 positions
    double kl_median = 0, kl_p90 = 0, kl_p99 = 0, kl_p999 = 0, kl_max = 0, kl_min = 0;
    double top1_agreement = 0;  // fraction of positions whose argmaxes agree
    double nll_sum_reference = 0, nll_sum_test = 0;
    double nll_correlation = 0;  // Pearson's r of the two models' per-position NLLs; NaN when either is constant
};

// Percentiles are exact order statistics of the per-position values, interpolated linearly between the two nearest
// ranks (numpy's default, and llama-perplexity's). Sorts a copy of `kl` (4 bytes a position).
CompareStats summarize_comparison(const float *kl, const float *nll_reference, const float *nll_test,
                                  const uint8_t *top1_match, size_t n);

}  // namespace tl
