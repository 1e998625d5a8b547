// Host INT4 quantization: error bounds of the round trip, exact dequantization, constant and zero groups.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "util/error.hpp"
#include "util/half.hpp"
#include "quant/cross_iter.hpp"
#include "quant/quant.hpp"
#include "../common/tl_error.hpp"
#include "reference.hpp"

namespace {

using tl::QuantMethod;

const char *method_name(QuantMethod m) { return m == QuantMethod::Asymmetric ? "asym" : "sym"; }

// Checks every element of W against the original: within half a step inside the representable range
// [z, z + 15 s], and no further than the range's end outside it (FP16 rounding of s and z can leave the extreme
// values just outside). Also checks that dequantization is exact.
void expect_round_trip_within_bound(const std::vector<float> &w, int32_t k, int32_t n, int32_t group_size,
                                    QuantMethod method) {
    SCOPED_TRACE(std::string(method_name(method)) + " group_size " + std::to_string(group_size));
    const tl::QuantizedMatrix qm = tl::quantize_minmax(w.data(), k, n, group_size, method);
    const int32_t gs = group_size == 0 ? k : group_size;
    ASSERT_EQ(qm.group_size, gs);
    ASSERT_EQ(qm.codes.size(), static_cast<size_t>(n) * k / 2);
    ASSERT_EQ(qm.scales.size(), static_cast<size_t>(n) * (k / gs));
    ASSERT_EQ(qm.zeros.size(), qm.scales.size());
    const tl::Linear lin = tl::make_quantized_linear("w", qm);
    std::vector<float> out(static_cast<size_t>(n) * k);
    tl::dequantize_rows(lin, 0, n, out.data());

    for (int32_t row = 0; row < n; ++row)
        for (int32_t g = 0; g < k / gs; ++g) {
            const float *wg = &w[static_cast<size_t>(row) * k + g * gs];
            const double lo = *std::min_element(wg, wg + gs), hi = *std::max_element(wg, wg + gs);
            const size_t gi = static_cast<size_t>(row) * (k / gs) + g;
            const double s = tl::half_to_float(qm.scales[gi]), z = tl::half_to_float(qm.zeros[gi]);
            // The header's min-max rule, with s and z rounded to FP16.
            if (method == QuantMethod::Asymmetric) {
                ASSERT_EQ(qm.scales[gi], tl::float_to_half(static_cast<float>((hi - lo) / 15)));
                ASSERT_EQ(qm.zeros[gi], tl::float_to_half(static_cast<float>(lo)));
            } else {
                ASSERT_EQ(qm.scales[gi], tl::float_to_half(static_cast<float>(std::max(hi / 7, -lo / 8))));
                ASSERT_EQ(z, -8 * s);
            }
            const double bound = std::max({s / 2, z - lo, hi - (z + 15 * s)}) + 1e-6 * std::max(-lo, hi);
            for (int32_t i = 0; i < gs; ++i) {
                const int32_t kk = g * gs + i;
                const float got = out[static_cast<size_t>(row) * k + kk];
                ASSERT_LE(std::fabs(got - wg[i]), bound) << "row " << row << " k " << kk;
                // Dequantization is exact: q*s + z rounded once in FP32.
                const float expected = static_cast<float>(tl::code_at(lin, kk, row)) * static_cast<float>(s) +
                                       static_cast<float>(z);
                ASSERT_EQ(got, expected) << "row " << row << " k " << kk;
            }
        }
}

}  // namespace

