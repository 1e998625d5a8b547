#include "gpu/gemm_dispatch.hpp"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "gpu/device.hpp"
#include "gpu/gemm_policy.hpp"
#include "util/error.hpp"
#include "util/log.hpp"

#if defined(TL_WITH_CUDA)
#include <cuda_runtime_api.h>
#include <cublas_v2.h>

#include "cublas_loader.hpp"
#include "gpu/cuda_host.hpp"
#include "gpu/device_weight_layout.hpp"
#include "gpu_kernels.hpp"
#endif

namespace tl {

#if !defined(TL_WITH_CUDA)

// ---- A build without CUDA -------------------------------------------------------------------------------------

size_t quant_gemm_workspace_size(const DeviceWeight &, int64_t, const DispatchSettings &) { fail_without_cuda(); }
void quant_gemm(const DeviceWeight &, const void *, void *, int64_t, Dtype, const DispatchSettings &, void *, void *,
                size_t, void *, const uint16_t *, bool) {
    fail_without_cuda();
}
size_t dequantized_gemm_workspace_size(const DeviceWeight &, int64_t) { fail_without_cuda(); }
bool dequant_cublas_wanted(const DeviceWeight &, int64_t, const DispatchSettings &) { fail_without_cuda(); }
DispatchCounts dispatch_counts(const DeviceWeight &) { fail_without_cuda(); }

#else

// ---- CUDA -------------------------------------------------------------------------------------------------------

namespace {

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

bool cublas_path_wanted(const DeviceWeight &dw, int64_t m, const DispatchSettings &settings) {
    const int64_t min_m = cublas_min_m_for(dw.k, dw.n, settings[DispatchSetting::CublasMinM], dw.hopper_kernels);
    return dw.marlin_ok && min_m > 0 && m >= min_m;
}

}  // namespace

size_t quant_gemm_workspace_size(const DeviceWeight &dw, int64_t m, const DispatchSettings &settings) {
    if (m < 1 || m > INT32_MAX) fail(TL_ERR_INVALID_ARGUMENT, "m must be in [1, 2^31), got " + std::to_string(m));
    // The scratch of every path the settings may take for this M.
    size_t scratch = 0;
    if (settings[DispatchSetting::Fp16Body] && dw.fp16_body) scratch = dw.cublas_workspace;
    if (settings[DispatchSetting::UseMarlin] && dw.marlin_ok) {
        if (cublas_path_wanted(dw, m, settings)) {
            scratch = std::max(scratch, dequant_scratch_bytes(dw) + dw.cublas_workspace);
        }
        if (dw.has_correction) scratch = std::max(scratch, correction_scratch_bytes(dw, m));
    }
    return dw.marlin_workspace + gathered_x_bytes(dw, m) + padded_y_bytes(dw, m) + scratch;
}

size_t dequantized_gemm_workspace_size(const DeviceWeight &dw, int64_t m) {
    if (m < 1 || m > INT32_MAX) fail(TL_ERR_INVALID_ARGUMENT, "m must be in [1, 2^31), got " + std::to_string(m));
    return dw.marlin_workspace + gathered_x_bytes(dw, m) + padded_y_bytes(dw, m) + dw.cublas_workspace;
}

bool dequant_cublas_wanted(const DeviceWeight &dw, int64_t m, const DispatchSettings &settings) {
    if (settings[DispatchSetting::Fp16Body] && dw.fp16_body) return false;
    return settings[DispatchSetting::UseMarlin] && cublas_path_wanted(dw, m, settings);
}

void quant_gemm(const DeviceWeight &dw, const void *x, void *y, int64_t m, Dtype dtype, const DispatchSettings &settings,
                void *stream_ptr, void *workspace, size_t workspace_bytes, void *cublas_handle,
                const uint16_t *dequantized, bool dequantized_only) {
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
        if (dequantized_only) {
            if (rc > 0) check_cuda(static_cast<cudaError_t>(rc), "cuBLAS on the dequantized '" + dw.name + "'");
            fail(TL_ERR_INTERNAL, "cuBLAS refused the dequantized '" + dw.name + "' (rc " + std::to_string(rc) +
                                      "), and no other path has its weights");
        }
        refused(rc, "cuBLAS on the caller's dequantized weight");
    }
    if (settings[DispatchSetting::Fp16Body] && dw.fp16_body && f16) {
        const int rc = fp16_gemm(dw.fp16_body.get<uint16_t>());
        if (rc == 0) return done_padded(dw.n_fp16);
        refused(rc, "FP16 body");
    }

    if (settings[DispatchSetting::UseMarlin] && dw.marlin_ok) {
        const bool workspace_ok = workspace_bytes >= dw.marlin_workspace && yp != nullptr;
        const size_t dequant_bytes = dequant_scratch_bytes(dw);
        if (cublas_path_wanted(dw, m, settings) && yp != nullptr &&
            scratch_bytes >= dequant_bytes + dw.cublas_workspace) {
            const int rc = with_cublas([&](cublasHandle_t h) {
                return gpu::dequant_cublas_gemm(h, xh, dw.codes.get<uint8_t>(), dw.scales.get<uint16_t>(),
                                                dw.zeros.get<uint16_t>(), yp, mi, np, kp, dw.group_size, dtype,
                                                scratch, dequant_bytes, stream, scratch + dequant_bytes,
                                                dw.cublas_workspace);
            });
            if (rc == 0) return done_padded(dw.n_cublas);
            refused(rc, "dequantize + cuBLAS");
        }
        const int32_t mode = settings[DispatchSetting::MarlinMode];
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

#endif  // TL_WITH_CUDA

}  // namespace tl
