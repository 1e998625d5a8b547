// W8A8 (per-token INT8 activations, INT8 weights with per-channel scales, cuBLAS INT8 GEMM into INT32 and the scaling
// epilogue) against a host implementation of the activation-precision rule (docs/quality.md) on the same FP16 input:
// equal bit for bit, on fresh random inputs into a poisoned output. Plus the rows the rule singles out (zeros, a NaN)
// and the refusals.
#include <cublas_v2.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "gpu_kernels.hpp"
#include "gpu_test_util.hpp"
#include "util/half.hpp"

namespace {

using tlt::DeviceBuffer;

struct W8a8Shape {
    int m, n, k;
};

// The rule on the host: true FP32 divisions, rne (the default rounding mode), exact integer sums, then
// fl(s_x · fl(s_w · fl(D))) rounded to FP16.
std::vector<uint16_t> reference(const std::vector<uint16_t> &x, const std::vector<int8_t> &w,
                                const std::vector<float> &w_scales, const W8a8Shape &s) {
    std::vector<uint16_t> y(static_cast<size_t>(s.m) * s.n);
    std::vector<int32_t> xq(static_cast<size_t>(s.k));
    for (int r = 0; r < s.m; ++r) {
        float amax = 0.0f;
        bool nan = false;
        for (int k = 0; k < s.k; ++k) {
            const float v = tl::half_to_float(x[static_cast<size_t>(r) * s.k + k]);
            nan = nan || std::isnan(v);
            amax = std::max(amax, std::fabs(v));
        }
        const float sx = nan ? NAN : amax / 127.0f;
        for (int k = 0; k < s.k; ++k) {
            const float v = tl::half_to_float(x[static_cast<size_t>(r) * s.k + k]);
            xq[k] = sx > 0.0f ? std::clamp(static_cast<int32_t>(std::nearbyint(v / sx)), -127, 127) : 0;
        }
        for (int c = 0; c < s.n; ++c) {
            int64_t d = 0;
            for (int k = 0; k < s.k; ++k) d += static_cast<int64_t>(xq[k]) * w[static_cast<size_t>(c) * s.k + k];
            const float t = w_scales[c] * static_cast<float>(static_cast<int32_t>(d));
            y[static_cast<size_t>(r) * s.n + c] = tl::float_to_half(sx * t);
        }
    }
    return y;
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

}  // namespace
