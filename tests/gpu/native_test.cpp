// The native INT4 GEMM (one thread per output) against the FP64 host reference, every element, on shapes that
// exercise both of its paths: 16-byte code loads (K and group size multiples of 32) and the one-code-at-a-time
// path (odd K, odd group sizes, ragged N).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "gpu_kernels.hpp"
#include "gpu_test_util.hpp"

namespace {

using tlt::DeviceBuffer;

struct NativeShape {
    int m, n, k, group_size;
};

class NativeGemm : public ::testing::TestWithParam<NativeShape> {};

TEST_P(NativeGemm, MatchesReference) {
    const NativeShape s = GetParam();
    if (tlt::g_quick && static_cast<double>(s.m) * s.n * s.k > 3e7) GTEST_SKIP() << "quick mode";
    const tlt::Int4Weight w = tlt::random_weight(s.k, s.n, s.group_size);
    const std::vector<uint16_t> x = tlt::random_normal_both(static_cast<size_t>(s.m) * s.k);
    const std::vector<double> ref = tlt::reference_gemm(x, s.m, w, {});
    DeviceBuffer<uint16_t> dx(x.size()), dy(static_cast<size_t>(s.m) * s.n), ds(w.scales.size()), dz(w.zeros.size());
    DeviceBuffer<uint8_t> dc(w.codes.size());
    for (bool ok : {dx.ok(), dy.ok(), ds.ok(), dz.ok(), dc.ok()}) ASSERT_TRUE(ok);
    CUDA_OK(dc.upload(w.codes));
    CUDA_OK(ds.upload(w.scales));
    CUDA_OK(dz.upload(w.zeros));
    for (const tl::Dtype dtype : {tl::Dtype::F16, tl::Dtype::BF16}) {
        const bool bf16 = dtype == tl::Dtype::BF16;
        SCOPED_TRACE(bf16 ? "BF16" : "FP16");
        CUDA_OK(dx.upload(bf16 ? tlt::bf16_bits(x) : x));
        CUDA_OK(dy.poison());
        ASSERT_EQ(0, tl::gpu::native_int4_gemm(dx.get(), dc.get(), ds.get(), dz.get(), dy.get(), s.m, s.n, s.k,
                                               s.group_size, dtype, nullptr));
        CUDA_OK(cudaDeviceSynchronize());
        std::vector<uint16_t> y;
        CUDA_OK(dy.download(y));
        EXPECT_TRUE(tlt::matches(y, s.m, s.n, ref, {}, bf16 ? 8e-3 : 2e-3, dtype));
    }
}

INSTANTIATE_TEST_SUITE_P(Shapes, NativeGemm,
                         ::testing::Values(NativeShape{1, 1, 2, 2}, NativeShape{3, 77, 50, 10},
                                           NativeShape{5, 130, 96, 32}, NativeShape{17, 64, 33, 11},
                                           NativeShape{2, 300, 1024, 1024}, NativeShape{64, 256, 4096, 128},
                                           NativeShape{1, 129, 8192, 64}, NativeShape{7, 6144, 2048, 128},
                                           NativeShape{255, 96, 2000, 40}),
                         [](const ::testing::TestParamInfo<NativeShape> &i) {
                             return "M" + std::to_string(i.param.m) + "_N" + std::to_string(i.param.n) + "_K" +
                                    std::to_string(i.param.k) + "_g" + std::to_string(i.param.group_size);
                         });

TEST(NativeLauncher, RefusesInvalidArguments) {
    DeviceBuffer<uint16_t> buf(1024);
    DeviceBuffer<uint8_t> codes(1024);
    ASSERT_TRUE(buf.ok() && codes.ok());
    const tl::Dtype f16 = tl::Dtype::F16;
    EXPECT_EQ(tl::gpu::kRcBadArgument,
              tl::gpu::native_int4_gemm(buf.get(), codes.get(), buf.get(), buf.get(), buf.get(), 0, 4, 4, 4, f16, nullptr));
    EXPECT_EQ(tl::gpu::kRcBadArgument,
              tl::gpu::native_int4_gemm(buf.get(), nullptr, buf.get(), buf.get(), buf.get(), 1, 4, 4, 4, f16, nullptr));
    EXPECT_EQ(tl::gpu::kRcBadArgument,
              tl::gpu::native_int4_gemm(buf.get(), codes.get(), buf.get(), buf.get(), buf.get(), 1, 4, 4, 0, f16, nullptr));
}

}  // namespace
