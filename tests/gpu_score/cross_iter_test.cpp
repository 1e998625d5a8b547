// Cross-iteration rounding on the GPU: each iteration's FP16 weight, dequantized from the codes and the rounding
// channels on the device, against the host's cross_iter_linear (every element, exactly), for single weights (padded K,
// act-order) and for two weights stored as one (gate|up); and score_cuda with the setting on against score_cpu.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "cpu/cpu_forward.hpp"
#include "gpu/device_weight.hpp"
#include "gpu/device_weight_layout.hpp"
#include "gpu/gpu_forward.hpp"
#include "import/synthetic.hpp"
#include "quant/cross_iter.hpp"
#include "quant/quant.hpp"
#include "reference.hpp"
#include "test_util.hpp"
#include "util/half.hpp"

namespace {

using tlt::rng;

struct Channels {
    bool frac4 = false, sign_bit = false;
};

std::string channels_name(Channels c) {
    return std::string(c.frac4 ? "frac4" : "") + (c.frac4 && c.sign_bit ? "+" : "") + (c.sign_bit ? "sign_bit" : "");
}

// w's codes, scales and zeros with random rounding channels (the rule reads the channels alone, whatever weights they
// came from) and, when `permute`, a random act-order K permutation.
tl::Linear with_channels(const tl::Linear &w, Channels c, bool permute) {
    std::uniform_int_distribution<int> byte(0, 255);
    tl::QuantizedMatrix m;
    m.k = w.k, m.n = w.n, m.group_size = w.group_size;
    const size_t groups = static_cast<size_t>(w.n) * w.n_groups();
    m.codes.assign(w.codes, w.codes + static_cast<size_t>(w.n) * w.k / 2);
    m.scales.assign(w.scales, w.scales + groups);
    m.zeros.assign(w.zeros, w.zeros + groups);
    if (c.frac4) {
        m.frac4.resize(m.codes.size());
        for (auto &b : m.frac4) b = static_cast<uint8_t>(byte(rng()));
    }
    if (c.sign_bit) {
        m.sign_bit.resize(static_cast<size_t>(w.n) * w.k / 8);
        for (auto &b : m.sign_bit) b = static_cast<uint8_t>(byte(rng()));
    }
    if (permute) {
        m.k_perm.resize(static_cast<size_t>(w.k));
        std::iota(m.k_perm.begin(), m.k_perm.end(), 0);
        std::shuffle(m.k_perm.begin(), m.k_perm.end(), rng());
    } else if (w.k_perm != nullptr) {
        m.k_perm.assign(w.k_perm, w.k_perm + w.k);
    }
    tl::Linear out = tl::make_quantized_linear(w.name, std::move(m));
    out.bias = w.bias;
    return out;
}

tl::Linear random_int4(const std::string &name, int32_t k, int32_t n, int32_t group_size) {
    std::normal_distribution<float> normal(0.0f, 0.05f);
    std::vector<float> w(static_cast<size_t>(k) * n);
    for (auto &v : w) v = normal(rng());
    return tl::make_quantized_linear(name,
                                     tl::quantize_minmax(w.data(), k, n, group_size, tl::QuantMethod::Asymmetric));
}

// Row nn of iteration `iteration`'s weight as the device holds it: FP16 of q'·s + z (one FP32 fma), q' the code
// cross_iter_linear gives, in w's stored K order; `kp` columns, zero codes past w.k.
void expected_rows(const tl::Linear &w, int32_t iteration, int32_t loops, int32_t kp, std::vector<uint16_t> &out,
                   size_t row0) {
    const tl::Linear it = tl::cross_iter_linear(w, iteration, loops);
    const int32_t gs = w.group_size;
    for (int32_t nn = 0; nn < w.n; ++nn) {
        for (int32_t kk = 0; kk < kp; ++kk) {
            const int32_t g = std::min(kk, w.k - 1) / gs;
            const float s = tl::half_to_float(w.scales[static_cast<size_t>(nn) * w.n_groups() + g]);
            const float z = tl::half_to_float(w.zeros[static_cast<size_t>(nn) * w.n_groups() + g]);
            // Padding groups: zero scale and zero (a per-row weight's one group spans the padding instead).
            if (kk >= w.k && gs != w.k) {
                out[(row0 + nn) * kp + kk] = tl::float_to_half(0.0f);
                continue;
            }
            const float q = kk < w.k ? static_cast<float>(tl::code_at(it, kk, nn)) : 0.0f;
            out[(row0 + nn) * kp + kk] = tl::float_to_half(std::fma(q, s, z));
        }
    }
}

// Every iteration's device weight of `parts` (one weight, or two stored as one) equals the host's.
void check_iterations(const std::vector<const tl::Linear *> &parts, int32_t loops) {
    const tl::Linear joined = parts.size() == 1 ? *parts[0] : tl::concat_linear_rows(*parts[0], *parts[1], "joined");
    const auto dw = tl::pack_weight(joined, 0, nullptr, tl::PackForms{}, nullptr);
    tl::attach_rounding_channels(*dw, *parts[0], parts.size() == 2 ? parts[1] : nullptr, nullptr);
    ASSERT_TRUE(tl::has_rounding_channels(*dw));
    const int32_t kp = dw->k_padded, np = dw->n_padded;
    tlt::DeviceArray<uint16_t> out(static_cast<size_t>(np) * kp);
    ASSERT_TRUE(out.ok());
    size_t moved = 0;
    std::vector<uint16_t> plain;
    for (int32_t iteration = 0; iteration < loops; ++iteration) {
        SCOPED_TRACE("iteration " + std::to_string(iteration) + " of " + std::to_string(loops));
        CUDA_OK(out.poison(0xFF));  // NaN halves wherever the kernel does not write
        tl::dequantize_weight_iteration(*dw, iteration, loops, out.get(), nullptr);
        CUDA_OK(cudaDeviceSynchronize());
        ASSERT_TRUE(out.guard_intact());
        std::vector<uint16_t> got;
        CUDA_OK(out.download(got));
        std::vector<uint16_t> want(got.size(), 0);
        size_t row0 = 0;
        for (const tl::Linear *p : parts) {
            expected_rows(*p, iteration, loops, kp, want, row0);
            row0 += static_cast<size_t>(p->n);
        }
        for (size_t i = 0; i < static_cast<size_t>(joined.n) * kp; ++i) {
            ASSERT_EQ(got[i], want[i]) << "row " << i / kp << " column " << i % kp;
        }
        if (iteration == 0) {
            tl::dequantize_weight(*dw, out.get(), nullptr);
            CUDA_OK(cudaDeviceSynchronize());
            CUDA_OK(out.download(plain));
        }
        for (size_t i = 0; i < static_cast<size_t>(joined.n) * kp; ++i) moved += got[i] != plain[i];
    }
    // With one iteration round(|r̂|) is 0 for every cell: nothing moves.
    if (loops == 1) {
        EXPECT_EQ(moved, 0u);
    } else {
        EXPECT_GT(moved, 0u) << "no iteration moved a code: the channels were not read";
    }
}

TEST(CrossIterGpu, IterationWeightsEqualTheHosts) {
    for (Channels c : {Channels{true, false}, Channels{false, true}, Channels{true, true}}) {
        SCOPED_TRACE(channels_name(c));
        // Group 64, a K the device pads (200 -> 256) on a per-row weight, act-order.
        const tl::Linear grouped = with_channels(random_int4("grouped", 256, 192, 64), c, false);
        const tl::Linear padded = with_channels(random_int4("padded", 200, 128, 200), c, false);
        const tl::Linear permuted = with_channels(random_int4("permuted", 256, 128, 32), c, true);
        for (int32_t loops : {1, 3, 4}) {
            check_iterations({&grouped}, loops);
            check_iterations({&padded}, loops);
            check_iterations({&permuted}, loops);
        }
        // gate|up: the second weight's rows follow the rule with their own row numbers.
        const tl::Linear gate = with_channels(random_int4("gate", 128, 192, 32), c, false);
        const tl::Linear up = with_channels(random_int4("up", 128, 192, 32), c, false);
        check_iterations({&gate, &up}, 4);
    }
}

// score_cuda with cross-iteration rounding on: within the parity bounds of score_cpu with it on, on models whose
// looped linears carry each kind of channel (qkv act-order too; gate and up stored as one), eager and with graphs,
// a window per pass and packed; and nearer to it than to the CPU's result with rounding off.
TEST(CrossIterGpu, ScoreMatchesCpu) {
    tl::ModelConfig config = ref::small_config(128);
    config.loops = 4;
    tl::SyntheticOptions synthetic;
    synthetic.seed = rng()();
    const auto base = tl::make_synthetic_model(config, synthetic);
    std::uniform_int_distribution<int32_t> token(0, config.vocab - 1);
    std::vector<int32_t> tokens(300);
    for (auto &t : tokens) t = token(rng());
    const size_t n = tokens.size() - 1;
    for (Channels c : {Channels{true, false}, Channels{false, true}, Channels{true, true}}) {
        SCOPED_TRACE(channels_name(c));
        tl::Model model = *base;
        for (int l = 0; l < 5; ++l) *model.loop.linear(l) = with_channels(*base->loop.linear(l), c, l == 0);
        std::vector<float> rounded(n), plain(n);
        tl::ScoreOptions cpu;
        cpu.window = 128;
        cpu.token_nll = rounded.data();
        cpu.dispatch[tl::DispatchSetting::CrossIterRound] = 1;
        const double rounded_sum = tl::score_cpu(model, tokens.data(), tokens.size(), cpu).nll_sum;
        cpu.token_nll = plain.data();
        cpu.dispatch[tl::DispatchSetting::CrossIterRound] = 0;
        tl::score_cpu(model, tokens.data(), tokens.size(), cpu);

        tl::GpuModel gm(model, 0);
        for (bool graphs : {false, true}) {
            for (int32_t pass_tokens : {128, 0}) {
                SCOPED_TRACE("graphs " + std::to_string(graphs) + " pass_tokens " + std::to_string(pass_tokens));
                std::vector<float> gpu(n, NAN);
                tl::ScoreOptions o;
                o.window = 128;
                o.pass_tokens = pass_tokens;
                o.use_graphs = graphs;
                o.token_nll = gpu.data();
                o.dispatch[tl::DispatchSetting::CrossIterRound] = 1;
                const double gpu_sum = tl::score_cuda(gm, tokens.data(), tokens.size(), o, 0, nullptr).nll_sum;
                double to_rounded = 0.0, to_plain = 0.0;
                for (size_t i = 0; i < n; ++i) {
                    ASSERT_NEAR(gpu[i], rounded[i], 0.02) << "position " << i;
                    to_rounded += std::fabs(gpu[i] - rounded[i]);
                    to_plain += std::fabs(gpu[i] - plain[i]);
                }
                EXPECT_NEAR(gpu_sum, rounded_sum, 0.0025 * std::fabs(rounded_sum));
                EXPECT_LT(to_rounded, 0.5 * to_plain) << "the GPU's result is not nearer the rounded CPU result";
            }
        }
    }
}

}  // namespace
