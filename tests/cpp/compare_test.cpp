// compare_cpu and top-k on the CPU backend: a model against itself, a dense model against its INT4 quantization
// checked position by position against the float64 reference (reference.hpp), the summary statistics, and
// score_cpu / score_batch_cpu's top-k against the reference's logits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "../common/tl_error.hpp"
#include "cpu/cpu_forward.hpp"
#include "format/format.hpp"
#include "import/synthetic.hpp"
#include "reference.hpp"
#include "score/compare.hpp"
#include "util/error.hpp"

namespace {

tl::ModelConfig small_config() { return ref::small_config(48); }

// Per-position outputs of one comparison.
struct Compared {
    std::vector<float> kl, nll_reference, nll_test;
    std::vector<uint8_t> match;
    tl::ScoreResult result;
};

Compared compare(const tl::Model &reference, const tl::Model &test, const std::vector<int32_t> &tokens,
                 int32_t window = 0) {
    Compared c;
    const size_t n = tokens.size() - 1;
    c.kl.assign(n, -1.0f);
    c.nll_reference.assign(n, -1.0f);
    c.nll_test.assign(n, -1.0f);
    c.match.assign(n, 7);
    tl::ScoreOptions options;
    options.n_threads = 2;
    options.window = window;
    const tl::CompareOutputs out{c.kl.data(), c.nll_reference.data(), c.nll_test.data(), c.match.data()};
    c.result = tl::compare_cpu(reference, test, tokens.data(), tokens.size(), options,
                               tl::default_dispatch_settings(), out);
    return c;
}

class Compare : public ::testing::Test {
protected:
    void SetUp() override {
        seed_ = ref::fresh_seed();
        tl::SyntheticOptions options;
        options.seed = seed_;
        options.quantized = false;
        dense_ = tl::make_synthetic_model(small_config(), options);
        options.quantized = true;  // the same draws, quantized: the dense model's INT4 twin
        int4_ = tl::make_synthetic_model(small_config(), options);
        std::mt19937_64 rng(seed_);
        tokens_ = ref::random_tokens(rng, 100, small_config().vocab);
    }

