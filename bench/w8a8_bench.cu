// w8a8_bench: the GEMMs of INT8 activations on the benchmark layers, beside dense cuBLAS FP16 and cuBLAS's bare INT8
// GEMM: W8A8 the seed's two ways (cuda/w8a8_gemm.cu: per-token quantization of X, cuBLAS INT8 GEMM into INT32, a
// scaling epilogue kernel; cuda/int8_gemm.cu: the quantization, then one kernel with the scaling in its epilogue),
// W4A8 (the quantization with code sums, then int8_gemm on packed INT4 codes with zero points; with --group G, the
// quantization with group sums and int8_gemm on INT4 codes with scales and zeros per group of G), and int8_gemm alone
// on quantized X (against the bare INT8 GEMM).
//
//   w8a8_bench <out.csv> [--m M[,M...]] [--layer NAME] [--group G]   (default M = 1024,4096; every layer; per row)
//
// Method: random data; each path run 20 times back to back between CUDA events, after 3 warm-up calls; the median of 7
// such timings, divided by 20. The weights are not rotated: at these M the GEMMs are compute-bound, so whether the
// weights sit in L2 barely matters. Columns: µs per call and TFLOPS (2MNK / time) of each path, and the W8A8 path's
// speed against the other two.
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "check_cuda.hpp"
#include "gpu_kernels.hpp"
#include "int8_gemm_layout.hpp"