// INT8: s = max|w| / 127 in FP16, q = round(w / s) in [-127, 127], no zeros; dequantization is q * s exactly. K need
// not be even (no packing).
TEST(Quant, Int8SymmetricRuleAndExactDequantization) {
    std::mt19937_64 rng(std::random_device{}());
    std::normal_distribution<float> normal(0.0f, 0.3f);
    for (auto [k, group_size] : {std::pair{45, 0}, std::pair{96, 32}}) {
        const int32_t n = 7, gs = group_size == 0 ? k : group_size;
        std::vector<float> w(static_cast<size_t>(n) * k);
        for (float &v : w) v = normal(rng);
        std::fill(w.begin(), w.begin() + gs, 0.0f);  // an all-zero group: s = 0, codes 0
        const tl::Linear lin = tl::make_quantized_linear(
            "w", tl::quantize_minmax(w.data(), k, n, group_size, QuantMethod::Symmetric, 8));
        ASSERT_EQ(lin.bits, 8);
        ASSERT_EQ(lin.zeros, nullptr);
        EXPECT_EQ(lin.quant_bytes(), size_t(n) * k + size_t(n) * (k / gs) * 2);
        std::vector<float> out(w.size());
        tl::dequantize_rows(lin, 0, n, out.data());
        const auto *codes = reinterpret_cast<const int8_t *>(lin.codes);
        for (int32_t row = 0; row < n; ++row)
            for (int32_t g = 0; g < k / gs; ++g) {
                const float *wg = &w[static_cast<size_t>(row) * k + g * gs];
                float amax = 0.0f;
                for (int32_t i = 0; i < gs; ++i) amax = std::max(amax, std::fabs(wg[i]));
                const uint16_t s_bits = lin.scales[static_cast<size_t>(row) * (k / gs) + g];
                ASSERT_EQ(s_bits, tl::float_to_half(static_cast<float>(amax / 127.0)));
                const float s = tl::half_to_float(s_bits);
                for (int32_t i = 0; i < gs; ++i) {
                    const size_t at = static_cast<size_t>(row) * k + g * gs + i;
                    ASSERT_GE(codes[at], -127);
                    ASSERT_EQ(out[at], static_cast<float>(codes[at]) * s);
                    ASSERT_LE(std::fabs(out[at] - wg[i]), s / 2 + 1e-3 * amax) << "row " << row << " k " << g * gs + i;
                }
            }
    }
    const std::vector<float> w(64, 1.0f);
    EXPECT_THROW(tl::quantize_minmax(w.data(), 8, 8, 0, QuantMethod::Asymmetric, 8), tl::Error);
    EXPECT_THROW(tl::quantize_minmax(w.data(), 8, 8, 0, QuantMethod::Symmetric, 6), tl::Error);
}

TEST(Quant, RoundTripWithinHalfStepPerGroupAndPerRow) {
    const uint64_t seed = ref::fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937_64 rng(seed);
    const int32_t k = 256, n = 24;
    std::vector<float> w = ref::random_floats(rng, static_cast<size_t>(k) * n, 0.05);
    // Rows with an offset and rows of one sign exercise z far from zero and the symmetric one-sided cases.
    for (int32_t i = 0; i < k; ++i) {
        w[1 * k + i] += 3.0f;
        w[2 * k + i] = std::fabs(w[2 * k + i]);
        w[3 * k + i] = -std::fabs(w[3 * k + i]) - 0.5f;
    }
    for (QuantMethod method : {QuantMethod::Asymmetric, QuantMethod::Symmetric})
        for (int32_t group_size : {32, 64, 128, 0, k}) expect_round_trip_within_bound(w, k, n, group_size, method);
}

TEST(Quant, ConstantAndZeroRows) {
    const int32_t k = 64, n = 4;
    std::vector<float> w(static_cast<size_t>(k) * n);
    const float values[4] = {0.0f, 1.2345f, -3.3f, 7e-6f};
    for (int32_t row = 0; row < n; ++row) std::fill(&w[row * k], &w[row * k] + k, values[row]);
    for (QuantMethod method : {QuantMethod::Asymmetric, QuantMethod::Symmetric}) {
        SCOPED_TRACE(method_name(method));
        const tl::QuantizedMatrix qm = tl::quantize_minmax(w.data(), k, n, 32, method);
        const tl::Linear lin = tl::make_quantized_linear("c", qm);
        std::vector<float> out(w.size());
        tl::dequantize_rows(lin, 0, n, out.data());
        for (int32_t row = 0; row < n; ++row)
            for (int32_t i = 0; i < k; ++i) {
                const float c = values[row];
                const float got = out[row * k + i];
                if (method == QuantMethod::Asymmetric) {
                    // s = 0 and W = z: the constant rounded to FP16.
                    EXPECT_EQ(qm.scales[row * 2 + i / 32], 0);
                    EXPECT_EQ(got, tl::round_to_half(c));
                } else {
                    EXPECT_LE(std::fabs(got - c), std::fabs(c) * 0x1p-10 + 8 * 0x1p-25) << "row " << row;
                }
            }
        // The all-zero row is exactly +0 in both methods.
        for (int32_t i = 0; i < k; ++i) {
            EXPECT_EQ(out[i], 0.0f);
            EXPECT_FALSE(std::signbit(out[i]));
        }
    }
}

