// FP16 <-> FP32 conversion against independent double-precision definitions.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>

#include "util/half.hpp"
#include "reference.hpp"

namespace {

float bits_to_float(uint32_t bits) {
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
}

// The value of a half bit pattern from the IEEE-754 binary16 definition.
double half_value(uint16_t h) {
    const int sign = (h >> 15) ? -1 : 1;
    const int exp = (h >> 10) & 0x1F;
    const int mant = h & 0x3FF;
    if (exp == 31) return mant ? NAN : sign * INFINITY;
    if (exp == 0) return sign * std::ldexp(mant, -24);
    return sign * std::ldexp(1024 + mant, exp - 25);
}

// Round-to-nearest-even of f onto the binary16 grid, computed in double: scale to an integer significand,
// round with nearbyint (ties to even), scale back; above the largest finite half it is infinity.
double round_to_half_reference(float f) {
    if (std::isnan(f)) return NAN;
    const double a = std::fabs(static_cast<double>(f));
    if (std::isinf(a)) return std::copysign(INFINITY, f);
    int e = 0;
    std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1): leading bit at 2^(e-1)
    const int spacing_exp = std::max(e - 1 - 10, -24);
    const double r = std::ldexp(std::nearbyint(std::ldexp(a, -spacing_exp)), spacing_exp);
    return std::copysign(r > 65504.0 ? INFINITY : r, f);
}

void expect_rounds_like_reference(float f) {
    const uint16_t h = tl::float_to_half(f);
    const double expected = round_to_half_reference(f);
    const double got = half_value(h);
    uint32_t fbits;
    std::memcpy(&fbits, &f, sizeof f);
    SCOPED_TRACE("float bits 0x" + std::to_string(fbits));
    if (std::isnan(expected)) {
        EXPECT_TRUE(std::isnan(got));
        return;
    }
    EXPECT_EQ(got, expected);
    EXPECT_EQ(std::signbit(got), std::signbit(f));  // -0 stays -0, negative underflow keeps its sign
}

}  // namespace

TEST(Half, EveryPatternConvertsExactlyAndRoundTrips) {
    for (uint32_t i = 0; i < 65536; ++i) {
        const uint16_t h = static_cast<uint16_t>(i);
        const float f = tl::half_to_float(h);
        const double expected = half_value(h);
        if (std::isnan(expected)) {
            EXPECT_TRUE(std::isnan(f)) << "half 0x" << std::hex << i;
            EXPECT_TRUE(std::isnan(tl::half_to_float(tl::float_to_half(f)))) << "half 0x" << std::hex << i;
            continue;
        }
        EXPECT_EQ(static_cast<double>(f), expected) << "half 0x" << std::hex << i;
        EXPECT_EQ(std::signbit(f), (h >> 15) != 0) << "half 0x" << std::hex << i;
        EXPECT_EQ(tl::float_to_half(f), h) << "half 0x" << std::hex << i;
    }
}

TEST(Half, RandomBitPatternsRoundToNearestEven) {
    const uint64_t seed = ref::fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937_64 rng(seed);
    for (int i = 0; i < 1000000; ++i) expect_rounds_like_reference(bits_to_float(static_cast<uint32_t>(rng())));
}

TEST(Half, SubnormalAndOverflowRangesRoundToNearestEven) {
    const uint64_t seed = ref::fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937_64 rng(seed);
    // Log-uniform magnitudes from below the smallest half subnormal (2^-24) to past the overflow point.
    std::uniform_real_distribution<double> log2_magnitude(-27.0, 17.0);
    std::uniform_real_distribution<double> near_overflow(65000.0, 66100.0);
    for (int i = 0; i < 300000; ++i) {
        const double sign = (rng() & 1) ? -1.0 : 1.0;
        expect_rounds_like_reference(static_cast<float>(sign * std::exp2(log2_magnitude(rng))));
        expect_rounds_like_reference(static_cast<float>(sign * near_overflow(rng)));
    }
}

TEST(Half, ExactTiesRoundToEven) {
    // Midpoints between neighbouring finite halves (exact in float), including the subnormal range and the tie
    // above 65504 that must overflow.
    for (uint32_t i = 0; i < 0x7BFF; ++i) {
        const double mid = (half_value(static_cast<uint16_t>(i)) + half_value(static_cast<uint16_t>(i + 1))) / 2;
        expect_rounds_like_reference(static_cast<float>(mid));
        expect_rounds_like_reference(static_cast<float>(-mid));
        const uint16_t h = tl::float_to_half(static_cast<float>(mid));
        EXPECT_EQ(h & 1, 0) << "tie between 0x" << std::hex << i << " and its successor";
    }
    EXPECT_EQ(tl::float_to_half(65520.0f), 0x7C00);
    EXPECT_EQ(tl::float_to_half(65519.99f), 0x7BFF);
}

TEST(Half, SpecialValues) {
    EXPECT_EQ(tl::float_to_half(INFINITY), 0x7C00);
    EXPECT_EQ(tl::float_to_half(-INFINITY), 0xFC00);
    EXPECT_TRUE(std::isnan(tl::half_to_float(tl::float_to_half(NAN))));
    EXPECT_EQ(tl::float_to_half(-0.0f), 0x8000);
    EXPECT_EQ(tl::float_to_half(1e-30f), 0x0000);
}
