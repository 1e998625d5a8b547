// Eight threads on one shared model, through the public C API only (linked against the shared library): tl_score
// on the CPU with mixed windows and progress callbacks (bit-identical to a single-threaded run), weight reads,
// tl_set_log_callback racing calls that log, per-thread tl_last_error_message, and two models with their own dispatcher
// settings. scripts/test.sh builds these
// under ThreadSanitizer and runs them by their label (ctest -L concurrency).
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tinyloop.h"

namespace {

// Scoring options for one CPU worker thread (the defaults otherwise).
tl_score_options one_thread_cpu_options() {
    tl_score_options options;
    tl_score_options_init(&options, sizeof options);
    options.backend = TL_BACKEND_CPU;
    options.n_threads = 1;
    return options;
}

constexpr int kThreads = 8;

// std::barrier is C++20.
class Barrier {
public:
    explicit Barrier(int count) : count_(count) {}
    void wait() {
        std::unique_lock<std::mutex> lock(mutex_);
        const uint64_t generation = generation_;
        if (++waiting_ == count_) {
            waiting_ = 0;
            ++generation_;
            cv_.notify_all();
        } else {
            cv_.wait(lock, [&] { return generation_ != generation; });
        }
    }

private:
    std::mutex mutex_;
    std::condition_variable cv_;
    const int count_;
    int waiting_ = 0;
    uint64_t generation_ = 0;
};

// Runs body(t) on kThreads threads started together; returns after all have finished.
template <typename Body>
void on_threads(Body body) {
    Barrier start(kThreads);
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
        threads.emplace_back([&, t] {
            start.wait();
            body(t);
        });
    }
    for (std::thread &th : threads) th.join();
}

class Concurrency : public ::testing::Test {
protected:
    void SetUp() override {
        ASSERT_EQ(tl_model_load(TL_TEST_FIXTURE, nullptr, &model_), TL_OK) << tl_last_error_message();
        props_.struct_size = sizeof props_;
        ASSERT_EQ(tl_model_info(model_, &props_), TL_OK) << tl_last_error_message();
    }
    void TearDown() override { tl_model_free(model_); }

    std::vector<int32_t> tokens(size_t n) const {
        std::vector<int32_t> out(n);
        uint32_t state = 12345;
        for (int32_t &t : out) {
            state = state * 1664525u + 1013904223u;
            t = static_cast<int32_t>((state >> 8) % static_cast<uint32_t>(props_.vocab));
        }
        return out;
    }

    tl_model *model_ = nullptr;
    tl_model_properties props_{};
};

// ---- scoring ----

struct ScoreConfig {
    int32_t window;     // 0 = max_seq
    int32_t n_threads;  // the call's own worker pool
    bool progress;
    int cancel_after;  // > 0: the progress callback stops the call on its cancel_after-th call
};

struct Progress {
    std::thread::id caller;
    int cancel_after = 0;
    std::vector<uint64_t> done;
    uint64_t total = 0;
    bool wrong_thread = false;
};

int32_t on_progress(void *user_data, uint64_t done, uint64_t total) {
    auto *p = static_cast<Progress *>(user_data);
    if (std::this_thread::get_id() != p->caller) p->wrong_thread = true;
    p->done.push_back(done);
    p->total = total;
    return p->cancel_after > 0 && static_cast<int>(p->done.size()) >= p->cancel_after ? 1 : 0;
}

struct ScoreRun {
    tl_status status = TL_OK;
    tl_score_result result{};
    std::vector<float> token_nll;
    Progress progress;
};

ScoreRun score(const tl_model *model, const std::vector<int32_t> &tokens, const ScoreConfig &config) {
    ScoreRun run;
    run.token_nll.assign(tokens.size() - 1, 0.0f);
    run.progress.caller = std::this_thread::get_id();
    run.progress.cancel_after = config.cancel_after;
    tl_score_options options;
    if (tl_score_options_init(&options, sizeof options) != TL_OK) std::abort();
    options.backend = TL_BACKEND_CPU;
    options.n_threads = config.n_threads;
    options.window = config.window;
    options.token_nll = run.token_nll.data();
    options.token_nll_len = run.token_nll.size();
    if (config.progress) {
        options.progress = on_progress;
        options.progress_user_data = &run.progress;
    }
    if (tl_score_result_init(&run.result, sizeof run.result) != TL_OK) std::abort();
    run.status = tl_score(model, tokens.data(), tokens.size(), &options, &run.result);
    return run;
}

