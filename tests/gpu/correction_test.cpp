// The seed's correction kernels against host references within 2 ULP.
// (The wrapper marlin_gemm_corrected is checked end to end in marlin_test.cpp.)
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gpu_kernels.hpp"
#include "gpu_test_util.hpp"
#include "util/half.hpp"

namespace {

using tlt::DeviceBuffer;

int64_t ordered(float f) {  // float bits mapped to a monotonic integer line, for ULP distances
    int32_t i;
    std::memcpy(&i, &f, sizeof i);
    return i < 0 ? -static_cast<int64_t>(i & 0x7FFFFFFF) : i;
}

double half_ulp(double v) {  // the FP16 unit in the last place at |v|
    const double a = std::max(std::fabs(v), 6.103515625e-05);  // subnormals: fixed 2^-24 spacing below 2^-14
    return std::ldexp(1.0, static_cast<int>(std::floor(std::log2(a))) - 10);
}

struct SumShape {
    int m, k, group_size;
};

class AGroupSum : public ::testing::TestWithParam<SumShape> {};

TEST_P(AGroupSum, WithinTwoUlpOfExactSum) {
    const SumShape s = GetParam();
    const int groups = s.k / s.group_size;
    const std::vector<uint16_t> a = tlt::random_normal_half(static_cast<size_t>(s.m) * s.k);
    DeviceBuffer<uint16_t> da(a.size());
    DeviceBuffer<float> dsum(static_cast<size_t>(s.m) * groups);
    ASSERT_TRUE(da.ok() && dsum.ok());
    CUDA_OK(da.upload(a));
    CUDA_OK(dsum.poison());
    ASSERT_EQ(0, tl::gpu::a_group_sum(da.get(), dsum.get(), s.m, s.k, s.group_size, nullptr));
    CUDA_OK(cudaDeviceSynchronize());
    std::vector<float> sum;
    CUDA_OK(dsum.download(sum));
    for (int mm = 0; mm < s.m; ++mm) {
        for (int g = 0; g < groups; ++g) {
            double exact = 0.0;
            for (int i = 0; i < s.group_size; ++i) {
                exact += tl::half_to_float(a[static_cast<size_t>(mm) * s.k + static_cast<size_t>(g) * s.group_size + i]);
            }
            const float got = sum[static_cast<size_t>(mm) * groups + g];
            ASSERT_TRUE(std::isfinite(got)) << "a_sum[" << mm << "][" << g << "] unwritten";
            ASSERT_LE(std::llabs(ordered(got) - ordered(static_cast<float>(exact))), 2)
                << "a_sum[" << mm << "][" << g << "] = " << got << ", exact " << exact;
        }
    }
}

INSTANTIATE_TEST_SUITE_P(Shapes, AGroupSum,
                         ::testing::Values(SumShape{1, 64, 32}, SumShape{7, 1024, 128}, SumShape{16, 4096, 4096},
                                           SumShape{33, 2048, 64}, SumShape{255, 8192, 128}),
                         [](const ::testing::TestParamInfo<SumShape> &i) {
                             return "M" + std::to_string(i.param.m) + "_K" + std::to_string(i.param.k) + "_g" +
                                    std::to_string(i.param.group_size);
                         });

struct AccumShape {
    int m, n, groups;
};

class CorrectionAccum : public ::testing::TestWithParam<AccumShape> {};

// C = fp16(C + a_sum @ delta): within 2 FP16 ULP of the FP64 result, plus the FP32 accumulation's own bound
// (groups * 2^-24 * sum of |terms|), which only matters where the sum cancels.
TEST_P(CorrectionAccum, WithinTwoUlpOfReference) {
    const AccumShape s = GetParam();
    std::normal_distribution<float> sums(0.0f, 8.0f), deltas(0.0f, 0.05f);
    std::vector<float> a_sum(static_cast<size_t>(s.m) * s.groups), delta(static_cast<size_t>(s.groups) * s.n);
    for (auto &v : a_sum) v = sums(tlt::rng());
    for (auto &v : delta) v = deltas(tlt::rng());
    const std::vector<uint16_t> c0 = tlt::random_normal_half(static_cast<size_t>(s.m) * s.n);
    DeviceBuffer<uint16_t> dc(c0.size());
    DeviceBuffer<float> dsum(a_sum.size()), ddelta(delta.size());
    ASSERT_TRUE(dc.ok() && dsum.ok() && ddelta.ok());
    CUDA_OK(dc.upload(c0));
    CUDA_OK(dsum.upload(a_sum));
    CUDA_OK(ddelta.upload(delta));
    ASSERT_EQ(0, tl::gpu::correction_accum(dc.get(), dsum.get(), ddelta.get(), s.m, s.n, s.groups, nullptr));
    CUDA_OK(cudaDeviceSynchronize());
    std::vector<uint16_t> c;
    CUDA_OK(dc.download(c));
    for (int mm = 0; mm < s.m; ++mm) {
        for (int nn = 0; nn < s.n; ++nn) {
            const size_t i = static_cast<size_t>(mm) * s.n + nn;
            double exact = tl::half_to_float(c0[i]), magnitude = std::fabs(exact);
            for (int g = 0; g < s.groups; ++g) {
                const double t = static_cast<double>(a_sum[static_cast<size_t>(mm) * s.groups + g]) *
                                 delta[static_cast<size_t>(g) * s.n + nn];
                exact += t;
                magnitude += std::fabs(t);
            }
            const double got = tl::half_to_float(c[i]);
            const double tol = 2.0 * half_ulp(exact) + (s.groups + 1) * std::ldexp(magnitude, -24);
            ASSERT_LE(std::fabs(got - exact), tol) << "C[" << mm << "][" << nn << "] = " << got << ", exact " << exact;
        }
    }
}

INSTANTIATE_TEST_SUITE_P(Shapes, CorrectionAccum,
                         ::testing::Values(AccumShape{1, 64, 1}, AccumShape{7, 300, 8}, AccumShape{16, 2048, 32},
                                           AccumShape{64, 1000, 64}, AccumShape{3, 6144, 16}),
                         [](const ::testing::TestParamInfo<AccumShape> &i) {
                             return "M" + std::to_string(i.param.m) + "_N" + std::to_string(i.param.n) + "_G" +
                                    std::to_string(i.param.groups);
                         });

TEST(CorrectionLaunchers, RefuseInvalidArguments) {
    DeviceBuffer<uint16_t> a(256);
    DeviceBuffer<float> f(256);
    ASSERT_TRUE(a.ok() && f.ok());
    EXPECT_EQ(tl::gpu::kRcBadArgument, tl::gpu::a_group_sum(a.get(), f.get(), 1, 96, 64, nullptr));  // 64 !| 96
    EXPECT_EQ(tl::gpu::kRcBadArgument, tl::gpu::a_group_sum(nullptr, f.get(), 1, 64, 64, nullptr));
    EXPECT_EQ(tl::gpu::kRcBadArgument, tl::gpu::correction_accum(a.get(), f.get(), f.get(), 0, 16, 1, nullptr));
}

}  // namespace
