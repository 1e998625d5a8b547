// tl_bench: the INT4 x FP16 GEMM paths side by side on the benchmark layers and M values below.
//
//   tl_bench <out.csv> <out.md> [--quick] [--layer S[,S...]] [--m M[,M...]] [--group 128|64|row]
//            [--kernels a,b,...] [--stream-loop] [--via-api]
//
// The filters keep a subset (for profiling one kernel under ncu, or the rows another benchmark times): a layer is
// kept when its name contains any of the substrings; kernel names as in the CSV. --stream-loop times the same calls
// launched one by one from a host loop (events around each pass, median of 7) instead of graph replays: how a
// caller without graphs sees them (Criterion's method), launch gaps included. --via-api times the five paths through
// the public C API instead of calling the kernels: owned weights made from host arrays (random codes; scales and zeros
// like a min-max quantization) and packed with every form, the path picked with tl_set_dispatch, tl_quant_gemm from a
// host loop (implies --stream-loop): what an application, or the Rust crate's Criterion bench, measures.
//
// Method: random data (never zeros); weights rotated through enough copies that they exceed 240 MB
// (4x the 60 MB L2); many calls captured in one CUDA graph, replayed 7 times, the median replay time divided by
// the calls per graph. Kernels: Marlin-class fused (q*s + z in the kernel), Marlin-class symmetric + the seed's
// correction (memset, GEMM, a_group_sum, correction_accum), native INT4 (M <= 256 only: it reads all weights once
// per row and takes seconds beyond that), dequantize + cuBLAS, cuBLAS FP16 on dense weights, and (16 < M <= 256,
// group 128) the classic Marlin-class kernel, the mainloop of GPUs without wgmma. Group sizes 128, 64 and per row
// (the paths other than the Marlin-class ones barely depend on the grouping: timed at 128 only).
// CSV columns beyond the timing: `plan`, the Marlin-class kernel and tile form plan_marlin chose (fused rows), and
// `dispatched`, 1 on the row of the path tl_quant_gemm runs by default for that call (cpp/gpu/gemm_policy.hpp).
// SOL = max(bytes / 4.6 TB/s, 2MNK / 790 TFLOPS), bytes = K*N/2 + scales + zeros (FP16 [G][N] each) + 2MK + 2MN.
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <random>
#include <string>
#include <vector>

#include "check_cuda.hpp"
#include "gpu/gemm_policy.hpp"
#include "gpu_kernels.hpp"
#include "util/half.hpp"
#include "tinyloop.h"

namespace {

constexpr double kHbmBytesPerSecond = 4.6e12;
constexpr double kPeakFlops = 790e12;
constexpr size_t kRotationBytes = 256ull << 20;  // > 4 x 60 MB L2
constexpr int kReplays = 7;
constexpr int kNativeMaxM = 256;

__device__ uint32_t hash32(uint64_t i, uint32_t seed) {
    uint64_t z = i * 0x9E3779B97F4A7C15ull + seed * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return static_cast<uint32_t>(z ^ (z >> 31));
}
__device__ float uniform01(uint64_t i, uint32_t seed) { return (hash32(i, seed) >> 8) * (1.0f / 16777216.0f); }

__global__ void fill_bits(uint32_t *p, size_t words, uint32_t seed) {
    for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < words; i += gridDim.x * blockDim.x)
        p[i] = hash32(i, seed);
}
// kind 0: N(0, scale) approximately (sum of four uniforms); 1: U(lo, hi) with lo = scale, hi = 5 * scale;
// 2: -U(6, 9) * scale (zero points of min-max quantization).
__global__ void fill_values(__half *h, float *f, size_t count, uint32_t seed, int kind, float scale) {
    for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < count; i += gridDim.x * blockDim.x) {
        float v;
        if (kind == 0) {
            v = (uniform01(4 * i, seed) + uniform01(4 * i + 1, seed) + uniform01(4 * i + 2, seed) +
                 uniform01(4 * i + 3, seed) - 2.0f) * 1.7320508f * scale;
        } else if (kind == 1) {
            v = scale * (1.0f + 4.0f * uniform01(i, seed));
        } else {
            v = -scale * (6.0f + 3.0f * uniform01(i, seed));
        }
        if (h != nullptr) h[i] = __float2half_rn(v);
        if (f != nullptr) f[i] = v;
    }
}

template <class T>
T *device_alloc(size_t count) {
    T *p = nullptr;
    CHECK_CUDA(cudaMalloc(&p, std::max<size_t>(count, 1) * sizeof(T)));
    return p;
}

