// The large-M path, FP16 and BF16: the dequantization kernel against the host (each weight within 1 ulp of q*s + z)
// and dequantize + cuBLAS against the FP64 reference.
#include <cublas_v2.h>
#include <gtest/gtest.h>

#include <cmath>
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

}  // namespace
