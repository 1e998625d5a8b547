// Quantized activations on the CPU (cpu/act_quant.hpp): the e4m3 rounding against the format's value table, the
// per-row quantizers and the linear layer against a scalar spelling-out of the rule in docs/quality.md, bit for bit;
// and the shipped demo model's perplexity with INT8 and FP8 activations.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfenv>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cpu/act_quant.hpp"
#include "cpu/cpu_forward.hpp"
#include "format/format.hpp"
#include "quant/quant.hpp"
#include "../common/tl_error.hpp"
#include "reference.hpp"
#include "util/error.hpp"
#include "util/half.hpp"

namespace {

using tl::ActivationMode;

// Every non-negative e4m3fn value, in code order (code = exponent << 3 | mantissa; 0x7F is NaN): subnormals m * 2^-9,
// normals (1 + m/8) * 2^(e-7).
std::vector<float> e4m3_values() {
    std::vector<float> v;
    for (int code = 0; code < 0x7F; ++code) {
        const int e = code >> 3, m = code & 7;
        v.push_back(e == 0 ? std::ldexp(static_cast<float>(m), -9) : std::ldexp(1.0f + m / 8.0f, e - 7));
    }
    return v;
}

// The nearest e4m3 value by searching the table: ties to the even code, beyond 448 saturated.
float nearest_e4m3(float x) {
    static const std::vector<float> table = e4m3_values();
    const float a = std::fabs(x);
    size_t best = 0;
    for (size_t i = 1; i < table.size(); ++i) {
        const double d = std::fabs(static_cast<double>(table[i]) - a);
        const double db = std::fabs(static_cast<double>(table[best]) - a);
        if (d < db || (d == db && i % 2 == 0)) best = i;
    }
    const float r = table[best];
    return r == 0.0f ? 0.0f : std::copysign(r, x);
}

float float_bits_equal_or_both_nan(float a, float b) {
    return (std::isnan(a) && std::isnan(b)) || std::memcmp(&a, &b, sizeof a) == 0;
}

// One row quantized by the rule, spelled out: s = max|x| / Q in FP32, x / s rounded (nearbyint under the default
// round-to-nearest-even mode), clamped for INT8, the nearest e4m3 value for FP8; s <= 0 or NaN gives zeros.
struct RefRow {
    float s = 0.0f;
    std::vector<double> v;  // the quantized values (integers for INT8, e4m3 values for FP8)
};

RefRow ref_quantize(const float *x, int32_t k, ActivationMode mode) {
    RefRow row;
    row.v.assign(k, 0.0);
    float m = 0.0f;
    bool finite = true;
    for (int32_t i = 0; i < k; ++i) {
        if (!std::isfinite(x[i])) finite = false;
        m = std::max(m, std::fabs(x[i]));
    }
    const float q = mode == ActivationMode::Int8 ? 127.0f : 448.0f;
    row.s = finite ? m / q : std::numeric_limits<float>::quiet_NaN();
    if (!(row.s > 0.0f)) return row;
    for (int32_t i = 0; i < k; ++i) {
        const float v = x[i] / row.s;
        row.v[i] = mode == ActivationMode::Int8 ? std::clamp(std::nearbyint(v), -127.0f, 127.0f) : nearest_e4m3(v);
    }
    return row;
}

// y by the documented rule: per group D = sum q*xq (exact) and S = sum xq (exact), each rounded to FP32 once;
// acc = fma(z, S, fma(s, D, acc)) over the groups in order from acc = -0 (each fma rounded once); y = fl(s_x * acc)
// (+ bias). A dense weight: each column quantized by the same row rule, one group, z = 0.
std::vector<float> ref_linear(const tl::Linear &w, const std::vector<float> &x, int32_t M, ActivationMode mode) {
    const int32_t K = w.k, N = w.n, gs = w.quantized ? w.group_size : K, G = K / gs;
    std::vector<float> y(static_cast<size_t>(M) * N);
    std::vector<float> permuted(K), column(K);
    for (int32_t m = 0; m < M; ++m) {
        for (int32_t kk = 0; kk < K; ++kk) {
            permuted[kk] = x[static_cast<size_t>(m) * K + (w.k_perm ? w.k_perm[kk] : kk)];
        }
        const RefRow xr = ref_quantize(permuted.data(), K, mode);
        for (int32_t n = 0; n < N; ++n) {
            std::vector<double> wv(K);
            std::vector<float> s(G), z(G);
            if (w.quantized && w.bits == 8) {
                for (int32_t kk = 0; kk < K; ++kk) {
                    wv[kk] = static_cast<int8_t>(w.codes[static_cast<size_t>(n) * K + kk]);
                }
                for (int32_t g = 0; g < G; ++g) s[g] = tl::half_to_float(w.scales[static_cast<size_t>(n) * G + g]);
            } else if (w.quantized) {
                for (int32_t kk = 0; kk < K; ++kk) wv[kk] = tl::code_at(w, kk, n);
                for (int32_t g = 0; g < G; ++g) {
                    s[g] = tl::half_to_float(w.scales[static_cast<size_t>(n) * G + g]);
                    z[g] = tl::half_to_float(w.zeros[static_cast<size_t>(n) * G + g]);
                }
            } else {
                for (int32_t kk = 0; kk < K; ++kk) {
                    column[kk] = tl::load_float(w.dense_dtype, w.dense, static_cast<size_t>(n) * K + kk);
                }
                const RefRow wr = ref_quantize(column.data(), K, mode);
                wv = wr.v;
                s[0] = wr.s;
                z[0] = 0.0f;
            }
            float acc = -0.0f;
            for (int32_t g = 0; g < G; ++g) {
                double d = 0.0, sum = 0.0;  // exact: integers, or multiples of 2^-18 far from 2^53
                for (int32_t kk = g * gs; kk < (g + 1) * gs; ++kk) {
                    d += wv[kk] * xr.v[kk];
                    sum += xr.v[kk];
                }
                acc = std::fmaf(s[g], static_cast<float>(d), acc);
                acc = std::fmaf(z[g], static_cast<float>(sum), acc);
            }
            float out = xr.s * acc;
            if (const float *bias = w.bias_values()) out = out + bias[n];
            y[static_cast<size_t>(m) * N + n] = out;
        }
    }
    return y;
}

}  // namespace

