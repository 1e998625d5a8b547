// score_cpu's contract: thread-count independence, argument validation, windows, progress and cancellation,
// and exceptions from worker threads; score_batch_cpu's: each sequence as score_cpu alone, greedy, progress, memory.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <initializer_list>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "../common/tl_error.hpp"
#include "cpu/cpu_forward.hpp"
#include "quant/quant.hpp"
#include "util/error.hpp"
#include "reference.hpp"
#include "import/synthetic.hpp"
#include "util/thread_pool.hpp"

namespace {

tl::ModelConfig small_config() { return ref::small_config(64); }

class Score : public ::testing::Test {
protected:
    void SetUp() override {
        seed_ = ref::fresh_seed();
        tl::SyntheticOptions options;
        options.seed = seed_;
        model_ = tl::make_synthetic_model(small_config(), options);
        std::mt19937_64 rng(seed_);
        tokens_ = ref::random_tokens(rng, 150, small_config().vocab);
    }

    uint64_t seed_ = 0;
    std::unique_ptr<tl::Model> model_;
    std::vector<int32_t> tokens_;
};

}  // namespace

TEST_F(Score, ThreadCountDoesNotChangeTheResult) {
    SCOPED_TRACE("seed " + std::to_string(seed_));
    std::vector<float> nll1(tokens_.size() - 1), nll_n(tokens_.size() - 1);
    tl::ScoreOptions options;
    options.n_threads = 1;
    options.token_nll = nll1.data();
    const tl::ScoreResult one = tl::score_cpu(*model_, tokens_.data(), tokens_.size(), options);
    for (int32_t threads : {2, 3, 0}) {
        options.n_threads = threads;
        options.token_nll = nll_n.data();
        const tl::ScoreResult many = tl::score_cpu(*model_, tokens_.data(), tokens_.size(), options);
        // Every output is the same sequence of FP32 operations whatever the partition: bitwise equal.
        EXPECT_EQ(many.nll_sum, one.nll_sum) << threads << " threads";
        EXPECT_EQ(nll_n, nll1) << threads << " threads";
    }
    double sum = 0.0;
    for (float v : nll1) sum += v;
    EXPECT_NEAR(sum, one.nll_sum, 1e-5 * one.nll_sum);
    EXPECT_TRUE(std::isfinite(one.nll_sum));
    EXPECT_GT(one.nll_sum, 0.0);
}

// The portable kernel and the widest one this CPU runs do the same FP32 operations in the same order.
TEST_F(Score, PortableKernelGivesTheSameBits) {
    std::vector<float> widest(tokens_.size() - 1), portable(tokens_.size() - 1);
    tl::ScoreOptions options;
    options.n_threads = 2;
    options.token_nll = widest.data();
    tl::score_cpu(*model_, tokens_.data(), tokens_.size(), options);
    tl::use_portable_cpu_kernel(true);
    options.token_nll = portable.data();
    tl::score_cpu(*model_, tokens_.data(), tokens_.size(), options);
    tl::use_portable_cpu_kernel(false);
    EXPECT_EQ(portable, widest);
}

