// W8A8 (per-token INT8 activations, INT8 weights with per-channel scales, cuBLAS INT8 GEMM into INT32 and the scaling
// epilogue) and the INT8 tensor-core GEMM (int8_gemm: W8A8, and W4A8 on packed INT4 codes with zero points, per row or
// in groups of 32, 64, 128) against a host implementation of the activation-precision rule (docs/quality.md) on the
// same FP16 input: equal bit for bit, on fresh random inputs into a poisoned output. Plus the rows the rule singles out
// (zeros, a NaN), the quantizer's group sums and the refusals.
#include <cublas_v2.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <tuple>
#include <vector>

#include "gpu/w4a8_pack.hpp"
#include "gpu_kernels.hpp"
#include "gpu_test_util.hpp"
#include "util/half.hpp"

namespace {

using tlt::DeviceBuffer;

struct W8a8Shape {
    int m, n, k;
};

// X quantized by the rule on the host: true FP32 divisions, rne (the default rounding mode), and each row's code sum.
struct QuantizedRows {
    std::vector<int32_t> q;  // [m][k]
    std::vector<float> scale;
    std::vector<int32_t> sum;
};
QuantizedRows quantize_reference(const std::vector<uint16_t> &x, int m, int k) {
    QuantizedRows out{std::vector<int32_t>(static_cast<size_t>(m) * k), std::vector<float>(m),
                      std::vector<int32_t>(m, 0)};
    for (int r = 0; r < m; ++r) {
        float amax = 0.0f;
        bool nan = false;
        for (int c = 0; c < k; ++c) {
            const float v = tl::half_to_float(x[static_cast<size_t>(r) * k + c]);
            nan = nan || std::isnan(v);
            amax = std::max(amax, std::fabs(v));
        }
        const float sx = nan ? NAN : amax / 127.0f;
        out.scale[r] = sx;
        for (int c = 0; c < k; ++c) {
            const float v = tl::half_to_float(x[static_cast<size_t>(r) * k + c]);
            const int32_t q = sx > 0.0f ? std::clamp(static_cast<int32_t>(std::nearbyint(v / sx)), -127, 127) : 0;
            out.q[static_cast<size_t>(r) * k + c] = q;
            out.sum[r] += q;
        }
    }
    return out;
}

// y = fp16(fl(s_x · fma(z, S, fl(s · D)))) with D exact; `code(c, k)` is weight column c's code at k.
template <class Code>
std::vector<uint16_t> rule_output(const QuantizedRows &xq, int m, int n, int k, Code code,
                                  const std::vector<float> &scales, const std::vector<float> &zeros) {
    std::vector<uint16_t> y(static_cast<size_t>(m) * n);
    for (int r = 0; r < m; ++r) {
        const int32_t *qr = xq.q.data() + static_cast<size_t>(r) * k;
        for (int c = 0; c < n; ++c) {
            int64_t d = 0;
            for (int kk = 0; kk < k; ++kk) d += static_cast<int64_t>(qr[kk]) * code(c, kk);
            const float z = zeros.empty() ? 0.0f : zeros[c];
            const float acc =
                std::fmaf(z, static_cast<float>(xq.sum[r]), scales[c] * static_cast<float>(static_cast<int32_t>(d)));
            y[static_cast<size_t>(r) * n + c] = tl::float_to_half(xq.scale[r] * acc);
        }
    }
    return y;
}

// The rule for INT8 weights: fl(s_x · fl(s_w · fl(D))) rounded to FP16.
std::vector<uint16_t> reference(const std::vector<uint16_t> &x, const std::vector<int8_t> &w,
                                const std::vector<float> &w_scales, const W8a8Shape &s) {
    return rule_output(quantize_reference(x, s.m, s.k), s.m, s.n, s.k,
                       [&](int c, int kk) { return static_cast<int32_t>(w[static_cast<size_t>(c) * s.k + kk]); },
                       w_scales, {});
}

// y against the rule's output bit for bit; where X's row 0 held a NaN, that row all NaN instead.
::testing::AssertionResult equals_rule(const std::vector<uint16_t> &y, const std::vector<uint16_t> &want, int n,
                                       bool nan_row0 = false) {
    for (size_t i = 0; i < y.size(); ++i) {
        const bool nan_wanted = nan_row0 && i < static_cast<size_t>(n);
        if (nan_wanted ? !std::isnan(tl::half_to_float(y[i])) : y[i] != want[i]) {
            return ::testing::AssertionFailure() << "y[" << i / n << "][" << i % n << "] = " << tl::half_to_float(y[i])
                                                 << ", the rule gives " << (nan_wanted ? NAN : tl::half_to_float(want[i]));
        }
    }
    return ::testing::AssertionSuccess();
}

class W8a8 : public ::testing::TestWithParam<W8a8Shape> {};

TEST_P(W8a8, EqualsTheRuleBitForBit) {
    const W8a8Shape s = GetParam();
    if (tlt::g_quick && static_cast<double>(s.m) * s.n * s.k > 6e7) GTEST_SKIP() << "quick mode";
    std::vector<uint16_t> x = tlt::random_normal_half(static_cast<size_t>(s.m) * s.k);
    if (s.m >= 3) {
        std::fill_n(x.begin() + s.k, s.k, tl::float_to_half(0.0f));      // row 1: zeros -> zero outputs
        x[2 * static_cast<size_t>(s.k) + s.k / 2] = tl::float_to_half(60000.0f);  // row 2: one huge value
    }
    std::uniform_int_distribution<int> code(-127, 127);
    std::vector<int8_t> w(static_cast<size_t>(s.n) * s.k);
    for (auto &v : w) v = static_cast<int8_t>(code(tlt::rng()));
    std::uniform_real_distribution<float> scale(0.001f, 0.02f);
    std::vector<float> ws(static_cast<size_t>(s.n));
    for (auto &v : ws) v = scale(tlt::rng());

    DeviceBuffer<uint16_t> dx(x.size()), dy(static_cast<size_t>(s.m) * s.n);
    DeviceBuffer<float> dws(ws.size());
    DeviceBuffer<int8_t> dw(w.size());
    DeviceBuffer<char> scratch(tl::gpu::w8a8_scratch_bytes(s.m, s.n, s.k));
    for (bool ok : {dx.ok(), dy.ok(), dws.ok(), dw.ok(), scratch.ok()}) ASSERT_TRUE(ok);
    CUDA_OK(dx.upload(x));
    CUDA_OK(dw.upload(w));
    CUDA_OK(dws.upload(ws));
    CUDA_OK(dy.poison());
    cublasHandle_t handle = nullptr;
    ASSERT_EQ(CUBLAS_STATUS_SUCCESS, cublasCreate(&handle));
    ASSERT_EQ(0, tl::gpu::w8a8_gemm(handle, dx.get(), dw.get(), dws.get(), dy.get(), s.m, s.n, s.k, scratch.get(),
                                    scratch.bytes(), nullptr));
    CUDA_OK(cudaDeviceSynchronize());
    std::vector<uint16_t> y;
    CUDA_OK(dy.download(y));
    const std::vector<uint16_t> want = reference(x, w, ws, s);
    for (size_t i = 0; i < y.size(); ++i) {
        ASSERT_EQ(y[i], want[i]) << "y[" << i / s.n << "][" << i % s.n << "] = " << tl::half_to_float(y[i])
                                 << ", the rule gives " << tl::half_to_float(want[i]);
    }
    if (s.m >= 3) {
        for (int c = 0; c < s.n; ++c) ASSERT_EQ(tl::half_to_float(y[static_cast<size_t>(s.n) + c]), 0.0f);
    }

    // A NaN in a row makes that row's outputs NaN and leaves the others as they were.
    x[0] = 0x7E00;
    CUDA_OK(dx.upload(x));
    ASSERT_EQ(0, tl::gpu::w8a8_gemm(handle, dx.get(), dw.get(), dws.get(), dy.get(), s.m, s.n, s.k, scratch.get(),
                                    scratch.bytes(), nullptr));
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(dy.download(y));
    for (int c = 0; c < s.n; ++c) ASSERT_TRUE(std::isnan(tl::half_to_float(y[c]))) << "column " << c;
    for (size_t i = static_cast<size_t>(s.n); i < y.size(); ++i) ASSERT_EQ(y[i], want[i]) << i;
    cublasDestroy(handle);
}

INSTANTIATE_TEST_SUITE_P(Shapes, W8a8,
                         ::testing::Values(W8a8Shape{1, 64, 64}, W8a8Shape{5, 200, 100}, W8a8Shape{64, 256, 512},
                                           W8a8Shape{300, 130, 2048}, W8a8Shape{1024, 512, 4096}),
                         [](const ::testing::TestParamInfo<W8a8Shape> &info) {
                             return "m" + std::to_string(info.param.m) + "_n" + std::to_string(info.param.n) + "_k" +
                                    std::to_string(info.param.k);
                         });

TEST(W8a8Launcher, Refusals) {
    DeviceBuffer<uint16_t> x(64 * 64), y(64 * 64);
    DeviceBuffer<float> ws(64);
    DeviceBuffer<int8_t> w(64 * 64);
    DeviceBuffer<char> scratch(tl::gpu::w8a8_scratch_bytes(64, 64, 64));
    cublasHandle_t handle = nullptr;
    ASSERT_EQ(CUBLAS_STATUS_SUCCESS, cublasCreate(&handle));
    auto run = [&](int m, int n, int k, size_t scratch_bytes, const int8_t *wp) {
        return tl::gpu::w8a8_gemm(handle, x.get(), wp, ws.get(), y.get(), m, n, k, scratch.get(), scratch_bytes,
                                  nullptr);
    };
    EXPECT_EQ(tl::gpu::kRcBadArgument, run(0, 64, 64, scratch.bytes(), w.get()));
    EXPECT_EQ(tl::gpu::kRcBadArgument, run(64, 64, 64, scratch.bytes(), nullptr));
    EXPECT_EQ(tl::gpu::kRcUnsupported, run(64, 64, 62, scratch.bytes(), w.get()));  // K % 4 != 0
    EXPECT_EQ(tl::gpu::kRcUnsupported, run(64, 64, 64, scratch.bytes(), w.get() + 4));  // misaligned weights
    EXPECT_EQ(tl::gpu::kRcWorkspace, run(64, 64, 64, scratch.bytes() - 1, w.get()));
    cublasDestroy(handle);
}

// ---- The INT8 tensor-core GEMM (int8_gemm) -------------------------------------------------------------------------

struct Int8GemmCase {
    W8a8Shape shape;
    bool int4;  // W4A8 (packed INT4 codes with zero points), else W8A8
};

class Int8Gemm : public ::testing::TestWithParam<Int8GemmCase> {};

TEST_P(Int8Gemm, EqualsTheRuleBitForBit) {
    const auto [s, int4] = GetParam();
    if (!tlt::sm90a_kernels_run()) GTEST_SKIP() << "needs compute capability 9.0 and a build for sm_90a";
    if (tlt::g_quick && static_cast<double>(s.m) * s.n * s.k > 6e7) GTEST_SKIP() << "quick mode";
    std::vector<uint16_t> x = tlt::random_normal_half(static_cast<size_t>(s.m) * s.k);
    if (s.m >= 3) {
        std::fill_n(x.begin() + s.k, s.k, tl::float_to_half(0.0f));                // row 1: zeros
        x[2 * static_cast<size_t>(s.k) + s.k / 2] = tl::float_to_half(60000.0f);  // row 2: one huge value
    }
    // Weights: INT8 codes [N][K] and per-column scales; or INT4 codes in the file's layout, FP16 scales and zeros
    // that straddle zero as min-max quantization leaves them.
    std::uniform_real_distribution<float> unit(0.0f, 1.0f);
    std::vector<float> scales(s.n), zeros;
    for (auto &v : scales) v = tl::half_to_float(tl::float_to_half(0.004f + 0.016f * unit(tlt::rng())));
    std::vector<int8_t> w8;
    std::vector<uint8_t> codes;
    std::vector<uint32_t> packed;
    if (int4) {
        zeros.resize(s.n);
        for (int c = 0; c < s.n; ++c) {
            zeros[c] = tl::half_to_float(tl::float_to_half(-scales[c] * (6.0f + 3.0f * unit(tlt::rng()))));
        }
        codes.resize(static_cast<size_t>(s.n) * ((s.k + 1) / 2));
        for (auto &v : codes) v = static_cast<uint8_t>(tlt::rng()());
        packed = tl::w4a8_pack(codes.data(), s.n, s.k);
    } else {
        std::uniform_int_distribution<int> code(-128, 127);
        w8.resize(static_cast<size_t>(s.n) * s.k);
        for (auto &v : w8) v = static_cast<int8_t>(code(tlt::rng()));
    }
    auto weight_code = [&](int c, int kk) -> int32_t {
        if (int4) return (codes[static_cast<size_t>(c) * ((s.k + 1) / 2) + kk / 2] >> (4 * (kk % 2))) & 0xF;
        return w8[static_cast<size_t>(c) * s.k + kk];
    };

    DeviceBuffer<uint16_t> dx(x.size()), dy(static_cast<size_t>(s.m) * s.n);
    DeviceBuffer<int8_t> dxq(static_cast<size_t>(s.m) * s.k), dw8(std::max<size_t>(w8.size(), 1));
    DeviceBuffer<uint32_t> dw4(std::max<size_t>(packed.size(), 1));
    DeviceBuffer<float> dxs(s.m), dscales(s.n), dzeros(std::max<size_t>(zeros.size(), 1));
    DeviceBuffer<int32_t> dsums(s.m);
    DeviceBuffer<char> workspace(tl::gpu::marlin_workspace_bytes(tlt::sm_count()));
    for (bool ok : {dx.ok(), dy.ok(), dxq.ok(), dw8.ok(), dw4.ok(), dxs.ok(), dscales.ok(), dzeros.ok(), dsums.ok(),
                    workspace.ok()}) {
        ASSERT_TRUE(ok);
    }
    CUDA_OK(dscales.upload(scales));
    if (int4) {
        CUDA_OK(dw4.upload(packed));
        CUDA_OK(dzeros.upload(zeros));
    } else {
        CUDA_OK(dw8.upload(w8));
    }
    CUDA_OK(cudaMemset(workspace.get(), 0, workspace.bytes()));
    tl::gpu::Int8GemmArgs a;
    a.xq = dxq.get();
    a.x_scales = dxs.get();
    a.x_sums = int4 ? dsums.get() : nullptr;
    a.w = int4 ? static_cast<const void *>(dw4.get()) : static_cast<const void *>(dw8.get());
    a.w_scales = dscales.get();
    a.w_zeros = int4 ? dzeros.get() : nullptr;
    a.y = dy.get();
    a.m = s.m;
    a.n = s.n;
    a.k = s.k;
    const auto weights = int4 ? tl::gpu::Int8Weights::Int4Packed : tl::gpu::Int8Weights::Int8;
    std::vector<uint16_t> y;
    auto run = [&](bool nan_row0) {  // into y; nan_row0: with a NaN in X's row 0
        if (nan_row0) x[0] = 0x7E00;
        CUDA_OK(dx.upload(x));
        CUDA_OK(dy.poison());
        ASSERT_EQ(0, tl::gpu::quantize_rows_int8(dx.get(), s.m, s.k, dxq.get(), dxs.get(), nullptr,
                                                 int4 ? dsums.get() : nullptr));
        ASSERT_EQ(0, tl::gpu::int8_gemm(a, weights, workspace.get(), workspace.bytes(), nullptr));
        CUDA_OK(cudaDeviceSynchronize());
        CUDA_OK(dy.download(y));
    };
    run(false);
    const std::vector<uint16_t> want =
        rule_output(quantize_reference(x, s.m, s.k), s.m, s.n, s.k, weight_code, scales, zeros);
    ASSERT_TRUE(equals_rule(y, want, s.n));
    // A NaN in a row makes that row's outputs NaN and leaves the others as they were; the workspace came back zeroed.
    run(true);
    ASSERT_TRUE(equals_rule(y, want, s.n, true));
    std::vector<char> ws;
    CUDA_OK(workspace.download(ws));
    ASSERT_TRUE(std::all_of(ws.begin(), ws.end(), [](char b) { return b == 0; })) << "the workspace was left dirty";
}

// Whole tiles and stream-K (few tiles, many k slices: cut tiles summed in the workspace); N and K off the tile sizes.
const Int8GemmCase kInt8GemmCases[] = {
    {{1, 64, 128}, false},     {{1, 64, 128}, true},       {{5, 200, 144}, false},    {{5, 200, 144}, true},
    {{64, 256, 512}, true},    {{300, 130, 2048}, false},  {{300, 130, 2048}, true},  {{256, 256, 8192}, false},
    {{256, 256, 8192}, true},  {{1024, 512, 4096}, true},  {{2048, 2048, 1024}, false}, {{2048, 2048, 1024}, true},
    {{4100, 384, 256}, true},
};
INSTANTIATE_TEST_SUITE_P(Shapes, Int8Gemm, ::testing::ValuesIn(kInt8GemmCases),
                         [](const ::testing::TestParamInfo<Int8GemmCase> &info) {
                             const W8a8Shape &s = info.param.shape;
                             return std::string(info.param.int4 ? "w4a8" : "w8a8") + "_m" + std::to_string(s.m) +
                                    "_n" + std::to_string(s.n) + "_k" + std::to_string(s.k);
                         });

// ---- Grouped INT4 weights (W4A8 with groups of 32, 64, 128) --------------------------------------------------------

struct GroupedCase {
    W8a8Shape shape;
    int group;
};

class Int8GemmGrouped : public ::testing::TestWithParam<GroupedCase> {};

// The quantizer's outputs (codes, scales, group sums) are copied back: its group sums must equal the host's sums of its
// codes, and the GEMM's output the host's rule on those same inputs, bit for bit: acc = fma(z, S, fma(s, D, acc)) over
// the groups in order from -0, y = fp16(fl(s_x · acc)).
TEST_P(Int8GemmGrouped, EqualsTheRuleBitForBit) {
    const auto [s, group] = GetParam();
    if (!tlt::sm90a_kernels_run()) GTEST_SKIP() << "needs compute capability 9.0 and a build for sm_90a";
    if (tlt::g_quick && static_cast<double>(s.m) * s.n * s.k > 6e7) GTEST_SKIP() << "quick mode";
    const int groups = s.k / group, ld = tl::gpu::int8_group_sums_ld(s.m);
    std::vector<uint16_t> x = tlt::random_normal_half(static_cast<size_t>(s.m) * s.k);
    if (s.m >= 3) {
        std::fill_n(x.begin() + s.k, s.k, tl::float_to_half(0.0f));                // row 1: zeros
        x[2 * static_cast<size_t>(s.k) + s.k / 2] = tl::float_to_half(60000.0f);  // row 2: one huge value
    }
    // FP16 scales and zeros per column and group, straddling zero as min-max quantization leaves them.
    std::uniform_real_distribution<float> unit(0.0f, 1.0f);
    std::vector<uint16_t> scales(static_cast<size_t>(s.n) * groups), zeros(scales.size());
    for (size_t i = 0; i < scales.size(); ++i) {
        const float sc = tl::half_to_float(tl::float_to_half(0.004f + 0.016f * unit(tlt::rng())));
        scales[i] = tl::float_to_half(sc);
        zeros[i] = tl::float_to_half(-sc * (6.0f + 3.0f * unit(tlt::rng())));
    }
    std::vector<uint8_t> codes(static_cast<size_t>(s.n) * ((s.k + 1) / 2));
    for (auto &v : codes) v = static_cast<uint8_t>(tlt::rng()());
    const std::vector<uint32_t> packed = tl::w4a8_pack(codes.data(), s.n, s.k);
    const std::vector<float> params = tl::w4a8_pack_groups(scales.data(), zeros.data(), s.n, s.k, group);

    DeviceBuffer<uint16_t> dx(x.size()), dy(static_cast<size_t>(s.m) * s.n);
    DeviceBuffer<int8_t> dxq(static_cast<size_t>(s.m) * s.k);
    DeviceBuffer<uint32_t> dw(packed.size());
    DeviceBuffer<float> dxs(s.m), dparams(params.size()), dsums(static_cast<size_t>(groups) * ld);
    for (bool ok : {dx.ok(), dy.ok(), dxq.ok(), dw.ok(), dxs.ok(), dparams.ok(), dsums.ok()}) ASSERT_TRUE(ok);
    CUDA_OK(dw.upload(packed));
    CUDA_OK(dparams.upload(params));
    tl::gpu::Int8GemmArgs a;
    a.xq = dxq.get();
    a.x_scales = dxs.get();
    a.w = dw.get();
    a.y = dy.get();
    a.m = s.m;
    a.n = s.n;
    a.k = s.k;
    a.group_size = group;
    a.w_groups = dparams.get();
    a.x_group_sums = dsums.get();
    std::vector<uint16_t> y;
    auto run = [&](bool nan_row0) {  // into y; nan_row0: with a NaN in X's row 0
        if (nan_row0) x[0] = 0x7E00;
        CUDA_OK(dx.upload(x));
        CUDA_OK(dy.poison());
        CUDA_OK(dsums.poison());
        ASSERT_EQ(0, tl::gpu::quantize_rows_int8(dx.get(), s.m, s.k, dxq.get(), dxs.get(), nullptr, nullptr,
                                                 dsums.get(), group));
        // Grouped weights run whole tiles: no workspace.
        ASSERT_EQ(0, tl::gpu::int8_gemm(a, tl::gpu::Int8Weights::Int4Packed, nullptr, 0, nullptr));
        CUDA_OK(cudaDeviceSynchronize());
        CUDA_OK(dy.download(y));
    };
    run(false);
    std::vector<int8_t> xq;
    std::vector<float> xs, sums;
    CUDA_OK(dxq.download(xq));
    CUDA_OK(dxs.download(xs));
    CUDA_OK(dsums.download(sums));
    const QuantizedRows host = quantize_reference(x, s.m, s.k);
    for (int r = 0; r < s.m; ++r) {
        ASSERT_EQ(xs[r], host.scale[r]) << "row " << r;
        for (int g = 0; g < groups; ++g) {
            int32_t sum = 0;
            for (int kk = g * group; kk < (g + 1) * group; ++kk) {
                const int8_t q = xq[static_cast<size_t>(r) * s.k + kk];
                ASSERT_EQ(q, host.q[static_cast<size_t>(r) * s.k + kk]) << "code (" << r << ", " << kk << ")";
                sum += q;
            }
            ASSERT_EQ(sums[static_cast<size_t>(g) * ld + r], static_cast<float>(sum))
                << "group " << g << ", row " << r;
        }
    }
    std::vector<uint16_t> want(y.size());
    for (int r = 0; r < s.m; ++r) {
        for (int c = 0; c < s.n; ++c) {
            float acc = -0.0f;
            for (int g = 0; g < groups; ++g) {
                int32_t d = 0;
                for (int kk = g * group; kk < (g + 1) * group; ++kk) {
                    const int q = (codes[static_cast<size_t>(c) * ((s.k + 1) / 2) + kk / 2] >> (4 * (kk % 2))) & 0xF;
                    d += q * xq[static_cast<size_t>(r) * s.k + kk];
                }
                const size_t at = static_cast<size_t>(c) * groups + g;
                acc = std::fmaf(tl::half_to_float(scales[at]), static_cast<float>(d), acc);
                acc = std::fmaf(tl::half_to_float(zeros[at]), sums[static_cast<size_t>(g) * ld + r], acc);
            }
            want[static_cast<size_t>(r) * s.n + c] = tl::float_to_half(xs[r] * acc);
        }
    }
    ASSERT_TRUE(equals_rule(y, want, s.n));
    // A NaN in a row makes that row's outputs NaN and leaves the others as they were.
    run(true);
    ASSERT_TRUE(equals_rule(y, want, s.n, true));
}

// M and N off the 128-row and 128-column tiles, K off the 128-deep slices (a last slice of fewer groups), up to 4096.
const GroupedCase kGroupedCases[] = {
    {{1, 64, 128}, 32},      {{7, 200, 160}, 32},     {{130, 130, 2048}, 32},  {{300, 384, 4096}, 32},
    {{1024, 512, 1024}, 32}, {{1, 130, 256}, 64},     {{7, 200, 192}, 64},     {{130, 256, 1024}, 64},
    {{300, 130, 4096}, 64},  {{1024, 512, 2048}, 64}, {{1, 64, 128}, 128},     {{7, 300, 384}, 128},
    {{130, 200, 1024}, 128}, {{300, 130, 4096}, 128}, {{1024, 512, 4096}, 128},
};
INSTANTIATE_TEST_SUITE_P(Shapes, Int8GemmGrouped, ::testing::ValuesIn(kGroupedCases),
                         [](const ::testing::TestParamInfo<GroupedCase> &info) {
                             const W8a8Shape &s = info.param.shape;
                             return "g" + std::to_string(info.param.group) + "_m" + std::to_string(s.m) + "_n" +
                                    std::to_string(s.n) + "_k" + std::to_string(s.k);
                         });

// The quantizer's group sums on its other paths: K above 4096 (the warp reads the row twice) and a misaligned x (a
// block per row); and its refusals.
TEST(QuantizeGroupSums, EqualTheHostSumsOfTheCodes) {
    for (auto [m, k, group, offset] : {std::tuple{3, 8192, 128, 0}, std::tuple{5, 160, 32, 1}, {9, 512, 64, 0}}) {
        SCOPED_TRACE("m " + std::to_string(m) + " k " + std::to_string(k) + " group " + std::to_string(group));
        const int ld = tl::gpu::int8_group_sums_ld(m);
        const std::vector<uint16_t> x = tlt::random_normal_half(static_cast<size_t>(m) * k + offset);
        DeviceBuffer<uint16_t> dx(x.size());
        DeviceBuffer<int8_t> dxq(static_cast<size_t>(m) * k);
        DeviceBuffer<float> dxs(m), dsums(static_cast<size_t>(k / group) * ld);
        for (bool ok : {dx.ok(), dxq.ok(), dxs.ok(), dsums.ok()}) ASSERT_TRUE(ok);
        CUDA_OK(dx.upload(x));
        CUDA_OK(dsums.poison());
        ASSERT_EQ(0, tl::gpu::quantize_rows_int8(dx.get() + offset, m, k, dxq.get(), dxs.get(), nullptr, nullptr,
                                                 dsums.get(), group));
        CUDA_OK(cudaDeviceSynchronize());
        std::vector<int8_t> xq;
        std::vector<float> sums;
        CUDA_OK(dxq.download(xq));
        CUDA_OK(dsums.download(sums));
        const QuantizedRows host =
            quantize_reference(std::vector<uint16_t>(x.begin() + offset, x.end()), m, k);
        for (int r = 0; r < m; ++r) {
            for (int g = 0; g < k / group; ++g) {
                int32_t sum = 0;
                for (int kk = g * group; kk < (g + 1) * group; ++kk) sum += host.q[static_cast<size_t>(r) * k + kk];
                ASSERT_EQ(sums[static_cast<size_t>(g) * ld + r], static_cast<float>(sum))
                    << "group " << g << ", row " << r;
            }
        }
        for (size_t i = 0; i < xq.size(); ++i) ASSERT_EQ(xq[i], host.q[i]) << i;
    }
    DeviceBuffer<uint16_t> dx(64 * 64);
    DeviceBuffer<int8_t> dxq(64 * 64 + 16);
    DeviceBuffer<float> dxs(64), dsums(64 * 64);
    auto run = [&](int8_t *xq, int group) {
        return tl::gpu::quantize_rows_int8(dx.get(), 64, 64, xq, dxs.get(), nullptr, nullptr, dsums.get(), group);
    };
    EXPECT_EQ(tl::gpu::kRcBadArgument, run(dxq.get(), 24));   // not a multiple of 16
    EXPECT_EQ(tl::gpu::kRcBadArgument, run(dxq.get(), 48));   // not dividing K
    EXPECT_EQ(tl::gpu::kRcUnsupported, run(dxq.get() + 8, 32));  // codes not 16-byte aligned
}

TEST(Int8GemmLauncher, GroupedRefusals) {
    DeviceBuffer<int8_t> xq(64 * 128);
    DeviceBuffer<uint32_t> w(64 * 128);
    DeviceBuffer<uint16_t> y(64 * 64);
    DeviceBuffer<float> xs(64), ws(64), params(4096), sums(4096);
    DeviceBuffer<int32_t> row_sums(64);
    tl::gpu::Int8GemmArgs a;
    a.xq = xq.get();
    a.x_scales = xs.get();
    a.w = w.get();
    a.y = y.get();
    a.m = a.n = 64;
    a.k = 128;
    a.group_size = 32;
    a.w_groups = params.get();
    a.x_group_sums = sums.get();
    auto run = [&](tl::gpu::Int8GemmArgs b, tl::gpu::Int8Weights form = tl::gpu::Int8Weights::Int4Packed) {
        return tl::gpu::int8_gemm(b, form, nullptr, 0, nullptr);
    };
    tl::gpu::Int8GemmArgs b = a;
    b.w_groups = nullptr;  // no scales
    EXPECT_EQ(tl::gpu::kRcBadArgument, run(b));
    b = a;
    b.x_group_sums = nullptr;  // no group sums
    EXPECT_EQ(tl::gpu::kRcBadArgument, run(b));
    b = a;
    b.w_scales = ws.get();  // per-row scales beside the groups'
    EXPECT_EQ(tl::gpu::kRcBadArgument, run(b));
    b = a;
    b.x_sums = row_sums.get();
    EXPECT_EQ(tl::gpu::kRcBadArgument, run(b));
    b = a;
    b.group_size = -32;
    EXPECT_EQ(tl::gpu::kRcBadArgument, run(b));
    for (int group : {16, 48, 256}) {  // group sizes the kernel does not take
        b = a;
        b.group_size = group;
        EXPECT_EQ(tl::gpu::kRcUnsupported, run(b)) << group;
    }
    b = a;
    b.k = 96;
    b.group_size = 64;  // K not a multiple of the group
    EXPECT_EQ(tl::gpu::kRcUnsupported, run(b));
    EXPECT_EQ(tl::gpu::kRcUnsupported, run(a, tl::gpu::Int8Weights::Int8));  // groups of INT8 weights
    b = a;
    b.x_group_sums = sums.get() + 1;  // misaligned group sums
    EXPECT_EQ(tl::gpu::kRcUnsupported, run(b));
    b = a;
    b.w_groups = nullptr;
    b.x_group_sums = nullptr;
    b.group_size = 0;  // per row without its scales
    EXPECT_EQ(tl::gpu::kRcBadArgument, run(b));
    if (!tlt::sm90a_kernels_run()) {
        EXPECT_EQ(tl::gpu::kRcUnsupported, run(a));
    }
}

TEST(Int8GemmLauncher, Refusals) {
    DeviceBuffer<int8_t> xq(64 * 64), w(64 * 64);
    DeviceBuffer<uint16_t> y(64 * 64);
    DeviceBuffer<float> xs(64), ws(64);
    DeviceBuffer<int32_t> sums(64);
    DeviceBuffer<char> workspace(tl::gpu::marlin_workspace_bytes(tlt::sm_count()));
    tl::gpu::Int8GemmArgs a;
    a.xq = xq.get();
    a.x_scales = xs.get();
    a.w = w.get();
    a.w_scales = ws.get();
    a.y = y.get();
    a.m = a.n = a.k = 64;
    auto run = [&](tl::gpu::Int8GemmArgs b, tl::gpu::Int8Weights form = tl::gpu::Int8Weights::Int8) {
        return tl::gpu::int8_gemm(b, form, workspace.get(), workspace.bytes(), nullptr);
    };
    tl::gpu::Int8GemmArgs b = a;
    b.m = 0;
    EXPECT_EQ(tl::gpu::kRcBadArgument, run(b));
    b = a;
    b.w = nullptr;
    EXPECT_EQ(tl::gpu::kRcBadArgument, run(b));
    b = a;
    b.w_zeros = ws.get();  // zeros on INT8 weights
    EXPECT_EQ(tl::gpu::kRcBadArgument, run(b));
    b.x_sums = nullptr;  // zeros without the code sums
    EXPECT_EQ(tl::gpu::kRcBadArgument, run(b, tl::gpu::Int8Weights::Int4Packed));
    b = a;
    b.k = 56;  // K % 16 != 0
    EXPECT_EQ(tl::gpu::kRcUnsupported, run(b));
    b = a;
    b.xq = xq.get() + 4;  // misaligned codes
    EXPECT_EQ(tl::gpu::kRcUnsupported, run(b));
    if (!tlt::sm90a_kernels_run()) {
        EXPECT_EQ(tl::gpu::kRcUnsupported, run(a));
    }
}

}  // namespace