uint32_t g_seed = 12345;
void random_bits(void *p, size_t bytes) {
    fill_bits<<<1024, 256>>>(static_cast<uint32_t *>(p), bytes / 4, g_seed++);
    CHECK_CUDA(cudaGetLastError());
}
void random_half(uint16_t *p, size_t count, int kind, float scale) {
    fill_values<<<1024, 256>>>(reinterpret_cast<__half *>(p), nullptr, count, g_seed++, kind, scale);
    CHECK_CUDA(cudaGetLastError());
}
void random_float(float *p, size_t count, float scale) {
    fill_values<<<1024, 256>>>(nullptr, p, count, g_seed++, 0, scale);
    CHECK_CUDA(cudaGetLastError());
}

struct Layer {
    const char *name;
    int k, n;
};

// Weight copies of one layer in every format the kernels read. Random bits are random codes in any layout, so
// the INT4 codes double as Marlin words, and the [N][G] scales as permuted [G][N] ones.
struct LayerData {
    int k = 0, n = 0, groups = 0, copies = 0;
    std::vector<uint8_t *> codes;                    // K*N/2 bytes each
    std::vector<uint16_t *> scales, zeros;           // G*N each
    std::vector<float *> delta;                      // G*N each
    std::vector<uint16_t *> dense;                   // K*N FP16 each (own copy count)
    void release() {
        for (auto *p : codes) cudaFree(p);
        for (auto *p : scales) cudaFree(p);
        for (auto *p : zeros) cudaFree(p);
        for (auto *p : delta) cudaFree(p);
        for (auto *p : dense) cudaFree(p);
        *this = LayerData{};
    }
};

LayerData make_layer(int k, int n, int group_size) {
    LayerData d;
    d.k = k;
    d.n = n;
    d.groups = k / group_size;
    const size_t int4_bytes = static_cast<size_t>(k) * n / 2 + static_cast<size_t>(d.groups) * n * 4;
    d.copies = static_cast<int>(std::max<size_t>(2, (kRotationBytes + int4_bytes - 1) / int4_bytes));
    for (int c = 0; c < d.copies; ++c) {
        d.codes.push_back(device_alloc<uint8_t>(static_cast<size_t>(k) * n / 2));
        random_bits(d.codes.back(), static_cast<size_t>(k) * n / 2);
        d.scales.push_back(device_alloc<uint16_t>(static_cast<size_t>(d.groups) * n));
        random_half(d.scales.back(), static_cast<size_t>(d.groups) * n, 1, 0.004f);
        d.zeros.push_back(device_alloc<uint16_t>(static_cast<size_t>(d.groups) * n));
        random_half(d.zeros.back(), static_cast<size_t>(d.groups) * n, 2, 0.01f);
        d.delta.push_back(device_alloc<float>(static_cast<size_t>(d.groups) * n));
        random_float(d.delta.back(), static_cast<size_t>(d.groups) * n, 0.01f);
    }
    const size_t dense_bytes = static_cast<size_t>(k) * n * 2;
    const int dense_copies = static_cast<int>(std::max<size_t>(1, (kRotationBytes + dense_bytes - 1) / dense_bytes));
    for (int c = 0; c < dense_copies; ++c) {
        d.dense.push_back(device_alloc<uint16_t>(static_cast<size_t>(k) * n));
        random_half(d.dense.back(), static_cast<size_t>(k) * n, 0, 0.02f);
    }
    return d;
}

bool g_stream_loop = false;  // --stream-loop: host-loop launches instead of graph replays
bool g_via_api = false;      // --via-api: the paths through tl_quant_gemm

// --via-api: each path as the dispatcher settings that select it (kernel = its column in kKernels).
struct ApiPath {
    int kernel;
    int32_t use_marlin, marlin_mode, cublas_min_m, fp16_body;
};
constexpr ApiPath kApiPaths[] = {{0, 1, 1, 0, 0}, {1, 1, 2, 0, 0}, {3, 1, 0, 1, 0}, {4, 1, 0, 0, 1}, {2, 0, 0, 0, 0}};

uint64_t path_count(const tl_dispatch_counts &c, int kernel) {
    switch (kernel) {
        case 0: return c.marlin_fused;
        case 1: return c.marlin_correction;
        case 2: return c.native;
        case 3: return c.dequant_cublas;
        default: return c.fp16_body;
    }
}