TEST_F(Score, InvalidTokensAreRejectedWithTheirIndex) {
    SCOPED_TRACE("seed " + std::to_string(seed_));
    tokens_[17] = 300;
    auto score = [&] { tl::score_cpu(*model_, tokens_.data(), tokens_.size(), {}); };
    const tlt::ErrorOf e = tlt::error_of(score);
    EXPECT_EQ(e.code, TL_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(e.message, "tokens[17] = 300 is outside the vocabulary [0, 256)");
    tokens_[17] = 0;
    tokens_[149] = -1;
    EXPECT_TRUE(tlt::throws(TL_ERR_INVALID_ARGUMENT, {"tokens[149] = -1"}, score));
    tokens_[149] = 256;
    EXPECT_TRUE(tlt::throws(TL_ERR_INVALID_ARGUMENT, {"tokens[149] = 256"}, score));
}

TEST_F(Score, TooFewTokensAndBadWindowsAreRejected) {
    for (size_t n : {0, 1}) {
        EXPECT_EQ(tlt::error_of([&] { tl::score_cpu(*model_, tokens_.data(), n, {}); }).code, TL_ERR_INVALID_ARGUMENT);
    }
    EXPECT_EQ(tlt::error_of([&] { tl::score_cpu(*model_, nullptr, 10, {}); }).code, TL_ERR_INVALID_ARGUMENT);
    for (int32_t window : {1, -3, 65}) {
        tl::ScoreOptions options;
        options.window = window;
        EXPECT_TRUE(tlt::throws(TL_ERR_INVALID_ARGUMENT, {"window"},
                                [&] { tl::score_cpu(*model_, tokens_.data(), tokens_.size(), options); }))
            << "window " << window;
    }
    for (int32_t threads : {-1, 1025}) {
        tl::ScoreOptions options;
        options.n_threads = threads;
        EXPECT_EQ(tlt::error_of([&] { tl::score_cpu(*model_, tokens_.data(), tokens_.size(), options); }).code,
                  TL_ERR_INVALID_ARGUMENT);
    }
}

TEST_F(Score, WindowsAreCountedAndEachTokenScoredOnce) {
    struct Case {
        size_t n;
        int32_t window;
        int32_t windows;
    };
    // Windows of L tokens advance by L - 1: ceil((n - 1) / (L - 1)) of them.
    for (const Case c : {Case{2, 0, 1}, Case{64, 0, 1}, Case{65, 0, 2}, Case{150, 0, 3}, Case{150, 2, 149},
                         Case{100, 32, 4}, Case{94, 32, 3}, Case{95, 32, 4}}) {
        std::vector<uint64_t> done;
        tl::ScoreOptions options;
        options.window = c.window;
        options.progress = [&](uint64_t d, uint64_t total) {
            EXPECT_EQ(total, c.n - 1);
            done.push_back(d);
            return true;
        };
        const tl::ScoreResult r = tl::score_cpu(*model_, tokens_.data(), c.n, options);
        EXPECT_EQ(r.n_windows, c.windows) << "n " << c.n << " window " << c.window;
        EXPECT_EQ(r.tokens_scored, c.n - 1);
        ASSERT_EQ(done.size(), static_cast<size_t>(c.windows));
        EXPECT_EQ(done.back(), c.n - 1);
        for (size_t i = 1; i < done.size(); ++i) EXPECT_GT(done[i], done[i - 1]);
    }
}

TEST_F(Score, ProgressCanCancel) {
    int calls = 0;
    tl::ScoreOptions options;
    options.window = 16;
    options.progress = [&](uint64_t, uint64_t) { return ++calls < 2; };
    EXPECT_TRUE(
        tlt::throws(TL_ERR_CANCELLED, {}, [&] { tl::score_cpu(*model_, tokens_.data(), tokens_.size(), options); }));
    EXPECT_EQ(calls, 2);
}

TEST_F(Score, ModelShapeMismatchIsRejected) {
    model_->loop.mlp_up.n -= 1;
    EXPECT_TRUE(tlt::throws(TL_ERR_INVALID_ARGUMENT, {"loop.mlp_up"},
                            [&] { tl::score_cpu(*model_, tokens_.data(), tokens_.size(), {}); }));
}

// Memory follows the tokens scored, not the model's max_seq: a model claiming a window of 2^20 tokens scores two
// tokens at once and in little memory (this sized 2^20-row activations, ~16 GB, before).
TEST_F(Score, MemoryFollowsTheTokensNotMaxSeq) {
    tl::ModelConfig c = small_config();
    c.max_seq = 1 << 20;
    tl::SyntheticOptions options;
    options.seed = seed_;
    const auto model = tl::make_synthetic_model(c, options);
    tl::ScoreOptions o;
    o.n_threads = 2;
    o.max_memory_bytes = 64u << 20;  // far below 2^20 rows, far above 2 rows
    const tl::ScoreResult r = tl::score_cpu(*model, tokens_.data(), 2, o);
    EXPECT_EQ(r.tokens_scored, 1u);
    EXPECT_EQ(r.n_windows, 1);
    EXPECT_LT(tl::cpu_score_bytes(*model, 2, 2, false), uint64_t{64} << 20);
    EXPECT_GT(tl::cpu_score_bytes(*model, 1 << 20, 2, false), uint64_t{1} << 30);
}

// Past the budget the call fails before allocating, with TL_ERR_OUT_OF_MEMORY naming the size it needed; the same
// call within the budget succeeds; the estimate grows with the window.
TEST_F(Score, MemoryBudgetIsEnforced) {
    tl::ScoreOptions o;
    o.n_threads = 1;
    const uint64_t needed = tl::cpu_score_bytes(*model_, 64, 1, false);
    EXPECT_GT(needed, tl::cpu_score_bytes(*model_, 16, 1, false));
    o.max_memory_bytes = needed - 1;
    EXPECT_TRUE(tlt::throws(TL_ERR_OUT_OF_MEMORY, {std::to_string(needed), "max_memory_bytes"},
                            [&] { tl::score_cpu(*model_, tokens_.data(), tokens_.size(), o); }));
    o.max_memory_bytes = needed;
    EXPECT_EQ(tl::score_cpu(*model_, tokens_.data(), tokens_.size(), o).tokens_scored, tokens_.size() - 1);
    // A shorter window fits a budget the default window does not.
    o.window = 16;
    o.max_memory_bytes = tl::cpu_score_bytes(*model_, 16, 1, false);
    EXPECT_EQ(tl::score_cpu(*model_, tokens_.data(), tokens_.size(), o).tokens_scored, tokens_.size() - 1);
    // Quantized activations need their own scratch, and the budget counts it.
    o.window = 0;
    o.activations = tl::ActivationMode::Int8;
    const uint64_t quantized = tl::cpu_score_bytes(*model_, 64, 1, false, tl::ActivationMode::Int8);
    EXPECT_GT(quantized, needed);
    o.max_memory_bytes = quantized - 1;
    EXPECT_EQ(tlt::error_of([&] { tl::score_cpu(*model_, tokens_.data(), tokens_.size(), o); }).code,
              TL_ERR_OUT_OF_MEMORY);
    o.max_memory_bytes = quantized;
    EXPECT_EQ(tl::score_cpu(*model_, tokens_.data(), tokens_.size(), o).tokens_scored, tokens_.size() - 1);
    o.activations = tl::ActivationMode::Fp16;
    // A batch has no window: its message points at what sets a batch's rows.
    o.max_memory_bytes = tl::cpu_score_bytes(*model_, 64, 1, false) - 1;
    const tl::Sequence sequence{tokens_.data(), 64, 0};
    tl::SequenceScore score;
    EXPECT_TRUE(tlt::throws(TL_ERR_OUT_OF_MEMORY, {"in tl_score_batch shorter sequences"},
                            [&] { tl::score_batch_cpu(*model_, &sequence, 1, o, &score); }));
}

TEST(ThreadPool, WorkerExceptionsReachTheCallerAndThePoolSurvives) {
    tl::ThreadPool pool(4);
    EXPECT_EQ(pool.size(), 4);
    std::atomic<int> ran{0};
    EXPECT_THROW(pool.parallel_for(1000,
                                   [&](size_t i, int32_t) {
                                       ++ran;
                                       if (i % 100 == 57) throw std::runtime_error("task " + std::to_string(i));
                                   }),
                 std::runtime_error);
    EXPECT_GE(ran.load(), 1);
    std::vector<std::atomic<int>> hits(500);
    pool.parallel_for(hits.size(), [&](size_t i, int32_t worker) {
        EXPECT_GE(worker, 0);
        EXPECT_LT(worker, 4);
        ++hits[i];
    });
    for (const auto &h : hits) EXPECT_EQ(h.load(), 1);
}

TEST(ThreadPool, LibraryErrorsInWorkersKeepTheirStatus) {
    // A dense Linear with a non-float dtype fails inside the column-tile tasks, on worker threads.
    std::vector<uint8_t> bytes(64 * 64);
    tl::Linear bad;
    bad.name = "bad";
    bad.k = 64;
    bad.n = 64;
    bad.dense_dtype = tl::DType::U8;
    bad.dense = bytes.data();
    std::vector<float> x(4 * 64, 1.0f), y(4 * 64);
    EXPECT_TRUE(tlt::throws(TL_ERR_INTERNAL, {}, [&] { tl::linear_forward(bad, x.data(), y.data(), 4, 2); }));
}

// ---- score_batch_cpu ----

namespace {

// Sequences over the fixture's tokens: (offset, n_tokens, n_context) each.
struct Piece {
    size_t offset, n_tokens, n_context;
};

std::vector<tl::Sequence> pieces_of(const std::vector<int32_t> &tokens, std::initializer_list<Piece> pieces) {
    std::vector<tl::Sequence> sequences;
    for (const Piece &p : pieces) {
        tl::Sequence s;
        s.tokens = tokens.data() + p.offset;
        s.n_tokens = p.n_tokens;
        s.n_context = p.n_context;
        sequences.push_back(s);
    }
    return sequences;
}

// A sequence's tokens scored alone by score_cpu: its per-token NLLs (and the result, if asked for).
std::vector<float> score_alone(const tl::Model &model, const tl::Sequence &s, tl::ScoreOptions options,
                               tl::ScoreResult *result = nullptr) {
    std::vector<float> nll(s.n_tokens - 1);
    options.token_nll = nll.data();
    const tl::ScoreResult r = tl::score_cpu(model, s.tokens, s.n_tokens, options);
    if (result != nullptr) *result = r;
    return nll;
}

// The sum of a sequence's per-token NLLs over the tokens after its context.
double scored_sum(const std::vector<float> &nll, const tl::Sequence &s) {
    double sum = 0.0;
    for (size_t j = s.first_scored(); j < s.n_tokens; ++j) sum += nll[j - 1];
    return sum;
}

}  // namespace

// Each sequence is one window from position 0: its NLLs are score_cpu's of its tokens alone, bitwise; nll_sum and
// greedy count the tokens after the context only; token_nll holds every prediction, the sequences one after another.
TEST_F(Score, BatchScoresEachSequenceAsScoreCpuAlone) {
    SCOPED_TRACE("seed " + std::to_string(seed_));
    const std::vector<tl::Sequence> sequences =
        pieces_of(tokens_, {{0, 2, 0}, {3, 64, 1}, {10, 17, 9}, {70, 40, 0}, {100, 33, 32}});
    const size_t predicted = tl::check_sequences(model_->config, sequences.data(), sequences.size(), 0);
    EXPECT_EQ(predicted, size_t{1 + 63 + 16 + 39 + 32});
    std::vector<float> batch_nll(predicted);
    std::vector<tl::SequenceScore> scores(sequences.size());
    tl::ScoreOptions options;
    options.n_threads = 2;
    options.token_nll = batch_nll.data();
    const tl::ScoreResult total = tl::score_batch_cpu(*model_, sequences.data(), sequences.size(), options,
                                                      scores.data());
    EXPECT_EQ(total.n_windows, 5);
    size_t offset = 0;
    double nll_sum = 0.0;
    for (size_t i = 0; i < sequences.size(); ++i) {
        const tl::Sequence &s = sequences[i];
        tl::ScoreResult alone;
        const std::vector<float> alone_nll = score_alone(*model_, s, options, &alone);
        const std::vector<float> in_batch(batch_nll.begin() + offset, batch_nll.begin() + offset + s.n_tokens - 1);
        EXPECT_EQ(in_batch, alone_nll) << "sequence " << i;
        EXPECT_EQ(scores[i].tokens_scored, s.n_tokens - s.first_scored()) << "sequence " << i;
        if (s.first_scored() == 1) {
            EXPECT_EQ(scores[i].nll_sum, alone.nll_sum) << "sequence " << i;
        }
        const double scored = scored_sum(alone_nll, s);
        EXPECT_NEAR(scores[i].nll_sum, scored, 1e-5 * scored) << "sequence " << i;
        offset += s.n_tokens - 1;
        nll_sum += scores[i].nll_sum;
    }
    EXPECT_EQ(total.nll_sum, nll_sum);
    EXPECT_EQ(total.tokens_scored, uint64_t{1 + 63 + 8 + 39 + 1});
}

// greedy against the double-precision reference's argmax, for one scored token: its best continuation is greedy,
// its second best is not (positions whose two best logits are too close to tell apart in FP32 are skipped).
TEST_F(Score, BatchGreedyIsTheReferenceArgmax) {
    SCOPED_TRACE("seed " + std::to_string(seed_));
    const int32_t V = model_->config.vocab;
    int checked = 0;
    for (int32_t n = 3; n < 40 && checked < 4; n += 3) {
        const ref::Vec logits = ref::window_logits(*model_, tokens_.data(), n);
        const double *last = &logits[static_cast<size_t>(n - 1) * V];
        std::vector<int32_t> order(V);
        for (int32_t v = 0; v < V; ++v) order[v] = v;
        std::partial_sort(order.begin(), order.begin() + 2, order.end(),
                          [&](int32_t a, int32_t b) { return last[a] > last[b]; });
        if (last[order[0]] - last[order[1]] < 1e-3 * std::max(1.0, std::fabs(last[order[0]]))) continue;
        std::vector<int32_t> best(tokens_.begin(), tokens_.begin() + n), second = best;
        best.push_back(order[0]);
        second.push_back(order[1]);
        const std::vector<tl::Sequence> sequences = {{best.data(), best.size(), static_cast<size_t>(n)},
                                                     {second.data(), second.size(), static_cast<size_t>(n)}};
        std::vector<tl::SequenceScore> scores(2);
        tl::score_batch_cpu(*model_, sequences.data(), 2, {}, scores.data());
        EXPECT_TRUE(scores[0].greedy) << "n " << n << ": the reference's argmax " << order[0];
        EXPECT_FALSE(scores[1].greedy) << "n " << n << ": the reference's second best " << order[1];
        ++checked;
    }
    EXPECT_GT(checked, 0) << "every position had two near-equal best logits";
}

// Progress after each sequence, counting scored tokens; cancelling stops before the next sequence.
TEST_F(Score, BatchProgressCountsScoredTokensAndCanCancel) {
    const std::vector<tl::Sequence> sequences = pieces_of(tokens_, {{0, 20, 5}, {20, 10, 0}, {30, 64, 60}});
    std::vector<tl::SequenceScore> scores(sequences.size());
    std::vector<uint64_t> done;
    tl::ScoreOptions options;
    options.progress = [&](uint64_t d, uint64_t total) {
        EXPECT_EQ(total, uint64_t{15 + 9 + 4});
        done.push_back(d);
        return true;
    };
    tl::score_batch_cpu(*model_, sequences.data(), sequences.size(), options, scores.data());
    EXPECT_EQ(done, (std::vector<uint64_t>{15, 24, 28}));

    int calls = 0;
    options.progress = [&](uint64_t, uint64_t) { return ++calls < 2; };
    EXPECT_TRUE(tlt::throws(TL_ERR_CANCELLED, {"after 24 of 28 tokens"}, [&] {
        tl::score_batch_cpu(*model_, sequences.data(), sequences.size(), options, scores.data());
    }));
    EXPECT_EQ(calls, 2);
}

// An empty batch: zero totals, no progress, nothing touched.
TEST_F(Score, BatchOfNoSequences) {
    tl::ScoreOptions options;
    options.progress = [](uint64_t, uint64_t) {
        ADD_FAILURE() << "progress for an empty batch";
        return true;
    };
    const tl::ScoreResult r = tl::score_batch_cpu(*model_, nullptr, 0, options, nullptr);
    EXPECT_EQ(r.nll_sum, 0.0);
    EXPECT_EQ(r.tokens_scored, 0u);
    EXPECT_EQ(r.n_windows, 0);
}

// Working memory is sized by the longest sequence, checked before anything is allocated.
TEST_F(Score, BatchMemoryFollowsTheLongestSequence) {
    const std::vector<tl::Sequence> sequences = pieces_of(tokens_, {{0, 10, 0}, {10, 48, 2}, {60, 20, 0}});
    std::vector<tl::SequenceScore> scores(sequences.size());
    tl::ScoreOptions o;
    o.n_threads = 1;
    const uint64_t needed = tl::cpu_score_bytes(*model_, 48, 1, false);
    o.max_memory_bytes = needed - 1;
    EXPECT_TRUE(tlt::throws(TL_ERR_OUT_OF_MEMORY, {std::to_string(needed)}, [&] {
        tl::score_batch_cpu(*model_, sequences.data(), sequences.size(), o, scores.data());
    }));
    o.max_memory_bytes = needed;
    EXPECT_EQ(tl::score_batch_cpu(*model_, sequences.data(), sequences.size(), o, scores.data()).tokens_scored,
              uint64_t{9 + 46 + 19});
}

// The linear_input hook sees each sequence's window, and cross-iteration rounding applies as in score_cpu.
TEST_F(Score, BatchHonoursTheLinearInputHookAndCrossIterationRounding) {
    SCOPED_TRACE("seed " + std::to_string(seed_));
    tl::SyntheticOptions synthetic;
    synthetic.seed = seed_;
    synthetic.frac4 = true;
    const auto model = tl::make_synthetic_model(small_config(), synthetic);
    const std::vector<tl::Sequence> sequences = pieces_of(tokens_, {{0, 30, 4}, {40, 12, 0}});
    std::vector<tl::SequenceScore> scores(sequences.size());
    std::vector<int32_t> head_rows;
    tl::ScoreOptions options;
    options.dispatch[tl::DispatchSetting::CrossIterRound] = 1;
    options.linear_input = [&](const tl::Linear &w, const float *, int32_t rows) {
        if (&w == &model->head) head_rows.push_back(rows);
    };
    tl::score_batch_cpu(*model, sequences.data(), sequences.size(), options, scores.data());
    EXPECT_EQ(head_rows, (std::vector<int32_t>{29, 11}));
    options.linear_input = nullptr;
    tl::ScoreOptions plain = options;
    plain.dispatch[tl::DispatchSetting::CrossIterRound] = 0;
    for (size_t i = 0; i < sequences.size(); ++i) {
        const tl::Sequence &s = sequences[i];
        const double scored = scored_sum(score_alone(*model, s, options), s);
        EXPECT_NEAR(scores[i].nll_sum, scored, 1e-5 * scored) << "sequence " << i;
        EXPECT_NE(scored_sum(score_alone(*model, s, plain), s), scored)
            << "cross-iteration rounding changed nothing: the test cannot tell";
    }
}

// An INT8 model scores exactly as its dequantized twin (every linear dense F32 holding q * s, which INT8
// dequantization computes exactly): the CPU backend's INT8 path only differs in where the weights come from. A mixed
// model (INT8 loop block, INT4 pre blocks) does the same.
TEST(ScoreInt8, MatchesTheDequantizedDenseModelBitForBit) {
    const uint64_t seed = ref::fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    for (int32_t group_size : {0, 32}) {
        tl::ModelConfig c = ref::small_config(64);
        c.group_size = group_size;
        c.bits = 8;
        tl::SyntheticOptions options;
        options.seed = seed;
        options.quantize_head = true;
        const auto int8 = tl::make_synthetic_model(c, options);
        c.bits = 4;
        auto mixed = tl::make_synthetic_model(c, options);
        mixed->loop = int8->loop;
        mixed->config.bits = 8;
        const tl::Model *const models[] = {int8.get(), mixed.get()};
        for (const tl::Model *model : models) {
            auto dense = std::make_unique<tl::Model>(*model);
            std::vector<tl::Linear *> linears = {&dense->head};
            for (tl::Block *b : {&dense->pre[0], &dense->loop})
                for (int i = 0; i < 5; ++i) linears.push_back(b->linear(i));
            for (tl::Linear *l : linears) {
                std::vector<float> w(static_cast<size_t>(l->k) * l->n);
                tl::dequantize_rows(*l, 0, l->n, w.data());
                *l = tl::make_dense_linear(l->name, w.data(), l->k, l->n);
            }
            std::mt19937_64 rng(seed);
            const std::vector<int32_t> tokens = ref::random_tokens(rng, 80, c.vocab);
            std::vector<float> got(tokens.size() - 1), want(tokens.size() - 1);
            tl::ScoreOptions so;
            so.token_nll = got.data();
            const tl::ScoreResult a = tl::score_cpu(*model, tokens.data(), tokens.size(), so);
            so.token_nll = want.data();
            const tl::ScoreResult b = tl::score_cpu(*dense, tokens.data(), tokens.size(), so);
            EXPECT_EQ(a.nll_sum, b.nll_sum);
            EXPECT_EQ(got, want);
            EXPECT_TRUE(std::isfinite(a.nll_sum));
        }
    }
}
