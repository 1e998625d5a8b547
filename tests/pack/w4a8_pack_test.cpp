// The W4A8 packer (cpp/gpu/w4a8_pack.hpp) against the INT8 GEMM's register operand: read back the way the kernel's
// threads read it (cuda/int8_gemm.cu: 32 bytes a lane per slice, two logic operations a word), each byte must be the
// code that wgmma's A fragment wants there (row lane / 4 (+ 8), k 4 (lane % 4) + byte (+ 16)); padding is zeros.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "gpu/w4a8_pack.hpp"
#include "int8_gemm_layout.hpp"
#include "util/half.hpp"
#include "../common/tl_error.hpp"

namespace {

// The file's layout: n rows of (k + 1) / 2 bytes, low nibble = even k.
std::vector<uint8_t> random_codes(int32_t n, int32_t k, uint32_t seed) {
    std::mt19937 g(seed);
    std::vector<uint8_t> codes(static_cast<size_t>(n) * ((k + 1) / 2));
    for (auto &c : codes) c = static_cast<uint8_t>(g());
    if (k % 2 != 0) {  // the unused high nibble of each row's last byte
        for (int32_t r = 0; r < n; ++r) codes[static_cast<size_t>(r) * ((k + 1) / 2) + k / 2] &= 0x0F;
    }
    return codes;
}

uint8_t file_code(const std::vector<uint8_t> &codes, int32_t k, int32_t row, int32_t kk) {
    return (codes[static_cast<size_t>(row) * ((k + 1) / 2) + kk / 2] >> (4 * (kk % 2))) & 0xF;
}

class W4a8Pack : public ::testing::TestWithParam<std::pair<int32_t, int32_t>> {};

TEST_P(W4a8Pack, ThreadsReadTheFragmentsWgmmaWants) {
    const auto [n, k] = GetParam();
    const std::vector<uint8_t> codes = random_codes(n, k, static_cast<uint32_t>(n * 7919 + k));
    const std::vector<uint32_t> packed = tl::w4a8_pack(codes.data(), n, k);
    namespace lay = tl::gpu::w4a8;
    const int64_t n_pad = lay::padded_n(n), k_pad = lay::padded_k(k);
    ASSERT_EQ(packed.size() * 4, lay::packed_bytes(n, k));
    ASSERT_EQ(static_cast<int64_t>(packed.size()) * 8, n_pad * k_pad);
    const int64_t strips = n_pad / 64;
    for (int64_t slice = 0; slice < k_pad / lay::kSliceK; ++slice) {
        for (int64_t strip = 0; strip < strips; ++strip) {
            // A stage's bytes of this strip, as the bulk copy leaves them in shared memory.
            const uint32_t *stage = packed.data() + (slice * strips + strip) * (lay::kStripBytes / 4);
            for (int w = 0; w < 4; ++w) {
                for (int lane = 0; lane < 32; ++lane) {
                    const uint32_t *h0 = stage + w * 256 + lane * 4, *h1 = h0 + 128;
                    const uint32_t words[8] = {h0[0], h0[1], h0[2], h0[3], h1[0], h1[1], h1[2], h1[3]};
                    for (int c = 0; c < 4; ++c) {
                        const uint32_t lo = words[2 * c], hi = words[2 * c + 1];
                        const uint32_t a[4] = {lo & 0x0F0F0F0Fu, hi & 0x0F0F0F0Fu, (lo >> 4) & 0x0F0F0F0Fu,
                                               (hi >> 4) & 0x0F0F0F0Fu};
                        for (int reg = 0; reg < 4; ++reg) {
                            for (int byte = 0; byte < 4; ++byte) {
                                const int64_t row = strip * 64 + w * 16 + lane / 4 + 8 * (reg % 2);
                                const int64_t kk = slice * lay::kSliceK + 32 * c + 4 * (lane % 4) + byte +
                                                   16 * (reg / 2);
                                const uint32_t want =
                                    row < n && kk < k ? file_code(codes, k, static_cast<int32_t>(row),
                                                                  static_cast<int32_t>(kk))
                                                      : 0u;
                                ASSERT_EQ((a[reg] >> (8 * byte)) & 0xFFu, want)
                                    << "row " << row << ", k " << kk << " (lane " << lane << ", step " << c << ")";
                            }
                        }
                    }
                }
            }
        }
    }
    for (int32_t col = 0; col < n; col += 7) {
        for (int32_t kk = 0; kk < k; kk += 5) {
            EXPECT_EQ(tl::w4a8_code(packed, n, col, kk), file_code(codes, k, col, kk));
        }
    }
}

INSTANTIATE_TEST_SUITE_P(Shapes, W4a8Pack,
                         ::testing::Values(std::pair{64, 128}, std::pair{128, 256}, std::pair{200, 144},
                                           std::pair{1, 1}, std::pair{130, 333}, std::pair{384, 1024}),
                         [](const auto &info) {
                             return "n" + std::to_string(info.param.first) + "_k" + std::to_string(info.param.second);
                         });

struct GroupShape {
    int32_t n, k, group;
};
class W4a8PackGroups : public ::testing::TestWithParam<GroupShape> {};

// A grouped weight's scales and zeros read back as the kernel does: per k slice one copy of the tile's groups, then
// thread (warpgroup wg, warp wj, lane) of group q loads 16 bytes: s and z of columns c and c + 8.
TEST_P(W4a8PackGroups, ThreadsReadTheirColumnsScalesAndZeros) {
    const auto [n, k, group] = GetParam();
    const int32_t groups = k / group;
    std::mt19937 rng(static_cast<uint32_t>(n * 31 + k + group));
    std::vector<uint16_t> scales(static_cast<size_t>(n) * groups), zeros(scales.size());
    for (auto &v : scales) v = static_cast<uint16_t>(0x1800 + rng() % 0x1000);  // positive, normal FP16
    for (auto &v : zeros) v = static_cast<uint16_t>(0x9800 + rng() % 0x1000);   // negative
    const std::vector<float> packed = tl::w4a8_pack_groups(scales.data(), zeros.data(), n, k, group);
    namespace lay = tl::gpu::w4a8;
    ASSERT_EQ(packed.size(), lay::group_floats(n, k, group));
    const int64_t tiles = lay::padded_n(n) / lay::kTileColumns, per_slice = lay::kSliceK / group;
    for (int64_t tile = 0; tile < tiles; ++tile) {
        for (int64_t slice = 0; slice < lay::padded_k(k) / lay::kSliceK; ++slice) {
            const float *copied = packed.data() + (tile * lay::padded_groups(k, group) + slice * per_slice) * 256;
            for (int64_t q = 0; q < per_slice; ++q) {
                const int64_t g = slice * per_slice + q;
                for (int t = 0; t < 256; ++t) {
                    const int wg = t / 128, wj = t / 32 % 4, lane = t % 32;
                    const float *v = copied + q * 256 + (wg * 32 + wj * 8 + lane / 4) * 4;
                    for (int h = 0; h < 2; ++h) {
                        const int64_t col = tile * 128 + 64 * wg + 16 * wj + lane / 4 + 8 * h;
                        const bool in = col < n && g < groups;
                        const size_t at = static_cast<size_t>(col) * groups + static_cast<size_t>(g);
                        ASSERT_EQ(v[h], in ? tl::half_to_float(scales[at]) : 0.0f)
                            << "s, column " << col << ", g " << g;
                        ASSERT_EQ(v[2 + h], in ? tl::half_to_float(zeros[at]) : 0.0f) << "z, column " << col;
                    }
                }
            }
        }
    }
}

INSTANTIATE_TEST_SUITE_P(Shapes, W4a8PackGroups,
                         ::testing::Values(GroupShape{64, 128, 32}, GroupShape{200, 160, 32}, GroupShape{130, 384, 64},
                                           GroupShape{1, 128, 128}, GroupShape{300, 640, 128}),
                         [](const auto &info) {
                             return "n" + std::to_string(info.param.n) + "_k" + std::to_string(info.param.k) + "_g" +
                                    std::to_string(info.param.group);
                         });

TEST(W4a8Pack, Refusals) {
    const uint8_t codes[64] = {};
    EXPECT_TRUE(tlt::throws(TL_ERR_INVALID_ARGUMENT, {"w4a8_pack"}, [&] { tl::w4a8_pack(nullptr, 4, 4); }));
    EXPECT_TRUE(tlt::throws(TL_ERR_INVALID_ARGUMENT, {"w4a8_pack"}, [&] { tl::w4a8_pack(codes, 0, 4); }));
    EXPECT_TRUE(tlt::throws(TL_ERR_INVALID_ARGUMENT, {"w4a8_pack"}, [&] { tl::w4a8_pack(codes, 4, 0); }));
    const uint16_t params[64] = {};
    auto groups = [&](const uint16_t *s, int32_t k, int32_t group) { tl::w4a8_pack_groups(s, params, 2, k, group); };
    EXPECT_TRUE(tlt::throws(TL_ERR_INVALID_ARGUMENT, {"w4a8_pack_groups"}, [&] { groups(nullptr, 128, 32); }));
    EXPECT_TRUE(tlt::throws(TL_ERR_INVALID_ARGUMENT, {"group 16"}, [&] { groups(params, 128, 16); }));
    EXPECT_TRUE(tlt::throws(TL_ERR_INVALID_ARGUMENT, {"group 64"}, [&] { groups(params, 96, 64); }));
}

}  // namespace