TEST(ActQuant, RoundHalfEvenIgnoresTheRoundingMode) {
    const int saved = std::fegetround();
    for (int mode : {FE_TONEAREST, FE_UPWARD, FE_DOWNWARD, FE_TOWARDZERO}) {
        std::fesetround(mode);
        EXPECT_EQ(tl::round_half_even(0.5f), 0.0f);
        EXPECT_EQ(tl::round_half_even(1.5f), 2.0f);
        EXPECT_EQ(tl::round_half_even(2.5f), 2.0f);
        EXPECT_EQ(tl::round_half_even(-2.5f), -2.0f);
        EXPECT_EQ(tl::round_half_even(-3.5f), -4.0f);
        EXPECT_EQ(tl::round_half_even(126.50001f), 127.0f);
        EXPECT_EQ(tl::round_half_even(-0.49999997f), -0.0f);
        EXPECT_EQ(tl::round_half_even(16777215.0f), 16777215.0f);
    }
    std::fesetround(saved);
}

TEST(ActQuant, E4m3RoundingMatchesTheValueTable) {
    const std::vector<float> table = e4m3_values();
    ASSERT_EQ(table.size(), 127u);
    EXPECT_EQ(table.back(), 448.0f);
    EXPECT_EQ(table[1], std::ldexp(1.0f, -9));
    // Every value maps to itself, and every midpoint between neighbours goes to the even code.
    for (size_t i = 0; i < table.size(); ++i) {
        EXPECT_EQ(tl::round_to_e4m3(table[i]), table[i]) << i;
        EXPECT_EQ(tl::round_to_e4m3(-table[i]), -table[i]) << i;
        if (i + 1 < table.size()) {
            const float mid = (table[i] + table[i + 1]) / 2;  // exact: both are short binary fractions
            EXPECT_EQ(tl::round_to_e4m3(mid), table[i % 2 == 0 ? i : i + 1]) << "midpoint after code " << i;
        }
    }
    EXPECT_EQ(tl::round_to_e4m3(1.0625f), 1.0f);   // tie between 1 (even) and 1.125
    EXPECT_EQ(tl::round_to_e4m3(248.0f), 256.0f);  // tie between 240 (odd) and 256
    EXPECT_EQ(tl::round_to_e4m3(460.0f), 448.0f);  // saturation, never NaN
    EXPECT_EQ(tl::round_to_e4m3(-1e30f), -448.0f);
    EXPECT_EQ(tl::round_to_e4m3(std::ldexp(1.0f, -10)), 0.0f);  // half the smallest subnormal: to 0 (even)
    EXPECT_EQ(tl::round_to_e4m3(std::ldexp(1.5f, -10)), std::ldexp(1.0f, -9));
    EXPECT_EQ(tl::round_to_e4m3(1e-30f), 0.0f);
    // Random values of every magnitude against the table search.
    std::mt19937_64 rng(ref::fresh_seed());
    std::uniform_real_distribution<float> exponent(-14.0f, 9.5f);
    for (int i = 0; i < 20000; ++i) {
        const float v = (i % 2 ? 1.0f : -1.0f) * std::exp2(exponent(rng));
        ASSERT_EQ(tl::round_to_e4m3(v), nearest_e4m3(v)) << v;
    }
}

