// The CPU forward pass, piece by piece and as a whole NLL, against the float64 reference (reference.hpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "cpu/cpu_forward.hpp"
#include "util/error.hpp"
#include "score/rope.hpp"
#include "quant/quant.hpp"
#include "reference.hpp"
#include "import/synthetic.hpp"

namespace {

// Every element within `rel` of the largest reference magnitude (FP32 accumulation against double).
void expect_close(const std::vector<float> &got, const ref::Vec &want, double rel, const std::string &what) {
    ASSERT_EQ(got.size(), want.size()) << what;
    double scale = 0.0;
    for (double w : want) scale = std::max(scale, std::fabs(w));
    ASSERT_GT(scale, 0.0) << what;
    for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], rel * scale) << what << " element " << i;
}

ref::Vec to_double(const std::vector<float> &v) { return ref::Vec(v.begin(), v.end()); }

}  // namespace

TEST(Forward, RmsNormMatchesReference) {
    const uint64_t seed = ref::fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937_64 rng(seed);
    const int32_t T = 7, d = 80;
    const std::vector<float> x = ref::random_floats(rng, static_cast<size_t>(T) * d, 3.0);
    std::vector<float> gain = ref::random_floats(rng, d, 0.2);
    for (float &g : gain) g += 1.0f;
    std::vector<float> y(x.size());
    tl::rmsnorm(x.data(), gain.data(), y.data(), T, d, 1e-5f);
    expect_close(y, ref::rmsnorm(to_double(x), gain, T, d, 1e-5), 1e-6, "rmsnorm");
}

TEST(Forward, RopeMatchesReference) {
    const uint64_t seed = ref::fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937_64 rng(seed);
    const int32_t T = 50, H = 3, hd = 16;
    for (int32_t pos0 : {0, 1000}) {
        const std::vector<float> x = ref::random_floats(rng, static_cast<size_t>(T) * H * hd);
        std::vector<float> got = x;
        tl::rope_inplace(got.data(), T, H, hd, 10000.0f, pos0);
        ref::Vec want = to_double(x);
        ref::rope(want, H * hd, 0, T, H, hd, 10000.0, pos0);
        expect_close(got, want, 1e-6, "rope pos0 " + std::to_string(pos0));
        if (pos0 == 0) {  // position 0 is the identity
            for (int32_t i = 0; i < H * hd; ++i) EXPECT_EQ(got[i], x[i]);
        }
    }
}

TEST(Forward, CausalAttentionMatchesReference) {
    const uint64_t seed = ref::fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937_64 rng(seed);
    const int32_t T = 150, H = 3, hd = 16;  // T spans several query blocks
    const std::vector<float> qkv = ref::random_floats(rng, static_cast<size_t>(T) * 3 * H * hd, 1.5);
    const ref::Vec want = ref::attention(to_double(qkv), T, H, hd);
    for (int32_t threads : {1, 3}) {
        std::vector<float> out(static_cast<size_t>(T) * H * hd);
        tl::causal_attention(qkv.data(), out.data(), T, H, hd, threads);
        expect_close(out, want, 1e-5, "attention, threads " + std::to_string(threads));
    }
}

// Grouped-query attention: 6 query heads over 2 K/V heads (and 1, multi-query), read in place.
TEST(Forward, GroupedQueryAttentionMatchesReference) {
    const uint64_t seed = ref::fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937_64 rng(seed);
    const int32_t T = 90, H = 6, hd = 16;
    for (int32_t kv : {2, 1, 6}) {
        const std::vector<float> qkv = ref::random_floats(rng, static_cast<size_t>(T) * (H + 2 * kv) * hd, 1.5);
        const ref::Vec want = ref::attention(to_double(qkv), T, H, hd, kv);
        for (int32_t threads : {1, 3}) {
            std::vector<float> out(static_cast<size_t>(T) * H * hd);
            tl::causal_attention(qkv.data(), out.data(), T, H, hd, threads, kv);
            expect_close(out, want, 1e-5, "kv heads " + std::to_string(kv) + ", threads " + std::to_string(threads));
        }
    }
    std::vector<float> buf(static_cast<size_t>(T) * 20 * hd);
    EXPECT_THROW(tl::causal_attention(buf.data(), buf.data(), T, H, hd, 1, 4), tl::Error);
}