// Owned copies of one random INT4 weight, packed with every form (the FP16 body only when asked: 2 bytes a weight),
// as many as the kernel-direct rotation (at least 2, >= kRotationBytes together). Empty on failure (printed).
struct ApiWeights {
    std::vector<tl_weight *> copies;
    ApiWeights() = default;
    ApiWeights(const ApiWeights &) = delete;
    ApiWeights &operator=(const ApiWeights &) = delete;
    ~ApiWeights() {
        for (tl_weight *w : copies) tl_weight_free(w);
    }
};

void make_api_weights(int k, int n, int group, bool fp16_body, ApiWeights &out) {
    const int groups = k / group;
    std::mt19937 rng(g_seed++);
    std::vector<uint8_t> codes(static_cast<size_t>(k) * n / 2);
    for (uint8_t &c : codes) c = static_cast<uint8_t>(rng());
    std::uniform_real_distribution<float> scale(0.004f, 0.02f), zero(6.0f, 9.0f);
    std::vector<uint16_t> scales(static_cast<size_t>(groups) * n), zeros(scales.size());
    for (size_t i = 0; i < scales.size(); ++i) {
        const float s = scale(rng);
        scales[i] = tl::float_to_half(s);
        zeros[i] = tl::float_to_half(-s * zero(rng));
    }
    tl_weight_desc desc;
    tl_weight_desc_init(&desc, sizeof desc);
    desc.k = k;
    desc.n = n;
    desc.group_size = group == k ? 0 : group;
    desc.codes = codes.data();
    desc.scales = scales.data();
    desc.zeros = zeros.data();
    tl_pack_options pack;
    tl_pack_options_init(&pack, sizeof pack);
    pack.forms = TL_FORM_MARLIN_FUSED | TL_FORM_MARLIN_CORRECTION | (fp16_body ? TL_FORM_FP16_BODY : 0u);
    const size_t copy_bytes = codes.size() + 4 * scales.size();
    const int copies = static_cast<int>(std::max<size_t>(2, (kRotationBytes + copy_bytes - 1) / copy_bytes));
    for (int c = 0; c < copies; ++c) {
        tl_weight *w = nullptr;
        if (tl_weight_create(&desc, &w) != TL_OK || tl_weight_pack_marlin(w, &pack, nullptr) != TL_OK) {
            std::fprintf(stderr, "--via-api: %s\n", tl_last_error_message());
            tl_weight_free(w);
            for (tl_weight *done : out.copies) tl_weight_free(done);
            out.copies.clear();
            return;
        }
        out.copies.push_back(w);
    }
}

struct Timing {
    double us = -1.0;  // < 0: not run
    int rc = 0;
    int calls = 0;
};

// Captures `calls` invocations of run(i) (i = call index) in a graph, replays it kReplays times, returns the
// median per-call time. run() returns the launcher's rc; a non-zero rc aborts the measurement.
template <class Run>
Timing time_calls(cudaStream_t stream, int rotation, Run run) {
    Timing t;
    for (int i = 0; i < rotation; ++i) {  // warm-up, first-use allocations, and rc check outside capture
        t.rc = run(i);
        if (t.rc != 0) return t;
    }
    CHECK_CUDA(cudaStreamSynchronize(stream));
    cudaEvent_t start, stop;
    CHECK_CUDA(cudaEventCreate(&start));
    CHECK_CUDA(cudaEventCreate(&stop));
    CHECK_CUDA(cudaEventRecord(start, stream));
    for (int i = 0; i < rotation; ++i) run(i);
    CHECK_CUDA(cudaEventRecord(stop, stream));
    CHECK_CUDA(cudaEventSynchronize(stop));
    float ms = 0.0f;
    CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
    const double estimate_us = std::max(1e-3, 1000.0 * ms / rotation);
    // At least one pass over every copy, and graphs of >= 2 ms so launch gaps and event resolution vanish.
    int calls = std::max(rotation, static_cast<int>(2000.0 / estimate_us));
    calls = std::min(calls, std::max(rotation, 2000));
    calls = (calls + rotation - 1) / rotation * rotation;

    // The median over kReplays passes of pass(), timed with events on the stream.
    auto median_pass_ms = [&](auto pass) {
        std::vector<float> pass_ms;
        for (int r = 0; r < kReplays; ++r) {
            CHECK_CUDA(cudaEventRecord(start, stream));
            pass();
            CHECK_CUDA(cudaEventRecord(stop, stream));
            CHECK_CUDA(cudaEventSynchronize(stop));
            CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
            pass_ms.push_back(ms);
        }
        std::sort(pass_ms.begin(), pass_ms.end());
        return pass_ms[kReplays / 2];
    };
    t.calls = calls;
    if (g_stream_loop) {
        t.us = 1000.0 * median_pass_ms([&] {
            for (int i = 0; i < calls; ++i) run(i);
        }) / calls;
    } else {
        cudaGraph_t graph;
        cudaGraphExec_t exec;
        CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
        for (int i = 0; i < calls; ++i) run(i);
        CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
        CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
        CHECK_CUDA(cudaGraphLaunch(exec, stream));  // warm replay
        t.us = 1000.0 * median_pass_ms([&] { CHECK_CUDA(cudaGraphLaunch(exec, stream)); }) / calls;
        CHECK_CUDA(cudaGraphExecDestroy(exec));
        CHECK_CUDA(cudaGraphDestroy(graph));
    }
    CHECK_CUDA(cudaEventDestroy(start));
    CHECK_CUDA(cudaEventDestroy(stop));
    return t;
}