TEST(ActQuant, RowQuantizersFollowTheRule) {
    std::mt19937_64 rng(ref::fresh_seed());
    const int32_t K = 77;
    std::vector<std::vector<float>> rows = {ref::random_floats(rng, K, 3.0), std::vector<float>(K, 0.0f),
                                            ref::random_floats(rng, K, 1e-3), ref::random_floats(rng, K, 1.0)};
    rows[3][5] = 3e38f;  // one huge value: the rest round to 0
    rows.push_back(std::vector<float>(K, 0.0f));
    rows.back()[3] = std::numeric_limits<float>::denorm_min();  // s underflows to 0: zeros, no division
    std::vector<int8_t> q(K);
    std::vector<float> e(K);
    for (size_t r = 0; r < rows.size(); ++r) {
        SCOPED_TRACE("row " + std::to_string(r));
        const RefRow want8 = ref_quantize(rows[r].data(), K, ActivationMode::Int8);
        EXPECT_EQ(tl::quantize_row_int8(rows[r].data(), K, q.data()), want8.s);
        for (int32_t i = 0; i < K; ++i) ASSERT_EQ(q[i], want8.v[i]) << i;
        const RefRow want_f = ref_quantize(rows[r].data(), K, ActivationMode::Fp8);
        EXPECT_EQ(tl::quantize_row_fp8(rows[r].data(), K, e.data()), want_f.s);
        for (int32_t i = 0; i < K; ++i) ASSERT_EQ(e[i], want_f.v[i]) << i;
    }
    // The largest value maps to 127; a zero row has scale 0 and zero codes.
    const float s = tl::quantize_row_int8(rows[0].data(), K, q.data());
    EXPECT_GT(s, 0.0f);
    int largest = 0;
    for (int8_t v : q) largest = std::max(largest, std::abs(static_cast<int>(v)));
    EXPECT_EQ(largest, 127);
    EXPECT_EQ(tl::quantize_row_int8(rows[1].data(), K, q.data()), 0.0f);
    EXPECT_TRUE(std::all_of(q.begin(), q.end(), [](int8_t v) { return v == 0; }));
    // Inf or NaN in a row: scale NaN, codes 0 (the row's outputs are NaN), nothing undefined.
    std::vector<float> bad = rows[0];
    bad[9] = std::numeric_limits<float>::infinity();
    EXPECT_TRUE(std::isnan(tl::quantize_row_int8(bad.data(), K, q.data())));
    EXPECT_TRUE(std::all_of(q.begin(), q.end(), [](int8_t v) { return v == 0; }));
    bad[9] = std::numeric_limits<float>::quiet_NaN();
    EXPECT_TRUE(std::isnan(tl::quantize_row_fp8(bad.data(), K, e.data())));
}