TEST(Quant, RangeBelowFp16KeepsANonzeroScale) {
    // (hi - lo) / 15 and max|w| / 7 underflow FP16 here; only an exactly constant (or zero) group may get s = 0.
    const int32_t k = 32;
    std::vector<float> w(k);
    for (int32_t i = 0; i < k; ++i) w[i] = i % 2 ? std::nextafter(0.5f, 1.0f) : 0.5f;
    const tl::QuantizedMatrix asym = tl::quantize_minmax(w.data(), k, 1, 0, QuantMethod::Asymmetric);
    EXPECT_NE(asym.scales[0], 0);
    std::vector<float> out(k);
    tl::dequantize_rows(tl::make_quantized_linear("a", asym), 0, 1, out.data());
    EXPECT_EQ(out, w);  // z = 0.5 and s = 2^-24 = ulp(0.5) represent both values exactly
    for (int32_t i = 0; i < k; ++i) w[i] = i % 2 ? 1e-9f : -1e-9f;
    EXPECT_NE(tl::quantize_minmax(w.data(), k, 1, 0, QuantMethod::Symmetric).scales[0], 0);
}

TEST(Quant, SymmetricZeroIsExact) {
    const uint64_t seed = ref::fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937_64 rng(seed);
    const int32_t k = 128, n = 16;
    std::vector<float> w = ref::random_floats(rng, static_cast<size_t>(k) * n);
    for (size_t i = 0; i < w.size(); i += 5) w[i] = 0.0f;
    const tl::Linear lin =
        tl::make_quantized_linear("z", tl::quantize_minmax(w.data(), k, n, 32, QuantMethod::Symmetric));
    std::vector<float> out(w.size());
    tl::dequantize_rows(lin, 0, n, out.data());
    for (size_t i = 0; i < w.size(); i += 5) {
        EXPECT_EQ(out[i], 0.0f) << "element " << i;
        EXPECT_EQ(tl::code_at(lin, static_cast<int32_t>(i % k), static_cast<int32_t>(i / k)), 8);
    }
}

TEST(Quant, DequantizeRowRangeMatchesFull) {
    const uint64_t seed = ref::fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937_64 rng(seed);
    const int32_t k = 96, n = 10;
    const std::vector<float> w = ref::random_floats(rng, static_cast<size_t>(k) * n);
    const tl::Linear lin =
        tl::make_quantized_linear("r", tl::quantize_minmax(w.data(), k, n, 32, QuantMethod::Asymmetric));
    std::vector<float> full(w.size()), part(static_cast<size_t>(4) * k);
    tl::dequantize_rows(lin, 0, n, full.data());
    tl::dequantize_rows(lin, 3, 7, part.data());
    for (size_t i = 0; i < part.size(); ++i) EXPECT_EQ(part[i], full[3 * k + i]);
    EXPECT_THROW(tl::dequantize_rows(lin, 5, 11, part.data()), tl::Error);
}

TEST(Quant, DenseLinearsConvertExactly) {
    const uint64_t seed = ref::fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937_64 rng(seed);
    const int32_t k = 16, n = 6;
    const std::vector<float> w = ref::random_floats(rng, static_cast<size_t>(k) * n);
    std::vector<float> out(w.size());

    const tl::Linear f32 = tl::make_dense_linear("f32", w.data(), k, n);
    tl::dequantize_rows(f32, 0, n, out.data());
    EXPECT_EQ(out, w);

    std::vector<uint16_t> halves(w.size()), bf16(w.size());
    for (size_t i = 0; i < w.size(); ++i) {
        halves[i] = tl::float_to_half(w[i]);
        uint32_t bits;
        std::memcpy(&bits, &w[i], sizeof bits);
        bf16[i] = static_cast<uint16_t>(bits >> 16);  // truncation: any BF16 pattern will do
    }
    tl::Linear lin;
    lin.k = k;
    lin.n = n;
    lin.dense_dtype = tl::DType::F16;
    lin.dense = halves.data();
    tl::dequantize_rows(lin, 1, n, out.data());
    for (size_t i = 0; i + k < w.size(); ++i) EXPECT_EQ(out[i], ref::dense_value(tl::DType::F16, halves.data(), i + k));
    lin.dense_dtype = tl::DType::BF16;
    lin.dense = bf16.data();
    tl::dequantize_rows(lin, 0, n, out.data());
    for (size_t i = 0; i < w.size(); ++i) {
        EXPECT_EQ(out[i], ref::dense_value(tl::DType::BF16, bf16.data(), i));
        EXPECT_LE(std::fabs(out[i] - w[i]), std::fabs(w[i]) * 0x1p-7);
    }
}

// ---- Rows of several linears as one, and padded rows (the GPU backend's fused gate|up and padded N) ----

