// Cross-iteration rounding: the per-iteration codes follow the rule docs/quality.md states, their average is
// closer to the unquantized weight than plain rounding, and the CPU forward pass applies them per iteration; the
// GPU kernels' copy of the rule (cuda/cross_iter_rule.hpp) gives the same codes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "cpu/cpu_forward.hpp"
#include "cross_iter_rule.hpp"
#include "quant/cross_iter.hpp"
#include "gptq_test_util.hpp"
#include "quant/quant.hpp"
#include "reference.hpp"
#include "import/synthetic.hpp"

namespace {

enum class Channels { Frac4, SignBit, Both };

const char *channels_name(Channels c) {
    return c == Channels::Frac4 ? "frac4" : c == Channels::SignBit ? "sign_bit" : "both";
}

// The rule as docs/quality.md writes it, in double: r̂ from frac4 (the centre of its 1/16 bucket, minus 1/2)
// or else ±1/4 from sign_bit; the cell takes one step toward r̂ on round(loops·|r̂|) iterations, those with
// (i + n + k) mod loops below that count.
int documented_code(const tl::Linear &w, int32_t nn, int32_t kk, int32_t iteration, int32_t loops) {
    const size_t at = static_cast<size_t>(nn) * w.k + kk;
    const int q = tl::code_at(w, kk, nn);
    double r;
    if (w.frac4 != nullptr) {
        r = (((w.frac4[at / 2] >> ((kk % 2) * 4)) & 0xF) + 0.5) / 16.0 - 0.5;
    } else {
        r = ((w.sign_bit[at / 8] >> (kk % 8)) & 1) ? -0.25 : 0.25;
    }
    const int moves = static_cast<int>(std::floor(loops * std::abs(r) + 0.5));
    if ((iteration + nn + kk) % loops >= moves) return q;
    return std::clamp(q + (r < 0 ? -1 : 1), 0, 15);
}

tl::Linear with_channels(const std::vector<float> &w, int32_t k, int32_t n, int32_t group, Channels c) {
    tl::QuantizedMatrix m = tl::quantize_minmax(w.data(), k, n, group, tl::QuantMethod::Asymmetric);
    tl::add_rounding_channels(w.data(), m, c != Channels::SignBit, c != Channels::Frac4);
    return tl::make_quantized_linear("loop.test", std::move(m));
}

TEST(CrossIter, CodesFollowTheDocumentedRule) {
    const uint64_t seed = gptq_test::fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937_64 rng(seed);
    const int32_t k = 64, n = 24;
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> w(static_cast<size_t>(k) * n);
    for (float &v : w) v = normal(rng);
    for (Channels c : {Channels::Frac4, Channels::SignBit, Channels::Both}) {
        const tl::Linear lin = with_channels(w, k, n, 16, c);
        for (int32_t loops : {1, 2, 3, 4, 7, 8}) {
            for (int32_t i = 0; i < loops; ++i) {
                const tl::Linear it = tl::cross_iter_linear(lin, i, loops);
                ASSERT_EQ(it.frac4, nullptr);
                ASSERT_EQ(it.sign_bit, nullptr);
                ASSERT_EQ(it.scales, lin.scales);
                for (int32_t nn = 0; nn < n; ++nn)
                    for (int32_t kk = 0; kk < k; ++kk) {
                        ASSERT_EQ(tl::code_at(it, kk, nn), documented_code(lin, nn, kk, i, loops))
                            << channels_name(c) << " loops " << loops << " iteration " << i << " n " << nn << " k "
                            << kk;
                    }
            }
        }
    }
}

// The property the path exists for: averaged over the loop, the weights come closer to the FP weights.
TEST(CrossIter, AverageOverIterationsIsCloserToTheWeight) {
    const uint64_t seed = gptq_test::fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937_64 rng(seed);
    const int32_t k = 128, n = 64;
    std::normal_distribution<float> normal(0.0f, 0.1f);
    std::vector<float> w(static_cast<size_t>(k) * n);
    for (float &v : w) v = normal(rng);
    for (Channels c : {Channels::Frac4, Channels::SignBit, Channels::Both}) {
        const tl::Linear lin = with_channels(w, k, n, 32, c);
        std::vector<float> plain(w.size()), one(w.size());
        tl::dequantize_rows(lin, 0, n, plain.data());
        for (int32_t loops : {3, 4, 8}) {
            std::vector<double> average(w.size(), 0.0);
            for (int32_t i = 0; i < loops; ++i) {
                tl::dequantize_rows(tl::cross_iter_linear(lin, i, loops), 0, n, one.data());
                for (size_t j = 0; j < w.size(); ++j) average[j] += one[j] / static_cast<double>(loops);
            }
            double plain_sq = 0.0, average_sq = 0.0;
            for (size_t j = 0; j < w.size(); ++j) {
                plain_sq += (plain[j] - static_cast<double>(w[j])) * (plain[j] - w[j]);
                average_sq += (average[j] - w[j]) * (average[j] - w[j]);
            }
            const double ratio = std::sqrt(average_sq / plain_sq);
            SCOPED_TRACE(std::string(channels_name(c)) + " loops " + std::to_string(loops));
            RecordProperty(std::string(channels_name(c)) + "_loops" + std::to_string(loops), std::to_string(ratio));
            // Expected about 0.3 (3 loops) to 0.15 (8) with frac4, 0.5-0.6 with sign_bit alone.
            EXPECT_LT(ratio, c == Channels::SignBit ? 0.7 : 0.4);
        }
    }
}

tl::ModelConfig loop_config(int32_t loops) {
    tl::ModelConfig c = ref::small_config(64);
    c.loops = loops;
    return c;
}

std::unique_ptr<tl::Model> model_with_channels(uint64_t seed, int32_t loops, bool channels) {
    tl::SyntheticOptions options;
    options.seed = seed;
    options.frac4 = channels;
    options.sign_bit = channels;
    return tl::make_synthetic_model(loop_config(loops), options);
}

double nll_sum(const tl::Model &model, const std::vector<int32_t> &tokens, bool cross_iter) {
    tl::ScoreOptions options;
    options.dispatch[tl::DispatchSetting::CrossIterRound] = cross_iter ? 1 : 0;
    options.window = 48;  // several windows
    return tl::score_cpu(model, tokens.data(), tokens.size(), options).nll_sum;
}

// The looped block's iteration i is the block the documented rule gives for i: scoring with the path equals
// scoring a model that unrolls the loop into unique blocks built by the test, bit for bit.
TEST(CrossIter, ForwardPassUsesEachIterationsCodes) {
    const uint64_t seed = gptq_test::fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    const int32_t loops = 3;
    const auto model = model_with_channels(seed, loops, true);
    tl::Model unrolled = *model;
    unrolled.config.pre += loops;
    unrolled.config.loops = 0;
    for (int32_t i = 0; i < loops; ++i) {
        tl::Block b = model->loop;
        for (int l = 0; l < 5; ++l) {
            const tl::Linear &src = *model->loop.linear(l);
            tl::QuantizedMatrix m;
            m.k = src.k, m.n = src.n, m.group_size = src.group_size;
            m.codes.assign(static_cast<size_t>(src.n) * src.k / 2, 0);
            for (int32_t nn = 0; nn < src.n; ++nn)
                for (int32_t kk = 0; kk < src.k; ++kk) {
                    m.codes[(static_cast<size_t>(nn) * src.k + kk) / 2] |=
                        static_cast<uint8_t>(documented_code(src, nn, kk, i, loops) << ((kk % 2) * 4));
                }
            const size_t groups = static_cast<size_t>(src.n) * src.n_groups();
            m.scales.assign(src.scales, src.scales + groups);
            m.zeros.assign(src.zeros, src.zeros + groups);
            *b.linear(l) = tl::make_quantized_linear(src.name, std::move(m));
        }
        unrolled.pre.push_back(std::move(b));
    }
    const std::vector<int32_t> tokens = gptq_test::text_tokens("data/demo.txt");
    const std::vector<int32_t> text(tokens.begin(), tokens.begin() + 200);
    const double with_path = nll_sum(*model, text, true);
    EXPECT_EQ(with_path, nll_sum(unrolled, text, false));
    EXPECT_NE(with_path, nll_sum(*model, text, false));
}

// Without channels there is nothing to dither, and with one loop iteration round(|r̂|) is 0 for every cell.
TEST(CrossIter, ChangesNothingWithoutChannelsOrWithOneLoop) {
    const uint64_t seed = gptq_test::fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    const std::vector<int32_t> tokens = gptq_test::text_tokens("data/demo.txt");
    const std::vector<int32_t> text(tokens.begin(), tokens.begin() + 120);
    const auto plain = model_with_channels(seed, 3, false);
    EXPECT_EQ(nll_sum(*plain, text, true), nll_sum(*plain, text, false));
    const auto one_loop = model_with_channels(seed, 1, true);
    EXPECT_EQ(nll_sum(*one_loop, text, true), nll_sum(*one_loop, text, false));
}

// The GPU's copy of the rule against the CPU's, on every input they can meet: every code, every residual frac4 or a
// sign bit gives, phases past several periods, and loop counts 1-9.
TEST(CrossIter, GpuRuleIsTheCpuRule) {
    std::vector<int32_t> residuals{-8, 8};
    for (int32_t f = 0; f < 16; ++f) residuals.push_back(tl::cross_iter_residual32(f, true, false));
    for (int32_t f = 0; f < 16; ++f) {
        for (bool sign : {false, true}) {
            ASSERT_EQ(tl::gpu::cross_iter_residual32(f, true, sign), tl::cross_iter_residual32(f, true, sign));
            ASSERT_EQ(tl::gpu::cross_iter_residual32(f, false, sign), tl::cross_iter_residual32(f, false, sign));
        }
    }
    size_t moved = 0;
    for (int32_t loops = 1; loops <= 9; ++loops) {
        for (int32_t iteration = 0; iteration < loops; ++iteration) {
            for (int32_t q = 0; q < 16; ++q) {
                for (int32_t r : residuals) {
                    for (int32_t nn : {0, 1, 5, 4095, 28671}) {
                        for (int32_t kk : {0, 3, 7, 127, 8191}) {
                            const uint32_t gpu = tl::gpu::cross_iter_code(static_cast<uint32_t>(q), r, nn, kk,
                                                                          iteration, loops);
                            const uint8_t cpu =
                                tl::cross_iter_code(static_cast<uint8_t>(q), r, nn, kk, iteration, loops);
                            ASSERT_EQ(gpu, cpu) << "q " << q << " r32 " << r << " nn " << nn << " kk " << kk
                                                << " iteration " << iteration << " of " << loops;
                            moved += gpu != static_cast<uint32_t>(q);
                        }
                    }
                }
            }
        }
    }
    EXPECT_GT(moved, 0u);  // the inputs do exercise the moves
}

}  // namespace
