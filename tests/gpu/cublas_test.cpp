// The large-M path, FP16 and BF16: the dequantization kernel against the host (each weight within 1 ulp of q*s + z)
// and dequantize + cuBLAS against the FP64 reference.
#include <cublas_v2.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "gpu_kernels.hpp"
#include "gpu_test_util.hpp"
#include "util/half.hpp"

namespace {

using tlt::DeviceBuffer;

struct CublasShape {
    int m, n, k, group_size;
};

class DequantCublas : public ::testing::TestWithParam<CublasShape> {};

TEST_P(DequantCublas, MatchesReference) {
    const CublasShape s = GetParam();
    if (tlt::g_quick && static_cast<double>(s.m) * s.n * s.k > 6e7) GTEST_SKIP() << "quick mode";
    const tlt::Int4Weight w = tlt::random_weight(s.k, s.n, s.group_size);
    const std::vector<uint16_t> x = tlt::random_normal_both(static_cast<size_t>(s.m) * s.k);
    const std::vector<double> ref = tlt::reference_gemm(x, s.m, w, {});
    DeviceBuffer<uint16_t> dx(x.size()), dy(static_cast<size_t>(s.m) * s.n), ds(w.scales.size()), dz(w.zeros.size()),
        dw(static_cast<size_t>(s.n) * s.k);
    DeviceBuffer<uint8_t> dc(w.codes.size());
    for (bool ok : {dx.ok(), dy.ok(), ds.ok(), dz.ok(), dw.ok(), dc.ok()}) ASSERT_TRUE(ok);
    CUDA_OK(dc.upload(w.codes));
    CUDA_OK(ds.upload(w.scales));
    CUDA_OK(dz.upload(w.zeros));
    cublasHandle_t handle = nullptr;
    ASSERT_EQ(CUBLAS_STATUS_SUCCESS, cublasCreate(&handle));

    for (const tl::Dtype dtype : {tl::Dtype::F16, tl::Dtype::BF16}) {
        const bool bf16 = dtype == tl::Dtype::BF16;
        SCOPED_TRACE(bf16 ? "BF16" : "FP16");
        CUDA_OK(dx.upload(bf16 ? tlt::bf16_bits(x) : x));
        CUDA_OK(dw.poison());
        CUDA_OK(dy.poison());
        ASSERT_EQ(0, tl::gpu::dequant_cublas_gemm(handle, dx.get(), dc.get(), ds.get(), dz.get(), dy.get(), s.m, s.n,
                                                  s.k, s.group_size, dtype, dw.get(), dw.bytes(), nullptr));
        CUDA_OK(cudaDeviceSynchronize());
        std::vector<uint16_t> wh, y;
        CUDA_OK(dw.download(wh));
        CUDA_OK(dy.download(y));
        const int mantissa_bits = bf16 ? 7 : 10;
        for (int nn = 0; nn < s.n; ++nn) {
            for (int kk = 0; kk < s.k; ++kk) {
                const double exact = w.at(kk, nn);
                const double got = tlt::decode(wh[static_cast<size_t>(nn) * s.k + kk], dtype);
                const int exponent = static_cast<int>(std::floor(std::log2(std::max(std::fabs(exact), 6.2e-5))));
                ASSERT_LE(std::fabs(got - exact), std::ldexp(1.0, exponent - mantissa_bits))
                    << "W[" << kk << "][" << nn << "] = " << got << ", exact " << exact;
            }
        }
        EXPECT_TRUE(tlt::matches(y, s.m, s.n, ref, {}, bf16 ? 8e-3 : 2e-3, dtype));
    }
    cublasDestroy(handle);
}

INSTANTIATE_TEST_SUITE_P(Shapes, DequantCublas,
                         ::testing::Values(CublasShape{1, 256, 512, 128}, CublasShape{64, 1024, 2048, 2048},
                                           CublasShape{1024, 512, 1024, 32}, CublasShape{100, 192, 384, 64},
                                           CublasShape{7, 6144, 2048, 128}),
                         [](const ::testing::TestParamInfo<CublasShape> &i) {
                             return "M" + std::to_string(i.param.m) + "_N" + std::to_string(i.param.n) + "_K" +
                                    std::to_string(i.param.k) + "_g" + std::to_string(i.param.group_size);
                         });

TEST(DequantLauncher, RefusesUnsupportedShapes) {
    DeviceBuffer<uint16_t> buf(4096);
    DeviceBuffer<uint8_t> codes(4096);
    ASSERT_TRUE(buf.ok() && codes.ok());
    const tl::Dtype f16 = tl::Dtype::F16;
    EXPECT_NE(0, tl::gpu::dequant_int4(codes.get(), buf.get(), buf.get(), buf.get(), 4, 12, 12, f16, nullptr));  // K % 8
    EXPECT_NE(0, tl::gpu::dequant_int4(codes.get(), buf.get(), buf.get(), buf.get(), 4, 64, 48, f16, nullptr));  // 48 !| 64
    EXPECT_NE(0, tl::gpu::dequant_cublas_gemm(nullptr, buf.get(), codes.get(), buf.get(), buf.get(), buf.get(), 1, 4,
                                              64, 64, f16, buf.get(), 8192, nullptr));
}

// INT8 weights: each element of dequant_int8's output against q * s in FP64 (within half an ulp of the dtype: one
// rounding), at its input column when a k_perm scatters them, on fresh random codes (the full range, -127 .. 127),
// scales and permutations, into a NaN-poisoned buffer. Shapes: per row, groups, an odd K, one group per element pair.
struct Int8Shape {
    int n, k, group_size;
    bool permuted;
};

class DequantInt8 : public ::testing::TestWithParam<Int8Shape> {};

TEST_P(DequantInt8, MatchesFp64Reference) {
    const Int8Shape s = GetParam();
    const int groups = s.k / s.group_size;
    std::mt19937_64 &rng = tlt::rng();
    std::vector<int8_t> codes(static_cast<size_t>(s.n) * s.k);
    for (int8_t &q : codes) q = static_cast<int8_t>(static_cast<int>(rng() % 255) - 127);
    std::vector<uint16_t> scales(static_cast<size_t>(s.n) * groups);
    std::uniform_real_distribution<double> log_scale(-14.0, 2.0);
    for (uint16_t &b : scales) {
        b = tl::float_to_half(static_cast<float>((rng() % 2 ? -1 : 1) * std::exp2(log_scale(rng))));
    }
    std::vector<int32_t> perm(s.k);
    for (int i = 0; i < s.k; ++i) perm[i] = i;
    if (s.permuted) std::shuffle(perm.begin(), perm.end(), rng);

    DeviceBuffer<int8_t> dc(codes.size());
    DeviceBuffer<uint16_t> ds(scales.size()), dw(static_cast<size_t>(s.n) * s.k);
    DeviceBuffer<int32_t> dp(perm.size());
    for (bool ok : {dc.ok(), ds.ok(), dw.ok(), dp.ok()}) ASSERT_TRUE(ok);
    CUDA_OK(dc.upload(codes));
    CUDA_OK(ds.upload(scales));
    CUDA_OK(dp.upload(perm));
    for (const tl::Dtype dtype : {tl::Dtype::F16, tl::Dtype::BF16}) {
        const bool bf16 = dtype == tl::Dtype::BF16;
        SCOPED_TRACE(bf16 ? "BF16" : "FP16");
        CUDA_OK(dw.poison());
        ASSERT_EQ(0, tl::gpu::dequant_int8(dc.get(), ds.get(), s.permuted ? dp.get() : nullptr, dw.get(), s.n, s.k,
                                           s.group_size, dtype, nullptr));
        CUDA_OK(cudaDeviceSynchronize());
        std::vector<uint16_t> w;
        CUDA_OK(dw.download(w));
        const int mantissa_bits = bf16 ? 7 : 10;
        for (int nn = 0; nn < s.n; ++nn) {
            for (int kk = 0; kk < s.k; ++kk) {
                const double exact = static_cast<double>(codes[static_cast<size_t>(nn) * s.k + kk]) *
                                     tl::half_to_float(scales[static_cast<size_t>(nn) * groups + kk / s.group_size]);
                const double got = tlt::decode(w[static_cast<size_t>(nn) * s.k + perm[kk]], dtype);
                // Half an ulp of the result's binade (subnormals: of the smallest normal's).
                const int min_exponent = bf16 ? -126 : -14;
                const int exponent = std::max(exact == 0.0 ? min_exponent : static_cast<int>(std::floor(std::log2(
                                                                                 std::fabs(exact)))),
                                              min_exponent);
                ASSERT_LE(std::fabs(got - exact), std::ldexp(1.0, exponent - mantissa_bits - 1))
                    << "W[" << kk << "][" << nn << "] = " << got << ", exact " << exact;
            }
        }
    }
}

INSTANTIATE_TEST_SUITE_P(Shapes, DequantInt8,
                         ::testing::Values(Int8Shape{64, 256, 256, false}, Int8Shape{37, 200, 40, true},
                                           Int8Shape{5, 1001, 7, true}, Int8Shape{300, 96, 2, false},
                                           Int8Shape{3, 4096, 128, true}),
                         [](const ::testing::TestParamInfo<Int8Shape> &i) {
                             return "N" + std::to_string(i.param.n) + "_K" + std::to_string(i.param.k) + "_g" +
                                    std::to_string(i.param.group_size) + (i.param.permuted ? "_perm" : "");
                         });

TEST(DequantInt8Launcher, RefusesBadArguments) {
    DeviceBuffer<uint16_t> buf(4096);
    DeviceBuffer<int8_t> codes(4096);
    ASSERT_TRUE(buf.ok() && codes.ok());
    const tl::Dtype f16 = tl::Dtype::F16;
    EXPECT_NE(0, tl::gpu::dequant_int8(nullptr, buf.get(), nullptr, buf.get(), 4, 64, 64, f16, nullptr));
    // 48 does not divide 64
    EXPECT_NE(0, tl::gpu::dequant_int8(codes.get(), buf.get(), nullptr, buf.get(), 4, 64, 48, f16, nullptr));
    EXPECT_NE(0, tl::gpu::dequant_int8(codes.get(), buf.get(), nullptr, buf.get(), 0, 64, 64, f16, nullptr));
    EXPECT_EQ(cudaSuccess, cudaGetLastError());
}

}  // namespace