// The layer against ref_linear, bit for bit, for grouped, per-row, permuted and dense weights, with a bias, on 1-3
// threads; edge rows (zero, one huge value) included. K = 40 and 72 are not multiples of the 32-byte vectors.
TEST(ActQuant, LinearMatchesTheScalarRuleBitForBit) {
    const uint64_t seed = ref::fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937_64 rng(seed);
    struct Shape {
        int32_t M, K, N, group_size;
    };
    for (const Shape sh : {Shape{1, 64, 37, 32}, Shape{13, 40, 70, 8}, Shape{6, 72, 33, 0}, Shape{9, 256, 100, 64},
                           Shape{5, 512, 19, 0}}) {
        const std::vector<float> w = ref::random_floats(rng, static_cast<size_t>(sh.K) * sh.N, 1.0 / std::sqrt(sh.K));
        std::vector<float> x = ref::random_floats(rng, static_cast<size_t>(sh.M) * sh.K, 2.0);
        if (sh.M > 2) {
            std::fill(x.begin() + sh.K, x.begin() + 2 * sh.K, 0.0f);  // row 1: all zero
            x[2 * static_cast<size_t>(sh.K) + 1] = 1e30f;            // row 2: one huge value
        }
        std::vector<tl::Linear> linears;
        linears.push_back(tl::make_quantized_linear(
            "asym", tl::quantize_minmax(w.data(), sh.K, sh.N, sh.group_size, tl::QuantMethod::Asymmetric)));
        linears.push_back(tl::make_quantized_linear(
            "sym", tl::quantize_minmax(w.data(), sh.K, sh.N, sh.group_size, tl::QuantMethod::Symmetric)));
        tl::QuantizedMatrix permuted =
            tl::quantize_minmax(w.data(), sh.K, sh.N, sh.group_size, tl::QuantMethod::Asymmetric);
        permuted.k_perm.resize(sh.K);
        std::iota(permuted.k_perm.begin(), permuted.k_perm.end(), 0);
        std::shuffle(permuted.k_perm.begin(), permuted.k_perm.end(), rng);
        linears.push_back(tl::make_quantized_linear("permuted", permuted));
        linears.push_back(tl::make_dense_linear("dense", w.data(), sh.K, sh.N));
        // INT8 weights (INT8 activations only), with -128 codes as imported GPTQ has them.
        tl::QuantizedMatrix int8 =
            tl::quantize_minmax(w.data(), sh.K, sh.N, sh.group_size, tl::QuantMethod::Symmetric, 8);
        for (size_t i = 0; i < int8.codes.size(); i += 7) int8.codes[i] = 0x80;
        linears.push_back(tl::make_quantized_linear("int8", int8));
        tl::Linear biased = tl::make_quantized_linear(
            "biased", tl::quantize_minmax(w.data(), sh.K, sh.N, sh.group_size, tl::QuantMethod::Asymmetric));
        biased.bias = std::make_shared<const std::vector<float>>(ref::random_floats(rng, sh.N, 0.5));
        linears.push_back(biased);
        for (const tl::Linear &lin : linears) {
            for (ActivationMode mode : {ActivationMode::Int8, ActivationMode::Fp8}) {
                if (lin.bits == 8 && mode == ActivationMode::Fp8) continue;
                const std::vector<float> want = ref_linear(lin, x, sh.M, mode);
                for (int32_t threads : {1, 2, 3}) {
                    std::vector<float> y(want.size(), NAN);
                    tl::linear_forward(lin, x.data(), y.data(), sh.M, threads, mode);
                    for (size_t i = 0; i < y.size(); ++i) {
                        ASSERT_TRUE(float_bits_equal_or_both_nan(y[i], want[i]))
                            << lin.name << " " << tl::activation_mode_name(mode) << " M " << sh.M << " K " << sh.K
                            << " N " << sh.N << " group " << sh.group_size << " threads " << threads << " element "
                            << i << ": " << y[i] << " vs " << want[i];
                    }
                }
                if (sh.M > 2) {  // the zero row gives exactly the bias (or 0)
                    for (int32_t n = 0; n < sh.N; ++n) {
                        std::vector<float> y(want.size());
                        tl::linear_forward(lin, x.data(), y.data(), sh.M, 1, mode);
                        ASSERT_EQ(y[static_cast<size_t>(sh.N) + n], lin.bias_values() ? lin.bias_values()[n] : 0.0f);
                    }
                }
            }
        }
    }
}