// marlin_fused_classic: the classic kernel forced where the policy runs another (16 < M <= 256, group 128).
// marlin_tma256: the TMA kernel forced (M > 64, on compute capability 9.0), where the policy may run another;
// marlin_wgmma128: the wgmma kernel's 128-row form forced (there too), where the policy may run the TMA kernel.
const char *kKernels[] = {"marlin_fused", "marlin_corr",          "native",            "deq_cublas",
                          "cublas_fp16",  "marlin_fused_classic", "marlin_fused_bf16", "cublas_bf16",
                          "marlin_tma256", "marlin_wgmma128"};
constexpr int kNumKernels = 10;
constexpr int kTmaMinM = 64;
constexpr int kClassicMaxM = 256;

// The Marlin-class plan as a CSV cell: kernel/rows, plus "x1" (one warpgroup) or "+copier" for the wgmma forms.
std::string plan_cell(const tl::MarlinPlan &p) {
    std::string s = std::string(tl::marlin_kernel_name(p.kernel)) + "/" + std::to_string(p.rows);
    if (p.kernel == tl::MarlinKernel::Wgmma) {
        if (p.wgmma_warpgroups == 1) s += "x1";
        if (p.wgmma_warp_specialized) s += "+copier";
    }
    return s;
}

struct Row {
    std::string layer;
    int k, n, m, group;  // group: the actual group size (k = per row)
    double sol_us;
    Timing t[kNumKernels];
    std::string plan;  // the Marlin-class plan (plan_cell)
};

const char *group_name(int group, int k) { return group == k ? "row" : group == 64 ? "64" : "128"; }

// The path tl_quant_gemm runs by default for an M x K x N call (FP16 bodies off): dequantize + cuBLAS from
// cublas_min_m_for's row count, else the fused Marlin-class kernel.
int dispatched_kernel(int m, int k, int n, bool hopper) {
    const int64_t from = tl::cublas_min_m_for(k, n, tl::kDefaultCublasMinM, hopper);
    return from > 0 && m >= from ? 3 : 0;
}

double sol_us(int m, int k, int n, int groups) {
    const double bytes = static_cast<double>(k) * n / 2 + 2.0 * groups * n * 2 + 2.0 * m * k + 2.0 * m * n;
    return 1e6 * std::max(bytes / kHbmBytesPerSecond, 2.0 * m * n * k / kPeakFlops);
}

std::string cell(const Row &r, int i) {
    char buf[64];
    if (r.t[i].us < 0) return r.t[i].rc != 0 ? "refused" : "–";
    std::snprintf(buf, sizeof buf, "%.1f (%.2f)", r.t[i].us, r.sol_us / r.t[i].us);
    return buf;
}

// "a,b,,c" -> {"a", "b", "c"}.
std::vector<std::string> split_list(const std::string &text) {
    std::vector<std::string> items;
    size_t start = 0;
    while (start <= text.size()) {
        const size_t end = std::min(text.find(',', start), text.size());
        if (end > start) items.push_back(text.substr(start, end - start));
        start = end + 1;
    }
    return items;
}

}  // namespace