TEST_F(Concurrency, SharedModelScoresBitIdenticallyToOneThread) {
    const std::vector<int32_t> toks = tokens(96);
    const std::vector<ScoreConfig> configs = {
        {0, 1, false, 0}, {0, 2, true, 0}, {5, 1, true, 0}, {17, 2, true, 0}, {64, 1, false, 0}, {17, 1, true, 3},
    };
    std::vector<ScoreRun> expected;
    for (const ScoreConfig &c : configs) expected.push_back(score(model_, toks, c));
    for (size_t i = 0; i < configs.size(); ++i) {
        ASSERT_EQ(expected[i].status, configs[i].cancel_after > 0 ? TL_ERR_CANCELLED : TL_OK) << "config " << i;
    }

    constexpr int kRounds = 2;
    std::vector<std::vector<ScoreRun>> runs(kThreads);
    on_threads([&](int t) {
        for (int r = 0; r < kRounds; ++r) {
            for (size_t i = 0; i < configs.size(); ++i) {
                // Each thread walks the configs from a different start, so different windows run side by side.
                runs[t].push_back(score(model_, toks, configs[(i + size_t(t)) % configs.size()]));
            }
        }
    });

    for (int t = 0; t < kThreads; ++t) {
        for (size_t j = 0; j < runs[t].size(); ++j) {
            const size_t i = (j % configs.size() + size_t(t)) % configs.size();
            const ScoreRun &got = runs[t][j], &want = expected[i];
            SCOPED_TRACE("thread " + std::to_string(t) + ", config " + std::to_string(i));
            ASSERT_EQ(got.status, want.status);
            EXPECT_FALSE(got.progress.wrong_thread) << "the progress callback ran off the calling thread";
            EXPECT_EQ(got.progress.done, want.progress.done);
            if (configs[i].progress) {
                EXPECT_EQ(got.progress.total, toks.size() - 1);
            }
            if (got.status != TL_OK) continue;
            // Bit for bit: the same reduction order whatever else runs at the same time.
            EXPECT_EQ(std::memcmp(&got.result.nll_sum, &want.result.nll_sum, sizeof(double)), 0)
                << got.result.nll_sum << " vs " << want.result.nll_sum;
            EXPECT_EQ(got.result.tokens_scored, want.result.tokens_scored);
            EXPECT_EQ(got.result.n_windows, want.result.n_windows);
            EXPECT_EQ(got.result.backend, TL_BACKEND_CPU);
            EXPECT_EQ(std::memcmp(got.token_nll.data(), want.token_nll.data(), got.token_nll.size() * sizeof(float)),
                      0);
        }
    }
}

// ---- weights ----

struct WeightRef {
    const tl_weight *weight;
    tl_weight_properties info;
    std::string name;
    std::vector<float> values;
};

WeightRef read_weight(const tl_weight *w) {
    WeightRef ref{w, {}, "", {}};
    ref.info.struct_size = sizeof ref.info;
    if (tl_weight_info(w, &ref.info) != TL_OK) return ref;
    ref.name = ref.info.name;
    ref.values.resize(size_t(ref.info.k) * size_t(ref.info.n));
    if (tl_weight_dequantize(w, ref.values.data(), ref.values.size()) != TL_OK) ref.values.clear();
    return ref;
}