    uint64_t seed_ = 0;
    std::unique_ptr<tl::Model> dense_, int4_;
    std::vector<int32_t> tokens_;
};

TEST_F(Compare, AModelAgainstItselfHasNoDivergence) {
    for (const bool same_object : {true, false}) {
        SCOPED_TRACE(same_object ? "the same Model" : "two loads of one model");
        tl::SyntheticOptions options;
        options.seed = seed_;
        const std::unique_ptr<tl::Model> twin = tl::make_synthetic_model(small_config(), options);
        const Compared c = compare(*int4_, same_object ? *int4_ : *twin, tokens_);
        const std::vector<double> nll = ref::sequence_nll(*int4_, tokens_, small_config().max_seq);
        for (size_t i = 0; i < c.kl.size(); ++i) {
            ASSERT_LT(std::fabs(c.kl[i]), 1e-6) << "position " << i;
            ASSERT_EQ(c.match[i], 1) << "position " << i;
            ASSERT_EQ(c.nll_reference[i], c.nll_test[i]) << "position " << i;
            ASSERT_NEAR(c.nll_reference[i], nll[i], 1e-3 * std::max(1.0, nll[i])) << "position " << i;
        }
        EXPECT_EQ(c.result.tokens_scored, tokens_.size() - 1);
        EXPECT_EQ(c.result.n_windows, 3);  // 100 tokens in windows of 48 overlapping by one
    }
}

TEST_F(Compare, DenseAgainstInt4MatchesTheFloat64Reference) {
    const int32_t window = small_config().max_seq;
    const Compared c = compare(*dense_, *int4_, tokens_, window);
    const int32_t V = small_config().vocab;
    double max_kl = 0;
    for (size_t start = 0; start + 1 < tokens_.size(); start += window - 1) {
        const int32_t len = static_cast<int32_t>(std::min<size_t>(window, tokens_.size() - start));
        const ref::Vec lr = ref::window_logits(*dense_, tokens_.data() + start, len);
        const ref::Vec lt = ref::window_logits(*int4_, tokens_.data() + start, len);
        for (int32_t p = 0; p + 1 < len; ++p) {
            const double *a = &lr[static_cast<size_t>(p) * V], *b = &lt[static_cast<size_t>(p) * V];
            auto lse = [V](const double *l) {
                const double mx = *std::max_element(l, l + V);
                double s = 0;
                for (int32_t v = 0; v < V; ++v) s += std::exp(l[v] - mx);
                return mx + std::log(s);
            };
            const double la = lse(a), lb = lse(b);
            double kl = 0;
            for (int32_t v = 0; v < V; ++v) kl += std::exp(a[v] - la) * ((a[v] - la) - (b[v] - lb));
            const size_t at = start + p;
            const int32_t target = tokens_[at + 1];
            ASSERT_NEAR(c.kl[at], kl, 1e-4 * std::max(1.0, kl) + 1e-6) << "position " << at;
            ASSERT_NEAR(c.nll_reference[at], la - a[target], 1e-3) << "position " << at;
            ASSERT_NEAR(c.nll_test[at], lb - b[target], 1e-3) << "position " << at;
            const bool agree = std::max_element(a, a + V) - a == std::max_element(b, b + V) - b;
            ASSERT_EQ(c.match[at], agree ? 1 : 0) << "position " << at;
            max_kl = std::max(max_kl, kl);
        }
    }
    EXPECT_GT(max_kl, 1e-5);  // INT4 does change the predictions: the comparison is not vacuous
}

TEST_F(Compare, RefusesModelsWithDifferentVocabularies) {
    tl::ModelConfig other = small_config();
    other.vocab = 300;
    tl::SyntheticOptions options;
    options.seed = seed_;
    const std::unique_ptr<tl::Model> wider = tl::make_synthetic_model(other, options);
    EXPECT_TRUE(tlt::throws(TL_ERR_INVALID_ARGUMENT, {"256", "300"}, [&] { compare(*int4_, *wider, tokens_); }));
}

TEST_F(Compare, WindowIsTheShorterMaxSeq) {
    tl::ModelConfig longer = small_config();
    longer.max_seq = 96;
    tl::SyntheticOptions options;
    options.seed = seed_;
    const std::unique_ptr<tl::Model> wide = tl::make_synthetic_model(longer, options);
    EXPECT_EQ(compare(*int4_, *wide, tokens_).result.n_windows, 3);
    EXPECT_EQ(compare(*wide, *int4_, tokens_).result.n_windows, 3);
}

TEST(CompareStats, PercentilesMeansAndCorrelation) {
    std::vector<float> kl(1001);
    std::iota(kl.begin(), kl.end(), 0.0f);  // 0 .. 1000
    std::shuffle(kl.begin(), kl.end(), std::mt19937_64(1));
    std::vector<float> nll_r(kl.size()), nll_t(kl.size());
    std::vector<uint8_t> match(kl.size());
    for (size_t i = 0; i < kl.size(); ++i) {
        nll_r[i] = static_cast<float>(i % 7);
        nll_t[i] = 2.0f * nll_r[i] + 1.0f;  // a perfect linear relation
        match[i] = i % 4 != 0;
    }
    const tl::CompareStats s = tl::summarize_comparison(kl.data(), nll_r.data(), nll_t.data(), match.data(), kl.size());
    EXPECT_DOUBLE_EQ(s.kl_mean, 500.0);
    EXPECT_DOUBLE_EQ(s.kl_median, 500.0);
    EXPECT_DOUBLE_EQ(s.kl_p90, 900.0);
    EXPECT_DOUBLE_EQ(s.kl_p99, 990.0);
    EXPECT_NEAR(s.kl_p999, 999.0, 1e-9);
    EXPECT_DOUBLE_EQ(s.kl_max, 1000.0);
    EXPECT_DOUBLE_EQ(s.kl_min, 0.0);
    // Sample standard deviation of 0..1000 is sqrt(1001 * 1002 / 12) ... / sqrt(n)
    const double sd = std::sqrt(1001.0 * 1002.0 / 12.0);
    EXPECT_NEAR(s.kl_stderr, sd / std::sqrt(1001.0), 1e-9);
    EXPECT_NEAR(s.nll_correlation, 1.0, 1e-12);
    EXPECT_NEAR(s.top1_agreement, 750.0 / 1001.0, 1e-12);
    const tl::CompareStats one = tl::summarize_comparison(kl.data(), nll_r.data(), nll_t.data(), match.data(), 1);
    EXPECT_TRUE(std::isnan(one.kl_stderr));
    EXPECT_TRUE(std::isnan(one.nll_correlation));
}

// The k most likely tokens of a reference logits row, ties to the lower id, and their log-probabilities.
void reference_top_k(const double *l, int32_t V, int32_t k, std::vector<int32_t> &ids, std::vector<double> &lp) {
    std::vector<int32_t> order(V);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [l](int32_t a, int32_t b) { return l[a] > l[b]; });
    const double mx = l[order[0]];
    double s = 0;
    for (int32_t v = 0; v < V; ++v) s += std::exp(l[v] - mx);
    ids.assign(order.begin(), order.begin() + k);
    lp.clear();
    for (int32_t id : ids) lp.push_back(l[id] - mx - std::log(s));
}