namespace {

struct Layer {
    const char *name;
    int k, n;
};

const Layer kLayers[] = {
    {"TinyLoop qkv", 2048, 6144},        {"TinyLoop gate+up", 2048, 16384},   {"TinyLoop down", 8192, 2048},
    {"Llama-8B qkv", 4096, 6144},        {"Llama-8B gate+up", 4096, 28672},   {"Llama-8B down", 14336, 4096},
    {"Llama-70B gate+up", 8192, 57344},  {"Llama-70B down", 28672, 8192},     {"Llama-2-13B gate+up", 5120, 27648},
    {"Llama-2-13B down", 13824, 5120},   {"Qwen2-7B gate+up", 3584, 37888},   {"Qwen2-7B down", 18944, 3584},
};

template <class T>
T *device_random(size_t count, std::mt19937_64 &g) {
    std::vector<T> host(count);
    if constexpr (std::is_same_v<T, uint32_t>) {
        for (auto &v : host) v = static_cast<uint32_t>(g());
    } else if constexpr (std::is_same_v<T, int8_t>) {
        std::uniform_int_distribution<int> d(-127, 127);
        for (auto &v : host) v = static_cast<int8_t>(d(g));
    } else if constexpr (std::is_same_v<T, float>) {
        std::uniform_real_distribution<float> d(0.001f, 0.02f);
        for (auto &v : host) v = d(g);
    } else {
        std::normal_distribution<float> d(0.0f, 1.0f);
        for (auto &v : host) v = __float2half(d(g));
    }
    T *p = nullptr;
    CHECK_CUDA(cudaMalloc(&p, count * sizeof(T)));
    CHECK_CUDA(cudaMemcpy(p, host.data(), count * sizeof(T), cudaMemcpyHostToDevice));
    return p;
}

template <class Run>
double time_us(cudaStream_t stream, Run run) {
    constexpr int kCalls = 20;
    for (int i = 0; i < 3; ++i) run();
    cudaEvent_t start, stop;
    CHECK_CUDA(cudaEventCreate(&start));
    CHECK_CUDA(cudaEventCreate(&stop));
    std::vector<float> ms;
    for (int rep = 0; rep < 7; ++rep) {
        CHECK_CUDA(cudaEventRecord(start, stream));
        for (int i = 0; i < kCalls; ++i) run();
        CHECK_CUDA(cudaEventRecord(stop, stream));
        CHECK_CUDA(cudaEventSynchronize(stop));
        float t = 0.0f;
        CHECK_CUDA(cudaEventElapsedTime(&t, start, stop));
        ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    return ms[ms.size() / 2] * 1000.0 / kCalls;
}

}  // namespace

int main(int argc, char **argv) {
    if (argc < 2) {
        std::fprintf(stderr, "usage: w8a8_bench <out.csv> [--m M[,M...]] [--layer NAME] [--group 32|64|128]\n");
        return 2;
    }
    std::vector<int> ms = {1024, 4096};
    const char *only_layer = nullptr;  // --layer NAME: that layer alone (a profiler's run)
    int group = 0;                     // --group G: the W4A8 column with groups of G (0: one group per row)
    for (int i = 2; i + 1 < argc; ++i) {
        if (std::strcmp(argv[i], "--m") == 0) {
            ms.clear();
            for (char *tok = std::strtok(argv[++i], ","); tok != nullptr; tok = std::strtok(nullptr, ",")) {
                ms.push_back(std::atoi(tok));
            }
        } else if (std::strcmp(argv[i], "--layer") == 0) {
            only_layer = argv[++i];
        } else if (std::strcmp(argv[i], "--group") == 0) {
            group = std::atoi(argv[++i]);
            if (group != 32 && group != 64 && group != 128) {
                std::fprintf(stderr, "--group takes 32, 64 or 128\n");
                return 2;
            }
        }
    }
    FILE *csv = std::fopen(argv[1], "w");
    if (csv == nullptr) {
        std::perror(argv[1]);
        return 1;
    }
    cudaDeviceProp prop{};
    CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
    std::fprintf(csv, "layer,k,n,m,fp16_us,int8_gemm_us,w8a8_us,w8a8_fused_us,w4a8_us,int8_mma_us,fp16_tflops,"
                      "int8_gemm_tops,w8a8_tops,w8a8_fused_tops,w4a8_tops,int8_mma_tops,w4a8_group\n");
    std::printf("%s\n| layer | M | cuBLAS FP16 µs | cuBLAS INT8 GEMM µs | W8A8 cuBLAS µs | W8A8 fused µs | "
                "W4A8 (group %d) µs | int8_gemm alone µs |\n|---|---|---|---|---|---|---|---|\n",
                prop.name, group);
    cudaStream_t stream;
    CHECK_CUDA(cudaStreamCreate(&stream));
    cublasHandle_t handle;
    if (cublasCreate(&handle) != CUBLAS_STATUS_SUCCESS) return 1;
    cublasSetStream(handle, stream);
    void *cublas_ws = nullptr;
    const size_t cublas_ws_bytes = 32u << 20;
    CHECK_CUDA(cudaMalloc(&cublas_ws, cublas_ws_bytes));
    cublasSetWorkspace(handle, cublas_ws, cublas_ws_bytes);
    std::mt19937_64 g(1);
    const int max_m = *std::max_element(ms.begin(), ms.end());
    for (const Layer &l : kLayers) {
        if (only_layer != nullptr && std::strcmp(l.name, only_layer) != 0) continue;
        auto *w16 = device_random<__half>(static_cast<size_t>(l.k) * l.n, g);
        auto *w8 = device_random<int8_t>(static_cast<size_t>(l.k) * l.n, g);
        auto *ws = device_random<float>(static_cast<size_t>(l.n), g);
        auto *x = device_random<__half>(static_cast<size_t>(max_m) * l.k, g);
        auto *x8 = device_random<int8_t>(static_cast<size_t>(max_m) * l.k, g);
        auto *w4 = device_random<uint32_t>(tl::gpu::w4a8::packed_bytes(l.n, l.k) / 4, g);
        auto *wz = device_random<float>(static_cast<size_t>(l.n), g);
        // Grouped: scales and zeros in w4a8_pack_groups's layout, and the group sums of X.
        auto *wg = group > 0 ? device_random<float>(tl::gpu::w4a8::group_floats(l.n, l.k, group), g) : nullptr;
        float *group_sums = nullptr;
        if (group > 0) {
            CHECK_CUDA(cudaMalloc(&group_sums, static_cast<size_t>(l.k / group) * tl::gpu::int8_group_sums_ld(max_m) *
                                                   sizeof(float)));
        }
        __half *y = nullptr;
        int32_t *acc = nullptr;
        void *scratch = nullptr, *workspace = nullptr;
        CHECK_CUDA(cudaMalloc(&y, static_cast<size_t>(max_m) * l.n * sizeof(__half)));
        CHECK_CUDA(cudaMalloc(&acc, static_cast<size_t>(max_m) * l.n * sizeof(int32_t)));
        const size_t scratch_bytes = tl::gpu::w8a8_scratch_bytes(max_m, l.n, l.k);
        CHECK_CUDA(cudaMalloc(&scratch, scratch_bytes));
        const size_t workspace_bytes = tl::gpu::marlin_workspace_bytes(prop.multiProcessorCount);
        CHECK_CUDA(cudaMalloc(&workspace, workspace_bytes));
        CHECK_CUDA(cudaMemset(workspace, 0, workspace_bytes));
        // The fused paths' quantized X: codes, scales and code sums (in `scratch`, as w8a8_gemm lays them out).
        auto *xq = static_cast<int8_t *>(scratch);
        const size_t codes_bytes = (static_cast<size_t>(max_m) * l.k + 255) / 256 * 256;
        auto *xs = reinterpret_cast<float *>(static_cast<char *>(scratch) + codes_bytes);
        auto *sums = reinterpret_cast<int32_t *>(xs + (max_m + 63) / 64 * 64);
        for (int m : ms) {
            const double fp16 = time_us(stream, [&] {
                tl::gpu::cublas_gemm(handle, reinterpret_cast<uint16_t *>(x), reinterpret_cast<uint16_t *>(w16),
                                     reinterpret_cast<uint16_t *>(y), m, l.n, l.k, tl::Dtype::F16, stream, cublas_ws,
                                     cublas_ws_bytes);
            });
            const int32_t one = 1, zero = 0;
            const double int8 = time_us(stream, [&] {
                cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, l.n, m, l.k, &one, w8, CUDA_R_8I, l.k, x8, CUDA_R_8I,
                             l.k, &zero, acc, CUDA_R_32I, l.n, CUBLAS_COMPUTE_32I, CUBLAS_GEMM_DEFAULT);
            });
            int rc = 0;
            const double w8a8 = time_us(stream, [&] {
                rc |= tl::gpu::w8a8_gemm(handle, reinterpret_cast<uint16_t *>(x), w8, ws,
                                         reinterpret_cast<uint16_t *>(y), m, l.n, l.k, scratch, scratch_bytes, stream,
                                         cublas_ws, cublas_ws_bytes);
            });
            CHECK_CUDA(cudaStreamSynchronize(stream));
            if (rc != 0) {
                std::fprintf(stderr, "%s M=%d: w8a8_gemm rc %d\n", l.name, m, rc);
                return 1;
            }
            auto xh = reinterpret_cast<uint16_t *>(x);
            auto yh = reinterpret_cast<uint16_t *>(y);
            tl::gpu::Int8GemmArgs a;
            a.xq = xq;
            a.x_scales = xs;
            a.w = w8;
            a.w_scales = ws;
            a.y = yh;
            a.m = m;
            a.n = l.n;
            a.k = l.k;
            const double fused = time_us(stream, [&] {
                rc |= tl::gpu::quantize_rows_int8(xh, m, l.k, xq, xs, stream);
                rc |= tl::gpu::int8_gemm(a, tl::gpu::Int8Weights::Int8, workspace, workspace_bytes, stream);
            });
            tl::gpu::Int8GemmArgs a4 = a;
            a4.w = w4;
            if (group > 0) {
                a4.w_scales = nullptr;
                a4.group_size = group;
                a4.w_groups = wg;
                a4.x_group_sums = group_sums;
            } else {
                a4.w_zeros = wz;
                a4.x_sums = sums;
            }
            const double w4a8 = time_us(stream, [&] {
                rc |= tl::gpu::quantize_rows_int8(xh, m, l.k, xq, xs, stream, group > 0 ? nullptr : sums, group_sums,
                                                  group);
                rc |= tl::gpu::int8_gemm(a4, tl::gpu::Int8Weights::Int4Packed, workspace, workspace_bytes, stream);
            });
            tl::gpu::Int8GemmArgs bare = a;
            bare.xq = x8;
            const double mma = time_us(stream, [&] {
                rc |= tl::gpu::int8_gemm(bare, tl::gpu::Int8Weights::Int8, workspace, workspace_bytes, stream);
            });
            CHECK_CUDA(cudaStreamSynchronize(stream));
            if (rc != 0) {
                std::fprintf(stderr, "%s M=%d: int8_gemm or its quantization rc %d\n", l.name, m, rc);
                return 1;
            }
            const double flops = 2.0 * m * l.n * static_cast<double>(l.k);
            auto t = [&](double us) { return flops / us / 1e6; };
            std::fprintf(csv, "%s,%d,%d,%d,%.2f,%.2f,%.2f,%.2f,%.2f,%.2f,%.1f,%.1f,%.1f,%.1f,%.1f,%.1f,%d\n", l.name,
                         l.k, l.n, m, fp16, int8, w8a8, fused, w4a8, mma, t(fp16), t(int8), t(w8a8), t(fused),
                         t(w4a8), t(mma), group);
            std::fflush(csv);  // a run stopped by a time limit keeps the rows it measured
            std::printf("| %s | %d | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f |\n", l.name, m, fp16, int8, w8a8, fused,
                        w4a8, mma);
            std::fflush(stdout);
        }
        for (void *p : {static_cast<void *>(w16), static_cast<void *>(w8), static_cast<void *>(ws),
                        static_cast<void *>(x), static_cast<void *>(x8), static_cast<void *>(y),
                        static_cast<void *>(acc), static_cast<void *>(w4), static_cast<void *>(wz),
                        static_cast<void *>(wg), static_cast<void *>(group_sums), scratch, workspace}) {
            cudaFree(p);
        }
    }
    std::fclose(csv);
    return 0;
}