tl::Linear random_int4(const std::string &name, int32_t k, int32_t n, int32_t group_size) {
    static std::mt19937 rng(11);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> w(static_cast<size_t>(k) * n);
    for (float &v : w) v = normal(rng);
    return tl::make_quantized_linear(name, tl::quantize_minmax(w.data(), k, n, group_size, tl::QuantMethod::Asymmetric));
}

std::vector<float> dequantized(const tl::Linear &w) {
    std::vector<float> out(static_cast<size_t>(w.n) * w.k);
    tl::dequantize_rows(w, 0, w.n, out.data());
    return out;
}

TEST(Quant, ConcatRows) {
    const tl::Linear gate = random_int4("gate", 128, 64, 32), up = random_int4("up", 128, 96, 32);
    const tl::Linear both = tl::concat_linear_rows(gate, up, "gate_up");
    ASSERT_EQ(both.n, 160);
    ASSERT_EQ(both.k, 128);
    ASSERT_EQ(both.group_size, 32);
    std::vector<float> expected = dequantized(gate);
    const std::vector<float> up_values = dequantized(up);
    expected.insert(expected.end(), up_values.begin(), up_values.end());
    EXPECT_EQ(dequantized(both), expected);

    const tl::Linear other_groups = random_int4("up", 128, 96, 64);
    EXPECT_TRUE(tlt::throws(TL_ERR_INVALID_ARGUMENT, {}, [&] { tl::concat_linear_rows(gate, other_groups, "bad"); }))
        << "mismatched group sizes";
    // Rows that read their input in another K order cannot share one weight.
    tl::QuantizedMatrix permuted = tl::quantize_minmax(std::vector<float>(128 * 96, 0.5f).data(), 128, 96, 32,
                                                       QuantMethod::Asymmetric);
    permuted.k_perm.resize(128);
    for (int32_t i = 0; i < 128; ++i) permuted.k_perm[i] = 127 - i;
    EXPECT_TRUE(tlt::throws(TL_ERR_INVALID_ARGUMENT, {"K order"}, [&] {
        tl::concat_linear_rows(gate, tl::make_quantized_linear("up", std::move(permuted)), "bad");
    }));
}

TEST(Quant, PadRows) {
    const tl::Linear head = random_int4("head", 64, 100, 0 /* per row */);
    const tl::Linear padded = tl::pad_linear_rows(head, 64);
    ASSERT_EQ(padded.n, 128);
    ASSERT_EQ(padded.k, 64);
    const std::vector<float> original = dequantized(head), values = dequantized(padded);
    EXPECT_TRUE(std::equal(original.begin(), original.end(), values.begin()));
    EXPECT_TRUE(std::all_of(values.begin() + original.size(), values.end(), [](float v) { return v == 0.0f; }));
    const tl::Linear again = tl::pad_linear_rows(padded, 64);
    EXPECT_EQ(again.n, 128);
    EXPECT_EQ(dequantized(again), values);
}

// Padded K: the inputs' extra columns are zero, so only the first K columns of the padded weight matter, and they
// are the weight's own, in input order (a k_perm extended with the identity); grouped weights gain zero groups.
TEST(Quant, PadCols) {
    struct Case {
        int32_t k, n, group_size;
        bool permuted;
    };
    for (const Case c :
         {Case{96, 40, 32, false}, Case{100, 24, 0, false}, Case{96, 40, 32, true}, Case{128, 8, 64, false}}) {
        SCOPED_TRACE("K " + std::to_string(c.k) + ", group " + std::to_string(c.group_size));
        tl::Linear w = random_int4("w", c.k, c.n, c.group_size);
        if (c.permuted) {
            tl::QuantizedMatrix m;
            m.k = w.k, m.n = w.n, m.group_size = w.group_size, m.bits = 4;
            m.codes.assign(w.codes, w.codes + static_cast<size_t>(w.n) * w.k / 2);
            m.scales.assign(w.scales, w.scales + static_cast<size_t>(w.n) * w.n_groups());
            m.zeros.assign(w.zeros, w.zeros + m.scales.size());
            for (int32_t i = 0; i < w.k; ++i) m.k_perm.push_back((i * 7 + 3) % w.k);  // 7 is prime to 96
            w = tl::make_quantized_linear("w", std::move(m));
        }
        const tl::Linear p = tl::pad_linear_cols(w, 64);
        const int32_t k_pad = (c.k + 63) / 64 * 64;
        ASSERT_EQ(p.k, k_pad);
        ASSERT_EQ(p.n, c.n);
        EXPECT_EQ(p.group_size, c.group_size == 0 ? k_pad : c.group_size);
        EXPECT_EQ(p.k_perm != nullptr, c.permuted);
        const std::vector<float> before = dequantized(w), after = dequantized(p);
        for (int32_t nn = 0; nn < c.n; ++nn) {
            for (int32_t kk = 0; kk < c.k; ++kk) {
                ASSERT_EQ(after[static_cast<size_t>(nn) * k_pad + kk], before[static_cast<size_t>(nn) * c.k + kk])
                    << "W[" << kk << ", " << nn << "]";
            }
            if (c.group_size != 0) {  // whole zero groups
                for (int32_t kk = c.k; kk < k_pad; ++kk) EXPECT_EQ(after[static_cast<size_t>(nn) * k_pad + kk], 0.0f);
            }
        }
    }
    // A group size that does not divide the padded K cannot be padded.
    EXPECT_TRUE(tlt::throws(TL_ERR_INVALID_ARGUMENT, {"does not divide the padded K = 128"},
                            [] { tl::pad_linear_cols(random_int4("w", 96, 8, 48), 64); }));
}