// The largest products everywhere: every code 15 against rows of +-127 (and mixed signs), per row over K = 1024 and in
// groups of 512, so every int16 and int32 partial sum of the kernels is at its bound; the sums must still be exact.
TEST(ActQuant, ExtremeCodesAndActivationsStayExact) {
    const int32_t M = 5, K = 1024, N = 9;
    for (int32_t group_size : {0, 512}) {
        tl::QuantizedMatrix m;
        m.k = K, m.n = N, m.group_size = group_size == 0 ? K : group_size;
        m.codes.assign(static_cast<size_t>(N) * K / 2, 0xFF);
        const size_t groups = static_cast<size_t>(N) * (K / m.group_size);
        m.scales.assign(groups, tl::float_to_half(0.5f));
        m.zeros.assign(groups, tl::float_to_half(-3.0f));
        const tl::Linear lin = tl::make_quantized_linear("extreme", m);
        std::vector<float> x(static_cast<size_t>(M) * K);
        for (int32_t k = 0; k < K; ++k) {
            x[k] = 1.0f;                              // all +127
            x[K + k] = -2.0f;                         // all -127
            x[2 * K + k] = k % 2 ? 448.0f : -448.0f;  // alternating
            x[3 * K + k] = 1e-30f * (k + 1);          // tiny values
            x[4 * K + k] = k < K / 2 ? 3.0f : -3.0f;
        }
        for (ActivationMode mode : {ActivationMode::Int8, ActivationMode::Fp8}) {
            const std::vector<float> want = ref_linear(lin, x, M, mode);
            std::vector<float> y(want.size());
            tl::linear_forward(lin, x.data(), y.data(), M, 2, mode);
            for (size_t i = 0; i < y.size(); ++i) {
                ASSERT_TRUE(float_bits_equal_or_both_nan(y[i], want[i]))
                    << tl::activation_mode_name(mode) << " group " << group_size << " element " << i << ": " << y[i]
                    << " vs " << want[i];
            }
            // Row 0: D = 15 * 127 * K per group (INT8) exactly; y = s_x * sum_g (0.5 D + (-3) S).
            if (mode == ActivationMode::Int8) {
                const float s_x = 1.0f / 127.0f;
                const float g = static_cast<float>(K / m.group_size);
                const float per_group = 0.5f * (15.0f * 127.0f * m.group_size) - 3.0f * (127.0f * m.group_size);
                EXPECT_EQ(y[0], s_x * (g * per_group)) << "group " << group_size;
            }
        }
    }
}

// Quantized activations stay close to the FP32 ones: the relative output error of a random layer is a few percent at
// most for INT8 and FP8 (and not zero: something was quantized).
TEST(ActQuant, LinearStaysCloseToFullPrecision) {
    std::mt19937_64 rng(ref::fresh_seed());
    const int32_t M = 16, K = 256, N = 64;
    const std::vector<float> w = ref::random_floats(rng, static_cast<size_t>(K) * N, 1.0 / std::sqrt(K));
    const std::vector<float> x = ref::random_floats(rng, static_cast<size_t>(M) * K, 1.0);
    const tl::Linear lin =
        tl::make_quantized_linear("w", tl::quantize_minmax(w.data(), K, N, 64, tl::QuantMethod::Asymmetric));
    std::vector<float> full(static_cast<size_t>(M) * N);
    tl::linear_forward(lin, x.data(), full.data(), M, 1);
    for (ActivationMode mode : {ActivationMode::Int8, ActivationMode::Fp8}) {
        std::vector<float> y(full.size());
        tl::linear_forward(lin, x.data(), y.data(), M, 1, mode);
        double err = 0, norm = 0;
        for (size_t i = 0; i < y.size(); ++i) {
            err += (y[i] - full[i]) * static_cast<double>(y[i] - full[i]);
            norm += full[i] * static_cast<double>(full[i]);
        }
        const double rel = std::sqrt(err / norm);
        EXPECT_GT(rel, 0.0) << tl::activation_mode_name(mode);
        EXPECT_LT(rel, mode == ActivationMode::Int8 ? 0.02 : 0.05) << tl::activation_mode_name(mode);
    }
}

