#include "gpu/gpu_backend.hpp"
#include "gpu/gemm_policy.hpp"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "util/error.hpp"
#include "util/log.hpp"
#include "quant/quant.hpp"

#if defined(TL_WITH_CUDA)
#include <cuda_runtime_api.h>
#include <cublas_v2.h>

#include "cublas_loader.hpp"
#include "gpu/cuda_host.hpp"
#include "gpu_kernels.hpp"
#include "gpu/marlin_pack.hpp"
#endif

namespace tl {

// ---- Dispatcher settings: process-global, initialised from the environment ----------------------------------

namespace {

int32_t env_setting(const char *name, int32_t fallback) {
    const char *text = std::getenv(name);
    if (text == nullptr || *text == '\0') return fallback;
    char *end = nullptr;
    const long v = std::strtol(text, &end, 10);
    if (*end != '\0' || v < 0 || v > INT32_MAX) {
        log(TL_LOG_WARN, std::string("ignoring ") + name + "='" + text + "' (not a non-negative integer)");
        return fallback;
    }
    return static_cast<int32_t>(v);
}

struct Settings {
    std::atomic<int32_t> values[kDispatchSettings];
    std::atomic<int32_t> &operator[](DispatchSetting setting) { return values[static_cast<int32_t>(setting)]; }
    Settings() {
        (*this)[DispatchSetting::UseMarlin] = env_setting("TINYLOOP_USE_MARLIN", 1);
        (*this)[DispatchSetting::Fp16Body] = env_setting("TINYLOOP_EXPERIMENTAL_FP16_BODY", 0);
        (*this)[DispatchSetting::CrossIterRound] = env_setting("TINYLOOP_CROSS_ITER_ROUND", 0);
        (*this)[DispatchSetting::MarlinMode] = env_setting("TINYLOOP_MARLIN_MODE", 0);
        (*this)[DispatchSetting::CublasMinM] = env_setting("TINYLOOP_CUBLAS_MIN_M", kDefaultCublasMinM);
    }
};

Settings &settings() {
    static Settings s;
    return s;
}

// The C API translates its values; this guards the array against a value cast from anything else.
void check_setting(DispatchSetting setting) {
    const int32_t index = static_cast<int32_t>(setting);
    if (index < 0 || index >= kDispatchSettings) {
        fail(TL_ERR_INVALID_ARGUMENT, "setting " + std::to_string(index) + " is not a dispatcher setting");
    }
}

}  // namespace

void set_dispatch(DispatchSetting setting, int32_t value) {
    check_setting(setting);
    const int32_t max = setting == DispatchSetting::MarlinMode   ? 2
                        : setting == DispatchSetting::CublasMinM ? INT32_MAX
                                                                 : 1;
    if (value < 0 || value > max) {
        fail(TL_ERR_INVALID_ARGUMENT,
             "value " + std::to_string(value) + " is out of range [0, " + std::to_string(max) + "] for setting " +
                 std::to_string(static_cast<int32_t>(setting)));
    }
    settings()[setting].store(value, std::memory_order_relaxed);
}

int32_t get_dispatch(DispatchSetting setting) {
    check_setting(setting);
    return settings()[setting].load(std::memory_order_relaxed);
}

#if !defined(TL_WITH_CUDA)

// ---- A build without CUDA -------------------------------------------------------------------------------------

struct DeviceWeight {};

namespace {
[[noreturn]] void no_cuda() { fail(TL_ERR_NO_DEVICE, "this build of the library has no CUDA support"); }
}  // namespace

int32_t device_count() noexcept { return 0; }
DeviceProperties device_info(int32_t) { no_cuda(); }
std::shared_ptr<DeviceWeight> pack_weight(const Linear &, int32_t, void *, const PackForms &, PackOutcome *) {
    no_cuda();
}
size_t quant_gemm_workspace_size(const DeviceWeight &, int64_t) { no_cuda(); }
void quant_gemm(const DeviceWeight &, const void *, void *, int64_t, Dtype, void *, void *, size_t, void *,
                const uint16_t *) {
    no_cuda();
}
bool dequant_cublas_wanted(const DeviceWeight &, int64_t) { no_cuda(); }
size_t dequantized_bytes(const DeviceWeight &) { no_cuda(); }
void dequantize_weight(const DeviceWeight &, uint16_t *, void *) { no_cuda(); }
DispatchCounts dispatch_counts(const DeviceWeight &) { no_cuda(); }
void *device_malloc(int32_t, size_t) { no_cuda(); }
void device_free(void *ptr, void *) {
    if (ptr != nullptr) no_cuda();
}
void memcpy_any(void *, const void *, size_t, void *) { no_cuda(); }
void memset_device(void *, int32_t, size_t, void *) { no_cuda(); }
void *stream_create(int32_t) { no_cuda(); }
void stream_destroy(void *stream) {
    if (stream != nullptr) no_cuda();
}
void stream_synchronize(void *) { no_cuda(); }

#else

// ---- CUDA -------------------------------------------------------------------------------------------------------

namespace {

void require_device(int32_t device) {
    const int32_t count = device_count();
    if (count == 0) fail(TL_ERR_NO_DEVICE, "no usable CUDA device on this machine");
    if (device < 0 || device >= count) {
        fail(TL_ERR_INVALID_ARGUMENT,
             "device " + std::to_string(device) + " does not exist (" + std::to_string(count) + " devices)");
    }
}

// Owned device memory on one device; freed on destruction (errors there are ignored: nothing to report to).
class DeviceBuffer {
public:
    DeviceBuffer() = default;
    DeviceBuffer(int device, size_t bytes) : device_(device), bytes_(bytes) {
        check_cuda(cudaMalloc(&ptr_, bytes), ("cudaMalloc of " + std::to_string(bytes) + " bytes").c_str());
    }
    ~DeviceBuffer() {
        if (ptr_ == nullptr) return;
        int previous = 0;
        cudaGetDevice(&previous);
        cudaSetDevice(device_);
        cudaFree(ptr_);
        cudaSetDevice(previous);
    }
    DeviceBuffer(DeviceBuffer &&o) noexcept { swap(o); }
    DeviceBuffer &operator=(DeviceBuffer &&o) noexcept {
        swap(o);
        return *this;
    }
    DeviceBuffer(const DeviceBuffer &) = delete;
    DeviceBuffer &operator=(const DeviceBuffer &) = delete;

