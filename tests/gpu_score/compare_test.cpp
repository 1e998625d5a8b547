// The comparison and top-k kernels (cuda/forward/compare.cu) against the host reductions in double
// (score/compare.hpp) on the same FP16 logits, and compare_cuda / score_cuda's top-k against the CPU backend on a
// dense synthetic model and its INT4 quantization.
//
// Tolerances: the kernels are FP32 over FP16 inputs, so against the double reduction of the same inputs a KL or NLL
// differs by float rounding only (1e-4 absolute plus 1e-4 relative covers sums over 50257 terms). Against the CPU
// backend the GPU rounds every GEMM input and output to FP16 (score_test.cpp: NLLs within 0.02 nats per position);
// KL, a difference of two such distributions, is then within 0.02 nats per position as well, and top-1 agreement
// may flip only at near-ties.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cpu/cpu_forward.hpp"
#include "forward/forward_kernels.hpp"
#include "gpu/gpu_forward.hpp"
#include "import/synthetic.hpp"
#include "score/compare.hpp"
#include "test_util.hpp"
#include "util/half.hpp"

namespace {

using tl::float_to_half;
using tl::half_to_float;
using tlt::DeviceArray;
using tlt::launched;
using tlt::random_half;
using tlt::upload_guarded;
using tlt::rng;

std::vector<float> row_floats(const std::vector<uint16_t> &logits, size_t row, int ld, int V) {
    std::vector<float> out(V);
    for (int v = 0; v < V; ++v) out[v] = half_to_float(logits[row * ld + v]);
    return out;
}

TEST(Kernels, CompareLogits) {
    for (int V : {256, 50257}) {
        for (int rows : {1, 5, 40}) {
            const int ld_r = (V / 64 + 1) * 64, ld_t = V;  // one padded chunk, one not
            SCOPED_TRACE("V=" + std::to_string(V) + " rows=" + std::to_string(rows));
            std::vector<uint16_t> ref = random_half(static_cast<size_t>(rows) * ld_r, 3.0);
            std::vector<uint16_t> test(static_cast<size_t>(rows) * ld_t);
            const std::vector<uint16_t> noise = random_half(test.size(), 0.3);
            for (int r = 0; r < rows; ++r) {
                for (int v = 0; v < ld_r; ++v) {
                    if (v >= V) ref[static_cast<size_t>(r) * ld_r + v] = float_to_half(60000.0f);  // ignored padding
                }
                for (int v = 0; v < V; ++v) {
                    const float base = half_to_float(ref[static_cast<size_t>(r) * ld_r + v]);
                    // Row 0 identical (KL exactly 0), the others perturbed.
                    const float shift = r == 0 ? 0.0f : half_to_float(noise[static_cast<size_t>(r) * ld_t + v]);
                    test[static_cast<size_t>(r) * ld_t + v] = float_to_half(base + shift);
                }
            }
            std::uniform_int_distribution<int32_t> pick(0, V - 1);
            std::vector<int32_t> targets(rows);
            for (auto &t : targets) t = pick(rng());
            DeviceArray<uint16_t> d_ref(ref.size()), d_test(test.size());
            DeviceArray<int32_t> d_targets(targets.size());
            DeviceArray<float> kl(rows), nll_r(rows), nll_t(rows);
            DeviceArray<uint8_t> match(rows);
            ASSERT_TRUE(upload_guarded(d_ref, ref) && upload_guarded(d_test, test) && upload_guarded(d_targets, targets));
            ASSERT_TRUE(kl.ok() && nll_r.ok() && nll_t.ok() && match.ok());
            CUDA_OK(kl.poison(0xFF));
            CUDA_OK(nll_r.poison(0xFF));
            CUDA_OK(nll_t.poison(0xFF));
            CUDA_OK(match.poison(0x7F));
            ASSERT_TRUE(launched(tl::gpu::compare_logits(d_ref.get(), ld_r, d_test.get(), ld_t, rows, V,
                                                         d_targets.get(), kl.get(), nll_r.get(), nll_t.get(),
                                                         match.get(), nullptr)));
            std::vector<float> got_kl, got_r, got_t;
            std::vector<uint8_t> got_match;
            CUDA_OK(kl.download(got_kl));
            CUDA_OK(nll_r.download(got_r));
            CUDA_OK(nll_t.download(got_t));
            CUDA_OK(match.download(got_match));
            EXPECT_TRUE(kl.guard_intact() && nll_r.guard_intact() && nll_t.guard_intact() && match.guard_intact());
            for (int r = 0; r < rows; ++r) {
                const std::vector<float> a = row_floats(ref, r, ld_r, V), b = row_floats(test, r, ld_t, V);
                const tl::CompareRow want = tl::compare_row(a.data(), b.data(), V, targets[r]);
                ASSERT_LE(std::fabs(got_kl[r] - want.kl), 1e-4 + 1e-4 * want.kl) << "row " << r;
                ASSERT_LE(std::fabs(got_r[r] - want.nll_reference), 1e-4 + 1e-6 * want.nll_reference) << "row " << r;
                ASSERT_LE(std::fabs(got_t[r] - want.nll_test), 1e-4 + 1e-6 * want.nll_test) << "row " << r;
                ASSERT_EQ(got_match[r], want.top1_match ? 1 : 0) << "row " << r;
                if (r == 0) {
                    ASSERT_EQ(got_kl[r], 0.0f);
                }
            }
        }
    }
}

TEST(Kernels, TopK) {
    for (int V : {256, 50257}) {
        for (int k : {1, 7, 20}) {
            const int rows = 9, ld = (V / 64 + 1) * 64;
            SCOPED_TRACE("V=" + std::to_string(V) + " k=" + std::to_string(k));
            std::vector<uint16_t> logits = random_half(static_cast<size_t>(rows) * ld, 2.0);
            for (int r = 0; r < rows; ++r) {
                uint16_t *l = logits.data() + static_cast<size_t>(r) * ld;
                for (int v = V; v < ld; ++v) l[v] = float_to_half(60000.0f);  // padding: never among the top
                if (r == 1) std::fill(l, l + V, float_to_half(0.5f));          // all tied: the lowest ids
                if (r == 2) l[V - 1] = l[3] = float_to_half(20.0f);            // a tie at the top
            }
            DeviceArray<uint16_t> d_logits(logits.size());
            DeviceArray<int32_t> ids(static_cast<size_t>(rows) * k);
            DeviceArray<float> logprobs(static_cast<size_t>(rows) * k);
            ASSERT_TRUE(upload_guarded(d_logits, logits) && ids.ok() && logprobs.ok());
            CUDA_OK(ids.poison(0xFF));
            CUDA_OK(logprobs.poison(0xFF));
            ASSERT_TRUE(launched(tl::gpu::head_top_k(d_logits.get(), ld, rows, V, k, ids.get(), logprobs.get(),
                                                     nullptr)));
            std::vector<int32_t> got_ids;
            std::vector<float> got_lp;
            CUDA_OK(ids.download(got_ids));
            CUDA_OK(logprobs.download(got_lp));
            EXPECT_TRUE(ids.guard_intact() && logprobs.guard_intact());
            for (int r = 0; r < rows; ++r) {
                const std::vector<float> l = row_floats(logits, r, ld, V);
                const double mx = *std::max_element(l.begin(), l.end());
                double sum = 0;
                for (float x : l) sum += std::exp(x - mx);
                std::vector<int32_t> want_ids(k);
                std::vector<float> want_lp(k);
                tl::top_k_row(l.data(), V, k, mx + std::log(sum), want_ids.data(), want_lp.data());
                for (int j = 0; j < k; ++j) {
                    ASSERT_EQ(got_ids[static_cast<size_t>(r) * k + j], want_ids[j]) << "row " << r << " rank " << j;
                    ASSERT_NEAR(got_lp[static_cast<size_t>(r) * k + j], want_lp[j], 1e-4) << "row " << r;
                }
            }
        }
    }
    DeviceArray<uint16_t> d_logits(256);
    DeviceArray<int32_t> ids(21);
    DeviceArray<float> logprobs(21);
    EXPECT_EQ(tl::gpu::head_top_k(d_logits.get(), 256, 1, 256, 21, ids.get(), logprobs.get(), nullptr),
              tl::gpu::kRcBadArgument);
}

tl::ModelConfig small_config() {
    tl::ModelConfig c;
    c.d_model = 64, c.n_heads = 4, c.head_dim = 16, c.ffn = 128, c.vocab = 256;
    c.pre = 1, c.loops = 2, c.max_seq = 96, c.group_size = 32;
    return c;
}

// A dense synthetic model and its INT4 twin (same draws), each on the host and on the GPU.
class GpuCompare : public ::testing::Test {
protected:
    static void SetUpTestSuite() {
        tl::SyntheticOptions options;
        options.seed = rng()();
        options.quantized = false;
        dense_ = tl::make_synthetic_model(small_config(), options).release();
        options.quantized = true;
        int4_ = tl::make_synthetic_model(small_config(), options).release();
        gpu_dense_ = new tl::GpuModel(*dense_, 0);
        gpu_int4_ = new tl::GpuModel(*int4_, 0);
    }
    static void TearDownTestSuite() {
        delete gpu_dense_;
        delete gpu_int4_;
        delete dense_;
        delete int4_;
    }

