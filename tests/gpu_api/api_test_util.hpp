// Helpers shared by the GPU C API suites: device memory, random quantized weights, FP64 references, and the
// dispatcher path selection.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "util/half.hpp"
#include "tinyloop.h"

namespace apitest {

#define CUDA_OK(call) ASSERT_EQ((call), cudaSuccess) << #call
#define TL_OK_(call) ASSERT_EQ((call), TL_OK) << #call << ": " << tl_last_error_message()

inline std::mt19937_64 &rng() {
    static std::mt19937_64 gen(std::random_device{}());
    return gen;
}

struct DeviceMemory {
    void *ptr = nullptr;
    explicit DeviceMemory(size_t bytes) {
        if (bytes > 0 && cudaMalloc(&ptr, bytes) != cudaSuccess) ptr = nullptr;
    }
    ~DeviceMemory() { cudaFree(ptr); }
    DeviceMemory(const DeviceMemory &) = delete;
    DeviceMemory &operator=(const DeviceMemory &) = delete;
};

struct WeightDeleter {
    void operator()(tl_weight *w) const { tl_weight_free(w); }
};
using WeightPtr = std::unique_ptr<tl_weight, WeightDeleter>;

inline WeightPtr random_weight(int k, int n, int group_size) {
    std::normal_distribution<float> normal(0.0f, 1.0f / std::sqrt(static_cast<float>(k)));
    std::vector<float> w(static_cast<size_t>(k) * n);
    for (float &v : w) v = normal(rng());
    tl_quantize_options opts;
    tl_quantize_options_init(&opts, sizeof opts);
    opts.group_size = group_size;
    tl_weight *raw = nullptr;
    EXPECT_EQ(tl_weight_quantize(w.data(), k, n, &opts, &raw), TL_OK) << tl_last_error_message();
    return WeightPtr(raw);
}

struct Problem {
    int m, k, n;
    std::vector<uint16_t> x;  // FP16 [m][k]
    std::vector<double> ref;  // [m][n], FP64 from the FP16 x and the exactly dequantized W
};

// Random FP16 x [m][k] and the FP64 reference x W for W given as wt[n][k].
inline Problem make_problem(const std::vector<double> &wt, int k, int n, int m) {
    Problem pr{m, k, n, {}, {}};
    std::normal_distribution<float> normal(0.0f, 1.0f);
    pr.x.resize(static_cast<size_t>(m) * k);
    for (uint16_t &v : pr.x) v = tl::float_to_half(normal(rng()));
    pr.ref.assign(static_cast<size_t>(m) * n, 0.0);
    for (int i = 0; i < m; ++i)
        for (int j = 0; j < n; ++j) {
            double acc = 0;
            for (int kk = 0; kk < k; ++kk)
                acc += static_cast<double>(tl::half_to_float(pr.x[static_cast<size_t>(i) * k + kk])) *
                       wt[static_cast<size_t>(j) * k + kk];
            pr.ref[static_cast<size_t>(i) * n + j] = acc;
        }
    return pr;
}

// ... with W the weight exactly dequantized (tl_weight_dequantize).
inline Problem make_problem(const tl_weight *w, int m) {
    tl_weight_properties p;
    p.struct_size = sizeof p;
    EXPECT_EQ(tl_weight_info(w, &p), TL_OK);
    std::vector<float> wt(static_cast<size_t>(p.k) * p.n);  // [n][k]
    EXPECT_EQ(tl_weight_dequantize(w, wt.data(), wt.size()), TL_OK);
    return make_problem(std::vector<double>(wt.begin(), wt.end()), p.k, p.n, m);
}

inline tl_dispatch_counts counts_of(const tl_weight *w) {
    tl_dispatch_counts c;
    std::memset(&c, 0, sizeof c);
    c.struct_size = sizeof c;
    EXPECT_EQ(tl_weight_dispatch_counts(w, &c), TL_OK) << tl_last_error_message();
    return c;
}

inline void pack(tl_weight *w, uint32_t forms, tl_pack_report *report) {
    tl_pack_options opts;
    tl_pack_options_init(&opts, sizeof opts);
    opts.forms = forms;
    tl_pack_report_init(report, sizeof *report);
    EXPECT_EQ(tl_weight_pack_marlin(w, &opts, report), TL_OK) << tl_last_error_message();
}

constexpr uint32_t kAllForms = TL_FORM_MARLIN_FUSED | TL_FORM_MARLIN_CORRECTION | TL_FORM_FP16_BODY;

enum class Path { Native, Fused, Correction, Cublas, Fp16Body };

inline void select(Path path) {
    tl_set_dispatch(TL_DISPATCH_USE_MARLIN, path != Path::Native);
    tl_set_dispatch(TL_DISPATCH_FP16_BODY, path == Path::Fp16Body);
    tl_set_dispatch(TL_DISPATCH_MARLIN_MODE, path == Path::Correction ? 2 : 1);
    tl_set_dispatch(TL_DISPATCH_CUBLAS_MIN_M, path == Path::Cublas ? 1 : 0);
}

inline uint64_t counter(const tl_dispatch_counts &c, Path path) {
    switch (path) {
        case Path::Native: return c.native;
        case Path::Fused: return c.marlin_fused;
        case Path::Correction: return c.marlin_correction;
        case Path::Cublas: return c.dequant_cublas;
        case Path::Fp16Body: return c.fp16_body;
    }
    return 0;
}

inline const char *path_name(Path p) {
    static const char *names[] = {"native", "fused", "correction", "cublas", "fp16-body"};
    return names[static_cast<int>(p)];
}

// The main() of a GPU suite: runs the tests, or exits 77 (CTest's "skipped") where there is no usable GPU.
inline int run_gpu_tests(int argc, char **argv, const char *suite) {
    ::testing::InitGoogleTest(&argc, argv);
    if (!::testing::GTEST_FLAG(list_tests)) {
        int32_t count = 0;
        if (tl_device_count(&count) != TL_OK || count == 0) {
            std::printf("no usable CUDA device: %s skipped\n", suite);
            return 77;
        }
    }
    return RUN_ALL_TESTS();
}

}  // namespace apitest
