// The GPU C API end to end: tl_weight_quantize -> tl_weight_pack_marlin -> tl_quant_gemm through every dispatcher
// path, against an FP64 host reference built from tl_weight_dequantize, on fresh random inputs with poisoned outputs.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

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

// Every path on packable shapes (M from 1, per group and per row) gives the reference within 2e-3 and
// counts itself; a shape the Marlin-class kernel does not take runs on the native kernel whatever is selected.
TEST(GpuApi, EveryPathMatchesTheReference) {
    struct Shape {
        int m, k, n, group_size;
        bool packable;
    };
    const Shape shapes[] = {{1, 256, 256, 128, true},    {7, 512, 384, 64, true},    {16, 1024, 512, 32, true},
                            {33, 2048, 1024, 0, true},   {64, 4096, 512, 128, true}, {255, 1024, 768, 128, true},
                            {1024, 2048, 1024, 128, true}, {5, 96, 100, 32, false},  {16, 200, 136, 0, false}};
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

// A weight whose K is not a multiple of 8 cannot get an FP16 body (the dequantizer's vector width): packing skips
// the body instead of failing, and the FP16-body setting then runs the weight on the next path.
TEST(GpuApi, Fp16BodySkippedWhereTheDequantizerCannotRun) {
    WeightPtr w = random_weight(100, 72, 0);
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
    CUDA_OK(cudaDeviceSynchronize());  // the device is still healthy
    CUDA_OK(cudaGetLastError());
    WeightPtr unpacked = random_weight(256, 128, 64);
    EXPECT_EQ(tl_quant_gemm(unpacked.get(), x.ptr, y.ptr, 4, nullptr, ws.ptr, ws_bytes), TL_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(tl_last_error_message()).find("tl_weight_pack_marlin"), std::string::npos);
}

int main(int argc, char **argv) { return run_gpu_tests(argc, argv, "GPU API tests"); }