    template <class T>
    static DeviceBuffer upload(int device, const std::vector<T> &host, cudaStream_t stream) {
        return upload(device, host.data(), host.size() * sizeof(T), stream);
    }
    static DeviceBuffer upload(int device, const void *host, size_t bytes, cudaStream_t stream) {
        DeviceBuffer b(device, bytes);
        check_cuda(cudaMemcpyAsync(b.ptr_, host, bytes, cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync (upload)");
        return b;
    }

    template <class T = void>
    T *get() const {
        return static_cast<T *>(ptr_);
    }
    size_t bytes() const { return bytes_; }
    explicit operator bool() const { return ptr_ != nullptr; }

private:
    void swap(DeviceBuffer &o) noexcept {
        std::swap(device_, o.device_);
        std::swap(ptr_, o.ptr_);
        std::swap(bytes_, o.bytes_);
    }
    int device_ = 0;
    void *ptr_ = nullptr;
    size_t bytes_ = 0;
};

// cuBLAS handles are expensive to create and may not be shared by concurrent calls: a pool per device, handles
// borrowed for one call. They live for the whole process (destroying them at exit races the CUDA runtime's own
// teardown).
class CublasPool {
public:
    struct Lease {
        CublasPool *pool;
        int device;
        cublasHandle_t handle;
        ~Lease() { pool->give_back(device, handle); }
    };
    Lease borrow(int device) {
        {
            std::lock_guard<std::mutex> lock(mutex_);
            auto &free_list = free_[device];
            if (!free_list.empty()) {
                cublasHandle_t h = free_list.back();
                free_list.pop_back();
                return Lease{this, device, h};
            }
        }
        cublasHandle_t h = nullptr;
        std::string why;
        const gpu::CublasApi *cublas = gpu::cublas_api(&why);
        if (cublas == nullptr) fail(TL_ERR_CUDA, "cuBLAS is not available: " + why);
        const cublasStatus_t st = cublas->create(&h);
        if (st != CUBLAS_STATUS_SUCCESS) fail(TL_ERR_CUDA, "cublasCreate failed with status " + std::to_string(st));
        return Lease{this, device, h};
    }

private:
    void give_back(int device, cublasHandle_t h) {
        std::lock_guard<std::mutex> lock(mutex_);
        free_[device].push_back(h);
    }
    std::mutex mutex_;
    std::map<int, std::vector<cublasHandle_t>> free_;
};

CublasPool &cublas_pool() {
    static CublasPool *pool = new CublasPool;  // never destroyed, see above
    return *pool;
}

std::once_flag g_first_marlin_dispatch;

size_t align_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

// Checks that [p, p + bytes) lies inside one device allocation on `device`, so that a host pointer or a short
// buffer becomes TL_ERR_INVALID_ARGUMENT instead of an illegal-address fault that would poison the context.
void check_device_range(const void *p, size_t bytes, int device, const char *name) {
    cudaPointerAttributes attr{};
    const cudaError_t err = cudaPointerGetAttributes(&attr, p);
    if (err != cudaSuccess) {
        cudaGetLastError();  // not sticky; clear it
        fail(TL_ERR_INVALID_ARGUMENT, std::string(name) + " is not a pointer CUDA knows");
    }
    if (attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged) {
        fail(TL_ERR_INVALID_ARGUMENT, std::string(name) + " is not device memory");
    }
    if (attr.device != device) {
        fail(TL_ERR_INVALID_ARGUMENT, std::string(name) + " is on device " + std::to_string(attr.device) +
                                          ", the weight is on device " + std::to_string(device));
    }
    // The allocation's extent, through the driver entry point (no link-time dependency on libcuda).
    using AddressRangeFn = int (*)(unsigned long long *, size_t *, unsigned long long);
    static AddressRangeFn address_range = [] {
        void *fn = nullptr;
        cudaDriverEntryPointQueryResult status{};
        if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 12000, cudaEnableDefault, &status) !=
                cudaSuccess ||
            status != cudaDriverEntryPointSuccess) {
            cudaGetLastError();
            fn = nullptr;
        }
        return reinterpret_cast<AddressRangeFn>(fn);
    }();
    if (address_range == nullptr) return;
    unsigned long long base = 0;
    size_t size = 0;
    const auto addr = reinterpret_cast<unsigned long long>(p);
    if (address_range(&base, &size, addr) != 0) return;  // not a plain allocation (e.g. a VMM mapping): skip
    if (addr + bytes > base + size) {
        fail(TL_ERR_INVALID_ARGUMENT, std::string(name) + " needs " + std::to_string(bytes) +
                                          " bytes but its allocation ends " + std::to_string(base + size - addr) +
                                          " bytes after it");
    }
}

}  // namespace

struct DeviceWeight {
    int device = 0;
    int32_t k = 0, n = 0, group_size = 0;
    // The rows every device form holds: n, or n rounded up to 64 with zero rows where only that keeps the shape off
    // the Marlin-class kernels (a vocabulary of 50257). Every path but the native kernel then computes n_padded
    // columns into the workspace, and the first n are copied to y.
    int32_t n_padded = 0;
    // Likewise K: k_padded, with zero codes and zero groups; every path then reads x through the workspace, its
    // columns zero from k on (and in the stored order of a k_perm, which then covers k_padded rows).
    int32_t k_padded = 0;
    int32_t kernel_group_size = 0;  // -1 for per-column scales (one group spanning K)
    std::string name;