TEST_F(Concurrency, SharedWeightsReadConsistently) {
    size_t count = 0;
    ASSERT_EQ(tl_model_weight_count(model_, &count), TL_OK);
    ASSERT_GT(count, 0u);
    std::vector<WeightRef> expected;
    for (size_t i = 0; i < count; ++i) {
        const tl_weight *w = nullptr;
        ASSERT_EQ(tl_model_weight_at(model_, i, &w), TL_OK);
        expected.push_back(read_weight(w));
        ASSERT_FALSE(expected.back().values.empty()) << "weight " << i << ": " << tl_last_error_message();
    }
    // And one weight owned by the caller, shared the same way.
    std::vector<float> dense(48 * 40);
    for (size_t i = 0; i < dense.size(); ++i) dense[i] = float(int(i * 37 % 101) - 50) / 50.0f;
    tl_weight *owned = nullptr;
    ASSERT_EQ(tl_weight_quantize(dense.data(), 48, 40, nullptr, &owned), TL_OK) << tl_last_error_message();
    const WeightRef owned_ref = read_weight(owned);
    ASSERT_FALSE(owned_ref.values.empty());

    std::vector<std::string> failures(kThreads);
    on_threads([&](int t) {
        auto fail = [&](const std::string &what) {
            if (failures[t].empty()) failures[t] = what + " (" + tl_last_error_message() + ")";
        };
        for (int round = 0; round < 3; ++round) {
            for (size_t j = 0; j <= count; ++j) {
                const size_t i = (j + size_t(t)) % (count + 1);
                const WeightRef &want = i < count ? expected[i] : owned_ref;
                const tl_weight *w = want.weight;
                if (i < count) {
                    if (tl_model_weight_at(model_, i, &w) != TL_OK || w != want.weight) fail("weight_at " + want.name);
                    const tl_weight *found = nullptr;
                    if (tl_model_find_weight(model_, want.name.c_str(), &found) != TL_OK || found != want.weight)
                        fail("find_weight " + want.name);
                }
                const WeightRef got = read_weight(w);
                if (got.info.k != want.info.k || got.info.n != want.info.n || got.info.group_size != want.info.group_size ||
                    got.info.bytes != want.info.bytes || got.name != want.name) {
                    fail("weight_info " + want.name);
                }
                if (got.values.size() != want.values.size() ||
                    std::memcmp(got.values.data(), want.values.data(), want.values.size() * sizeof(float)) != 0) {
                    fail("dequantize " + want.name);
                }
            }
            tl_model_properties props{};
            props.struct_size = sizeof props;
            if (tl_model_info(model_, &props) != TL_OK || props.n_quant_weights != props_.n_quant_weights ||
                props.parameter_count != props_.parameter_count || props.d_model != props_.d_model) {
                fail("model_info");
            }
        }
    });
    tl_weight_free(owned);
    for (int t = 0; t < kThreads; ++t) EXPECT_EQ(failures[t], "") << "thread " << t;
}

// ---- the log callback ----

struct LogSink {
    std::atomic<int> score_lines{0};    // the debug line each tl_score call writes
    std::atomic<int> wrong_pairing{0};  // called with another sink's user data: a torn (callback, user_data) pair
};
LogSink g_sink_a, g_sink_b;

void log_into(LogSink &expected, void *user_data, const char *message) {
    if (user_data != &expected) expected.wrong_pairing.fetch_add(1);
    if (message != nullptr && std::strncmp(message, "[score] ", 8) == 0) expected.score_lines.fetch_add(1);
}
void log_a(void *user_data, int32_t, const char *message) { log_into(g_sink_a, user_data, message); }
void log_b(void *user_data, int32_t, const char *message) { log_into(g_sink_b, user_data, message); }