TEST(Quant, RejectsBadArguments) {
    std::vector<float> w(64 * 2, 0.5f);
    auto status = [&](int32_t k, int32_t group_size, QuantMethod method) {
        return tlt::error_of([&] { tl::quantize_minmax(w.data(), k, 2, group_size, method); }).code;
    };
    EXPECT_EQ(status(63, 0, QuantMethod::Asymmetric), TL_ERR_INVALID_ARGUMENT);   // odd K cannot pack nibbles
    EXPECT_EQ(status(64, 48, QuantMethod::Asymmetric), TL_ERR_INVALID_ARGUMENT);  // group does not divide K
    EXPECT_EQ(status(64, 32, QuantMethod::Asymmetric), TL_OK);
    w[7] = NAN;
    EXPECT_EQ(status(64, 32, QuantMethod::Asymmetric), TL_ERR_INVALID_ARGUMENT);
    w[7] = 1e6f;  // the symmetric scale 1e6/7 exceeds FP16
    EXPECT_EQ(status(64, 32, QuantMethod::Symmetric), TL_ERR_INVALID_ARGUMENT);
}

// Cross-iteration rounding follows the input index: the same weights stored in another K order, with the k_perm
// that undoes it, get the same weights on every iteration (it once took its phase from the stored row).
TEST(Quant, CrossIterationRoundingFollowsKPerm) {
    const int32_t k = 64, n = 24, loops = 5;
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    std::vector<int32_t> perm(k);
    for (int32_t i = 0; i < k; ++i) perm[i] = (i * 23 + 5) % k;  // 23 is prime to 64
    std::vector<float> w(static_cast<size_t>(k) * n), stored(w.size());
    for (float &v : w) v = uniform(rng);
    for (int32_t nn = 0; nn < n; ++nn)
        for (int32_t kk = 0; kk < k; ++kk) stored[nn * k + kk] = w[nn * k + perm[kk]];
    for (const bool frac4 : {true, false}) {
        SCOPED_TRACE(frac4 ? "frac4" : "sign_bit");
        // Per row: a row's scale and zero do not depend on the order of its inputs.
        tl::QuantizedMatrix plain = tl::quantize_minmax(w.data(), k, n, 0, QuantMethod::Asymmetric);
        tl::add_rounding_channels(w.data(), plain, frac4, !frac4);
        tl::QuantizedMatrix permuted = tl::quantize_minmax(stored.data(), k, n, 0, QuantMethod::Asymmetric);
        tl::add_rounding_channels(stored.data(), permuted, frac4, !frac4);
        permuted.k_perm = perm;
        const tl::Linear a = tl::make_quantized_linear("a", std::move(plain));
        const tl::Linear b = tl::make_quantized_linear("b", std::move(permuted));
        int moved = 0;
        for (int32_t iteration = 0; iteration < loops; ++iteration) {
            const tl::Linear ai = tl::cross_iter_linear(a, iteration, loops);
            const tl::Linear bi = tl::cross_iter_linear(b, iteration, loops);
            for (int32_t nn = 0; nn < n; ++nn) {
                for (int32_t kk = 0; kk < k; ++kk) {
                    ASSERT_EQ(tl::code_at(bi, kk, nn), tl::code_at(ai, perm[kk], nn))
                        << "iteration " << iteration << ", stored row " << kk << ", column " << nn;
                    moved += tl::code_at(ai, perm[kk], nn) != tl::code_at(a, perm[kk], nn);
                }
            }
        }
        EXPECT_GT(moved, 0) << "no code moved: the test cannot tell";
    }
}
