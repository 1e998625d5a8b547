// The Marlin-class GEMM, both modes (fused q*s + z; symmetric + the seed's correction wrapper), against an FP64
// host reference on small shapes (every element) and, on the benchmark layers, against the native INT4 kernel
// (every element) plus the FP64 reference on 96 random columns. Also: the workspace is left zeroed, the launcher
// refuses unsupported arguments without launching, the classic kernel forced on every shape, the wgmma kernel (Hopper)
// in each of its tile forms, and the C API's dispatcher reaches each kernel.
#include <cublas_v2.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gpu_kernels.hpp"
#include "gpu_test_util.hpp"
#include "util/half.hpp"
#include "gpu/marlin_pack.hpp"
#include "tinyloop.h"

namespace {

using tlt::DeviceBuffer;

// Which packings a FusedCase uploads: the fused one (W = q*s + z) only, or also the symmetric one with its
// correction (W = (q - 8)*s + delta, marlin_gemm_corrected).
enum class Modes { Fused, Both };

// One case on the device, for the tests that call marlin_gemm (and marlin_gemm_corrected) directly, with the policy's
// plan or a forced one: fresh random weights and activations, the packed weight uploaded (fused; with Modes::Both also
// the symmetric packing and its delta), a zeroed workspace, the FP64 reference. The activations are exact in FP16 and
// BF16 and uploaded in both types, so one reference serves calls of either type.
struct FusedCase {
    int m, k, n, gs;  // gs: the kernel's group size (-1 per row)
    bool both;        // the symmetric packing is there too
    tlt::Int4Weight w;
    std::vector<uint16_t> x;       // FP16 bits
    tl::MarlinPacked packed, sym;  // fused; symmetric (empty unless Modes::Both)
    size_t ws_bytes;
    DeviceBuffer<uint16_t> dx, dxb, dy, ds, dz, dss;  // dxb: x as BF16
    DeviceBuffer<uint32_t> dw, dws;
    DeviceBuffer<float> ddelta, a_sum;
    DeviceBuffer<uint8_t> work;