TEST(ConcurrencyLog, CallbackSwapsRaceCallsThatLog) {
    ASSERT_EQ(tl_set_log_callback(log_a, &g_sink_a, TL_LOG_DEBUG), TL_OK);
    tl_model *model = nullptr;
    ASSERT_EQ(tl_model_load(TL_TEST_FIXTURE, nullptr, &model), TL_OK) << tl_last_error_message();
    const int32_t toks[4] = {1, 2, 3, 4};
    const auto score_once = [&] {
        const tl_score_options options = one_thread_cpu_options();
        tl_score_result result;
        tl_score_result_init(&result, sizeof result);
        return tl_score(model, toks, 4, &options, &result) == TL_OK ? std::string() : tl_last_error_message();
    };

    // Half the threads swap the callback (never to NULL, at debug or warning level), half score: each call writes one
    // debug line, which goes to at most one sink, and always with that sink's own user data.
    constexpr int kScoresPerThread = 5;
    std::vector<std::string> failures(kThreads);
    on_threads([&](int t) {
        for (int i = 0; i < 50; ++i) {
            if (t % 2 == 0) {
                const bool a = (i + t / 2) % 2 == 0;
                const tl_status s = tl_set_log_callback(a ? log_a : log_b, a ? &g_sink_a : &g_sink_b,
                                                        i % 3 == 0 ? TL_LOG_WARN : TL_LOG_DEBUG);
                if (s != TL_OK) failures[t] = tl_last_error_message();
            } else {
                int32_t value = -1;
                if (tl_get_dispatch(TL_DISPATCH_CUBLAS_MIN_M, &value) != TL_OK) failures[t] = tl_last_error_message();
                if (i % 10 == 0) {
                    const std::string failure = score_once();
                    if (!failure.empty()) failures[t] = failure;
                }
            }
        }
    });
    for (int t = 0; t < kThreads; ++t) EXPECT_EQ(failures[t], "") << "thread " << t;
    EXPECT_EQ(g_sink_a.wrong_pairing.load() + g_sink_b.wrong_pairing.load(), 0);
    const int raced = g_sink_a.score_lines.load() + g_sink_b.score_lines.load();
    EXPECT_LE(raced, kThreads / 2 * kScoresPerThread) << "a line was delivered twice";

    // Once the swaps are over, one call's line reaches the one callback set, exactly once.
    ASSERT_EQ(tl_set_log_callback(log_b, &g_sink_b, TL_LOG_DEBUG), TL_OK);
    const int before = g_sink_b.score_lines.load();
    EXPECT_EQ(score_once(), "");
    EXPECT_EQ(g_sink_b.score_lines.load(), before + 1);
    ASSERT_EQ(tl_set_log_callback(nullptr, nullptr, TL_LOG_ERROR), TL_OK);
    tl_model_free(model);
}

// ---- dispatcher settings on handles ----

// The NLL sum of scoring `tokens` on the CPU, or NaN with the error in `failure`.
double cpu_nll(const tl_model *model, const std::vector<int32_t> &tokens, std::string *failure = nullptr) {
    const tl_score_options options = one_thread_cpu_options();
    tl_score_result result;
    tl_score_result_init(&result, sizeof result);
    if (tl_score(model, tokens.data(), tokens.size(), &options, &result) != TL_OK) {
        if (failure != nullptr) *failure = tl_last_error_message();
        return std::nan("");
    }
    return result.nll_sum;
}

// A model whose looped block carries rounding channels, so that cross-iteration rounding, a setting the CPU backend
// honours, changes its scores.
tl_model *load_rounding_model() {
    tl_model *model = nullptr;
    EXPECT_EQ(tl_model_load(TL_TEST_ROUNDING_FIXTURE, nullptr, &model), TL_OK) << tl_last_error_message();
    return model;
}

const std::vector<int32_t> kRoundingTokens = {3, 17, 5, 28, 9, 0, 31, 12, 7, 22, 14, 1, 30, 8, 19, 4};