int main(int argc, char **argv) {
    if (argc < 3) {
        std::fprintf(stderr,
                     "usage: %s <out.csv> <out.md> [--quick] [--layer S[,S]] [--m M[,M]] [--group 128|64|row] "
                     "[--kernels a,b] [--stream-loop] [--via-api]\n",
                     argv[0]);
        return 2;
    }
    bool quick = false;
    std::string only_group, only_kernels;
    std::vector<std::string> only_layers;
    std::vector<int> only_ms;
    for (int i = 3; i < argc; ++i) {
        const std::string arg = argv[i];
        const bool has_value = i + 1 < argc;
        if (arg == "--quick") quick = true;
        else if (arg == "--stream-loop") g_stream_loop = true;
        else if (arg == "--via-api") g_via_api = g_stream_loop = true;
        else if (arg == "--layer" && has_value) only_layers = split_list(argv[++i]);
        else if (arg == "--m" && has_value) {
            for (const std::string &m : split_list(argv[++i])) {
                only_ms.push_back(std::atoi(m.c_str()));
                if (only_ms.back() <= 0) {
                    std::fprintf(stderr, "--m: %s is not a positive integer\n", m.c_str());
                    return 2;
                }
            }
        }
        else if (arg == "--group" && has_value) only_group = argv[++i];
        else if (arg == "--kernels" && has_value) only_kernels = "," + std::string(argv[++i]) + ",";
        else {
            std::fprintf(stderr, "unknown argument %s\n", arg.c_str());
            return 2;
        }
    }
    auto wanted = [&](int kernel) {
        return only_kernels.empty() || only_kernels.find("," + std::string(kKernels[kernel]) + ",") != std::string::npos;
    };
    int device_count = 0;
    if (cudaGetDeviceCount(&device_count) != cudaSuccess || device_count == 0) {
        std::fprintf(stderr, "no CUDA device\n");
        return 77;
    }
    cudaDeviceProp prop{};
    CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
    cudaStream_t stream;
    CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    cublasHandle_t handle;
    if (cublasCreate(&handle) != CUBLAS_STATUS_SUCCESS) return 1;
    void *cublas_ws = device_alloc<uint8_t>(64u << 20);  // a fixed cuBLAS workspace: nothing allocated in capture
    cublasSetWorkspace(handle, cublas_ws, 64u << 20);
    cublasSetStream(handle, stream);

    const size_t ws_bytes = tl::gpu::marlin_workspace_bytes(prop.multiProcessorCount);
    const bool wgmma_runs = tl::gpu::marlin_wgmma_built() && prop.major == 9 && prop.minor == 0;
    void *workspace = device_alloc<uint8_t>(ws_bytes);
    CHECK_CUDA(cudaMemset(workspace, 0, ws_bytes));

    std::vector<Layer> layers = {
        {"TinyLoop qkv", 2048, 6144},      {"TinyLoop out", 2048, 2048},   {"TinyLoop gate+up", 2048, 16384},
        {"TinyLoop down", 8192, 2048},     {"TinyLoop head", 2048, 50257}, {"Llama-8B qkv", 4096, 6144},
        {"Llama-8B gate+up", 4096, 28672}, {"Llama-8B down", 14336, 4096}, {"Llama-70B gate+up", 8192, 57344},
        {"Llama-70B down", 28672, 8192},   {"Llama-70B qkv", 8192, 10240}, {"Llama-2-7B qkv", 4096, 12288},
        {"Llama-2-7B gate+up", 4096, 22016}, {"Llama-2-7B down", 11008, 4096}, {"Llama-2-13B qkv", 5120, 15360},
        {"Llama-2-13B gate+up", 5120, 27648}, {"Llama-2-13B down", 13824, 5120}, {"Qwen2-7B qkv", 3584, 4608},
        {"Qwen2-7B gate+up", 3584, 37888}, {"Qwen2-7B down", 18944, 3584},
    };
    std::vector<int> ms = {1, 16, 17, 32, 64, 128, 256, 1024, 4096};
    if (quick) {
        layers = {{"TinyLoop qkv", 2048, 6144}, {"Llama-8B gate+up", 4096, 28672}};
        ms = {1, 16, 64};
    }
    if (!only_ms.empty()) ms = only_ms;
    if (!only_layers.empty()) {
        std::vector<Layer> kept;
        for (const Layer &l : layers) {
            const bool named = std::any_of(only_layers.begin(), only_layers.end(), [&](const std::string &s) {
                return std::string(l.name).find(s) != std::string::npos;
            });
            if (named) kept.push_back(l);
        }
        layers = kept;
    }
    if (layers.empty()) {
        std::fprintf(stderr, "--layer keeps no layer\n");
        return 2;
    }
    const int max_m = *std::max_element(ms.begin(), ms.end());

    std::vector<Row> rows;
    void *api_ws = nullptr;  // --via-api: the dispatcher's workspace, grown to the largest query
    size_t api_ws_bytes = 0;
    for (const Layer &layer : layers) {
        const int k = layer.k, n = layer.n;
        uint16_t *x = device_alloc<uint16_t>(static_cast<size_t>(max_m) * k);
        random_half(x, static_cast<size_t>(max_m) * k, 0, 1.0f);
        uint16_t *y = device_alloc<uint16_t>(static_cast<size_t>(max_m) * n);
        uint16_t *w_scratch = device_alloc<uint16_t>(static_cast<size_t>(k) * n);
        const size_t a_sum_bytes = tl::gpu::correction_scratch_bytes(max_m, k, 1);  // enough for any grouping
        float *a_sum = device_alloc<float>(a_sum_bytes / sizeof(float));
        for (const int group : {128, 64, k}) {
            if (!only_group.empty() && only_group != group_name(group, k)) continue;
            if (g_via_api) {
                ApiWeights api;
                make_api_weights(k, n, group, wanted(4) && group == 128, api);
                const int rot = static_cast<int>(api.copies.size());
                for (const int m : ms) {
                    Row r{layer.name, k, n, m, group, sol_us(m, k, n, k / group), {}};
                    r.plan = plan_cell(tl::plan_marlin(m, k, n, wgmma_runs, prop.multiProcessorCount));
                    for (const ApiPath &p : kApiPaths) {
                        if (rot == 0 || !wanted(p.kernel)) continue;
                        if (p.kernel >= 2 && group != 128) continue;  // timed once per layer, as below
                        if (p.kernel == 2 && m > kNativeMaxM) continue;
                        const int32_t settings[5] = {p.use_marlin, p.fp16_body, 0, p.marlin_mode, p.cublas_min_m};
                        for (int32_t i = 0; i < 5; ++i) tl_set_dispatch(i, settings[i]);
                        size_t need = 0;
                        tl_quant_gemm_workspace_size(api.copies[0], m, &need);
                        if (need > api_ws_bytes) {
                            cudaFree(api_ws);
                            api_ws = device_alloc<uint8_t>(need);
                            api_ws_bytes = need;
                            CHECK_CUDA(cudaMemset(api_ws, 0, need));
                        }
                        tl_dispatch_counts before{}, after{};
                        before.struct_size = after.struct_size = sizeof before;
                        tl_weight_dispatch_counts(api.copies[0], &before);
                        r.t[p.kernel] = time_calls(stream, rot, [&](int i) {
                            return static_cast<int>(
                                tl_quant_gemm(api.copies[i % rot], x, y, m, stream, api_ws, api_ws_bytes));
                        });
                        tl_weight_dispatch_counts(api.copies[0], &after);
                        // Only the selected path may have run: a fallback would time another kernel.
                        if (r.t[p.kernel].rc == 0 && (path_count(after, p.kernel) == path_count(before, p.kernel) ||
                                                      after.fallbacks != before.fallbacks)) {
                            r.t[p.kernel] = Timing{-1.0, -100, 0};
                        }
                    }
                    std::printf("%-18s K=%5d N=%5d M=%4d %-5s SOL %8.1f us (via the C API) |", layer.name, k, n, m,
                                group_name(group, k), r.sol_us);
                    for (int i = 0; i < kNumKernels; ++i) std::printf(" %s %s |", kKernels[i], cell(r, i).c_str());
                    std::printf("\n");
                    std::fflush(stdout);
                    rows.push_back(r);
                }
                continue;
            }
            LayerData d = make_layer(k, n, group);
            const int gs = group == k ? -1 : group;
            for (const int m : ms) {
                Row r{layer.name, k, n, m, group, sol_us(m, k, n, d.groups), {}};
                const int rot = d.copies;
                auto fused = [&](int i) {
                    const int c = i % d.copies;
                    return tl::gpu::marlin_gemm(x, reinterpret_cast<const uint32_t *>(d.codes[c]), d.scales[c],
                                                d.zeros[c], y, m, n, k, gs, true, tl::Dtype::F16, workspace, ws_bytes,
                                                stream);
                };
                if (wanted(0)) r.t[0] = time_calls(stream, rot, fused);
                r.plan = plan_cell(tl::plan_marlin(m, k, n, wgmma_runs, prop.multiProcessorCount));
                // The fused kernel under a forced plan; no time where the kernel refused it (another ran instead).
                auto forced = [&](const tl::MarlinPlan &plan) {
                    const uint64_t before = tl::gpu::marlin_launch_count(plan.kernel);
                    Timing t = time_calls(stream, rot, [&](int i) {
                        const int c = i % d.copies;
                        return tl::gpu::marlin_gemm(x, reinterpret_cast<const uint32_t *>(d.codes[c]), d.scales[c],
                                                    d.zeros[c], y, m, n, k, gs, true, tl::Dtype::F16, workspace,
                                                    ws_bytes, stream, &plan);
                    });
                    if (tl::gpu::marlin_launch_count(plan.kernel) == before) t = Timing{-1.0, -1, 0};
                    return t;
                };
                if (wanted(5) && group == 128 && m > 16 && m <= kClassicMaxM && r.plan.rfind("classic", 0) != 0) {
                    r.t[5] = forced(tl::classic_plan(m));
                }
                if (wanted(8) && wgmma_runs && m > kTmaMinM) {
                    tl::MarlinPlan tma;
                    tma.kernel = tl::MarlinKernel::Tma;
                    tma.rows = tl::kTmaRows;
                    r.t[8] = forced(tma);
                }
                if (wanted(9) && wgmma_runs && m > kTmaMinM) {
                    tl::MarlinPlan wgmma;
                    wgmma.kernel = tl::MarlinKernel::Wgmma;
                    wgmma.rows = 128;
                    wgmma.wgmma_warp_specialized = true;
                    r.t[9] = forced(wgmma);
                }
                if (wanted(1)) r.t[1] = time_calls(stream, rot, [&](int i) {
                    const int c = i % d.copies;
                    return tl::gpu::marlin_gemm_corrected(x, reinterpret_cast<const uint32_t *>(d.codes[c]),
                                                          d.scales[c], d.delta[c], y, m, n, k, gs, workspace,
                                                          ws_bytes, a_sum, a_sum_bytes, stream);
                });
                if (group == 128) {  // the other paths barely depend on the grouping: timed once
                    if (m <= kNativeMaxM && wanted(2)) {
                        r.t[2] = time_calls(stream, rot, [&](int i) {
                            const int c = i % d.copies;
                            return tl::gpu::native_int4_gemm(x, d.codes[c], d.scales[c], d.zeros[c], y, m, n, k, group,
                                                             tl::Dtype::F16, stream);
                        });
                    }
                    if (wanted(3)) r.t[3] = time_calls(stream, rot, [&](int i) {
                        const int c = i % d.copies;
                        return tl::gpu::dequant_cublas_gemm(handle, x, d.codes[c], d.scales[c], d.zeros[c], y, m, n,
                                                            k, group, tl::Dtype::F16, w_scratch,
                                                            static_cast<size_t>(k) * n * 2, stream);
                    });
                    const int dense_rot = static_cast<int>(d.dense.size());
                    if (wanted(4)) r.t[4] = time_calls(stream, dense_rot, [&](int i) {
                        return tl::gpu::cublas_gemm(handle, x, d.dense[i % dense_rot], y, m, n, k, tl::Dtype::F16,
                                                    stream);
                    });
                    // BF16 x and y. The FP16 buffers are reused: their bits read as BF16 are finite values, and the
                    // kernels' time does not depend on them.
                    if (wanted(6)) r.t[6] = time_calls(stream, rot, [&](int i) {
                        const int c = i % d.copies;
                        return tl::gpu::marlin_gemm(x, reinterpret_cast<const uint32_t *>(d.codes[c]), d.scales[c],
                                                    d.zeros[c], y, m, n, k, gs, true, tl::Dtype::BF16, workspace,
                                                    ws_bytes, stream);
                    });
                    if (wanted(7)) r.t[7] = time_calls(stream, dense_rot, [&](int i) {
                        return tl::gpu::cublas_gemm(handle, x, d.dense[i % dense_rot], y, m, n, k, tl::Dtype::BF16,
                                                    stream);
                    });
                }
                std::printf("%-18s K=%5d N=%5d M=%4d %-5s SOL %8.1f us |", layer.name, k, n, m,
                            group_name(group, k), r.sol_us);
                for (int i = 0; i < kNumKernels; ++i) std::printf(" %s %s |", kKernels[i], cell(r, i).c_str());
                std::printf("\n");
                std::fflush(stdout);
                rows.push_back(r);
            }
            d.release();
        }
        cudaFree(x);
        cudaFree(y);
        cudaFree(w_scratch);
        cudaFree(a_sum);
    }

    cudaFree(api_ws);

    FILE *csv = std::fopen(argv[1], "w");
    FILE *md = std::fopen(argv[2], "w");
    if (csv == nullptr || md == nullptr) {
        std::fprintf(stderr, "cannot write %s / %s\n", argv[1], argv[2]);
        return 1;
    }
    std::fprintf(csv, "layer,K,N,M,group,kernel,us,tflops,sol_us,sol_fraction,rc,calls_per_graph,plan,dispatched\n");
    for (const Row &r : rows) {
        for (int i = 0; i < kNumKernels; ++i) {
            if (r.t[i].us < 0 && r.t[i].rc == 0) continue;
            const double tflops = r.t[i].us > 0 ? 2.0 * r.m * r.n * r.k / (r.t[i].us * 1e6) : 0.0;
            std::fprintf(csv, "%s,%d,%d,%d,%s,%s,%.3f,%.2f,%.3f,%.4f,%d,%d,%s,%d\n", r.layer.c_str(), r.k, r.n, r.m,
                         group_name(r.group, r.k), kKernels[i], r.t[i].us, tflops, r.sol_us,
                         r.t[i].us > 0 ? r.sol_us / r.t[i].us : 0.0, r.t[i].rc, r.t[i].calls,
                         i == 0 ? r.plan.c_str() : "", i == dispatched_kernel(r.m, r.k, r.n, wgmma_runs) ? 1 : 0);
        }
    }
    std::fclose(csv);

    char date[64];
    const std::time_t now = std::time(nullptr);
    std::strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
    std::string command = argv[0];
    for (int i = 1; i < argc; ++i) command += std::string(" ") + argv[i];
    std::fprintf(md, "Benchmark %s on %s (SM %d.%d, %d SMs). Command: `%s`.\n\n", date, prop.name, prop.major,
                 prop.minor, prop.multiProcessorCount, command.c_str());
    std::fprintf(md, "Cells: µs per call (SOL / time). SOL = max(bytes / 4.6 TB/s, 2MNK / 790 TFLOPS), bytes counting "
                     "codes, FP16 scales and zeros, X and Y. Native INT4 only for M ≤ %d. %s, median of "
                     "%d passes, weights rotated through ≥ 256 MB.\n\n", kNativeMaxM,
                 g_via_api ? "Through the C API (tl_quant_gemm), host-loop launches (--via-api)"
                 : g_stream_loop ? "Host-loop launches (--stream-loop)"
                                 : "CUDA-graph timing",
                 kReplays);
    for (const char *grouping : {"128", "64", "row"}) {
        const bool g128 = std::strcmp(grouping, "128") == 0;
        std::fprintf(md, "### %s\n\n", g128 ? "Group size 128" : std::strcmp(grouping, "64") == 0
                                                                    ? "Group size 64"
                                                                    : "Per-row scales (gs = -1)");
        std::fprintf(md, g128 ? "| layer (K×N) | M | SOL µs | Marlin-class fused | plan | Marlin-class + correction | "
                                "native INT4 | dequant + cuBLAS | cuBLAS FP16 (dense) | fused, classic kernel | "
                                "fused, BF16 | cuBLAS BF16 (dense) | TMA kernel | wgmma kernel, 128 rows |\n"
                                "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n"
                              : "| layer (K×N) | M | SOL µs | Marlin-class fused | plan | Marlin-class + correction | "
                                "TMA kernel | wgmma kernel, 128 rows |\n"
                                "|---|---|---|---|---|---|---|---|\n");
        for (const Row &r : rows) {
            if (std::strcmp(group_name(r.group, r.k), grouping) != 0) continue;
            std::fprintf(md, "| %s (%d×%d) | %d | %.1f | %s | %s | %s |", r.layer.c_str(), r.k, r.n, r.m, r.sol_us,
                         cell(r, 0).c_str(), r.plan.c_str(), cell(r, 1).c_str());
            if (g128) {
                std::fprintf(md, " %s | %s | %s | %s | %s | %s |", cell(r, 2).c_str(), cell(r, 3).c_str(),
                             cell(r, 4).c_str(), cell(r, 5).c_str(), cell(r, 6).c_str(), cell(r, 7).c_str());
            }
            std::fprintf(md, " %s | %s |\n", cell(r, 8).c_str(), cell(r, 9).c_str());
        }
        std::fprintf(md, "\n");
    }
    std::fclose(md);
    cublasDestroy(handle);
    return 0;
}