    FusedCase(int m_, int k_, int n_, int group_size, Modes modes = Modes::Fused)
        : m(m_), k(k_), n(n_), gs(tl::marlin_kernel_group_size(k_, group_size)), both(modes == Modes::Both),
          w(tlt::random_weight(k_, n_, group_size)), x(tlt::random_normal_both(static_cast<size_t>(m_) * k_)),
          packed(tl::marlin_pack(w.codes.data(), w.scales.data(), w.zeros.data(), k_, n_, group_size,
                                 tl::MarlinMode::Fused)),
          sym(both ? tl::marlin_pack(w.codes.data(), w.scales.data(), w.zeros.data(), k_, n_, group_size,
                                     tl::MarlinMode::Symmetric)
                   : tl::MarlinPacked{}),
          ws_bytes(tl::gpu::marlin_workspace_bytes(tlt::sm_count())), dx(x.size()), dxb(x.size()),
          dy(static_cast<size_t>(m_) * n_), ds(packed.scales.size()), dz(packed.zeros.size()),
          dss(sym.scales.size()), dw(packed.words.size()), dws(sym.words.size()), ddelta(sym.delta.size()),
          a_sum(tl::gpu::correction_scratch_bytes(m_, k_, gs) / sizeof(float) + 1), work(ws_bytes) {}
    std::string name() const {
        return "M=" + std::to_string(m) + " K=" + std::to_string(k) + " N=" + std::to_string(n) + " group " +
               std::to_string(w.group_size);
    }
    // Allocations and uploads; call once under ASSERT_TRUE.
    ::testing::AssertionResult upload() {
        for (bool ok : {dx.ok(), dxb.ok(), dy.ok(), ds.ok(), dz.ok(), dss.ok(), dw.ok(), dws.ok(), ddelta.ok(),
                        a_sum.ok(), work.ok()}) {
            if (!ok) return ::testing::AssertionFailure() << "cudaMalloc failed";
        }
        for (cudaError_t rc : {dx.upload(x), dxb.upload(tlt::bf16_bits(x)), dw.upload(packed.words), ds.upload(packed.scales),
                               dz.upload(packed.zeros), cudaMemset(work.get(), 0, ws_bytes)}) {
            if (rc != cudaSuccess) return ::testing::AssertionFailure() << cudaGetErrorString(rc);
        }
        if (both) {
            for (cudaError_t rc : {dws.upload(sym.words), dss.upload(sym.scales), ddelta.upload(sym.delta)}) {
                if (rc != cudaSuccess) return ::testing::AssertionFailure() << cudaGetErrorString(rc);
            }
        }
        return ::testing::AssertionSuccess();
    }
    // Fresh activations of `rows` rows (at most the M the case was built with), uploaded; M becomes `rows`. Y keeps
    // the size it was built with (poisoned and fetched whole).
    ::testing::AssertionResult new_activations(int rows) {
        if (rows < 1 || static_cast<size_t>(rows) * k > dx.count()) {
            return ::testing::AssertionFailure() << rows << " rows do not fit";
        }
        m = rows;
        x = tlt::random_normal_both(static_cast<size_t>(rows) * k);
        for (cudaError_t rc : {dx.upload(x), dxb.upload(tlt::bf16_bits(x))}) {
            if (rc != cudaSuccess) return ::testing::AssertionFailure() << cudaGetErrorString(rc);
        }
        return ::testing::AssertionSuccess();
    }
    // marlin_gemm (fused) or marlin_gemm_corrected (symmetric + correction; Modes::Both only) into the poisoned
    // output, under `plan` (NULL: the policy's), on x and y of `dtype` (fused only for BF16): its rc (a poison failure
    // is reported as that CUDA error).
    int run(bool fused_mode = true, const tl::MarlinPlan *plan = nullptr, tl::Dtype dtype = tl::Dtype::F16) {
        if (!fused_mode && !both) return tl::gpu::kRcBadArgument;  // nothing packed for it
        const cudaError_t poisoned = dy.poison();
        if (poisoned != cudaSuccess) return static_cast<int>(poisoned);
        const uint16_t *xd = dtype == tl::Dtype::BF16 ? dxb.get() : dx.get();
        return fused_mode ? tl::gpu::marlin_gemm(xd, dw.get(), ds.get(), dz.get(), dy.get(), m, n, k, gs, true, dtype,
                                                 work.get(), ws_bytes, nullptr, plan)
                          : tl::gpu::marlin_gemm_corrected(dx.get(), dws.get(), dss.get(), ddelta.get(), dy.get(), m,
                                                           n, k, gs, work.get(), ws_bytes, a_sum.get(),
                                                           a_sum.count() * sizeof(float), nullptr, plan);
    }
    // Waits for the call and fetches Y.
    cudaError_t result(std::vector<uint16_t> &y) {
        const cudaError_t rc = cudaDeviceSynchronize();
        return rc != cudaSuccess ? rc : dy.download(y);
    }
    ::testing::AssertionResult workspace_clean() const {
        std::vector<uint8_t> bytes;
        const cudaError_t rc = work.download(bytes);
        if (rc != cudaSuccess) return ::testing::AssertionFailure() << cudaGetErrorString(rc);
        if (!std::all_of(bytes.begin(), bytes.end(), [](uint8_t b) { return b == 0; })) {
            return ::testing::AssertionFailure() << "workspace not clean after the calls";
        }
        return ::testing::AssertionSuccess();
    }
};

// What a call runs on: the form (fused q*s + z, or symmetric + the seed's correction) and the type of x and y; every
// test below runs the three there are. BF16's tolerance is wider: y is rounded to 8 significant bits, not 11.
struct Variant {
    bool fused;
    tl::Dtype dtype;
    const char *name;
    double tol() const { return dtype == tl::Dtype::BF16 ? 8e-3 : 2e-3; }
};
const Variant kVariants[] = {{true, tl::Dtype::F16, "fused q*s+z, FP16"},
                             {false, tl::Dtype::F16, "symmetric + correction, FP16"},
                             {true, tl::Dtype::BF16, "fused q*s+z, BF16"}};

struct GemmShape {
    int m, k, n, group_size;  // group_size == k: per row (kernel gs = -1)
    bool layer;               // a benchmark layer: too large for a full FP64 reference
    std::string name;
};

std::vector<GemmShape> gemm_shapes() {
    std::vector<GemmShape> s = {
        {1, 128, 64, 32, false, ""},       {7, 256, 192, 64, false, ""},      {16, 512, 576, 128, false, ""},
        {33, 1024, 1024, 1024, false, ""}, {64, 2048, 640, 32, false, ""},    {255, 1024, 832, 128, false, ""},
        {1024, 512, 1088, 64, false, ""},  {1, 4096, 128, 128, false, ""},    {7, 8192, 64, 8192, false, ""},
        {16, 64, 8192, 32, false, ""},     {33, 192, 1536, 64, false, ""},    {64, 3072, 512, 128, false, ""},
        {255, 128, 4096, 128, false, ""},  {1024, 1024, 512, 32, false, ""},  {100, 640, 960, 128, false, ""},
        {48, 256, 320, 256, false, ""},
        // M <= 16: partial 8-row tiles, group 32 / 64 / 192 (a group size the stream kernel refuses), per row, K = 384
        // (three 128-deep stages), per row with K % 128 != 0 (the stream kernel refuses).
        {9, 1024, 1536, 32, false, ""},    {13, 1152, 320, 192, false, ""},   {5, 512, 704, 64, false, ""},
        {3, 28672, 1024, 28672, false, ""}, {4, 384, 256, 128, false, ""},     {2, 320, 192, 320, false, ""},
        // The benchmark layers of tl_bench (K x N).
        {1, 2048, 6144, 128, true, "tl_qkv"},       {16, 2048, 2048, 2048, true, "tl_out"},
        {64, 2048, 16384, 128, true, "tl_gateup"},  {7, 8192, 2048, 128, true, "tl_down"},
        {33, 4096, 6144, 4096, true, "l8_qkv"},     {16, 4096, 28672, 128, true, "l8_gateup"},
        {1, 14336, 4096, 14336, true, "l8_down"},   {1, 8192, 57344, 128, true, "l70_gateup"},
        {16, 28672, 8192, 28672, true, "l70_down"}, {255, 2048, 6144, 64, true, "tl_qkv"},
        {1024, 4096, 6144, 128, true, "l8_qkv"},
        // 16 < M <= 64 on layers: group 32 / 128, per row.
        {64, 4096, 6144, 128, true, "l8_qkv"},      {48, 4096, 6144, 32, true, "l8_qkv"},
        {24, 4096, 6144, 4096, true, "l8_qkv"},
    };
    // 16 < M <= 64 on small shapes: 32- and 64-row tiles, full and partial, x group 32, 64, 128 and per row. N cycles
    // through one partial 512-column tile (192), a tile plus a strip (576), two tiles plus a strip (1088) and three
    // plus a partial one (1600: 25 strips).
    const int ms[] = {17, 24, 31, 32, 33, 48, 63, 64};
    const int groups[] = {32, 64, 128, 0};  // 0: per row
    const int ks[] = {512, 768, 1024};
    const int ns[] = {576, 192, 1088, 1600};
    for (int i = 0; i < 8; ++i) {
        for (int j = 0; j < 4; ++j) {
            const int k = ks[(i + j) % 3];
            s.push_back({ms[i], k, ns[(i + 2 * j) % 4], groups[j] == 0 ? k : groups[j], false, "medium"});
        }
    }
    return s;
}

std::string shape_name(const ::testing::TestParamInfo<GemmShape> &info) {
    const GemmShape &s = info.param;
    std::string g = s.group_size == s.k ? "row" : "g" + std::to_string(s.group_size);
    return (s.name.empty() ? std::string("small") : s.name) + "_M" + std::to_string(s.m) + "_K" + std::to_string(s.k) +
           "_N" + std::to_string(s.n) + "_" + g;
}

class MarlinGemm : public ::testing::TestWithParam<GemmShape> {};

TEST_P(MarlinGemm, BothModesMatchReference) {
    const GemmShape sh = GetParam();
    if (tlt::g_quick && (sh.layer || static_cast<double>(sh.m) * sh.n * sh.k > 6e7)) GTEST_SKIP() << "quick mode";
    FusedCase c(sh.m, sh.k, sh.n, sh.group_size, Modes::Both);
    ASSERT_TRUE(c.upload());
    const int m = c.m, k = c.k, n = c.n;
    const tlt::Int4Weight &w = c.w;

    // The reference: FP64 on every column for small shapes; for layers, FP64 on sampled columns plus the native
    // kernel (itself tested against FP64 in native_test.cpp) on every element.
    const std::vector<int> cols = sh.layer ? tlt::sample_columns(n, 96) : std::vector<int>{};
    const std::vector<double> ref = tlt::reference_gemm(c.x, m, w, cols);
    std::vector<uint16_t> native;
    if (sh.layer) {
        DeviceBuffer<uint8_t> dcodes(w.codes.size());
        DeviceBuffer<uint16_t> dscales(w.scales.size()), dzeros(w.zeros.size()), dyn(static_cast<size_t>(m) * n);
        for (bool ok : {dcodes.ok(), dscales.ok(), dzeros.ok(), dyn.ok()}) ASSERT_TRUE(ok);
        CUDA_OK(dcodes.upload(w.codes));
        CUDA_OK(dscales.upload(w.scales));
        CUDA_OK(dzeros.upload(w.zeros));
        CUDA_OK(dyn.poison());
        ASSERT_EQ(0, tl::gpu::native_int4_gemm(c.dx.get(), dcodes.get(), dscales.get(), dzeros.get(), dyn.get(), m, n,
                                               k, sh.group_size, tl::Dtype::F16, nullptr));
        CUDA_OK(cudaDeviceSynchronize());
        CUDA_OK(dyn.download(native));
        EXPECT_TRUE(tlt::matches(native, m, n, ref, cols, 2e-3)) << "native INT4 (the second reference)";
    }

    std::vector<uint16_t> y;
    // The policy's kernel, then the classic kernel forced (the mainloop of GPUs without wgmma, and the others'
    // fallback). M <= 16: the policy's is the stream kernel where it takes the shape.
    const bool stream_applies = m <= 16 && k % 128 == 0 && (sh.group_size % 128 == 0 || sh.group_size == 32 ||
                                                            sh.group_size == 64);
    const tl::MarlinPlan classic = tl::classic_plan(m);
    for (const tl::MarlinPlan *plan : {static_cast<const tl::MarlinPlan *>(nullptr), &classic}) {
        SCOPED_TRACE(plan == nullptr ? "the policy's kernel" : "the classic kernel");
        for (const Variant &v : kVariants) {
            SCOPED_TRACE(v.name);
            const uint64_t streams = tl::gpu::marlin_launch_count(tl::MarlinKernel::Stream);
            const uint64_t classics = tl::gpu::marlin_launch_count(tl::MarlinKernel::Classic);
            ASSERT_EQ(0, c.run(v.fused, plan, v.dtype));
            EXPECT_EQ(tl::gpu::marlin_launch_count(tl::MarlinKernel::Stream),
                      streams + (stream_applies && plan == nullptr ? 1 : 0));
            if (plan != nullptr) {
                EXPECT_EQ(tl::gpu::marlin_launch_count(tl::MarlinKernel::Classic), classics + 1);
            }
            CUDA_OK(c.result(y));
            EXPECT_TRUE(tlt::matches(y, m, n, ref, cols, v.tol(), v.dtype)) << "vs FP64";
            if (sh.layer && v.dtype == tl::Dtype::F16) {
                EXPECT_TRUE(tlt::matches_half(y, native, m, n, 2e-3)) << "vs native INT4";
            }
        }
    }

    // Every call leaves the stream-K workspace (counters and partial sums) zeroed for the next one.
    EXPECT_TRUE(c.workspace_clean());
}

INSTANTIATE_TEST_SUITE_P(Shapes, MarlinGemm, ::testing::ValuesIn(gemm_shapes()), shape_name);

// The stream kernel is two launches (the main grid and the fix-up of the strips cut between warps, a programmatic
// dependent launch on Hopper); the library's scoring and the benchmark capture them in CUDA graphs. Three calls
// captured back to back on one stream, the graph replayed twice into a poisoned output: each replay matches the
// reference and leaves the workspace zeroed.
TEST(MarlinStream, GraphReplaysMatchReference) {
    for (const int m : {1, 12}) {
        FusedCase c(m, 2048, 1600, 128);
        SCOPED_TRACE(c.name());
        ASSERT_TRUE(c.upload());
        const std::vector<double> ref = tlt::reference_gemm(c.x, c.m, c.w, {});
        struct Graph {
            cudaStream_t stream = nullptr;
            cudaGraph_t graph = nullptr;
            cudaGraphExec_t exec = nullptr;
            ~Graph() {
                if (exec != nullptr) cudaGraphExecDestroy(exec);
                if (graph != nullptr) cudaGraphDestroy(graph);
                if (stream != nullptr) cudaStreamDestroy(stream);
            }
        } g;
        CUDA_OK(cudaStreamCreateWithFlags(&g.stream, cudaStreamNonBlocking));
        const uint64_t streams = tl::gpu::marlin_launch_count(tl::MarlinKernel::Stream);
        CUDA_OK(cudaStreamBeginCapture(g.stream, cudaStreamCaptureModeThreadLocal));
        int rc = 0;
        for (int call = 0; call < 3 && rc == 0; ++call) {
            rc = tl::gpu::marlin_gemm(c.dx.get(), c.dw.get(), c.ds.get(), c.dz.get(), c.dy.get(), c.m, c.n, c.k, c.gs,
                                      true, tl::Dtype::F16, c.work.get(), c.ws_bytes, g.stream);
        }
        const cudaError_t captured = cudaStreamEndCapture(g.stream, &g.graph);
        ASSERT_EQ(0, rc);
        CUDA_OK(captured);
        EXPECT_EQ(tl::gpu::marlin_launch_count(tl::MarlinKernel::Stream), streams + 3);
        CUDA_OK(cudaGraphInstantiate(&g.exec, g.graph, 0));
        for (int replay = 0; replay < 2; ++replay) {
            CUDA_OK(c.dy.poison());
            CUDA_OK(cudaDeviceSynchronize());  // the poison (legacy stream) lands before the graph's stream starts
            CUDA_OK(cudaGraphLaunch(g.exec, g.stream));
            CUDA_OK(cudaStreamSynchronize(g.stream));
            std::vector<uint16_t> y;
            CUDA_OK(c.dy.download(y));
            EXPECT_TRUE(tlt::matches(y, c.m, c.n, ref, {}, 2e-3)) << "replay " << replay;
        }
        EXPECT_TRUE(c.workspace_clean());
    }
}

// The same call twice gives the same output up to the FP32 summation order of cut tiles (<= 1 FP16 ulp apart).
TEST(MarlinGemmRepeat, RepeatedCallsAgree) {
    FusedCase c(16, 4096, 1024, 128);
    ASSERT_TRUE(c.upload());
    std::vector<uint16_t> first, again;
    for (int rep = 0; rep < 2; ++rep) {
        ASSERT_EQ(0, c.run());
        CUDA_OK(c.result(rep == 0 ? first : again));
    }
    EXPECT_TRUE(tlt::matches_half(again, first, c.m, c.n, 1e-3));
}

// The worst case for precision: per-row scales with K = 28672 (the unscaled sums of the stream kernel carry a
// 1024 * sum(x) bias), M = 1, 8 and 16, every element against FP64. Prints the measured relative errors.
TEST(MarlinPrecision, PerRowLongK) {
    if (tlt::g_quick) GTEST_SKIP() << "quick mode";
    const int k = 28672, n = 1024;
    FusedCase c(16, k, n, k, Modes::Both);  // Y [16][n]; M = 1 and 8 use its first rows
    ASSERT_TRUE(c.upload());
    for (const int m : {1, 8, 16}) {
        ASSERT_TRUE(c.new_activations(m));
        const std::vector<double> ref = tlt::reference_gemm(c.x, m, c.w, {});
        for (const Variant &v : kVariants) {
            ASSERT_EQ(0, c.run(v.fused, nullptr, v.dtype));
            std::vector<uint16_t> y;
            CUDA_OK(c.result(y));
            y.resize(static_cast<size_t>(m) * n);
            const ::testing::AssertionResult r = tlt::matches(y, m, n, ref, {}, v.tol(), v.dtype);
            std::printf("[precision] per row, K = %d, N = %d, M = %2d, %s: %s\n", k, n, m, v.name, r.message());
            EXPECT_TRUE(r) << "M = " << m << ", " << v.name;
        }
    }
}

// Within cuBLAS's own error, FP16 and BF16: on fresh random inputs, the relative error against FP64 of the policy's
// kernel and of the classic kernel, at 1 to 200 rows, is at most 1.5 times that of cuBLAS multiplying the same
// activations by the weight rounded once to the same type (what a cuBLAS user holds). Prints the ratios.
TEST(MarlinPrecision, WithinCublasError) {
    if (tlt::g_quick) GTEST_SKIP() << "quick mode";
    const int k = 4096, n = 1536, max_m = 200;
    FusedCase c(max_m, k, n, 128);
    ASSERT_TRUE(c.upload());
    std::vector<uint16_t> w16(static_cast<size_t>(n) * k), wbf(w16.size());  // [n][k]
    for (int nn = 0; nn < n; ++nn)
        for (int kk = 0; kk < k; ++kk) {
            const double w = c.w.at(kk, nn);
            w16[static_cast<size_t>(nn) * k + kk] = tl::float_to_half(static_cast<float>(w));
            wbf[static_cast<size_t>(nn) * k + kk] = tlt::float_to_bf16(static_cast<float>(w));
        }
    DeviceBuffer<uint16_t> dwd(w16.size()), dyc(static_cast<size_t>(max_m) * n);
    ASSERT_TRUE(dwd.ok() && dyc.ok());
    cublasHandle_t handle = nullptr;
    ASSERT_EQ(CUBLAS_STATUS_SUCCESS, cublasCreate(&handle));
    for (const int m : {1, 16, 17, 64, 200}) {
        ASSERT_TRUE(c.new_activations(m));
        const std::vector<double> ref = tlt::reference_gemm(c.x, m, c.w, {});
        for (const tl::Dtype dtype : {tl::Dtype::F16, tl::Dtype::BF16}) {
            const bool bf16 = dtype == tl::Dtype::BF16;
            SCOPED_TRACE(std::string(bf16 ? "BF16" : "FP16") + ", M = " + std::to_string(m));
            CUDA_OK(dwd.upload(bf16 ? wbf : w16));
            CUDA_OK(dyc.poison());
            ASSERT_EQ(0, tl::gpu::cublas_gemm(handle, bf16 ? c.dxb.get() : c.dx.get(), dwd.get(), dyc.get(), m, n, k,
                                              dtype, nullptr));
            std::vector<uint16_t> y;
            CUDA_OK(cudaDeviceSynchronize());
            CUDA_OK(dyc.download(y));
            y.resize(static_cast<size_t>(m) * n);
            const double cublas_error = tlt::relative_error(y, m, n, ref, dtype);
            ASSERT_TRUE(std::isfinite(cublas_error));
            const tl::MarlinPlan classic = tl::classic_plan(m);
            for (const tl::MarlinPlan *plan : {static_cast<const tl::MarlinPlan *>(nullptr), &classic}) {
                ASSERT_EQ(0, c.run(true, plan, dtype));
                CUDA_OK(c.result(y));
                y.resize(static_cast<size_t>(m) * n);
                const double error = tlt::relative_error(y, m, n, ref, dtype);
                std::printf("[precision] %s M = %3d, %-8s: relative error %.3g, cuBLAS %.3g, ratio %.2f\n",
                            bf16 ? "BF16" : "FP16", m, plan == nullptr ? "policy" : "classic", error, cublas_error,
                            error / cublas_error);
                EXPECT_LE(error, 1.5 * cublas_error) << (plan == nullptr ? "the policy's kernel" : "the classic kernel");
            }
        }
    }
    cublasDestroy(handle);
}

// Unsupported or invalid arguments: a non-zero rc and nothing launched (the output keeps its poison).
TEST(MarlinLauncher, RefusesInvalidArgumentsWithoutLaunching) {
    const int m = 4;
    const size_t ws_bytes = tl::gpu::marlin_workspace_bytes(tlt::sm_count());
    DeviceBuffer<uint16_t> dx(static_cast<size_t>(m) * 32768), dy(static_cast<size_t>(m) * 65536), ds(65536),
        dz(65536);
    DeviceBuffer<uint32_t> dw(1 << 22);
    DeviceBuffer<uint8_t> work(ws_bytes);
    for (bool ok : {dx.ok(), dy.ok(), ds.ok(), dz.ok(), dw.ok(), work.ok()}) ASSERT_TRUE(ok);
    CUDA_OK(cudaMemset(dx.get(), 0, dx.bytes()));
    CUDA_OK(cudaMemset(work.get(), 0, ws_bytes));
    struct Case {
        const char *what;
        int m, n, k, gs;
        int x_offset;
        bool zeros;
        size_t ws;
        bool symmetric = false;
        tl::Dtype dtype = tl::Dtype::F16;
    };
    const Case cases[] = {
        {"N = 50257 (the head)", m, 50257, 2048, 128, 0, true, ws_bytes},
        {"N % 64 != 0", m, 100, 256, 128, 0, true, ws_bytes},
        {"K % 64 != 0", m, 128, 96, 32, 0, true, ws_bytes},
        {"group size 16", m, 128, 256, 16, 0, true, ws_bytes},
        {"group size 48", m, 128, 192, 48, 0, true, ws_bytes},
        {"group size not dividing K", m, 128, 320, 128, 0, true, ws_bytes},
        {"M = 0", 0, 128, 256, 128, 0, true, ws_bytes},
        {"fused without zeros", m, 128, 256, 128, 0, false, ws_bytes},
        {"misaligned X", m, 128, 256, 128, 1, true, ws_bytes},
        {"workspace too small", m, 4096, 4096, 128, 0, true, 1024},
        {"BF16 in the symmetric form (FP16 alone)", m, 128, 256, 128, 0, true, ws_bytes, true, tl::Dtype::BF16},
    };
    for (const Case &c : cases) {
        SCOPED_TRACE(c.what);
        CUDA_OK(dy.poison());
        const int rc =
            tl::gpu::marlin_gemm(dx.get() + c.x_offset, dw.get(), ds.get(), c.zeros ? dz.get() : nullptr, dy.get(),
                                 c.m, c.n, c.k, c.gs, !c.symmetric, c.dtype, work.get(), c.ws, nullptr);
        EXPECT_NE(0, rc);
        EXPECT_LT(rc, 0) << "refusals are negative rc values, not CUDA errors";
        CUDA_OK(cudaDeviceSynchronize());
        std::vector<uint16_t> y;
        CUDA_OK(dy.download(y));
        EXPECT_TRUE(std::all_of(y.begin(), y.end(), [](uint16_t v) { return v == 0xFFFF; })) << "output was written";
    }
    EXPECT_EQ(tl::gpu::kRcBadArgument, tl::gpu::marlin_gemm(nullptr, dw.get(), ds.get(), dz.get(), dy.get(), m, 128,
                                                             256, 128, true, tl::Dtype::F16, work.get(), ws_bytes,
                                                             nullptr));
    CUDA_OK(cudaGetLastError());
}


// The wgmma kernel (compute capability 9.0, library built for sm_90a) in each tile form the policy uses, forced on
// every shape whatever its weight size: 32-row tiles on one warpgroup and on two (M <= 32), 64-row tiles with and
// without the copying warpgroup (33-64), 128-row tiles (above); full and partial tiles, N with partial 256-column
// tiles, group 32 / 64 / 128 and per row, both modes, stream-K and whole-tile scheduling; against FP64, and the
// workspace is left zeroed. Where the kernel cannot run the launcher falls through to the classic kernel, and the
// results must still match (the launch counter then stays put).
TEST(MarlinWgmma, EveryTileFormMatchesReference) {
    const bool runs = tlt::sm90a_kernels_run();
    std::printf("wgmma kernel %s (built for sm_90a: %s)\n", runs ? "runs" : "does not run",
                tl::gpu::marlin_wgmma_built() ? "yes" : "no");
    struct Case {
        int m, k, n, group_size;
    };
    const Case cases[] = {{17, 512, 320, 32},    {20, 1024, 1600, 128}, {32, 768, 576, 64},   {33, 1024, 576, 64},
                          {64, 768, 1088, 128},  {64, 512, 256, 512},   {65, 1024, 1600, 32}, {100, 640, 960, 128},
                          {128, 2048, 512, 64},  {129, 384, 1344, 384}, {300, 1024, 832, 128}, {517, 256, 2112, 32},
                          {96, 8192, 256, 128},  {200, 64, 448, 64},
                          // 576 tiles of 128 rows: whole-tile scheduling (>= 4 tiles per resident block)
                          {1100, 64, 16384, 64}};
    for (const Case sh : cases) {
        FusedCase c(sh.m, sh.k, sh.n, sh.group_size, Modes::Both);
        SCOPED_TRACE(c.name());
        ASSERT_TRUE(c.upload());
        const std::vector<double> ref = tlt::reference_gemm(c.x, c.m, c.w, {});
        std::vector<tl::MarlinPlan> forms;
        tl::MarlinPlan form;
        form.kernel = tl::MarlinKernel::Wgmma;
        form.rows = sh.m <= 32 ? 32 : sh.m <= 64 ? 64 : 128;
        form.wgmma_warp_specialized = sh.m > 64;
        forms.push_back(form);
        if (sh.m <= 32) {
            form.wgmma_warpgroups = 1;
            forms.push_back(form);
        } else if (sh.m <= 64) {
            form.wgmma_warp_specialized = true;
            forms.push_back(form);
        }
        for (const tl::MarlinPlan &plan : forms) {
            SCOPED_TRACE(std::to_string(plan.rows) + "-row tiles on " + std::to_string(plan.wgmma_warpgroups) +
                         " warpgroup(s)" + (plan.wgmma_warp_specialized ? " and a copying one" : ""));
            for (const Variant &v : kVariants) {
                SCOPED_TRACE(v.name);
                const uint64_t before = tl::gpu::marlin_launch_count(tl::MarlinKernel::Wgmma);
                EXPECT_EQ(0, c.run(v.fused, &plan, v.dtype));
                EXPECT_EQ(tl::gpu::marlin_launch_count(tl::MarlinKernel::Wgmma), before + (runs ? 1 : 0));
                std::vector<uint16_t> y;
                CUDA_OK(c.result(y));
                EXPECT_TRUE(tlt::matches(y, c.m, c.n, ref, {}, v.tol(), v.dtype)) << "vs FP64";
            }
        }
        // Every call leaves the workspace zeroed.
        EXPECT_TRUE(c.workspace_clean());
    }
}

// The TMA kernel (compute capability 9.0, library built for sm_90a), forced on every shape: full and partial row
// tiles, N with a last tile of one strip, group 32 / 64 / 128 and per row, both modes and BF16, whole tiles (one per
// block and several: the grid is one block per SM) and stream-K with tiles cut between two or more blocks, K from one
// slice to many rounds of the ring; against FP64, and the workspace of the cut tiles' sums is left zeroed.
TEST(MarlinTma, MatchesReference) {
    const bool runs = tlt::sm90a_kernels_run();
    struct Case {
        int m, k, n, group_size;
    };
    const Case cases[] = {{64, 512, 320, 32},   {100, 1024, 1600, 128}, {128, 768, 576, 64},  {129, 64, 448, 64},
                          {256, 2048, 512, 64}, {300, 384, 1344, 384},  {517, 256, 2112, 32}, {200, 8192, 256, 128},
                          {1100, 128, 16384, 64}, {700, 512, 4096, 512}, {260, 128, 6144, 64}};
    for (const Case sh : cases) {
        // Quick mode (the sanitizer runs): the small shapes, one of them in whole tiles (260 x 6144: 96 tiles of 256).
        if (tlt::g_quick && static_cast<double>(sh.m) * sh.n * sh.k > 2.1e8) continue;
        FusedCase c(sh.m, sh.k, sh.n, sh.group_size, Modes::Both);
        SCOPED_TRACE(c.name());
        ASSERT_TRUE(c.upload());
        const std::vector<double> ref = tlt::reference_gemm(c.x, c.m, c.w, {});
        tl::MarlinPlan plan;
        plan.kernel = tl::MarlinKernel::Tma;
        plan.rows = tl::kTmaRows;
        for (const Variant &v : kVariants) {
            SCOPED_TRACE(v.name);
            const uint64_t before = tl::gpu::marlin_launch_count(tl::MarlinKernel::Tma);
            EXPECT_EQ(0, c.run(v.fused, &plan, v.dtype));
            EXPECT_EQ(tl::gpu::marlin_launch_count(tl::MarlinKernel::Tma), before + (runs ? 1 : 0));
            std::vector<uint16_t> y;
            CUDA_OK(c.result(y));
            EXPECT_TRUE(tlt::matches(y, c.m, c.n, ref, {}, v.tol(), v.dtype)) << "vs FP64";
        }
        EXPECT_TRUE(c.workspace_clean());
    }
}

// The C API's dispatcher (tl_quant_gemm) sends M <= 16 to the stream kernel and larger M to the wgmma or TMA kernel
// where they run (else the classic kernel), in plan_marlin's tile forms, for a small and a larger weight, on both Marlin-class
// paths (fused and symmetric + correction): the weight's path counter and the kernel's launch counter each move by
// one, nothing falls back, and the output matches the native INT4 fallback (USE_MARLIN = 0) and the FP64 reference.
TEST(MarlinLauncher, DispatcherRunsThePolicysKernel) {
    const int group_size = 128;
    int32_t saved[5];
    for (int32_t setting = 0; setting < 5; ++setting) ASSERT_EQ(TL_OK, tl_get_dispatch(setting, &saved[setting]));
    struct WeightCase {
        int k, n;
        std::vector<int> ms;
    };
    // A small weight and one just above 2^25 (a copying warpgroup at 33-64 rows); 4096 x 16448 is above 2^26 (one
    // warpgroup up to 32 rows); 256 x 2432 at 1100 rows has 95 tiles of the TMA kernel (whole tiles on 132 SMs).
    for (const WeightCase &wc : {WeightCase{1024, 1536, {1, 16, 17, 32, 33, 64, 100}}, WeightCase{2048, 16448, {40}},
                                 WeightCase{4096, 16448, {17}}, WeightCase{256, 2432, {1100}}}) {
        const int k = wc.k, n = wc.n;
        SCOPED_TRACE("K = " + std::to_string(k) + ", N = " + std::to_string(n));
        // Random FP32 weights [n][k] (a Linear's layout), quantized by the library; the reference multiplies by what
        // tl_weight_dequantize returns, so the test checks the GEMM, not the quantizer.
        std::vector<float> wf(static_cast<size_t>(k) * n);
        std::normal_distribution<float> normal(0.0f, 0.03f);
        for (float &v : wf) v = normal(tlt::rng());
        tl_quantize_options qopts;
        ASSERT_EQ(TL_OK, tl_quantize_options_init(&qopts, sizeof qopts));
        qopts.group_size = group_size;
        tl_weight *weight = nullptr;
        ASSERT_EQ(TL_OK, tl_weight_quantize(wf.data(), k, n, &qopts, &weight)) << tl_last_error_message();
        std::unique_ptr<tl_weight, void (*)(tl_weight *)> owner(weight, tl_weight_free);
        tl_pack_options popts;
        ASSERT_EQ(TL_OK, tl_pack_options_init(&popts, sizeof popts));
        popts.forms = TL_FORM_MARLIN_FUSED | TL_FORM_MARLIN_CORRECTION | TL_FORM_FP16_BODY;
        tl_pack_report report;
        ASSERT_EQ(TL_OK, tl_pack_report_init(&report, sizeof report));
        ASSERT_EQ(TL_OK, tl_weight_pack_marlin(weight, &popts, &report)) << tl_last_error_message();
        std::vector<float> wt(static_cast<size_t>(k) * n);  // [n][k], what the library multiplies by
        ASSERT_EQ(TL_OK, tl_weight_dequantize(weight, wt.data(), wt.size()));

        auto counts = [&]() {
            tl_dispatch_counts c;
            std::memset(&c, 0, sizeof c);
            c.struct_size = sizeof c;
            EXPECT_EQ(TL_OK, tl_weight_dispatch_counts(weight, &c)) << tl_last_error_message();
            return c;
        };
        auto run = [&](const DeviceBuffer<uint16_t> &dx, DeviceBuffer<uint16_t> &dy, int m, std::vector<uint16_t> &out,
                       int32_t dtype = TL_DTYPE_FP16) {
            size_t ws_bytes = 0;
            ASSERT_EQ(TL_OK, tl_quant_gemm_workspace_size(weight, m, &ws_bytes));
            DeviceBuffer<uint8_t> work(ws_bytes);
            ASSERT_TRUE(work.ok());
            CUDA_OK(cudaMemset(work.get(), 0, ws_bytes));
            CUDA_OK(dy.poison());
            ASSERT_EQ(TL_OK, tl_quant_gemm_dtype(weight, dtype, dx.get(), dy.get(), m, nullptr, work.get(), ws_bytes))
                << tl_last_error_message();
            CUDA_OK(cudaDeviceSynchronize());
            CUDA_OK(dy.download(out));
        };
        const bool wgmma_runs = tlt::sm90a_kernels_run();
        auto kernel_for = [&](int m) { return tl::plan_marlin(m, k, n, wgmma_runs, tlt::sm_count()).kernel; };
        ASSERT_EQ(TL_OK, tl_set_dispatch(TL_DISPATCH_FP16_BODY, 0));
        ASSERT_EQ(TL_OK, tl_set_dispatch(TL_DISPATCH_CUBLAS_MIN_M, 0));
        for (const int m : wc.ms) {
            SCOPED_TRACE("M = " + std::to_string(m));
            const std::vector<uint16_t> x = tlt::random_normal_both(static_cast<size_t>(m) * k);
            DeviceBuffer<uint16_t> dx(x.size()), dxb(x.size()), dy(static_cast<size_t>(m) * n);
            ASSERT_TRUE(dx.ok() && dxb.ok() && dy.ok());
            CUDA_OK(dx.upload(x));
            CUDA_OK(dxb.upload(tlt::bf16_bits(x)));
            std::vector<double> ref(static_cast<size_t>(m) * n, 0.0);
            for (int i = 0; i < m; ++i)
                for (int j = 0; j < n; ++j) {
                    double acc = 0;
                    for (int kk = 0; kk < k; ++kk)
                        acc += tl::half_to_float(x[static_cast<size_t>(i) * k + kk]) *
                               static_cast<double>(wt[static_cast<size_t>(j) * k + kk]);
                    ref[static_cast<size_t>(i) * n + j] = acc;
                }

            ASSERT_EQ(TL_OK, tl_set_dispatch(TL_DISPATCH_USE_MARLIN, 0));
            std::vector<uint16_t> native;
            const tl_dispatch_counts before_native = counts();
            run(dx, dy, m, native);
            EXPECT_EQ(counts().native, before_native.native + 1);
            EXPECT_TRUE(tlt::matches(native, m, n, ref, {}, 2e-3)) << "native";

            ASSERT_EQ(TL_OK, tl_set_dispatch(TL_DISPATCH_USE_MARLIN, 1));
            for (const int mode : {1, 2}) {  // 1: fused only, 2: correction only
                SCOPED_TRACE(mode == 1 ? "fused" : "correction");
                ASSERT_EQ(TL_OK, tl_set_dispatch(TL_DISPATCH_MARLIN_MODE, mode));
                const tl_dispatch_counts before = counts();
                const tl::MarlinKernel expected = kernel_for(m);
                const uint64_t launches = tl::gpu::marlin_launch_count(expected);
                std::vector<uint16_t> y;
                run(dx, dy, m, y);
                const tl_dispatch_counts after = counts();
                EXPECT_EQ(tl::gpu::marlin_launch_count(expected), launches + 1)
                    << "kernel " << static_cast<int>(expected);
                EXPECT_EQ(mode == 1 ? after.marlin_fused : after.marlin_correction,
                          (mode == 1 ? before.marlin_fused : before.marlin_correction) + 1);
                EXPECT_EQ(after.fallbacks, before.fallbacks);
                EXPECT_EQ(after.native, before.native);
                EXPECT_TRUE(tlt::matches_half(y, native, m, n, 2e-3)) << "vs the native fallback";
                EXPECT_TRUE(tlt::matches(y, m, n, ref, {}, 2e-3)) << "vs FP64";
            }
            // BF16: the fused form whatever the mode (the correction form and the FP16 body are FP16 alone, so a BF16
            // call passes them by without counting a fallback), then the native kernel.
            ASSERT_EQ(TL_OK, tl_set_dispatch(TL_DISPATCH_FP16_BODY, 1));
            for (const int mode : {0, 2}) {
                SCOPED_TRACE("BF16, mode " + std::to_string(mode));
                ASSERT_EQ(TL_OK, tl_set_dispatch(TL_DISPATCH_MARLIN_MODE, mode));
                const tl_dispatch_counts before = counts();
                const tl::MarlinKernel expected = kernel_for(m);
                const uint64_t launches = tl::gpu::marlin_launch_count(expected);
                std::vector<uint16_t> y;
                run(dxb, dy, m, y, TL_DTYPE_BF16);
                const tl_dispatch_counts after = counts();
                EXPECT_EQ(tl::gpu::marlin_launch_count(expected), launches + 1);
                EXPECT_EQ(after.marlin_fused, before.marlin_fused + 1);
                EXPECT_EQ(after.fallbacks, before.fallbacks);
                EXPECT_TRUE(tlt::matches(y, m, n, ref, {}, 8e-3, tl::Dtype::BF16)) << "vs FP64";
            }
            ASSERT_EQ(TL_OK, tl_set_dispatch(TL_DISPATCH_FP16_BODY, 0));
            ASSERT_EQ(TL_OK, tl_set_dispatch(TL_DISPATCH_USE_MARLIN, 0));
            {
                SCOPED_TRACE("BF16, native");
                const tl_dispatch_counts before = counts();
                std::vector<uint16_t> y;
                run(dxb, dy, m, y, TL_DTYPE_BF16);
                EXPECT_EQ(counts().native, before.native + 1);
                EXPECT_TRUE(tlt::matches(y, m, n, ref, {}, 8e-3, tl::Dtype::BF16)) << "vs FP64";
            }
            ASSERT_EQ(TL_OK, tl_set_dispatch(TL_DISPATCH_USE_MARLIN, 1));
        }
    }
    for (int32_t setting = 0; setting < 5; ++setting) EXPECT_EQ(TL_OK, tl_set_dispatch(setting, saved[setting]));
}

// The dispatcher's size rule: with TL_DISPATCH_CUBLAS_MIN_M = 512, a small weight takes dequantize + cuBLAS from 128
// rows (K·N <= 2^25, or 2^24 where the Hopper kernels run); a larger one stays on the Marlin-class kernels until 512
// rows (2048 on Hopper), one with K·N >= 2^27 until twice that; 0 still means never.
TEST(MarlinLauncher, DispatcherSendsSmallWeightsToCublasFrom128Rows) {
    int32_t saved[5];
    for (int32_t setting = 0; setting < 5; ++setting) ASSERT_EQ(TL_OK, tl_get_dispatch(setting, &saved[setting]));
    const bool hopper = tlt::sm90a_kernels_run();
    struct Case {
        int k, n, m;
        int32_t cublas_min_m;
        bool cublas, cublas_on_hopper;  // expected path
    };
    // 1024 x 1536: 1.5M weights (small); 8192 x 2048: 2^24 (small); 4096 x 6144: 25.2M (small without the Hopper
    // kernels); 8192 x 4160: 34.1M > 2^25 = 33.6M; 8192 x 16384: 2^27 (large).
    const Case cases[] = {{1024, 1536, 128, 512, true, true},     {1024, 1536, 127, 512, false, false},
                          {1024, 1536, 128, 0, false, false},     {1024, 1536, 100, 100, true, true},
                          {8192, 2048, 128, 512, true, true},     {4096, 6144, 128, 512, true, false},
                          {8192, 4160, 128, 512, false, false},   {8192, 4160, 512, 512, true, false},
                          {8192, 4160, 2048, 512, true, true},    {8192, 16384, 512, 512, false, false},
                          {8192, 16384, 1024, 512, true, false},  {8192, 16384, 4096, 512, true, true},
                          {8192, 16384, 1024, 0, false, false}};
    std::mt19937 rng(7);
    for (const Case c : cases) {
        SCOPED_TRACE("K=" + std::to_string(c.k) + " N=" + std::to_string(c.n) + " M=" + std::to_string(c.m) +
                     " CUBLAS_MIN_M=" + std::to_string(c.cublas_min_m));
        const int group = 128, groups = c.k / group;
        std::vector<uint8_t> codes(static_cast<size_t>(c.k) * c.n / 2);
        for (uint8_t &b : codes) b = static_cast<uint8_t>(rng());
        std::vector<uint16_t> scales(static_cast<size_t>(groups) * c.n, tl::float_to_half(0.01f));
        std::vector<uint16_t> zeros(scales.size(), tl::float_to_half(-0.08f));
        tl_weight_desc desc;
        ASSERT_EQ(TL_OK, tl_weight_desc_init(&desc, sizeof desc));
        desc.k = c.k;
        desc.n = c.n;
        desc.group_size = group;
        desc.codes = codes.data();
        desc.scales = scales.data();
        desc.zeros = zeros.data();
        tl_weight *weight = nullptr;
        ASSERT_EQ(TL_OK, tl_weight_create(&desc, &weight)) << tl_last_error_message();
        std::unique_ptr<tl_weight, void (*)(tl_weight *)> owner(weight, tl_weight_free);
        tl_pack_options popts;
        ASSERT_EQ(TL_OK, tl_pack_options_init(&popts, sizeof popts));
        popts.forms = TL_FORM_MARLIN_FUSED;
        ASSERT_EQ(TL_OK, tl_weight_pack_marlin(weight, &popts, nullptr)) << tl_last_error_message();

        ASSERT_EQ(TL_OK, tl_set_dispatch(TL_DISPATCH_FP16_BODY, 0));
        ASSERT_EQ(TL_OK, tl_set_dispatch(TL_DISPATCH_USE_MARLIN, 1));
        ASSERT_EQ(TL_OK, tl_set_dispatch(TL_DISPATCH_MARLIN_MODE, 0));
        ASSERT_EQ(TL_OK, tl_set_dispatch(TL_DISPATCH_CUBLAS_MIN_M, c.cublas_min_m));
        const std::vector<uint16_t> x = tlt::random_normal_half(static_cast<size_t>(c.m) * c.k);
        DeviceBuffer<uint16_t> dx(x.size()), dy(static_cast<size_t>(c.m) * c.n);
        ASSERT_TRUE(dx.ok() && dy.ok());
        CUDA_OK(dx.upload(x));
        size_t ws_bytes = 0;
        ASSERT_EQ(TL_OK, tl_quant_gemm_workspace_size(weight, c.m, &ws_bytes));
        DeviceBuffer<uint8_t> work(ws_bytes);
        ASSERT_TRUE(work.ok());
        CUDA_OK(cudaMemset(work.get(), 0, ws_bytes));
        tl_dispatch_counts before, after;
        for (tl_dispatch_counts *cnt : {&before, &after}) {
            std::memset(cnt, 0, sizeof *cnt);
            cnt->struct_size = sizeof *cnt;
        }
        ASSERT_EQ(TL_OK, tl_weight_dispatch_counts(weight, &before));
        ASSERT_EQ(TL_OK, tl_quant_gemm(weight, dx.get(), dy.get(), c.m, nullptr, work.get(), ws_bytes))
            << tl_last_error_message();
        CUDA_OK(cudaDeviceSynchronize());
        ASSERT_EQ(TL_OK, tl_weight_dispatch_counts(weight, &after));
        const bool cublas = hopper ? c.cublas_on_hopper : c.cublas;
        EXPECT_EQ(after.dequant_cublas - before.dequant_cublas, cublas ? 1u : 0u);
        EXPECT_EQ(after.marlin_fused - before.marlin_fused, cublas ? 0u : 1u);
        EXPECT_EQ(after.fallbacks, before.fallbacks);
    }
    for (int32_t setting = 0; setting < 5; ++setting) EXPECT_EQ(TL_OK, tl_set_dispatch(setting, saved[setting]));
}

}  // namespace