// Two models in one process with different settings, scored from several threads while other threads change the
// process-wide default: each scores as it does alone with its own settings.
TEST(ConcurrencySettings, TwoModelsKeepTheirOwnSettingsAcrossThreads) {
    tl_model *plain = load_rounding_model(), *rounded = load_rounding_model();
    ASSERT_NE(plain, nullptr);
    ASSERT_NE(rounded, nullptr);
    ASSERT_EQ(tl_model_set_dispatch(plain, TL_DISPATCH_CROSS_ITER_ROUND, 0), TL_OK);
    ASSERT_EQ(tl_model_set_dispatch(rounded, TL_DISPATCH_CROSS_ITER_ROUND, 1), TL_OK);
    const double want_plain = cpu_nll(plain, kRoundingTokens), want_rounded = cpu_nll(rounded, kRoundingTokens);
    ASSERT_NE(want_plain, want_rounded) << "cross-iteration rounding changed nothing: the test cannot tell";

    std::vector<std::string> failures(kThreads);
    on_threads([&](int t) {
        for (int i = 0; i < 10; ++i) {
            if (t >= kThreads - 2) {  // the default flips under the scoring threads
                if (tl_set_dispatch(TL_DISPATCH_CROSS_ITER_ROUND, (i + t) % 2) != TL_OK) {
                    failures[t] = tl_last_error_message();
                }
                continue;
            }
            const bool round = t % 2 == 1;
            std::string failure;
            const double got = cpu_nll(round ? rounded : plain, kRoundingTokens, &failure);
            if (!failure.empty()) failures[t] = failure;
            else if (got != (round ? want_rounded : want_plain)) failures[t] = "score " + std::to_string(got);
        }
    });
    for (int t = 0; t < kThreads; ++t) EXPECT_EQ(failures[t], "") << "thread " << t;
    ASSERT_EQ(tl_set_dispatch(TL_DISPATCH_CROSS_ITER_ROUND, 0), TL_OK);
    tl_model_free(plain);
    tl_model_free(rounded);
}

// The library reads no environment variable: the ones the tinyloop tool maps onto its model change nothing here.
TEST(ConcurrencySettings, EnvironmentVariablesChangeNothing) {
    const std::pair<const char *, const char *> variables[] = {
        {"TINYLOOP_USE_MARLIN", "0"},   {"TINYLOOP_EXPERIMENTAL_FP16_BODY", "1"}, {"TINYLOOP_CROSS_ITER_ROUND", "1"},
        {"TINYLOOP_MARLIN_MODE", "2"}, {"TINYLOOP_CUBLAS_MIN_M", "7"},           {"TINYLOOP_ATTENTION", "simt"}};
    for (const auto &[name, value] : variables) ASSERT_EQ(setenv(name, value, 1), 0);
    tl_model *model = load_rounding_model();
    ASSERT_NE(model, nullptr);
    const int32_t builtin[] = {1, 0, 0, 0, 512, 0};  // TL_DISPATCH_USE_MARLIN .. TL_DISPATCH_ATTENTION
    for (int32_t setting = 0; setting <= TL_DISPATCH_ATTENTION; ++setting) {
        int32_t value = -1;
        ASSERT_EQ(tl_model_get_dispatch(model, setting, &value), TL_OK);
        EXPECT_EQ(value, builtin[setting]) << "setting " << setting;
    }
    const double from_environment = cpu_nll(model, kRoundingTokens);
    ASSERT_EQ(tl_model_set_dispatch(model, TL_DISPATCH_CROSS_ITER_ROUND, 1), TL_OK);
    const double rounded = cpu_nll(model, kRoundingTokens);
    ASSERT_EQ(tl_model_set_dispatch(model, TL_DISPATCH_CROSS_ITER_ROUND, 0), TL_OK);
    EXPECT_EQ(from_environment, cpu_nll(model, kRoundingTokens));
    EXPECT_NE(from_environment, rounded) << "TINYLOOP_CROSS_ITER_ROUND=1 in the environment turned rounding on";
    for (const auto &[name, value] : variables) unsetenv(name);
    tl_model_free(model);
}

// ---- per-thread error messages ----

