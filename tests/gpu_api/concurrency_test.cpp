// The header's thread-safety promises on the GPU, through the C API: eight threads calling tl_quant_gemm on one
// shared weight through every dispatcher path (on one shared stream and on a stream each), and eight threads scoring
// one shared model with mixed CUDA-graph settings, progress callbacks and re-entrant calls. Every result is checked
// against the same work done by one thread, and the GEMMs against an FP64 reference too. Run under
// compute-sanitizer memcheck and racecheck by tools/gpu/device_check.sh.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "api_test_util.hpp"

using namespace apitest;

namespace {

constexpr int kThreads = 8;

// One GEMM problem of one thread: input, output, workspace, and the single-threaded result to match.
struct Call {
    Problem problem;
    std::vector<uint16_t> expected;  // the output of the same call made alone
};

// tl_quant_gemm with its own workspace (zero-filled once), the output poisoned first; returns the output.
std::vector<uint16_t> gemm(const tl_weight *w, const Problem &pr, void *stream, DeviceMemory &ws, size_t ws_bytes,
                           std::string *error) {
    DeviceMemory x(pr.x.size() * 2), y(pr.ref.size() * 2);
    std::vector<uint16_t> out(pr.ref.size(), 0xFFFF);
    auto cuda = [&](cudaError_t rc, const char *what) {
        if (rc != cudaSuccess && error->empty()) *error = std::string(what) + ": " + cudaGetErrorString(rc);
        return rc == cudaSuccess;
    };
    if (!cuda(x.ptr && y.ptr ? cudaSuccess : cudaErrorMemoryAllocation, "cudaMalloc")) return out;
    auto s = static_cast<cudaStream_t>(stream);
    cuda(cudaMemcpyAsync(x.ptr, pr.x.data(), pr.x.size() * 2, cudaMemcpyHostToDevice, s), "upload x");
    cuda(cudaMemsetAsync(y.ptr, 0xFF, pr.ref.size() * 2, s), "poison y");  // 0xFFFF is a NaN
    const tl_status st = tl_quant_gemm(w, x.ptr, y.ptr, pr.m, stream, ws.ptr, ws_bytes);
    if (st != TL_OK && error->empty()) *error = std::string("tl_quant_gemm: ") + tl_last_error_message();
    cuda(cudaMemcpyAsync(out.data(), y.ptr, out.size() * 2, cudaMemcpyDeviceToHost, s), "download y");
    cuda(cudaStreamSynchronize(s), "cudaStreamSynchronize");
    return out;
}

double relative_error(const std::vector<uint16_t> &out, const std::vector<double> &ref) {
    double num = 0, den = 0;
    for (size_t i = 0; i < out.size(); ++i) {
        const double v = tl::half_to_float(out[i]);
        if (!std::isfinite(v)) return std::nan("");
        num += (v - ref[i]) * (v - ref[i]);
        den += ref[i] * ref[i];
    }
    return std::sqrt(num / den);
}

// Largest difference between two FP16 outputs relative to the reference's RMS (0 = bitwise equal). Measured against
// the output's scale, not per element: the correction form rounds its symmetric product to FP16 before adding the
// correction, so an output that nearly cancels carries the rounding of a much larger intermediate.
double max_difference(const std::vector<uint16_t> &a, const std::vector<uint16_t> &b, const std::vector<double> &ref) {
    double worst = 0, sum_sq = 0;
    for (double r : ref) sum_sq += r * r;
    const double rms = std::sqrt(sum_sq / static_cast<double>(ref.size()));
    for (size_t i = 0; i < a.size(); ++i) {
        if (a[i] == b[i]) continue;
        const double x = tl::half_to_float(a[i]), y = tl::half_to_float(b[i]);
        if (!std::isfinite(x) || !std::isfinite(y)) return INFINITY;
        worst = std::max(worst, std::fabs(x - y) / rms);
    }
    return worst;
}

// How many times each thread repeats its calls (TL_STRESS_REPEATS; the sanitizer runs use 1).
int repeats() {
    const char *text = std::getenv("TL_STRESS_REPEATS");
    const int n = text != nullptr ? std::atoi(text) : 0;
    return n > 0 ? n : 3;
}

struct StressCase {
    Path path;
    bool shared_stream;
};

class QuantGemmStress : public ::testing::TestWithParam<StressCase> {};

// Eight threads, one shared weight, the same path for all (the dispatcher settings are process-wide), each thread
// with its own workspace and a sequence of M values that takes the Marlin-class path's several kernels.
TEST_P(QuantGemmStress, EightThreadsMatchOneThread) {
    const StressCase c = GetParam();
    WeightPtr w = random_weight(1024, 768, 128);
    ASSERT_TRUE(w);
    tl_pack_report report;
    pack(w.get(), kAllForms, &report);
    ASSERT_EQ(report.weights_packed, 1u);
    select(c.path);
    const int ms[] = {1, 16, 17, 48, 130};
    constexpr int kCallsPerThread = 5;

    // The single-threaded run: every call of every thread, one after another on one stream.
    std::vector<std::vector<Call>> calls(kThreads);
    size_t ws_bytes = 0;
    for (int m : ms) {
        size_t need = 0;
        TL_OK_(tl_quant_gemm_workspace_size(w.get(), m, &need));
        ws_bytes = std::max(ws_bytes, need);
    }
    void *alone_stream = nullptr;
    TL_OK_(tl_stream_create(0, &alone_stream));
    {
        DeviceMemory ws(ws_bytes);
        CUDA_OK(cudaMemset(ws.ptr, 0, ws_bytes));
        for (int t = 0; t < kThreads; ++t) {
            for (int i = 0; i < kCallsPerThread; ++i) {
                Call call{make_problem(w.get(), ms[(t + i) % 5]), {}};
                std::string error;
                call.expected = gemm(w.get(), call.problem, alone_stream, ws, ws_bytes, &error);
                ASSERT_EQ(error, "");
                ASSERT_LE(relative_error(call.expected, call.problem.ref), 2e-3) << "m=" << call.problem.m;
                calls[t].push_back(std::move(call));
            }
        }
    }
    const tl_dispatch_counts before = counts_of(w.get());

    void *shared = nullptr;
    TL_OK_(tl_stream_create(0, &shared));
    std::vector<std::string> errors(kThreads);
    std::vector<double> worst_diff(kThreads, 0), worst_error(kThreads, 0);
    const int reps = repeats();
    std::vector<std::vector<uint8_t>> workspace_after(kThreads);
    std::vector<std::thread> threads;
    std::atomic<int> ready{0};
    for (int t = 0; t < kThreads; ++t) {
        threads.emplace_back([&, t] {
            void *stream = shared;
            if (!c.shared_stream && tl_stream_create(0, &stream) != TL_OK) {
                errors[t] = tl_last_error_message();
                return;
            }
            DeviceMemory ws(ws_bytes);
            if (ws_bytes > 0 && (ws.ptr == nullptr || cudaMemset(ws.ptr, 0, ws_bytes) != cudaSuccess)) {
                errors[t] = "workspace";
                return;
            }
            ready.fetch_add(1);
            while (ready.load() < kThreads) std::this_thread::yield();  // start together
            for (int rep = 0; rep < reps; ++rep) {
                for (const Call &call : calls[t]) {
                    const std::vector<uint16_t> out = gemm(w.get(), call.problem, stream, ws, ws_bytes, &errors[t]);
                    worst_diff[t] = std::max(worst_diff[t], max_difference(out, call.expected, call.problem.ref));
                    const double e = relative_error(out, call.problem.ref);
                    worst_error[t] = std::isnan(e) ? INFINITY : std::max(worst_error[t], e);
                }
            }
            workspace_after[t].resize(ws_bytes);
            if (ws_bytes > 0) cudaMemcpy(workspace_after[t].data(), ws.ptr, ws_bytes, cudaMemcpyDeviceToHost);
            if (!c.shared_stream) tl_stream_destroy(stream);
        });
    }
    for (auto &th : threads) th.join();
    tl_stream_destroy(shared);
    tl_stream_destroy(alone_stream);

    const tl_dispatch_counts after = counts_of(w.get());
    // The counters region's size: the whole workspace of a fused-only weight of the same shape at M = 1.
    size_t counters = 0;
    {
        WeightPtr fused_only = random_weight(1024, 768, 128);
        pack(fused_only.get(), TL_FORM_MARLIN_FUSED, &report);
        select(Path::Fused);
        TL_OK_(tl_quant_gemm_workspace_size(fused_only.get(), 1, &counters));
        ASSERT_GT(counters, 0u);
    }
    const uint64_t total = static_cast<uint64_t>(kThreads) * kCallsPerThread * reps;
    // Paths that reduce in a fixed order are bitwise reproducible; the Marlin-class kernels sum a tile cut across
    // blocks in arrival order (FP32 atomics), so theirs may differ by a rounding of a few outputs (measured on the
    // H200: up to 4 FP16 ulps fused, up to 128 ulps on a near-cancelling output of the correction form).
    // Another call's data in a thread's scratch would be differences of the order of the RMS itself.
    const bool deterministic = c.path == Path::Native || c.path == Path::Cublas || c.path == Path::Fp16Body;
    for (int t = 0; t < kThreads; ++t) {
        SCOPED_TRACE("thread " + std::to_string(t));
        EXPECT_EQ(errors[t], "");
        EXPECT_LE(worst_error[t], 2e-3);
        if (deterministic) {
            EXPECT_EQ(worst_diff[t], 0.0) << "not bitwise equal to the single-threaded result";
        } else {
            EXPECT_LE(worst_diff[t], 1e-2);
        }
        // The workspace's counters are zero again once the calls' work is done (the header's contract).
        size_t dirty = 0;
        for (size_t i = 0; i < std::min(counters, workspace_after[t].size()); ++i) dirty += workspace_after[t][i] != 0;
        EXPECT_EQ(dirty, 0u) << "counter bytes left non-zero";
    }
    // Paths whose M rule excludes some M (cuBLAS from M = 1 here, so none) still count every call.
    EXPECT_EQ(counter(after, c.path) - counter(before, c.path), total) << path_name(c.path);
    EXPECT_EQ(after.fallbacks, before.fallbacks);
    std::printf("%s, %s: worst difference from one thread %.2e of the RMS, worst relative error %.2e\n",
                path_name(c.path), c.shared_stream ? "one shared stream" : "a stream per thread",
                *std::max_element(worst_diff.begin(), worst_diff.end()),
                *std::max_element(worst_error.begin(), worst_error.end()));
}

INSTANTIATE_TEST_SUITE_P(
    EveryPath, QuantGemmStress,
    ::testing::Values(StressCase{Path::Native, true}, StressCase{Path::Native, false}, StressCase{Path::Fused, true},
                      StressCase{Path::Fused, false}, StressCase{Path::Correction, true},
                      StressCase{Path::Correction, false}, StressCase{Path::Cublas, true},
                      StressCase{Path::Cublas, false}, StressCase{Path::Fp16Body, true},
                      StressCase{Path::Fp16Body, false}),
    [](const ::testing::TestParamInfo<StressCase> &i) {
        std::string name = path_name(i.param.path);
        for (char &ch : name) ch = ch == '-' ? '_' : ch;
        return name + (i.param.shared_stream ? "_shared_stream" : "_own_streams");
    });

// What one tl_score call produced.
struct Scored {
    tl_status status = TL_OK;
    std::string error;
    tl_score_result result{};
    std::vector<float> nll;
};

Scored score(const tl_model *model, const std::vector<int32_t> &tokens, int32_t window, int32_t graphs,
             tl_progress_fn progress = nullptr, void *user = nullptr) {
    Scored s;
    s.nll.assign(tokens.size() - 1, NAN);
    tl_score_options o;
    tl_score_options_init(&o, sizeof o);
    o.backend = TL_BACKEND_CUDA;
    o.window = window;
    o.use_graphs = graphs;
    o.token_nll = s.nll.data();
    o.token_nll_len = s.nll.size();
    o.progress = progress;
    o.progress_user_data = user;
    tl_score_result_init(&s.result, sizeof s.result);
    s.status = tl_score(model, tokens.data(), tokens.size(), &o, &s.result);
    if (s.status != TL_OK) s.error = tl_last_error_message();
    return s;
}

uint64_t gemms(const tl_score_result &r) {
    return r.gemm_marlin_fused + r.gemm_marlin_correction + r.gemm_dequant_cublas + r.gemm_fp16_body + r.gemm_native;
}

// A progress callback that scores a short sequence on the same model from inside the callback (re-entrant), once.
struct Reentry {
    const tl_model *model;
    std::vector<int32_t> tokens;
    Scored inner;
    bool done = false;
    static int32_t callback(void *user, uint64_t, uint64_t) {
        auto *r = static_cast<Reentry *>(user);
        if (!r->done) {
            r->done = true;
            r->inner = score(r->model, r->tokens, 0, 1);
        }
        return 0;
    }
};

// Eight threads score one shared model (the fixture) with windows of several lengths, graphs on for half of them,
// progress callbacks that call tl_score re-entrantly on the same model: every call succeeds, its NLLs match the same
// call made alone, and the GEMM counts it reports are its own (those of the same call alone), not a neighbour's.
TEST(ScoreStress, EightThreadsShareOneModel) {
    tl_model *model = nullptr;
    TL_OK_(tl_model_load(TL_TEST_FIXTURE, nullptr, &model));
    tl_model_properties props;
    props.struct_size = sizeof props;
    TL_OK_(tl_model_info(model, &props));
    std::vector<int32_t> tokens(300);
    std::uniform_int_distribution<int32_t> token(0, props.vocab - 1);
    for (int32_t &v : tokens) v = token(rng());
    const int32_t windows[] = {0, 57, 100};

    std::vector<Scored> alone;
    for (int32_t window : windows) {
        alone.push_back(score(model, tokens, window, 0));
        ASSERT_EQ(alone.back().status, TL_OK) << alone.back().error;
        ASSERT_GT(gemms(alone.back().result), 0u);
    }
    const Scored short_alone = score(model, std::vector<int32_t>(tokens.begin(), tokens.begin() + 40), 0, 0);
    ASSERT_EQ(short_alone.status, TL_OK);

    std::vector<std::string> errors(kThreads);
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
        threads.emplace_back([&, t] {
            for (int rep = 0; rep <= repeats(); ++rep) {
                const size_t which = static_cast<size_t>(t + rep) % 3;
                Reentry reentry{model, std::vector<int32_t>(tokens.begin(), tokens.begin() + 40), {}, false};
                const bool with_callback = (t + rep) % 2 == 0;
                const Scored s = score(model, tokens, windows[which], (t + rep / 2) % 2,
                                       with_callback ? &Reentry::callback : nullptr, &reentry);
                const Scored &want = alone[which];
                std::string e;
                if (s.status != TL_OK) e = "tl_score: " + s.error;
                else if (std::fabs(s.result.nll_sum - want.result.nll_sum) > 1e-5 * std::fabs(want.result.nll_sum))
                    e = "nll_sum " + std::to_string(s.result.nll_sum) + " vs " + std::to_string(want.result.nll_sum);
                else if (s.result.n_windows != want.result.n_windows) e = "n_windows differ";
                else if (gemms(s.result) != gemms(want.result) ||
                         s.result.gemm_dense_cublas != want.result.gemm_dense_cublas ||
                         s.result.gemm_fallbacks != 0)
                    e = "GEMM counts " + std::to_string(gemms(s.result)) + " vs " + std::to_string(gemms(want.result));
                for (size_t i = 0; e.empty() && i < want.nll.size(); ++i) {
                    if (!(std::fabs(s.nll[i] - want.nll[i]) <= 1e-3)) e = "token " + std::to_string(i + 1) + " NLL";
                }
                if (e.empty() && with_callback) {
                    if (!reentry.done) e = "the progress callback never ran";
                    else if (reentry.inner.status != TL_OK) e = "re-entrant tl_score: " + reentry.inner.error;
                    else if (std::fabs(reentry.inner.result.nll_sum - short_alone.result.nll_sum) >
                             1e-5 * std::fabs(short_alone.result.nll_sum))
                        e = "re-entrant tl_score's result differs";
                }
                if (!e.empty() && errors[t].empty()) errors[t] = "rep " + std::to_string(rep) + ": " + e;
            }
        });
    }
    for (auto &th : threads) th.join();
    for (int t = 0; t < kThreads; ++t) EXPECT_EQ(errors[t], "") << "thread " << t;
    tl_model_free(model);
}