    struct Run {
        std::vector<float> kl, nll_r, nll_t;
        std::vector<uint8_t> match;
        tl::CompareOutputs out() { return {kl.data(), nll_r.data(), nll_t.data(), match.data()}; }
        explicit Run(size_t n) : kl(n, NAN), nll_r(n, NAN), nll_t(n, NAN), match(n, 7) {}
    };

    static tl::Model *dense_, *int4_;
    static tl::GpuModel *gpu_dense_, *gpu_int4_;
};
tl::Model *GpuCompare::dense_ = nullptr;
tl::Model *GpuCompare::int4_ = nullptr;
tl::GpuModel *GpuCompare::gpu_dense_ = nullptr;
tl::GpuModel *GpuCompare::gpu_int4_ = nullptr;

TEST_F(GpuCompare, MatchesCpu) {
    std::uniform_int_distribution<int32_t> pick(0, small_config().vocab - 1);
    std::vector<int32_t> tokens(300);
    for (auto &t : tokens) t = pick(rng());
    const size_t n = tokens.size() - 1;
    for (const bool graphs : {false, true}) {
        SCOPED_TRACE(graphs ? "graphs" : "eager");
        tl::ScoreOptions options;
        options.use_graphs = graphs;
        options.window = 64;
        options.pass_tokens = 100;  // several passes, windows packed
        Run cpu(n), gpu(n);
        const tl::ScoreResult c = tl::compare_cpu(*dense_, *int4_, tokens.data(), tokens.size(), options,
                                                  tl::default_dispatch_settings(), cpu.out());
        const tl::ScoreResult g = tl::compare_cuda(*gpu_dense_, *gpu_int4_, tokens.data(), tokens.size(), options,
                                                   tl::default_dispatch_settings(), 0, nullptr, gpu.out());
        EXPECT_EQ(g.n_windows, c.n_windows);
        EXPECT_EQ(g.tokens_scored, n);
        size_t flips = 0;
        for (size_t i = 0; i < n; ++i) {
            ASSERT_NEAR(gpu.kl[i], cpu.kl[i], 0.02) << "position " << i;
            ASSERT_NEAR(gpu.nll_r[i], cpu.nll_r[i], 0.02) << "position " << i;
            ASSERT_NEAR(gpu.nll_t[i], cpu.nll_t[i], 0.02) << "position " << i;
            ASSERT_LE(gpu.match[i], 1) << "position " << i;
            flips += gpu.match[i] != cpu.match[i];
        }
        EXPECT_LE(flips, n / 50) << "top-1 agreement differs at " << flips << " of " << n << " positions";
        const tl::CompareStats sc = tl::summarize_comparison(cpu.kl.data(), cpu.nll_r.data(), cpu.nll_t.data(),
                                                             cpu.match.data(), n);
        const tl::CompareStats sg = tl::summarize_comparison(gpu.kl.data(), gpu.nll_r.data(), gpu.nll_t.data(),
                                                             gpu.match.data(), n);
        EXPECT_NEAR(sg.kl_mean, sc.kl_mean, 0.005 + 0.05 * sc.kl_mean);
        EXPECT_GT(sc.kl_mean, 0.0);
    }
}

TEST_F(GpuCompare, AgainstItselfIsExactlyZero) {
    std::uniform_int_distribution<int32_t> pick(0, small_config().vocab - 1);
    std::vector<int32_t> tokens(150);
    for (auto &t : tokens) t = pick(rng());
    Run run(tokens.size() - 1);
    tl::ScoreOptions options;
    tl::compare_cuda(*gpu_int4_, *gpu_int4_, tokens.data(), tokens.size(), options, tl::default_dispatch_settings(), 0,
                     nullptr, run.out());
    std::vector<float> nll(tokens.size() - 1);
    options.token_nll = nll.data();
    tl::score_cuda(*gpu_int4_, tokens.data(), tokens.size(), options, 0, nullptr);
    for (size_t i = 0; i < run.kl.size(); ++i) {
        ASSERT_EQ(run.kl[i], 0.0f) << "position " << i;
        ASSERT_EQ(run.match[i], 1) << "position " << i;
        ASSERT_EQ(run.nll_r[i], run.nll_t[i]) << "position " << i;
        ASSERT_NEAR(run.nll_r[i], nll[i], 1e-5) << "position " << i;  // the same head, the same NLL kernel math
    }
}

TEST_F(GpuCompare, TopKMatchesCpu) {
    std::uniform_int_distribution<int32_t> pick(0, small_config().vocab - 1);
    std::vector<int32_t> tokens(200);
    for (auto &t : tokens) t = pick(rng());
    const int k = 6;
    // The CPU's 20 best per position: a GPU rank may hold a token that is near-tied with the CPU's k-th best but
    // just outside the CPU's k.
    const int k_cpu = 20;
    const size_t n = tokens.size() - 1;
    std::vector<int32_t> cpu_ids(n * k_cpu), gpu_ids(n * k, -1);
    std::vector<float> cpu_lp(n * k_cpu), gpu_lp(n * k, NAN);
    tl::ScoreOptions options;
    options.window = 64;
    options.top_k = k_cpu;
    options.top_ids = cpu_ids.data();
    options.top_logprobs = cpu_lp.data();
    tl::score_cpu(*int4_, tokens.data(), tokens.size(), options);
    options.top_k = k;
    options.top_ids = gpu_ids.data();
    options.top_logprobs = gpu_lp.data();
    options.use_graphs = true;
    tl::score_cuda(*gpu_int4_, tokens.data(), tokens.size(), options, 0, nullptr);
    for (size_t i = 0; i < n; ++i) {
        const auto cpu_first = cpu_ids.begin() + i * k_cpu, cpu_last = cpu_first + k_cpu;
        for (int j = 0; j < k; ++j) {
            const size_t at = i * k + j;
            ASSERT_NEAR(gpu_lp[at], cpu_lp[i * k_cpu + j], 0.02) << "position " << i << " rank " << j;
            // Ranks may swap only between near-tied tokens: the GPU's token has nearly the same log-probability on
            // the CPU.
            const auto found = std::find(cpu_first, cpu_last, gpu_ids[at]);
            ASSERT_NE(found, cpu_last) << "position " << i << " rank " << j;
            ASSERT_NEAR(cpu_lp[i * k_cpu + (found - cpu_first)], gpu_lp[at], 0.02) << "position " << i << " rank " << j;
        }
    }
    // The batch form: each sequence's positions after the previous one's, as token_nll.
    options.window = 0;  // batches take no window
    const tl::Sequence sequences[2] = {{tokens.data(), 30, 5}, {tokens.data() + 30, 40, 0}};
    std::vector<int32_t> batch_ids(68 * k);
    std::vector<float> batch_lp(68 * k);
    options.top_ids = batch_ids.data();
    options.top_logprobs = batch_lp.data();
    tl::SequenceScore scores[2];
    tl::score_batch_cuda(*gpu_int4_, sequences, 2, options, 0, nullptr, scores);
    std::vector<int32_t> alone_ids(39 * k);
    std::vector<float> alone_lp(39 * k);
    options.top_ids = alone_ids.data();
    options.top_logprobs = alone_lp.data();
    tl::score_cuda(*gpu_int4_, tokens.data() + 30, 40, options, 0, nullptr);
    for (size_t i = 0; i < alone_ids.size(); ++i) {
        ASSERT_EQ(batch_ids[29 * k + i], alone_ids[i]) << i;
        ASSERT_NEAR(batch_lp[29 * k + i], alone_lp[i], 1e-5) << i;
    }
}

}  // namespace