TEST(Forward, LinearMatchesReferenceQuantizedAndDense) {
    const uint64_t seed = ref::fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937_64 rng(seed);
    struct Shape {
        int32_t M, K, N, group_size;
    };
    // N not a multiple of the column tile and M not a multiple of the row block exercise the edges.
    for (const Shape s : {Shape{1, 64, 37, 32}, Shape{13, 96, 70, 32}, Shape{6, 128, 33, 0}, Shape{9, 256, 100, 64}}) {
        const std::vector<float> w = ref::random_floats(rng, static_cast<size_t>(s.K) * s.N, 1.0 / std::sqrt(s.K));
        const std::vector<float> x = ref::random_floats(rng, static_cast<size_t>(s.M) * s.K);
        auto quantized = [&](const char *name, tl::QuantMethod method) {
            return tl::make_quantized_linear(name, tl::quantize_minmax(w.data(), s.K, s.N, s.group_size, method));
        };
        const tl::Linear linears[3] = {quantized("asym", tl::QuantMethod::Asymmetric),
                                       quantized("sym", tl::QuantMethod::Symmetric),
                                       tl::make_dense_linear("dense", w.data(), s.K, s.N)};
        for (const tl::Linear &lin : linears) {
            const ref::Vec want = ref::linear(lin, to_double(x), s.M);
            for (int32_t threads : {1, 2, 3}) {
                std::vector<float> y(static_cast<size_t>(s.M) * s.N, NAN);
                tl::linear_forward(lin, x.data(), y.data(), s.M, threads);
                expect_close(y, want, 1e-5,
                             lin.name + " M " + std::to_string(s.M) + " K " + std::to_string(s.K) + " N " +
                                 std::to_string(s.N) + " threads " + std::to_string(threads));
            }
        }
    }
}

namespace {

struct NllCase {
    const char *name;
    bool quantized;
    tl::QuantMethod method;
    bool quantize_head;
    int32_t group_size;
    int32_t window;  // 0 = max_seq
    bool biases = false;
    tl::RopeScaling rope = {};
    int32_t kv_heads = 0;  // 0: n_heads
};

tl::RopeScaling rope_scaling(tl::RopeScalingType type) {
    tl::RopeScaling r;
    r.type = type;
    r.factor = type == tl::RopeScalingType::Linear ? 2.0 : 4.0;
    r.original_max_positions = 128;  // the models' max_seq: dynamic is then plain RoPE
    r.low_freq_factor = 1.0;
    r.high_freq_factor = 4.0;
    r.attention_factor = 1.1386294361119891;  // 0.1 ln 4 + 1
    return r;
}

void expect_nll_matches_reference(const NllCase &c, uint64_t seed) {
    SCOPED_TRACE(std::string(c.name) + ", seed " + std::to_string(seed));
    tl::ModelConfig config = ref::small_config(128);
    config.loops = 3;
    config.group_size = c.group_size;
    config.rope_scaling = c.rope;
    config.n_kv_heads = c.kv_heads;
    tl::SyntheticOptions options;
    options.seed = seed;
    options.quantized = c.quantized;
    options.method = c.method;
    options.quantize_head = c.quantize_head;
    options.biases = c.biases;
    const std::unique_ptr<tl::Model> model = tl::make_synthetic_model(config, options);

    std::mt19937_64 rng(seed);
    const std::vector<int32_t> tokens = ref::random_tokens(rng, 100, config.vocab);
    std::vector<float> token_nll(tokens.size() - 1, NAN);
    tl::ScoreOptions score_options;
    score_options.window = c.window;
    score_options.token_nll = token_nll.data();
    const tl::ScoreResult got = tl::score_cpu(*model, tokens.data(), tokens.size(), score_options);

    const ref::Vec want = ref::sequence_nll(*model, tokens, c.window ? c.window : config.max_seq);
    ASSERT_EQ(want.size(), tokens.size() - 1);
    double want_sum = 0.0;
    for (double v : want) want_sum += v;
    EXPECT_EQ(got.tokens_scored, tokens.size() - 1);
    EXPECT_LE(std::fabs(got.nll_sum - want_sum), 1e-4 * std::fabs(want_sum)) << got.nll_sum << " vs " << want_sum;
    for (size_t i = 0; i < want.size(); ++i)
        EXPECT_LE(std::fabs(token_nll[i] - want[i]), 1e-4 * std::max(1.0, std::fabs(want[i]))) << "position " << i;
}

}  // namespace