// Two models in one process with different dispatcher settings, scored on the GPU from eight threads at once while
// the process-wide default flips: one runs every INT4 GEMM on the native kernel, the other on the Marlin-class kernel
// and the SIMT attention, and each call's results and GEMM counts are those of the same call alone.
TEST(ScoreStress, TwoModelsKeepTheirOwnSettings) {
    tl_model *native = nullptr, *marlin = nullptr;
    TL_OK_(tl_model_load(TL_TEST_FIXTURE, nullptr, &native));
    TL_OK_(tl_model_load(TL_TEST_FIXTURE, nullptr, &marlin));
    TL_OK_(tl_model_set_dispatch(native, TL_DISPATCH_USE_MARLIN, 0));
    TL_OK_(tl_model_set_dispatch(marlin, TL_DISPATCH_USE_MARLIN, 1));
    TL_OK_(tl_model_set_dispatch(marlin, TL_DISPATCH_CUBLAS_MIN_M, 0));
    TL_OK_(tl_model_set_dispatch(marlin, TL_DISPATCH_ATTENTION, 1));
    tl_model_properties props;
    props.struct_size = sizeof props;
    TL_OK_(tl_model_info(native, &props));
    std::vector<int32_t> tokens(200);
    std::uniform_int_distribution<int32_t> token(0, props.vocab - 1);
    for (int32_t &v : tokens) v = token(rng());
    const Scored native_alone = score(native, tokens, 0, 1), marlin_alone = score(marlin, tokens, 0, 1);
    ASSERT_EQ(native_alone.status, TL_OK) << native_alone.error;
    ASSERT_EQ(marlin_alone.status, TL_OK) << marlin_alone.error;
    ASSERT_GT(native_alone.result.gemm_native, 0u);
    ASSERT_EQ(native_alone.result.gemm_marlin_fused + native_alone.result.gemm_marlin_correction, 0u);
    ASSERT_EQ(marlin_alone.result.gemm_native, 0u);
    ASSERT_GT(marlin_alone.result.gemm_marlin_fused + marlin_alone.result.gemm_marlin_correction, 0u);

    std::vector<std::string> errors(kThreads);
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
        threads.emplace_back([&, t] {
            for (int rep = 0; rep <= repeats(); ++rep) {
                if (t == kThreads - 1) {  // the process-wide default flips under the others
                    tl_set_dispatch(TL_DISPATCH_USE_MARLIN, rep % 2);
                    continue;
                }
                const bool use_native = (t + rep) % 2 == 0;
                const Scored s = score(use_native ? native : marlin, tokens, 0, rep % 2);
                const Scored &want = use_native ? native_alone : marlin_alone;
                std::string e;
                if (s.status != TL_OK) e = "tl_score: " + s.error;
                else if (std::fabs(s.result.nll_sum - want.result.nll_sum) > 1e-5 * std::fabs(want.result.nll_sum))
                    e = "nll_sum " + std::to_string(s.result.nll_sum) + " vs " + std::to_string(want.result.nll_sum);
                else if (s.result.gemm_native != want.result.gemm_native ||
                         s.result.gemm_marlin_fused != want.result.gemm_marlin_fused ||
                         s.result.gemm_marlin_correction != want.result.gemm_marlin_correction)
                    e = "GEMM paths differ from the model's own settings";
                if (!e.empty() && errors[t].empty()) errors[t] = "rep " + std::to_string(rep) + ": " + e;
            }
        });
    }
    for (auto &th : threads) th.join();
    for (int t = 0; t < kThreads; ++t) EXPECT_EQ(errors[t], "") << "thread " << t;
    TL_OK_(tl_set_dispatch(TL_DISPATCH_USE_MARLIN, 1));
    tl_model_free(native);
    tl_model_free(marlin);
}

}  // namespace

int main(int argc, char **argv) { return run_gpu_tests(argc, argv, "GPU concurrency tests"); }