TEST_F(Compare, TopKOfScoreAndScoreBatchMatchTheReference) {
    const int32_t k = 5, V = small_config().vocab, window = small_config().max_seq;
    const size_t n = tokens_.size() - 1;
    std::vector<int32_t> ids(n * k, -1);
    std::vector<float> lp(n * k, 1.0f);
    tl::ScoreOptions options;
    options.n_threads = 2;
    options.top_k = k;
    options.top_ids = ids.data();
    options.top_logprobs = lp.data();
    tl::score_cpu(*int4_, tokens_.data(), tokens_.size(), options);
    for (size_t start = 0; start + 1 < tokens_.size(); start += window - 1) {
        const int32_t len = static_cast<int32_t>(std::min<size_t>(window, tokens_.size() - start));
        const ref::Vec logits = ref::window_logits(*int4_, tokens_.data() + start, len);
        for (int32_t p = 0; p + 1 < len; ++p) {
            std::vector<int32_t> want_ids;
            std::vector<double> want_lp;
            reference_top_k(&logits[static_cast<size_t>(p) * V], V, k, want_ids, want_lp);
            const size_t at = (start + p) * k;
            for (int32_t j = 0; j < k; ++j) {
                ASSERT_NEAR(lp[at + j], want_lp[j], 1e-3) << "position " << start + p << ", rank " << j;
                // Near-ties may swap between float32 and float64: the id named must have the reported probability.
                const double lse = logits[static_cast<size_t>(p) * V + want_ids[0]] - want_lp[0];
                ASSERT_NEAR(lp[at + j], logits[static_cast<size_t>(p) * V + ids[at + j]] - lse, 1e-3)
                    << "position " << start + p << ", rank " << j;
            }
            ASSERT_TRUE(std::is_sorted(lp.begin() + at, lp.begin() + at + k, std::greater<float>()));
        }
    }
    // score_batch_cpu lays them out as token_nll: each sequence's n_tokens - 1 positions after the last.
    const std::vector<int32_t> a(tokens_.begin(), tokens_.begin() + 20), b(tokens_.begin() + 20, tokens_.begin() + 45);
    const tl::Sequence sequences[2] = {{a.data(), a.size(), 3}, {b.data(), b.size(), 0}};
    std::vector<int32_t> batch_ids((a.size() - 1 + b.size() - 1) * k);
    std::vector<float> batch_lp(batch_ids.size());
    options.top_ids = batch_ids.data();
    options.top_logprobs = batch_lp.data();
    tl::SequenceScore scores[2];
    tl::score_batch_cpu(*int4_, sequences, 2, options, scores);
    std::vector<int32_t> alone_ids((b.size() - 1) * k);
    std::vector<float> alone_lp(alone_ids.size());
    options.top_ids = alone_ids.data();
    options.top_logprobs = alone_lp.data();
    tl::score_cpu(*int4_, b.data(), b.size(), options);
    for (size_t i = 0; i < alone_ids.size(); ++i) {
        ASSERT_EQ(batch_ids[(a.size() - 1) * k + i], alone_ids[i]) << i;
        ASSERT_EQ(batch_lp[(a.size() - 1) * k + i], alone_lp[i]) << i;
    }
}

TEST(TopKRow, OrdersByLogitWithTiesToTheLowerId) {
    const float logits[8] = {1, 3, 3, -2, 5, 3, 0, 5};
    int32_t ids[4];
    float lp[4];
    tl::top_k_row(logits, 8, 4, 0.0, ids, lp);
    EXPECT_EQ(std::vector<int32_t>(ids, ids + 4), (std::vector<int32_t>{4, 7, 1, 2}));
    EXPECT_EQ(std::vector<float>(lp, lp + 4), (std::vector<float>{5, 5, 3, 3}));
}

}  // namespace

namespace {

TEST(BosTokenId, KeptInTheConfigAndChecked) {
    tl::ModelConfig c = small_config();
    EXPECT_EQ(tl::config_from_json(tl::config_to_json(c)).bos_token_id, -1);  // none: the key is left out
    EXPECT_EQ(tl::config_to_json(c).find("bos_token_id"), std::string::npos);
    c.bos_token_id = 10;
    const tl::ModelConfig back = tl::config_from_json(tl::config_to_json(c));
    EXPECT_EQ(back.bos_token_id, 10);
    tl::validate_config(back);
    c.bos_token_id = c.vocab;
    EXPECT_TRUE(tlt::throws(TL_ERR_FORMAT, {"bos_token_id = 256"}, [&] { tl::validate_config(c); }));
}

}  // namespace
