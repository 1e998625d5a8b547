// Internal to the GPU layer (device_weight.cpp, gemm_dispatch.cpp); compiled only with TL_WITH_CUDA: the struct behind
// DeviceWeight, and the layout of the workspace of a call on one.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

#include "gpu/device_memory.hpp"
#include "gpu/device_weight.hpp"
#include "gpu_kernels.hpp"

namespace tl {

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
    // Cross-iteration rounding (attach_rounding_channels): frac4 [N][K/2] and sign bits [N][K/8] in the padded layout
    // of `codes`, either may be empty; rows from round_row_split on (when > 0) are the second weight's.
    DeviceBuffer round_frac4, round_sign;
    int32_t round_row_split = 0;
    bool has_fused = false, has_correction = false, marlin_ok = false;
    bool hopper_kernels = false;  // the sm_90a Marlin-class kernels run on its device (the dispatch policy's input)
    size_t marlin_workspace = 0;  // the Marlin-class kernels' zero-filled region at the start of the workspace
    size_t cublas_workspace = 0;  // what the cuBLAS paths give cuBLAS, from the caller's workspace

    mutable std::atomic<uint64_t> n_fp16{0}, n_fused{0}, n_correction{0}, n_cublas{0}, n_native{0}, n_fallbacks{0};

    const uint32_t *correction_words() const { return corr_words ? corr_words.get<uint32_t>() : words.get<uint32_t>(); }
    const uint16_t *correction_scales() const {
        return corr_scales ? corr_scales.get<uint16_t>() : fused_scales.get<uint16_t>();
    }
};

inline size_t align_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

// An INT8 weight (bits 8) as FP16 [rows][K] on `device`, W in input order (a k_perm undone), the rows past w.n zero
// (rows >= w.n): its codes, scales and k_perm uploaded, gpu::dequant_int8 run on `stream`, and waited for. The GPU
// backend then runs it as a dense linear (cuBLAS): INT8 weights have no quantized kernel of their own.
DeviceBuffer dequantize_int8_weight(const Linear &w, int32_t rows, int32_t device, cudaStream_t stream);

// The workspace of a call: [0, marlin_workspace) holds the Marlin-class kernels' counters, zero-filled by the caller
// before first use and zero again when every call's work is done; then, for a weight with a k_perm or a padded K, x
// as the weight reads it [M][k_padded]; for a weight whose N was padded, the padded output [M][n_padded]; then the
// scratch of whichever path runs. The contents after the counters are unspecified after a call. Path scratch:
//   Marlin-class correction form: the FP32 group sums [M][groups];
//   dequantize + cuBLAS: the FP16 weight [N][K], then cuBLAS's workspace;
//   FP16 body: cuBLAS's workspace.
// Scratch per call (never per stream or per process) is what lets any number of calls run at once on one weight.
inline size_t dequant_scratch_bytes(const DeviceWeight &dw) {
    return align_up(static_cast<size_t>(dw.n_padded) * dw.k_padded * sizeof(uint16_t), 256);
}
inline size_t padded_y_bytes(const DeviceWeight &dw, int64_t m) {
    return dw.n_padded != dw.n ? align_up(static_cast<size_t>(m) * dw.n_padded * sizeof(uint16_t), 256) : 0;
}
// x as the weight reads it: permuted (act-order) and zero-padded to k_padded, or x itself (0 bytes).
inline bool reads_x_through_workspace(const DeviceWeight &dw) { return dw.k_perm || dw.k_padded != dw.k; }
inline size_t gathered_x_bytes(const DeviceWeight &dw, int64_t m) {
    return reads_x_through_workspace(dw) ? align_up(static_cast<size_t>(m) * dw.k_padded * sizeof(uint16_t), 256) : 0;
}
inline size_t correction_scratch_bytes(const DeviceWeight &dw, int64_t m) {
    return align_up(gpu::correction_scratch_bytes(static_cast<int>(m), dw.k_padded, dw.kernel_group_size), 256);
}

}  // namespace tl