// A weight the integer path cannot take exactly is refused, naming it.

TEST(ActQuant, RefusesWeightsItCannotTakeExactly) {
    // FP8 activations with INT8 weights: their codes are not exact in e4m3.
    const std::vector<float> values(64 * 8, 0.25f);
    const tl::Linear int8 = tl::make_quantized_linear(
        "int8", tl::quantize_minmax(values.data(), 64, 8, 0, tl::QuantMethod::Symmetric, 8));
    tl::QuantizedInput fp8_in;
    EXPECT_TRUE(tlt::throws(TL_ERR_UNSUPPORTED, {"not exact in e4m3"},
                            [&] { tl::prepare_quantized_input(int8, 1, ActivationMode::Fp8, fp8_in); }));
    EXPECT_NO_THROW(tl::prepare_quantized_input(int8, 1, ActivationMode::Int8, fp8_in));
    tl::Linear wide;
    wide.name = "wide";
    wide.k = (1 << 17) + 2;
    wide.n = 1;
    wide.quantized = false;
    tl::QuantizedInput in;
    EXPECT_TRUE(tlt::throws(TL_ERR_UNSUPPORTED, {"wide"},
                            [&] { tl::prepare_quantized_input(wide, 1, ActivationMode::Int8, in); }));
}

// The shipped demo model on data/demo.txt (bytes are its tokens): INT8 and FP8 activations move the perplexity by a
// little (the bounds hold the measured figures of docs/quality.md with room), and the result does not depend on the
// thread count.
TEST(ActQuant, DemoModelPerplexityMovesLittleAndIsThreadIndependent) {
    const auto model = tl::load_model(std::string(TL_SOURCE_DIR) + "/models/demo-int4.tinyloop", {});
    std::ifstream in(std::string(TL_SOURCE_DIR) + "/data/demo.txt", std::ios::binary);
    std::vector<int32_t> tokens;
    for (std::istreambuf_iterator<char> it(in), end; it != end; ++it) tokens.push_back(static_cast<unsigned char>(*it));
    ASSERT_GT(tokens.size(), 1000u);
    auto perplexity = [&](ActivationMode mode, int32_t threads, std::vector<float> *nll) {
        tl::ScoreOptions options;
        options.n_threads = threads;
        options.activations = mode;
        if (nll != nullptr) {
            nll->assign(tokens.size() - 1, 0.0f);
            options.token_nll = nll->data();
        }
        const tl::ScoreResult r = tl::score_cpu(*model, tokens.data(), tokens.size(), options);
        return std::exp(r.nll_sum / static_cast<double>(r.tokens_scored));
    };
    const double fp16 = perplexity(ActivationMode::Fp16, 2, nullptr);
    std::vector<float> nll1, nll2;
    const double int8 = perplexity(ActivationMode::Int8, 1, &nll1);
    EXPECT_EQ(perplexity(ActivationMode::Int8, 2, &nll2), int8);
    EXPECT_EQ(nll1, nll2);
    const double fp8 = perplexity(ActivationMode::Fp8, 2, nullptr);
    RecordProperty("fp16", std::to_string(fp16));
    RecordProperty("int8", std::to_string(int8));
    RecordProperty("fp8", std::to_string(fp8));
    EXPECT_NE(int8, fp16);
    EXPECT_NE(fp8, fp16);
    // Measured on this text: -0.16% (int8) and +0.01% (fp8).
    EXPECT_LT(std::fabs(int8 / fp16 - 1.0), 0.005) << "fp16 " << fp16 << ", int8 " << int8;
    EXPECT_LT(std::fabs(fp8 / fp16 - 1.0), 0.005) << "fp16 " << fp16 << ", fp8 " << fp8;
}
