// The GPU C API end to end: tl_weight_quantize -> tl_weight_pack_marlin -> tl_quant_gemm through every dispatcher
// path, against an FP64 host reference built from tl_weight_dequantize, on fresh random inputs with poisoned outputs.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "util/half.hpp"
#include "tinyloop.h"

#include "api_test_util.hpp"

using namespace apitest;

namespace {

// Runs one tl_quant_gemm with a fresh zero-filled workspace of `workspace_bytes` (the queried size when
// SIZE_MAX), a poisoned output, and returns the relative error against the reference (NaN if any output is not
// finite, i.e. unwritten).
double run_gemm(const tl_weight *w, const Problem &pr, size_t workspace_bytes = SIZE_MAX) {
    size_t needed = 0;
    EXPECT_EQ(tl_quant_gemm_workspace_size(w, pr.m, &needed), TL_OK) << tl_last_error_message();
    if (workspace_bytes == SIZE_MAX) workspace_bytes = needed;
    DeviceMemory x(pr.x.size() * 2), y(pr.ref.size() * 2), ws(workspace_bytes);
    EXPECT_EQ(cudaMemcpy(x.ptr, pr.x.data(), pr.x.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
    EXPECT_EQ(cudaMemset(y.ptr, 0xFF, pr.ref.size() * 2), cudaSuccess);  // 0xFFFF is a NaN
    if (workspace_bytes > 0) {
        EXPECT_EQ(cudaMemset(ws.ptr, 0, workspace_bytes), cudaSuccess);
    }
    const tl_status st = tl_quant_gemm(w, x.ptr, y.ptr, pr.m, nullptr, ws.ptr, workspace_bytes);
    EXPECT_EQ(st, TL_OK) << tl_last_error_message();
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<uint16_t> out(pr.ref.size());
    EXPECT_EQ(cudaMemcpy(out.data(), y.ptr, out.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
    double num = 0, den = 0;
    for (size_t i = 0; i < out.size(); ++i) {
        const double v = tl::half_to_float(out[i]);
        if (!std::isfinite(v)) return std::nan("");
        num += (v - pr.ref[i]) * (v - pr.ref[i]);
        den += pr.ref[i] * pr.ref[i];
    }
    return std::sqrt(num / den);
}

}  // namespace

TEST(GpuApi, DeviceInfo) {
    int32_t count = 0;
    TL_OK_(tl_device_count(&count));
    ASSERT_GE(count, 1);
    tl_device_properties p;
    p.struct_size = sizeof p;
    TL_OK_(tl_device_info(0, &p));
    EXPECT_GT(std::strlen(p.name), 0u);
    EXPECT_GT(p.sm_count, 0);
    EXPECT_GT(p.total_memory, p.free_memory / 2);
    EXPECT_EQ(p.marlin_supported, p.sm_major >= 8);
    std::printf("device 0: %s, SM %d.%d, %d SMs, %.1f GiB\n", p.name, p.sm_major, p.sm_minor, p.sm_count,
                p.total_memory / 1073741824.0);
    EXPECT_EQ(tl_device_info(count, &p), TL_ERR_INVALID_ARGUMENT);
}

// The whole fixture packs (10 of 10 weights), every weight runs on the fused Marlin-class path with no fallback,
// and the first-dispatch line is logged exactly once. The line is once per process: this test comes before every
// other test that dispatches, so it also holds when the whole binary runs in one process (compute-sanitizer).
TEST(GpuApi, ModelPackAndFirstDispatchLog) {
    static std::vector<std::string> lines;
    ASSERT_EQ(tl_set_log_callback([](void *, int32_t, const char *msg) { lines.emplace_back(msg); }, nullptr,
                                  TL_LOG_INFO),
              TL_OK);
    tl_model *model = nullptr;
    TL_OK_(tl_model_load(TL_TEST_FIXTURE, nullptr, &model));
    tl_pack_report report;
    tl_pack_report_init(&report, sizeof report);
    TL_OK_(tl_pack_marlin(model, nullptr, &report));
    EXPECT_EQ(report.weights_uploaded, 10u);
    EXPECT_EQ(report.weights_packed, 10u);
    EXPECT_EQ(report.weights_not_packable, 0u);
    select(Path::Fused);
    size_t n = 0;
    TL_OK_(tl_model_weight_count(model, &n));
    for (int round = 0; round < 2; ++round) {
        for (size_t i = 0; i < n; ++i) {
            const tl_weight *w = nullptr;
            TL_OK_(tl_model_weight_at(model, i, &w));
            const Problem pr = make_problem(w, 16);
            EXPECT_LE(run_gemm(w, pr), 2e-3) << i;
        }
    }
    for (size_t i = 0; i < n; ++i) {
        const tl_weight *w = nullptr;
        TL_OK_(tl_model_weight_at(model, i, &w));
        const tl_dispatch_counts c = counts_of(w);
        EXPECT_EQ(c.marlin_fused, 2u) << i;
        EXPECT_EQ(c.native + c.fallbacks + c.marlin_correction + c.dequant_cublas + c.fp16_body, 0u) << i;
    }
    int first_dispatch = 0;
    for (const std::string &l : lines) {
        if (l.rfind("[marlin] first dispatch ok: BT=16 N=", 0) == 0) ++first_dispatch;
        std::printf("log: %s\n", l.c_str());
    }
    EXPECT_EQ(first_dispatch, 1);
    tl_set_log_callback(nullptr, nullptr, TL_LOG_ERROR);
    tl_model_free(model);
}

// Every path on packable shapes (M from 1, per group and per row; K and N padded at pack time where they are not
// multiples of 64) gives the reference within 2e-3 and counts itself; a shape the Marlin-class kernel does not take
// even padded (a group size that does not divide the padded K) runs on the native kernel whatever is selected.
TEST(GpuApi, EveryPathMatchesTheReference) {
    struct Shape {
        int m, k, n, group_size;
        bool packable;
    };
    const Shape shapes[] = {{1, 256, 256, 128, true},    {7, 512, 384, 64, true},    {16, 1024, 512, 32, true},
                            {33, 2048, 1024, 0, true},   {64, 4096, 512, 128, true}, {255, 1024, 768, 128, true},
                            {1024, 2048, 1024, 128, true},
                            // N not a multiple of 64: packed with zero rows up to the next multiple, every path but
                            // the native kernel computing the padded columns and copying out the first N.
                            {7, 512, 1000, 128, true},    {300, 1024, 200, 0, true},  {1, 256, 50, 32, true},
                            // K not a multiple of 64: zero codes and zero groups up to the next multiple, x read
                            // through the workspace with zero columns; with N padded too.
                            {5, 96, 100, 32, true},       {16, 200, 136, 0, true},    {40, 1000, 512, 0, true},
                            // A group size that does not divide the padded K: the native kernel only.
                            {5, 96, 100, 48, false},      {3, 160, 64, 80, false}};
    for (const Shape &s : shapes) {
        WeightPtr w = random_weight(s.k, s.n, s.group_size);
        ASSERT_TRUE(w);
        tl_pack_report report;
        pack(w.get(), kAllForms, &report);
        EXPECT_EQ(report.weights_uploaded, 1u);
        EXPECT_EQ(report.weights_packed, s.packable ? 1u : 0u);
        EXPECT_EQ(report.weights_not_packable, s.packable ? 0u : 1u);
        EXPECT_GT(report.extra_device_bytes, 0u);  // at least the FP16 body
        const Problem pr = make_problem(w.get(), s.m);
        for (Path path : {Path::Native, Path::Fused, Path::Correction, Path::Cublas, Path::Fp16Body}) {
            select(path);
            const tl_dispatch_counts before = counts_of(w.get());
            const double err = run_gemm(w.get(), pr);
            const tl_dispatch_counts after = counts_of(w.get());
            const Path expected = !s.packable && path != Path::Fp16Body ? Path::Native : path;
            SCOPED_TRACE(std::string("m=") + std::to_string(s.m) + " k=" + std::to_string(s.k) +
                         " n=" + std::to_string(s.n) + " gs=" + std::to_string(s.group_size) + " path=" +
                         path_name(path));
            EXPECT_LE(err, 2e-3);  // NaN fails too
            EXPECT_EQ(counter(after, expected) - counter(before, expected), 1u);
            EXPECT_EQ(after.fallbacks, before.fallbacks);
        }
    }
}

// A workspace smaller than the query makes the Marlin-class path refuse; the call still succeeds on the next path,
// with the same result, and counts a fallback.
TEST(GpuApi, TooSmallWorkspaceFallsThrough) {
    WeightPtr w = random_weight(1024, 512, 128);
    tl_pack_report report;
    pack(w.get(), TL_FORM_MARLIN_FUSED, &report);
    select(Path::Fused);
    const Problem pr = make_problem(w.get(), 16);
    EXPECT_LE(run_gemm(w.get(), pr, 0), 2e-3);
    const tl_dispatch_counts c = counts_of(w.get());
    EXPECT_EQ(c.native, 1u);
    EXPECT_EQ(c.fallbacks, 1u);
    EXPECT_EQ(c.marlin_fused, 0u);
}

// An owned weight's own setting holds whatever the process-wide default says; set back to -1 it follows the default.
TEST(GpuApi, AWeightsOwnSettingsChooseItsPath) {
    WeightPtr w = random_weight(1024, 512, 128);
    tl_pack_report report;
    pack(w.get(), TL_FORM_MARLIN_FUSED, &report);
    select(Path::Fused);  // the process-wide defaults
    TL_OK_(tl_weight_set_dispatch(w.get(), TL_DISPATCH_USE_MARLIN, 0));
    const Problem pr = make_problem(w.get(), 16);
    EXPECT_LE(run_gemm(w.get(), pr), 2e-3);
    tl_dispatch_counts c = counts_of(w.get());
    EXPECT_EQ(c.native, 1u);
    EXPECT_EQ(c.marlin_fused, 0u);
    TL_OK_(tl_weight_set_dispatch(w.get(), TL_DISPATCH_USE_MARLIN, -1));
    EXPECT_LE(run_gemm(w.get(), pr), 2e-3);
    c = counts_of(w.get());
    EXPECT_EQ(c.native, 1u);
    EXPECT_EQ(c.marlin_fused, 1u);
}

// A weight whose K is not a multiple of 8 cannot get an FP16 body (the dequantizer's vector width): packing skips
// the body instead of failing, and the FP16-body setting then runs the weight on the next path.
TEST(GpuApi, Fp16BodySkippedWhereTheDequantizerCannotRun) {
    WeightPtr w = random_weight(100, 72, 50);  // group 50: not packable even with K padded to 128
    ASSERT_TRUE(w);
    tl_pack_report report;
    pack(w.get(), kAllForms, &report);
    EXPECT_EQ(report.weights_uploaded, 1u);
    EXPECT_EQ(report.extra_device_bytes, 0u) << "no Marlin-class form (K % 64 != 0) and no body";
    select(Path::Fp16Body);
    const Problem pr = make_problem(w.get(), 5);
    EXPECT_LE(run_gemm(w.get(), pr), 2e-3);
    const tl_dispatch_counts c = counts_of(w.get());
    EXPECT_EQ(c.native, 1u);
    EXPECT_EQ(c.fp16_body + c.fallbacks, 0u);
}

TEST(GpuApi, BadArgumentsAreRefusedWithoutTouchingTheDevice) {
    WeightPtr w = random_weight(256, 128, 64);
    tl_pack_report report;
    pack(w.get(), TL_FORM_MARLIN_FUSED, &report);
    size_t ws_bytes = 0;
    TL_OK_(tl_quant_gemm_workspace_size(w.get(), 4, &ws_bytes));
    DeviceMemory x(4 * 256 * 2), y(4 * 128 * 2), ws(ws_bytes), small_y(2 * 128 * 2);
    CUDA_OK(cudaMemset(ws.ptr, 0, ws_bytes));
    std::vector<uint16_t> host_x(4 * 256), host_y(4 * 128);
    EXPECT_EQ(tl_quant_gemm(w.get(), host_x.data(), y.ptr, 4, nullptr, ws.ptr, ws_bytes), TL_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(tl_last_error_message()).find("x"), std::string::npos);
    EXPECT_EQ(tl_quant_gemm(w.get(), x.ptr, host_y.data(), 4, nullptr, ws.ptr, ws_bytes), TL_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(tl_quant_gemm(w.get(), x.ptr, small_y.ptr, 4, nullptr, ws.ptr, ws_bytes), TL_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(tl_last_error_message()).find("y needs"), std::string::npos) << tl_last_error_message();
    EXPECT_EQ(tl_quant_gemm(w.get(), static_cast<char *>(x.ptr) + 2, y.ptr, 4, nullptr, ws.ptr, ws_bytes),
              TL_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(tl_quant_gemm(w.get(), x.ptr, y.ptr, 0, nullptr, ws.ptr, ws_bytes), TL_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(tl_quant_gemm(w.get(), x.ptr, y.ptr, 4, nullptr, nullptr, 64), TL_ERR_INVALID_ARGUMENT);
    for (const int32_t dtype : {-1, 2, 100}) {
        EXPECT_EQ(tl_quant_gemm_dtype(w.get(), dtype, x.ptr, y.ptr, 4, nullptr, ws.ptr, ws_bytes),
                  TL_ERR_INVALID_ARGUMENT);
        EXPECT_NE(std::string(tl_last_error_message()).find("dtype"), std::string::npos) << tl_last_error_message();
    }
    CUDA_OK(cudaDeviceSynchronize());  // the device is still healthy
    CUDA_OK(cudaGetLastError());
    WeightPtr unpacked = random_weight(256, 128, 64);
    EXPECT_EQ(tl_quant_gemm(unpacked.get(), x.ptr, y.ptr, 4, nullptr, ws.ptr, ws_bytes), TL_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(tl_last_error_message()).find("tl_weight_pack_marlin"), std::string::npos);
}

// A GPTQ act-order checkpoint layer (desc_act: g_idx scatters each group over K), written here: random codes, zero
// points and scales, and g_idx[k] = perm[k] / group_size for a random permutation. Every path gives x W with W the
// checkpoint's own (q - z[g_idx[k]]) * s[g_idx[k]] and x in the checkpoint's K order; the weight needs its workspace
// (the permuted x), and says so when it is too small.
TEST(GpuApi, ActOrderWeightOnEveryPath) {
    struct Shape {
        int k, n, group_size;
    };
    for (const Shape &s : {Shape{1024, 512, 128}, Shape{512, 256, 32}}) {
        SCOPED_TRACE("k=" + std::to_string(s.k) + " n=" + std::to_string(s.n) + " gs=" + std::to_string(s.group_size));
        const int groups = s.k / s.group_size;
        std::uniform_int_distribution<int> code(0, 15), zero(1, 16);
        std::uniform_real_distribution<float> scale(0.01f, 0.03f);
        std::vector<int> q(static_cast<size_t>(s.k) * s.n), z(static_cast<size_t>(groups) * s.n);  // [k][n], [g][n]
        std::vector<uint16_t> scales(z.size());
        for (int &v : q) v = code(rng());
        for (int &v : z) v = zero(rng());
        for (uint16_t &v : scales) v = tl::float_to_half(scale(rng()));
        std::vector<int32_t> perm(s.k), g_idx(s.k);
        for (int i = 0; i < s.k; ++i) perm[i] = i;
        std::shuffle(perm.begin(), perm.end(), rng());
        for (int i = 0; i < s.k; ++i) g_idx[i] = perm[i] / s.group_size;
        std::vector<int32_t> qweight(static_cast<size_t>(s.k / 8) * s.n, 0);
        std::vector<int32_t> qzeros(static_cast<size_t>(groups) * s.n / 8, 0);
        for (int r = 0; r < s.k / 8; ++r)
            for (int c = 0; c < s.n; ++c)
                for (int i = 0; i < 8; ++i)
                    qweight[static_cast<size_t>(r) * s.n + c] |= q[static_cast<size_t>(8 * r + i) * s.n + c] << (4 * i);
        for (int g = 0; g < groups; ++g)
            for (int c = 0; c < s.n / 8; ++c)
                for (int i = 0; i < 8; ++i)
                    qzeros[static_cast<size_t>(g) * s.n / 8 + c] |= (z[static_cast<size_t>(g) * s.n + 8 * c + i] - 1)
                                                                     << (4 * i);
        std::vector<double> wt(static_cast<size_t>(s.n) * s.k);  // [n][k]
        for (int kk = 0; kk < s.k; ++kk)
            for (int c = 0; c < s.n; ++c) {
                const size_t g = static_cast<size_t>(g_idx[kk]) * s.n + c;
                wt[static_cast<size_t>(c) * s.k + kk] =
                    (q[static_cast<size_t>(kk) * s.n + c] - z[g]) * static_cast<double>(tl::half_to_float(scales[g]));
            }

        tl_int4_import_desc d;
        TL_OK_(tl_int4_import_desc_init(&d, sizeof d));
        d.k = s.k;
        d.n = s.n;
        d.group_size = s.group_size;
        d.qweight = qweight.data();
        d.qzeros = qzeros.data();
        d.scales = scales.data();
        d.g_idx = g_idx.data();
        tl_weight *raw = nullptr;
        TL_OK_(tl_weight_import_int4(&d, &raw));
        WeightPtr w(raw);
        tl_pack_report report;
        pack(w.get(), kAllForms, &report);
        ASSERT_EQ(report.weights_packed, 1u);
        for (int m : {1, 16, 40, 300}) {
            const Problem pr = make_problem(wt, s.k, s.n, m);
            for (Path path : {Path::Native, Path::Fused, Path::Correction, Path::Cublas, Path::Fp16Body}) {
                select(path);
                const tl_dispatch_counts before = counts_of(w.get());
                SCOPED_TRACE(std::string("m=") + std::to_string(m) + " path=" + path_name(path));
                EXPECT_LE(run_gemm(w.get(), pr), 2e-3);  // NaN fails too
                EXPECT_EQ(counter(counts_of(w.get()), path) - counter(before, path), 1u);
            }
        }
        // The permuted x is part of the workspace: without room for it the call is refused, naming the reason.
        select(Path::Native);
        size_t needed = 0;
        TL_OK_(tl_quant_gemm_workspace_size(w.get(), 16, &needed));
        EXPECT_GE(needed, static_cast<size_t>(16) * s.k * 2);
        DeviceMemory x(static_cast<size_t>(16) * s.k * 2), y(static_cast<size_t>(16) * s.n * 2), ws(needed);
        EXPECT_EQ(tl_quant_gemm(w.get(), x.ptr, y.ptr, 16, nullptr, ws.ptr, needed / 2), TL_ERR_INVALID_ARGUMENT);
        EXPECT_NE(std::string(tl_last_error_message()).find("act-order"), std::string::npos) << tl_last_error_message();
        EXPECT_EQ(tl_quant_gemm(w.get(), x.ptr, y.ptr, 16, nullptr, nullptr, 0), TL_ERR_INVALID_ARGUMENT);
    }
}

int main(int argc, char **argv) { return run_gpu_tests(argc, argv, "GPU API tests"); }