    DeviceBuffer codes, scales, zeros;              // the file's layout: native kernel, dequantize
    DeviceBuffer words, fused_scales, fused_zeros;  // Marlin-class tiles; fused form
    DeviceBuffer corr_words, corr_scales, delta;    // correction form (words/scales empty when shared)
    DeviceBuffer fp16_body;                         // [N][K] FP16
    DeviceBuffer k_perm;                            // INT32 [K] (act-order): stored row k reads input k_perm[k]
    bool has_fused = false, has_correction = false, marlin_ok = false;
    size_t marlin_workspace = 0;  // the Marlin-class kernels' zero-filled region at the start of the workspace
    size_t cublas_workspace = 0;  // what the cuBLAS paths give cuBLAS, from the caller's workspace

    mutable std::atomic<uint64_t> n_fp16{0}, n_fused{0}, n_correction{0}, n_cublas{0}, n_native{0}, n_fallbacks{0};

    const uint32_t *correction_words() const { return corr_words ? corr_words.get<uint32_t>() : words.get<uint32_t>(); }
    const uint16_t *correction_scales() const {
        return corr_scales ? corr_scales.get<uint16_t>() : fused_scales.get<uint16_t>();
    }
};

int32_t device_count() noexcept {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return count;
}

DeviceProperties device_info(int32_t device) {
    require_device(device);
    cudaDeviceProp prop{};
    check_cuda(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
    size_t free_bytes = 0, total_bytes = 0;
    {
        DeviceScope scope(device);
        check_cuda(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
    }
    DeviceProperties p;
    p.name = prop.name;
    p.sm_major = prop.major;
    p.sm_minor = prop.minor;
    p.sm_count = prop.multiProcessorCount;
    p.total_memory = total_bytes;
    p.free_memory = free_bytes;
    p.marlin_supported = prop.major >= 8;
    return p;
}

std::shared_ptr<DeviceWeight> pack_weight(const Linear &w, int32_t device, void *stream_ptr, const PackForms &forms,
                                          PackOutcome *outcome) {
    if (!w.quantized || w.bits != 4) fail(TL_ERR_UNSUPPORTED, "'" + w.name + "' is not an INT4 weight");
    require_device(device);
    const DeviceProperties props = device_info(device);
    DeviceScope scope(device);
    auto stream = static_cast<cudaStream_t>(stream_ptr);

    auto dw = std::make_shared<DeviceWeight>();
    dw->device = device;
    dw->k = w.k;
    dw->n = w.n;
    dw->name = w.name;
    // K and N padded to multiples of 64 (the kernels' k tile and column strip) where only that keeps the shape off the
    // Marlin-class kernels: K with zero codes and zero groups (the inputs get zero columns), N with zero rows.
    constexpr int32_t kPad = 64;
    auto up = [](int32_t v) { return (v + kPad - 1) / kPad * kPad; };
    const int32_t k_up = up(w.k), n_up = up(w.n), group_up = w.group_size == w.k ? k_up : w.group_size;
    const bool pad_k = k_up != w.k && marlin_shape_error(k_up, n_up, group_up) == nullptr;
    const Linear k_padded = pad_k ? pad_linear_cols(w, kPad) : Linear{};
    const Linear &k_src = pad_k ? k_padded : w;
    const bool pad_n = n_up != w.n && marlin_shape_error(k_src.k, n_up, k_src.group_size) == nullptr;
    const Linear padded = pad_n ? pad_linear_rows(k_src, kPad) : Linear{};
    const Linear &src = pad_n ? padded : k_src;  // what every device form is made from
    dw->k_padded = src.k;
    dw->n_padded = src.n;
    dw->group_size = src.group_size;
    const size_t groups = static_cast<size_t>(src.n) * static_cast<size_t>(src.n_groups());
    dw->codes = DeviceBuffer::upload(device, src.codes, static_cast<size_t>(src.n) * (src.k / 2), stream);
    dw->scales = DeviceBuffer::upload(device, src.scales, groups * sizeof(uint16_t), stream);
    dw->zeros = DeviceBuffer::upload(device, src.zeros, groups * sizeof(uint16_t), stream);
    if (src.k_perm != nullptr) {
        dw->k_perm = DeviceBuffer::upload(device, src.k_perm, static_cast<size_t>(src.k) * sizeof(int32_t), stream);
    }
    const uint64_t native_bytes = dw->codes.bytes() + dw->scales.bytes() + dw->zeros.bytes() + dw->k_perm.bytes();

    const bool packable = props.marlin_supported && marlin_shape_error(src.k, src.n, src.group_size) == nullptr;
    dw->kernel_group_size = marlin_kernel_group_size(src.k, src.group_size);
    MarlinPacked fused;  // kept until the correction form has compared its tiles with it
    if (packable && forms.marlin_fused) {
        fused = marlin_pack(src, MarlinMode::Fused);
        dw->words = DeviceBuffer::upload(device, fused.words, stream);
        dw->fused_scales = DeviceBuffer::upload(device, fused.scales, stream);
        dw->fused_zeros = DeviceBuffer::upload(device, fused.zeros, stream);
        dw->has_fused = true;
    }
    if (packable && forms.marlin_correction) {
        const MarlinPacked p = marlin_pack(src, MarlinMode::Symmetric);
        // The symmetric codes are q itself, so both forms share the tiles when both are packed.
        if (!dw->has_fused) {
            dw->words = DeviceBuffer::upload(device, p.words, stream);
            dw->fused_scales = DeviceBuffer::upload(device, p.scales, stream);
        } else {
            if (fused.words != p.words) dw->corr_words = DeviceBuffer::upload(device, p.words, stream);
            if (fused.scales != p.scales) dw->corr_scales = DeviceBuffer::upload(device, p.scales, stream);
        }
        dw->delta = DeviceBuffer::upload(device, p.delta, stream);
        dw->has_correction = true;
    }
    dw->marlin_ok = dw->has_fused || dw->has_correction;
    if (dw->marlin_ok) dw->marlin_workspace = align_up(gpu::marlin_workspace_bytes(props.sm_count), 256);
    // cuBLAS's recommended workspace: 32 MiB on Hopper, 4 MiB on earlier GPUs.
    dw->cublas_workspace = static_cast<size_t>(props.sm_major >= 9 ? 32 : 4) << 20;
    if (forms.fp16_body) {
        dw->fp16_body = DeviceBuffer(device, static_cast<size_t>(src.n) * src.k * sizeof(uint16_t));
        const int rc = gpu::dequant_int4(dw->codes.get<uint8_t>(), dw->scales.get<uint16_t>(),
                                         dw->zeros.get<uint16_t>(), dw->fp16_body.get<uint16_t>(), src.n, src.k,
                                         src.group_size, Dtype::F16, stream);
        if (rc > 0) check_cuda(static_cast<cudaError_t>(rc), "dequantizing '" + w.name + "' to FP16");
        if (rc < 0) {
            // A shape the dequantizer does not take (K % 8 != 0): the weight simply goes without a body.
            dw->fp16_body = DeviceBuffer{};
            log(TL_LOG_INFO, "[pack] '" + w.name + "' gets no FP16 body: K = " + std::to_string(w.k) +
                                 " is not a multiple of 8 (rc " + std::to_string(rc) + ")");
        }
    }
    check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize (pack)");

    if (outcome != nullptr) {
        outcome->packed = dw->marlin_ok;
        outcome->packable = packable;
        outcome->device_bytes = native_bytes;
        for (const DeviceBuffer *b : {&dw->words, &dw->fused_scales, &dw->fused_zeros, &dw->corr_words,
                                      &dw->corr_scales, &dw->delta, &dw->fp16_body}) {
            outcome->extra_device_bytes += b->bytes();
        }
        outcome->device_bytes += outcome->extra_device_bytes;
    }
    return dw;
}

namespace {

// The workspace of a call: [0, marlin_workspace) holds the Marlin-class kernels' counters, zero-filled by the caller
// before first use and zero again when every call's work is done; then, for a weight with a k_perm or a padded K, x
// as the weight reads it [M][k_padded]; for a weight whose N was padded, the padded output [M][n_padded]; then the
// scratch of whichever path runs. The contents after the counters are unspecified after a call. Path scratch:
//   Marlin-class correction form: the FP32 group sums [M][groups];
//   dequantize + cuBLAS: the FP16 weight [N][K], then cuBLAS's workspace;
//   FP16 body: cuBLAS's workspace.
// Scratch per call (never per stream or per process) is what lets any number of calls run at once on one weight.
size_t dequant_scratch_bytes(const DeviceWeight &dw) {
    return align_up(static_cast<size_t>(dw.n_padded) * dw.k_padded * sizeof(uint16_t), 256);
}
size_t padded_y_bytes(const DeviceWeight &dw, int64_t m) {
    return dw.n_padded != dw.n ? align_up(static_cast<size_t>(m) * dw.n_padded * sizeof(uint16_t), 256) : 0;
}
// x as the weight reads it: permuted (act-order) and zero-padded to k_padded, or x itself (0 bytes).
bool reads_x_through_workspace(const DeviceWeight &dw) { return dw.k_perm || dw.k_padded != dw.k; }
size_t gathered_x_bytes(const DeviceWeight &dw, int64_t m) {
    return reads_x_through_workspace(dw) ? align_up(static_cast<size_t>(m) * dw.k_padded * sizeof(uint16_t), 256) : 0;
}
size_t correction_scratch_bytes(const DeviceWeight &dw, int64_t m) {
    return align_up(gpu::correction_scratch_bytes(static_cast<int>(m), dw.k_padded, dw.kernel_group_size), 256);
}

bool cublas_path_wanted(const DeviceWeight &dw, int64_t m) {
    const int64_t min_m = cublas_min_m_for(dw.k, dw.n, get_dispatch(DispatchSetting::CublasMinM));
    return dw.marlin_ok && min_m > 0 && m >= min_m;
}

}  // namespace

size_t quant_gemm_workspace_size(const DeviceWeight &dw, int64_t m) {
    if (m < 1 || m > INT32_MAX) fail(TL_ERR_INVALID_ARGUMENT, "m must be in [1, 2^31), got " + std::to_string(m));
    // The scratch of every path the current settings may take for this M.
    size_t scratch = 0;
    if (get_dispatch(DispatchSetting::Fp16Body) && dw.fp16_body) scratch = dw.cublas_workspace;
    if (get_dispatch(DispatchSetting::UseMarlin) && dw.marlin_ok) {
        if (cublas_path_wanted(dw, m)) scratch = std::max(scratch, dequant_scratch_bytes(dw) + dw.cublas_workspace);
        if (dw.has_correction) scratch = std::max(scratch, correction_scratch_bytes(dw, m));
    }
    return dw.marlin_workspace + gathered_x_bytes(dw, m) + padded_y_bytes(dw, m) + scratch;
}

bool dequant_cublas_wanted(const DeviceWeight &dw, int64_t m) {
    if (get_dispatch(DispatchSetting::Fp16Body) && dw.fp16_body) return false;
    return get_dispatch(DispatchSetting::UseMarlin) && cublas_path_wanted(dw, m);
}

size_t dequantized_bytes(const DeviceWeight &dw) { return dequant_scratch_bytes(dw); }

void dequantize_weight(const DeviceWeight &dw, uint16_t *dst, void *stream) {
    DeviceScope scope(dw.device);
    const int rc = gpu::dequant_int4(dw.codes.get<uint8_t>(), dw.scales.get<uint16_t>(), dw.zeros.get<uint16_t>(), dst,
                                     dw.n_padded, dw.k_padded, dw.group_size, Dtype::F16,
                                     static_cast<cudaStream_t>(stream));
    if (rc > 0) check_cuda(static_cast<cudaError_t>(rc), "dequantizing '" + dw.name + "' to FP16");
    if (rc < 0) fail(TL_ERR_INTERNAL, "the dequantizer refused '" + dw.name + "' (rc " + std::to_string(rc) + ")");
}

void quant_gemm(const DeviceWeight &dw, const void *x, void *y, int64_t m, Dtype dtype, void *stream_ptr,
                void *workspace, size_t workspace_bytes, void *cublas_handle, const uint16_t *dequantized) {
    const bool f16 = dtype == Dtype::F16;  // (the C API checked the value)
    if (m < 1 || m > INT32_MAX) fail(TL_ERR_INVALID_ARGUMENT, "m must be in [1, 2^31), got " + std::to_string(m));
    if (x == nullptr) fail(TL_ERR_INVALID_ARGUMENT, "x is NULL");
    if (y == nullptr) fail(TL_ERR_INVALID_ARGUMENT, "y is NULL");
    if ((reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(y)) & 15u) {
        fail(TL_ERR_INVALID_ARGUMENT, "x and y must be 16-byte aligned");
    }
    if (workspace == nullptr && workspace_bytes != 0) fail(TL_ERR_INVALID_ARGUMENT, "workspace is NULL but workspace_bytes is not 0");
    DeviceScope scope(dw.device);
    const int mi = static_cast<int>(m);
    check_device_range(x, static_cast<size_t>(m) * dw.k * sizeof(uint16_t), dw.device, "x");
    check_device_range(y, static_cast<size_t>(m) * dw.n * sizeof(uint16_t), dw.device, "y");
    if (workspace != nullptr) check_device_range(workspace, workspace_bytes, dw.device, "workspace");

    auto stream = static_cast<cudaStream_t>(stream_ptr);
    const auto *xh = static_cast<const uint16_t *>(x);
    auto *yh = static_cast<uint16_t *>(y);
    // After the Marlin-class region: x permuted or padded as the weight reads it (every path needs it), then the
    // padded output and the scratch of the paths (see quant_gemm_workspace_size); a path whose share does not fit
    // refuses the call.
    size_t used = dw.marlin_workspace;
    if (reads_x_through_workspace(dw)) {
        const size_t needed = dw.marlin_workspace + gathered_x_bytes(dw, m);
        if (workspace_bytes < needed) {
            fail(TL_ERR_INVALID_ARGUMENT,
                 "workspace_bytes is " + std::to_string(workspace_bytes) + ", but '" + dw.name + "' reads its input " +
                     (dw.k_perm ? "permuted (act-order)" : "padded to K = " + std::to_string(dw.k_padded)) +
                     " from the workspace and needs at least " + std::to_string(needed) + " bytes at m = " +
                     std::to_string(m));
        }
        auto *gathered = reinterpret_cast<uint16_t *>(static_cast<char *>(workspace) + used);
        const int rc = gpu::gather_columns(xh, dw.k, dw.k_perm ? dw.k_perm.get<int32_t>() : nullptr, gathered,
                                           dw.k_padded, mi, stream);
        if (rc > 0) check_cuda(static_cast<cudaError_t>(rc), "gathering the input of '" + dw.name + "'");
        if (rc < 0) {
            fail(TL_ERR_INTERNAL, "gathering the input of '" + dw.name + "' refused (rc " + std::to_string(rc) + ")");
        }
        xh = gathered;
        used = needed;
    }
    const int kp = dw.k_padded;  // the GEMMs' inner dimension
    // A padded weight's paths other than the native kernel write its n_padded columns here, and the first n are copied
    // to y; without room for them, only the native kernel runs.
    const int np = dw.n_padded;
    uint16_t *yp = yh;
    if (np != dw.n) {
        const size_t bytes = padded_y_bytes(dw, m);
        yp = workspace_bytes >= used + bytes ? reinterpret_cast<uint16_t *>(static_cast<char *>(workspace) + used)
                                             : nullptr;
        if (yp != nullptr) used += bytes;
    }
    char *scratch = workspace_bytes > used ? static_cast<char *>(workspace) + used : nullptr;
    const size_t scratch_bytes = scratch != nullptr ? workspace_bytes - used : 0;
    bool fell_back = false;
    // A path's non-zero rc: the next path runs instead. A positive rc is a CUDA error: clear it if it is not sticky.
    auto refused = [&](int rc, const char *path) {
        if (rc > 0) cudaGetLastError();
        fell_back = true;
        log(TL_LOG_WARN, std::string("[dispatch] ") + path + " refused '" + dw.name + "' (rc " + std::to_string(rc) +
                             "), falling through");
    };
    auto done = [&](std::atomic<uint64_t> &counter) {
        counter.fetch_add(1, std::memory_order_relaxed);
        if (fell_back) dw.n_fallbacks.fetch_add(1, std::memory_order_relaxed);
    };
    // A path that wrote yp succeeded: y gets its first n columns.
    auto done_padded = [&](std::atomic<uint64_t> &counter) {
        if (yp != yh) {
            check_cuda(cudaMemcpy2DAsync(yh, static_cast<size_t>(dw.n) * sizeof(uint16_t), yp,
                                         static_cast<size_t>(np) * sizeof(uint16_t),
                                         static_cast<size_t>(dw.n) * sizeof(uint16_t), static_cast<size_t>(m),
                                         cudaMemcpyDeviceToDevice, stream),
                       "copying the columns of '" + dw.name + "' out of its padded result");
        }
        done(counter);
    };

    // The caller's cuBLAS handle, else one borrowed from the pool for this call.
    auto with_cublas = [&](auto &&gemm) {
        if (cublas_handle != nullptr) return gemm(static_cast<cublasHandle_t>(cublas_handle));
        if (gpu::cublas_api() == nullptr) return gpu::kRcCublas;  // not loadable here: the next path runs
        auto lease = cublas_pool().borrow(dw.device);
        return gemm(lease.handle);
    };
    // cuBLAS on an FP16 form of the weight, with cuBLAS's workspace from the scratch.
    auto fp16_gemm = [&](const uint16_t *w) {
        if (yp == nullptr || scratch_bytes < dw.cublas_workspace) return gpu::kRcWorkspace;
        return with_cublas([&](cublasHandle_t h) {
            return gpu::cublas_gemm(h, xh, w, yp, mi, np, kp, Dtype::F16, stream, scratch, dw.cublas_workspace);
        });
    };
    if (dequantized != nullptr && f16) {
        const int rc = fp16_gemm(dequantized);
        if (rc == 0) return done_padded(dw.n_cublas);
        refused(rc, "cuBLAS on the caller's dequantized weight");
    }
    if (get_dispatch(DispatchSetting::Fp16Body) && dw.fp16_body && f16) {
        const int rc = fp16_gemm(dw.fp16_body.get<uint16_t>());
        if (rc == 0) return done_padded(dw.n_fp16);
        refused(rc, "FP16 body");
    }

    if (get_dispatch(DispatchSetting::UseMarlin) && dw.marlin_ok) {
        const bool workspace_ok = workspace_bytes >= dw.marlin_workspace && yp != nullptr;
        const size_t dequant_bytes = dequant_scratch_bytes(dw);
        if (cublas_path_wanted(dw, m) && yp != nullptr && scratch_bytes >= dequant_bytes + dw.cublas_workspace) {
            const int rc = with_cublas([&](cublasHandle_t h) {
                return gpu::dequant_cublas_gemm(h, xh, dw.codes.get<uint8_t>(), dw.scales.get<uint16_t>(),
                                                dw.zeros.get<uint16_t>(), yp, mi, np, kp, dw.group_size, dtype,
                                                scratch, dequant_bytes, stream, scratch + dequant_bytes,
                                                dw.cublas_workspace);
            });
            if (rc == 0) return done_padded(dw.n_cublas);
            refused(rc, "dequantize + cuBLAS");
        }
        const int32_t mode = get_dispatch(DispatchSetting::MarlinMode);
        int rc = gpu::kRcUnsupported;
        std::atomic<uint64_t> *counter = nullptr;
        if (!workspace_ok) {
            refused(gpu::kRcWorkspace, "Marlin-class kernel (workspace too small)");
        } else if (dw.has_fused && (mode != 2 || !f16)) {
            rc = gpu::marlin_gemm(xh, dw.words.get<uint32_t>(), dw.fused_scales.get<uint16_t>(),
                                  dw.fused_zeros.get<uint16_t>(), yp, mi, np, kp, dw.kernel_group_size, true, dtype,
                                  workspace, dw.marlin_workspace, stream);
            counter = &dw.n_fused;
        } else if (dw.has_correction && mode != 1 && f16) {
            rc = gpu::marlin_gemm_corrected(xh, dw.correction_words(), dw.correction_scales(), dw.delta.get<float>(),
                                            yp, mi, np, kp, dw.kernel_group_size, workspace, dw.marlin_workspace,
                                            reinterpret_cast<float *>(scratch), scratch_bytes, stream);
            counter = &dw.n_correction;
        }
        if (counter != nullptr) {
            if (rc == 0) {
                std::call_once(g_first_marlin_dispatch, [&] {
                    log(TL_LOG_INFO, "[marlin] first dispatch ok: BT=" + std::to_string(m) + " N=" + std::to_string(dw.n) +
                                         " K=" + std::to_string(dw.k) + " gs=" + std::to_string(dw.kernel_group_size));
                });
                return done_padded(*counter);
            }
            refused(rc, counter == &dw.n_fused ? "Marlin-class fused" : "Marlin-class correction");
        }
    }

    const int rc = gpu::native_int4_gemm(xh, dw.codes.get<uint8_t>(), dw.scales.get<uint16_t>(),
                                         dw.zeros.get<uint16_t>(), yh, mi, dw.n, kp, dw.group_size, dtype, stream);
    if (rc > 0) check_cuda(static_cast<cudaError_t>(rc), ("native INT4 GEMM of '" + dw.name + "'").c_str());
    if (rc < 0) fail(TL_ERR_INTERNAL, "the native INT4 GEMM refused '" + dw.name + "' (rc " + std::to_string(rc) + ")");
    done(dw.n_native);
}

DispatchCounts dispatch_counts(const DeviceWeight &dw) {
    DispatchCounts c;
    c.fp16_body = dw.n_fp16.load();
    c.marlin_fused = dw.n_fused.load();
    c.marlin_correction = dw.n_correction.load();
    c.dequant_cublas = dw.n_cublas.load();
    c.native = dw.n_native.load();
    c.fallbacks = dw.n_fallbacks.load();
    return c;
}

void *device_malloc(int32_t device, size_t bytes) {
    require_device(device);
    if (bytes == 0) fail(TL_ERR_INVALID_ARGUMENT, "bytes must be > 0");
    DeviceScope scope(device);
    void *p = nullptr;
    check_cuda(cudaMalloc(&p, bytes), ("cudaMalloc of " + std::to_string(bytes) + " bytes").c_str());
    return p;
}

void device_free(void *ptr, void *stream) {
    if (ptr == nullptr) return;
    if (device_count() == 0) fail(TL_ERR_NO_DEVICE, "no usable CUDA device");
    if (stream != nullptr) {
        check_cuda(cudaFreeAsync(ptr, static_cast<cudaStream_t>(stream)), "cudaFreeAsync");
    } else {
        check_cuda(cudaFree(ptr), "cudaFree");
    }
}

void memcpy_any(void *dst, const void *src, size_t bytes, void *stream) {
    if (device_count() == 0) fail(TL_ERR_NO_DEVICE, "no usable CUDA device");
    if (bytes == 0) return;
    if (dst == nullptr || src == nullptr) fail(TL_ERR_INVALID_ARGUMENT, dst == nullptr ? "dst is NULL" : "src is NULL");
    auto s = static_cast<cudaStream_t>(stream);
    check_cuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s), "cudaMemcpyAsync");
    check_cuda(cudaStreamSynchronize(s), "cudaStreamSynchronize (memcpy)");
}

void memset_device(void *dst, int32_t value, size_t bytes, void *stream) {
    if (device_count() == 0) fail(TL_ERR_NO_DEVICE, "no usable CUDA device");
    if (value < 0 || value > 255) fail(TL_ERR_INVALID_ARGUMENT, "value must be in [0, 255], got " + std::to_string(value));
    if (bytes == 0) return;
    if (dst == nullptr) fail(TL_ERR_INVALID_ARGUMENT, "dst is NULL");
    check_cuda(cudaMemsetAsync(dst, value, bytes, static_cast<cudaStream_t>(stream)), "cudaMemsetAsync");
}

void *stream_create(int32_t device) {
    require_device(device);
    DeviceScope scope(device);
    cudaStream_t s = nullptr;
    check_cuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    return s;
}

void stream_destroy(void *stream) {
    if (stream == nullptr) return;
    if (device_count() == 0) fail(TL_ERR_NO_DEVICE, "no usable CUDA device");
    check_cuda(cudaStreamDestroy(static_cast<cudaStream_t>(stream)), "cudaStreamDestroy");
}

void stream_synchronize(void *stream) {
    if (device_count() == 0) fail(TL_ERR_NO_DEVICE, "no usable CUDA device");
    check_cuda(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)), "cudaStreamSynchronize");
}

#endif  // TL_WITH_CUDA

}  // namespace tl