// The one host function of both backends' RoPE against transformers' formulas as the reference writes them, on
// the shapes and parameters of real checkpoints (Llama 3.1, Qwen2.5 with YaRN, DeepSeek's mscale, ...).
TEST(Rope, FrequenciesMatchTheReference) {
    struct Case {
        const char *name;
        int32_t head_dim;
        float theta;
        tl::RopeScaling r;
    };
    auto make = [](tl::RopeScalingType type, double factor, int32_t original) {
        tl::RopeScaling r;
        r.type = type;
        r.factor = factor;
        r.original_max_positions = original;
        return r;
    };
    std::vector<Case> cases = {
        {"plain", 128, 10000.0f, {}},
        {"linear x2", 64, 10000.0f, make(tl::RopeScalingType::Linear, 2.0, 0)},
        {"dynamic", 128, 10000.0f, make(tl::RopeScalingType::Dynamic, 2.0, 4096)},
        {"llama3.1 8B", 128, 500000.0f, make(tl::RopeScalingType::Llama3, 8.0, 8192)},
        {"llama3.2 1B", 64, 500000.0f, make(tl::RopeScalingType::Llama3, 32.0, 8192)},
        {"qwen2.5 yarn x4", 128, 1000000.0f, make(tl::RopeScalingType::Yarn, 4.0, 32768)},
        {"yarn untruncated", 96, 10000.0f, make(tl::RopeScalingType::Yarn, 8.0, 4096)},
        {"yarn one-dim ramp", 16, 10000.0f, make(tl::RopeScalingType::Yarn, 2.0, 64)},
    };
    cases[3].r.low_freq_factor = cases[4].r.low_freq_factor = 1.0;
    cases[3].r.high_freq_factor = cases[4].r.high_freq_factor = 4.0;
    cases[5].r.attention_factor = 0.1 * std::log(4.0) + 1.0;
    cases[6].r.truncate = false;
    cases[6].r.beta_fast = 16.0;
    cases[6].r.beta_slow = 2.0;
    cases[6].r.attention_factor = 1.3;
    for (const Case &c : cases) {
        SCOPED_TRACE(c.name);
        tl::ModelConfig config;
        config.head_dim = c.head_dim;
        config.rope_theta = c.theta;
        config.rope_scaling = c.r;
        const tl::RopeFrequencies got = tl::rope_frequencies(config);
        const ref::RopeAngles want = ref::rope_angles(config);
        ASSERT_EQ(got.inv_freq.size(), want.inv_freq.size());
        size_t scaled = 0;
        for (size_t i = 0; i < want.inv_freq.size(); ++i) {
            const double w = static_cast<double>(want.inv_freq[i]);
            EXPECT_NEAR(got.inv_freq[i], w, 1e-13 * w) << "pair " << i;
            scaled += std::fabs(w - std::pow(static_cast<double>(c.theta), -2.0 * i / c.head_dim)) > 1e-9 * w;
        }
        EXPECT_NEAR(got.attention_scale, static_cast<double>(want.scale), 1e-15);
        // Each scaling changes some frequencies (dynamic, inside its range, none).
        const bool changes = c.r.type != tl::RopeScalingType::None && c.r.type != tl::RopeScalingType::Dynamic;
        EXPECT_EQ(scaled > 0, changes) << scaled << " frequencies scaled";
        // The tables: cos and sin of position * inv_freq, times the scale, rounded once.
        std::vector<float> cos_table, sin_table;
        tl::rope_tables(config, 3, 1000, cos_table, sin_table);
        const size_t half = got.inv_freq.size();
        ASSERT_EQ(cos_table.size(), 3 * half);
        for (size_t i = 0; i < half; ++i) {
            const long double angle = 1002.0L * want.inv_freq[i];
            EXPECT_NEAR(cos_table[2 * half + i], static_cast<double>(want.scale * std::cos(angle)), 2e-6) << i;
            EXPECT_NEAR(sin_table[2 * half + i], static_cast<double>(want.scale * std::sin(angle)), 2e-6) << i;
        }
    }
}

TEST(Forward, WholeNllMatchesReference) {
    const uint64_t seed = ref::fresh_seed();
    const NllCase cases[] = {
        {"asymmetric g32, tied head, one window", true, tl::QuantMethod::Asymmetric, false, 32, 0},
        {"asymmetric g32, windows of 24", true, tl::QuantMethod::Asymmetric, false, 32, 24},
        {"symmetric per row, quantized head", true, tl::QuantMethod::Symmetric, true, 0, 0},
        {"dense, windows of 40", false, tl::QuantMethod::Asymmetric, false, 0, 40},
        {"asymmetric g32, biases on every linear, quantized head", true, tl::QuantMethod::Asymmetric, true, 32, 0,
         true},
        {"dense, biases on every linear, windows of 40", false, tl::QuantMethod::Asymmetric, false, 0, 40, true},
        {"linear RoPE scaling", true, tl::QuantMethod::Asymmetric, false, 32, 0, false,
         rope_scaling(tl::RopeScalingType::Linear)},
        {"dynamic RoPE scaling", true, tl::QuantMethod::Asymmetric, false, 32, 0, false,
         rope_scaling(tl::RopeScalingType::Dynamic)},
        {"llama3 RoPE scaling, windows of 24", true, tl::QuantMethod::Asymmetric, false, 32, 24, false,
         rope_scaling(tl::RopeScalingType::Llama3)},
        {"yarn RoPE scaling", false, tl::QuantMethod::Asymmetric, true, 0, 0, false,
         rope_scaling(tl::RopeScalingType::Yarn)},
        {"grouped-query attention, 2 K/V heads, windows of 24", true, tl::QuantMethod::Asymmetric, false, 32, 24,
         false, {}, 2},
        {"multi-query attention, biases, llama3 RoPE", false, tl::QuantMethod::Asymmetric, true, 0, 0, true,
         rope_scaling(tl::RopeScalingType::Llama3), 1},
    };
    for (const NllCase &c : cases) expect_nll_matches_reference(c, seed);
}