TEST_F(Concurrency, EachThreadReadsItsOwnErrorMessage) {
    // The largest weight, so that every short out_len below is short for it.
    const tl_weight *big = nullptr;
    ASSERT_EQ(tl_model_find_weight(model_, "pre.0.attn_qkv", &big), TL_OK) << tl_last_error_message();
    tl_weight_properties big_info{};
    big_info.struct_size = sizeof big_info;
    ASSERT_EQ(tl_weight_info(big, &big_info), TL_OK);
    const std::vector<int32_t> good_tokens = tokens(8);

    constexpr int kRounds = 20;
    constexpr int kKinds = 8;  // as many as threads: in each round every thread fails (or succeeds) differently
    ASSERT_LT(1000 + kRounds * kThreads, big_info.k * big_info.n);
    // What thread t's message must contain in round r: a string built around its own id, never another's.
    auto signature = [&](int t, int r) -> std::string {
        const int id = 1000 + r * kThreads + t;
        switch ((t + r) % kKinds) {
            case 0: return "tl-concurrency-" + std::to_string(id) + ".tinyloop";
            case 1: return "'tl-concurrency-" + std::to_string(id) + "'";
            case 2: return "out_len is " + std::to_string(id) + ",";
            case 3: return "= " + std::to_string(props_.vocab + id) + " is outside";
            case 4: return "window = " + std::to_string(props_.max_seq + id) + " is outside";
            case 5: return "got " + std::to_string(100 + id);
            case 6: return "weight index " + std::to_string(id) + " is out of range";
            default: return "";  // a successful call: the message is empty
        }
    };
    auto provoke = [&](int t, int r) -> tl_status {
        const int id = 1000 + r * kThreads + t;
        tl_score_options options = one_thread_cpu_options();
        tl_score_result result;
        tl_score_result_init(&result, sizeof result);
        switch ((t + r) % kKinds) {
            case 0: {
                tl_model *m = nullptr;
                const std::string path = "/nonexistent-tl-dir/tl-concurrency-" + std::to_string(id) + ".tinyloop";
                return tl_model_load(path.c_str(), nullptr, &m);
            }
            case 1: {
                const tl_weight *w = nullptr;
                return tl_model_find_weight(model_, ("tl-concurrency-" + std::to_string(id)).c_str(), &w);
            }
            case 2: {
                std::vector<float> out(static_cast<size_t>(id));
                return tl_weight_dequantize(big, out.data(), out.size());
            }
            case 3: {
                std::vector<int32_t> bad = good_tokens;
                bad[5] = props_.vocab + id;
                return tl_score(model_, bad.data(), bad.size(), &options, &result);
            }
            case 4:
                options.window = props_.max_seq + id;
                return tl_score(model_, good_tokens.data(), good_tokens.size(), &options, &result);
            case 5: return tl_set_log_callback(nullptr, nullptr, 100 + id);
            case 6: {
                const tl_weight *w = nullptr;
                return tl_model_weight_at(model_, size_t(id), &w);
            }
            default: {
                tl_model_properties p{};
                p.struct_size = sizeof p;
                return tl_model_info(model_, &p);
            }
        }
    };

    std::vector<std::string> failures(kThreads);
    Barrier step(kThreads);
    on_threads([&](int t) {
        for (int r = 0; r < kRounds; ++r) {
            const tl_status status = provoke(t, r);
            step.wait();  // every thread has now set its message; a shared one would hold just one of them
            const std::string message = tl_last_error_message();
            const std::string own = signature(t, r);
            if ((status == TL_OK) != own.empty()) {
                failures[t] = "round " + std::to_string(r) + ": status " + std::to_string(status) + " (" + message + ")";
            } else if (own.empty() ? !message.empty() : message.find(own) == std::string::npos) {
                failures[t] = "round " + std::to_string(r) + ": expected \"" + own + "\" in \"" + message + "\"";
            }
            for (int other = 0; other < kThreads; ++other) {
                const std::string theirs = signature(other, r);
                if (other != t && !theirs.empty() && message.find(theirs) != std::string::npos)
                    failures[t] = "round " + std::to_string(r) + ": read thread " + std::to_string(other) + "'s \"" +
                                  message + "\"";
            }
            step.wait();  // nobody starts the next round's call before all have read this round's message
        }
    });
    for (int t = 0; t < kThreads; ++t) EXPECT_EQ(failures[t], "") << "thread " << t;
}

}  // namespace
