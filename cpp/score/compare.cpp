#include "score/compare.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "text/tokenizer.hpp"
#include "util/error.hpp"

namespace tl {

namespace {

// Max and log-sum-exp of a row, and the index of its first maximum.
struct RowNorm {
    double max = -std::numeric_limits<double>::infinity();
    int32_t argmax = 0;
    double lse = 0;
};

RowNorm row_norm(const float *l, int32_t vocab) {
    RowNorm r;
    for (int32_t v = 0; v < vocab; ++v) {
        if (l[v] > r.max) {
            r.max = l[v];
            r.argmax = v;
        }
    }
    double sum = 0;
    for (int32_t v = 0; v < vocab; ++v) sum += std::exp(static_cast<double>(l[v]) - r.max);
    r.lse = r.max + std::log(sum);
    return r;
}

// The value at fraction q of the sorted values, interpolated between the two nearest ranks.
double percentile(const std::vector<float> &sorted, double q) {
    if (sorted.empty()) return std::nan("");
    const double rank = q * static_cast<double>(sorted.size() - 1);
    const size_t lo = static_cast<size_t>(std::floor(rank)), hi = std::min(lo + 1, sorted.size() - 1);
    return sorted[lo] + (rank - static_cast<double>(lo)) * (static_cast<double>(sorted[hi]) - sorted[lo]);
}

}  // namespace

CompareRow compare_row(const float *reference, const float *test, int32_t vocab, int32_t target) {
    const RowNorm r = row_norm(reference, vocab), t = row_norm(test, vocab);
    double weighted = 0;  // sum_v e^(l_ref - lse_ref) (l_ref - l_test)
    for (int32_t v = 0; v < vocab; ++v) {
        const double diff = static_cast<double>(reference[v]) - test[v];
        if (diff != 0) weighted += std::exp(static_cast<double>(reference[v]) - r.lse) * diff;
    }
    CompareRow row;
    row.kl = weighted - r.lse + t.lse;
    row.nll_reference = r.lse - reference[target];
    row.nll_test = t.lse - test[target];
    row.top1_match = r.argmax == t.argmax;
    return row;
}

void top_k_row(const float *logits, int32_t vocab, int32_t k, double logsumexp, int32_t *ids, float *logprobs) {
    // Insertion into a sorted list of k: k <= 20, so this beats a heap or a partial sort of vocab indices.
    int32_t n = 0;
    for (int32_t v = 0; v < vocab; ++v) {
        const float l = logits[v];
        if (n == k && !(l > logits[ids[k - 1]])) continue;  // ties keep the lower id already in
        int32_t j = n < k ? n++ : k - 1;
        while (j > 0 && l > logits[ids[j - 1]]) {
            ids[j] = ids[j - 1];
            --j;
        }
        ids[j] = v;
    }
    for (int32_t j = 0; j < k; ++j) logprobs[j] = static_cast<float>(logits[ids[j]] - logsumexp);
}

void check_same_vocabulary(const Model &reference, const Model &test) {
    if (reference.config.vocab != test.config.vocab) {
        fail(TL_ERR_INVALID_ARGUMENT, "the reference's vocabulary has " + std::to_string(reference.config.vocab) +
                                          " tokens and the test's " + std::to_string(test.config.vocab) +
                                          ": models compared on one text must share a vocabulary");
    }
    auto kind = [](const Model &m) { return m.tokenizer ? text::kind_name(m.tokenizer->kind()) : "bytes"; };
    if (std::string(kind(reference)) != kind(test)) {
        fail(TL_ERR_INVALID_ARGUMENT, std::string("the reference's tokenizer is ") + kind(reference) +
                                          " and the test's " + kind(test) +
                                          ": models compared on one text must share a vocabulary");
    }
}

ScorePlan plan_compare(const ModelConfig &reference, const ModelConfig &test, const int32_t *tokens, size_t n_tokens,
                       int32_t window) {
    ModelConfig shorter = reference;
    shorter.max_seq = std::min(reference.max_seq, test.max_seq);
    return plan_score(shorter, tokens, n_tokens, window);
}

CompareStats summarize_comparison(const float *kl, const float *nll_reference, const float *nll_test,
                                  const uint8_t *top1_match, size_t n) {
    CompareStats s;
    s.n = n;
    const double nan = std::nan("");
    if (n == 0) {
        s.kl_mean = s.kl_stderr = s.kl_median = s.kl_p90 = s.kl_p99 = s.kl_p999 = s.kl_max = s.kl_min = nan;
        s.top1_agreement = s.nll_correlation = nan;
        return s;
    }
    const double count = static_cast<double>(n);
    double kl_sum = 0, agree = 0, sum_r = 0, sum_t = 0;
    for (size_t i = 0; i < n; ++i) {
        kl_sum += kl[i];
        agree += top1_match[i];
        sum_r += nll_reference[i];
        sum_t += nll_test[i];
    }
    s.kl_mean = kl_sum / count;
    s.top1_agreement = agree / count;
    s.nll_sum_reference = sum_r;
    s.nll_sum_test = sum_t;
    // Second passes around the means: no cancellation between sums of squares and n·mean².
    const double mean_r = sum_r / count, mean_t = sum_t / count;
    double kl_sq = 0, rr = 0, tt = 0, rt = 0;
    for (size_t i = 0; i < n; ++i) {
        const double d = kl[i] - s.kl_mean, a = nll_reference[i] - mean_r, b = nll_test[i] - mean_t;
        kl_sq += d * d;
        rr += a * a;
        tt += b * b;
        rt += a * b;
    }
    s.kl_stderr = n >= 2 ? std::sqrt(kl_sq / (count - 1)) / std::sqrt(count) : nan;
    s.nll_correlation = rr > 0 && tt > 0 ? rt / std::sqrt(rr * tt) : nan;
    std::vector<float> sorted(kl, kl + n);
    std::sort(sorted.begin(), sorted.end());
    s.kl_min = sorted.front();
    s.kl_max = sorted.back();
    s.kl_median = percentile(sorted, 0.5);
    s.kl_p90 = percentile(sorted, 0.90);
    s.kl_p99 = percentile(sorted, 0.99);
    s.kl_p999 = percentile(sorted, 0.999);
    return s;
}

}  // namespace tl
