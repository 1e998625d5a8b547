// The Marlin-class host packer: layout round trip, the documented nibble semantics the kernel relies on, the
// symmetric form's delta against the library's dequantization, and the shape rules.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <set>
#include <vector>

#include "util/error.hpp"
#include "util/half.hpp"
#include "gpu/marlin_pack.hpp"
#include "quant/quant.hpp"

namespace {

struct RawInt4 {
    int32_t k, n, group_size;
    std::vector<uint8_t> codes;    // [n][k/2]
    std::vector<uint16_t> scales;  // [n][G]
    std::vector<uint16_t> zeros;   // [n][G]
};

// Random codes and random finite, nonzero FP16 scales / zeros of either sign.
RawInt4 random_int4(int32_t k, int32_t n, int32_t group_size, std::mt19937_64 &rng) {
    RawInt4 r{k, n, group_size, {}, {}, {}};
    const size_t groups = static_cast<size_t>(n) * (k / group_size);
    std::uniform_int_distribution<int> byte(0, 255);
    std::uniform_real_distribution<float> mag(1e-3f, 2.0f);
    r.codes.resize(static_cast<size_t>(n) * k / 2);
    for (auto &c : r.codes) c = static_cast<uint8_t>(byte(rng));
    r.scales.resize(groups);
    r.zeros.resize(groups);
    for (size_t i = 0; i < groups; ++i) {
        r.scales[i] = tl::float_to_half(mag(rng));
        r.zeros[i] = tl::float_to_half((byte(rng) & 1 ? -1.0f : 1.0f) * mag(rng));
    }
    return r;
}

struct Shape {
    int32_t k, n, group_size;
};

std::vector<Shape> round_trip_shapes() {
    std::vector<Shape> shapes;
    for (int32_t k : {64, 128, 256, 384, 1024}) {
        for (int32_t n : {64, 128, 192, 320}) {
            for (int32_t gs : {32, 64, 128, k}) {
                if (k % gs == 0) shapes.push_back({k, n, gs});
            }
        }
    }
    return shapes;
}

TEST(MarlinPack, RoundTripFusedIsExact) {
    std::mt19937_64 rng(std::random_device{}());
    for (const Shape &s : round_trip_shapes()) {
        SCOPED_TRACE("k=" + std::to_string(s.k) + " n=" + std::to_string(s.n) + " gs=" + std::to_string(s.group_size));
        const RawInt4 w = random_int4(s.k, s.n, s.group_size, rng);
        const tl::MarlinPacked p =
            tl::marlin_pack(w.codes.data(), w.scales.data(), w.zeros.data(), s.k, s.n, s.group_size, tl::MarlinMode::Fused);
        ASSERT_EQ(p.words.size(), static_cast<size_t>(s.k) * s.n / 8);
        EXPECT_EQ(p.kernel_group_size(), s.group_size == s.k ? -1 : s.group_size);
        const tl::MarlinUnpacked u = tl::marlin_unpack(p);
        EXPECT_EQ(u.codes, w.codes);
        EXPECT_EQ(u.scales, w.scales);
        EXPECT_EQ(u.zeros, w.zeros);
        EXPECT_TRUE(u.delta.empty());
    }
}

TEST(MarlinPack, RoundTripSymmetricKeepsCodesAndDelta) {
    std::mt19937_64 rng(std::random_device{}());
    for (const Shape &s : round_trip_shapes()) {
        SCOPED_TRACE("k=" + std::to_string(s.k) + " n=" + std::to_string(s.n) + " gs=" + std::to_string(s.group_size));
        const RawInt4 w = random_int4(s.k, s.n, s.group_size, rng);
        const tl::MarlinPacked p = tl::marlin_pack(w.codes.data(), w.scales.data(), w.zeros.data(), s.k, s.n,
                                                   s.group_size, tl::MarlinMode::Symmetric);
        EXPECT_TRUE(p.zeros.empty());
        const tl::MarlinUnpacked u = tl::marlin_unpack(p);
        EXPECT_EQ(u.codes, w.codes);  // re-derived from (q - 8)s, they equal q
        EXPECT_EQ(u.scales, w.scales);
        ASSERT_EQ(u.delta.size(), w.scales.size());
        for (size_t i = 0; i < u.delta.size(); ++i) {
            const double expected = tl::half_to_float(w.zeros[i]) + 8.0 * tl::half_to_float(w.scales[i]);
            ASSERT_EQ(u.delta[i], static_cast<float>(expected)) << "group entry " << i;
        }
    }
}

// Every (k, n) lands on its own nibble, and the nibbles tile the words exactly.
TEST(MarlinPack, CodePositionsAreABijection) {
    const int32_t k = 128, n = 192;
    std::set<std::pair<size_t, int32_t>> seen;
    for (int32_t nn = 0; nn < n; ++nn) {
        for (int32_t kk = 0; kk < k; ++kk) {
            const tl::MarlinNibble at = tl::marlin_code_position(k, n, kk, nn);
            ASSERT_LT(at.word, static_cast<size_t>(k) * n / 8);
            ASSERT_TRUE(at.shift >= 0 && at.shift <= 28 && at.shift % 4 == 0);
            ASSERT_TRUE(seen.insert({at.word, at.shift}).second) << "kk=" << kk << " nn=" << nn;
        }
    }
    EXPECT_EQ(seen.size(), static_cast<size_t>(k) * n);
}

// The layout contract the kernel's fragments rely on, written from the header's formula (word index ->
// lane/word/nibble -> (k, n)), independently of the packer's own index function.
TEST(MarlinPack, WordsFollowTheDocumentedFragmentOrder) {
    std::mt19937_64 rng(std::random_device{}());
    const int32_t k = 256, n = 192, gs = 64;
    const RawInt4 w = random_int4(k, n, gs, rng);
    const tl::MarlinPacked p =
        tl::marlin_pack(w.codes.data(), w.scales.data(), w.zeros.data(), k, n, gs, tl::MarlinMode::Fused);
    for (size_t i = 0; i < p.words.size(); ++i) {
        const int32_t word = static_cast<int32_t>(i % 4), lane = static_cast<int32_t>((i / 4) % 32);
        const size_t cell = i / 128;
        const int32_t kblock = static_cast<int32_t>(cell % (k / 16)), strip = static_cast<int32_t>(cell / (k / 16));
        for (int32_t nib = 0; nib < 8; ++nib) {
            const int32_t nn = strip * 64 + 8 * (2 * word + (nib & 1)) + lane / 4;
            const int32_t kk = kblock * 16 + 8 * ((nib >> 1) & 1) + 2 * (lane % 4) + (nib >> 2);
            const uint32_t expected = (w.codes[static_cast<size_t>(nn) * (k / 2) + kk / 2] >> ((kk & 1) * 4)) & 0xF;
            ASSERT_EQ((p.words[i] >> (4 * nib)) & 0xF, expected) << "word " << i << " nibble " << nib;
        }
    }
    // Lane L's eight scales of a strip sit together: position 8 * (L / 4) + j is column 8j + L / 4.
    for (int32_t g = 0; g < k / gs; ++g) {
        for (int32_t strip = 0; strip < n / 64; ++strip) {
            for (int32_t r = 0; r < 8; ++r) {
                for (int32_t j = 0; j < 8; ++j) {
                    const int32_t nn = strip * 64 + 8 * j + r;
                    ASSERT_EQ(p.scales[static_cast<size_t>(g) * n + strip * 64 + 8 * r + j],
                              w.scales[static_cast<size_t>(nn) * (k / gs) + g]);
                }
            }
        }
    }
}

// The second reading of the same words, used by the M <= 16 kernel: word w of lane L is the mma.m16n8k16 A
// fragment of the 16 x 16 tile (rows = columns 16w + r of the strip, columns = k), written here from the PTX
// fragment definition: register i (nibbles i and i + 4, the low half first) holds row L/4 + 8 (i & 1), columns
// 2 (L % 4) + 8 (i >> 1) + {0, 1}.
TEST(MarlinPack, WordsAreMmaAFragments) {
    std::mt19937_64 rng(std::random_device{}());
    const int32_t k = 128, n = 128, gs = 64;
    const RawInt4 w = random_int4(k, n, gs, rng);
    const tl::MarlinPacked p =
        tl::marlin_pack(w.codes.data(), w.scales.data(), w.zeros.data(), k, n, gs, tl::MarlinMode::Fused);
    for (int32_t strip = 0; strip < n / 64; ++strip) {
        for (int32_t kb = 0; kb < k / 16; ++kb) {
            for (int32_t lane = 0; lane < 32; ++lane) {
                for (int32_t word = 0; word < 4; ++word) {
                    const uint32_t v = p.words[((static_cast<size_t>(strip) * (k / 16) + kb) * 32 + lane) * 4 + word];
                    for (int32_t reg = 0; reg < 4; ++reg) {
                        for (int32_t half = 0; half < 2; ++half) {
                            const int32_t row = lane / 4 + 8 * (reg & 1);
                            const int32_t col = 2 * (lane % 4) + 8 * (reg >> 1) + half;
                            const int32_t nn = strip * 64 + 16 * word + row, kk = kb * 16 + col;
                            const uint8_t byte = w.codes[static_cast<size_t>(nn) * (k / 2) + kk / 2];
                            const uint32_t code = (byte >> ((kk & 1) * 4)) & 0xF;
                            ASSERT_EQ((v >> (4 * (reg + 4 * half))) & 0xF, code)
                                << "strip " << strip << " k block " << kb << " lane " << lane << " word " << word;
                        }
                    }
                }
            }
        }
    }
}

// Symmetric form: for every cell, (q - 8)s + delta equals the library's dequantized W = q*s + z.
TEST(MarlinPack, DeltaMatchesDequantize) {
    std::mt19937_64 rng(std::random_device{}());
    std::normal_distribution<float> normal(0.0f, 0.05f);
    for (int32_t gs : {32, 64, 128, 0}) {
        const int32_t k = 256, n = 128;
        std::vector<float> dense(static_cast<size_t>(k) * n);
        for (auto &v : dense) v = normal(rng);
        const tl::Linear lin = tl::make_quantized_linear(
            "w", tl::quantize_minmax(dense.data(), k, n, gs, tl::QuantMethod::Asymmetric));
        const tl::MarlinPacked p = tl::marlin_pack(lin, tl::MarlinMode::Symmetric);
        std::vector<float> deq(static_cast<size_t>(k) * n);
        tl::dequantize_rows(lin, 0, n, deq.data());
        const tl::MarlinUnpacked u = tl::marlin_unpack(p);
        const int32_t groups = lin.n_groups();
        for (int32_t nn = 0; nn < n; ++nn) {
            for (int32_t kk = 0; kk < k; ++kk) {
                const size_t gi = static_cast<size_t>(nn) * groups + kk / lin.group_size;
                const double s = tl::half_to_float(u.scales[gi]);
                const double q = (u.codes[static_cast<size_t>(nn) * (k / 2) + kk / 2] >> ((kk & 1) * 4)) & 0xF;
                const double rebuilt = (q - 8.0) * s + u.delta[gi];
                const double ref = deq[static_cast<size_t>(nn) * k + kk];
                // Both sides are the same real number rounded once to FP32 at most.
                ASSERT_NEAR(rebuilt, ref, 2e-7 * (std::fabs(ref) + std::fabs(u.delta[gi]) + 8.0 * std::fabs(s)))
                    << "gs=" << gs << " k=" << kk << " n=" << nn;
            }
        }
    }
}

TEST(MarlinPack, RefusesUnsupportedShapes) {
    const std::vector<uint8_t> codes(64 * 256, 0x88);
    const std::vector<uint16_t> sz(64 * 64, tl::float_to_half(1.0f));
    for (const Shape &s : {Shape{96, 64, 32}, Shape{128, 96, 32}, Shape{128, 64, 48}, Shape{128, 64, 16},
                           Shape{256, 64, 96}, Shape{0, 64, 32}}) {
        EXPECT_NE(tl::marlin_shape_error(s.k, s.n, s.group_size), nullptr);
        EXPECT_THROW(tl::marlin_pack(codes.data(), sz.data(), sz.data(), s.k, s.n, s.group_size, tl::MarlinMode::Fused),
                     tl::Error);
    }
    EXPECT_EQ(tl::marlin_shape_error(128, 64, 32), nullptr);
    EXPECT_EQ(tl::marlin_shape_error(192, 64, 192), nullptr);  // per row, K a multiple of 64
    EXPECT_THROW(tl::marlin_pack(nullptr, sz.data(), sz.data(), 128, 64, 32, tl::MarlinMode::Fused), tl::Error);
}

}  // namespace
