#include "gpu/device_weight.hpp"

#include <algorithm>
#include <string>
#include <vector>

#include "gpu/device.hpp"
#include "util/error.hpp"
#include "util/log.hpp"

#if defined(TL_WITH_CUDA)
#include <cuda_runtime_api.h>

#include "gpu/cuda_host.hpp"
#include "gpu/device_memory.hpp"
#include "gpu/device_weight_layout.hpp"
#include "gpu/marlin_pack.hpp"
#include "gpu_kernels.hpp"
#include "quant/quant.hpp"
#endif

namespace tl {

#if !defined(TL_WITH_CUDA)

// ---- A build without CUDA -------------------------------------------------------------------------------------

struct DeviceWeight {};

std::shared_ptr<DeviceWeight> pack_weight(const Linear &, int32_t, void *, const PackForms &, PackOutcome *) {
    fail_without_cuda();
}
size_t dequantized_bytes(const DeviceWeight &) { fail_without_cuda(); }
void dequantize_weight(const DeviceWeight &, uint16_t *, void *) { fail_without_cuda(); }
uint64_t attach_rounding_channels(DeviceWeight &, const Linear &, const Linear *, void *) { fail_without_cuda(); }
bool has_rounding_channels(const DeviceWeight &) { return false; }
void dequantize_weight_iteration(const DeviceWeight &, int32_t, int32_t, uint16_t *, void *) { fail_without_cuda(); }

#else

// ---- CUDA -------------------------------------------------------------------------------------------------------

std::shared_ptr<DeviceWeight> pack_weight(const Linear &w, int32_t device, void *stream_ptr, const PackForms &forms,
                                          PackOutcome *outcome) {
    if (!w.quantized || w.bits != 4) {
        fail(TL_ERR_UNSUPPORTED, "'" + w.name + "' is not an INT4 weight" +
                                     (w.bits == 8 ? " (INT8 weights run on the GPU only inside a model, as dense FP16)"
                                                  : ""));
    }
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
    dw->hopper_kernels = gpu::marlin_wgmma_built() && props.sm_major == 9 && props.sm_minor == 0;
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

DeviceBuffer dequantize_int8_weight(const Linear &w, int32_t rows, int32_t device, cudaStream_t stream) {
    require_complete_quantized(w, "dequantize_int8_weight");
    if (w.bits != 8 || rows < w.n) fail(TL_ERR_INTERNAL, "dequantize_int8_weight: '" + w.name + "' is not INT8");
    DeviceScope scope(device);
    const size_t k = static_cast<size_t>(w.k), n = static_cast<size_t>(w.n);
    const DeviceBuffer codes = DeviceBuffer::upload(device, w.codes, n * k, stream);
    const DeviceBuffer scales =
        DeviceBuffer::upload(device, w.scales, n * static_cast<size_t>(w.n_groups()) * sizeof(uint16_t), stream);
    const DeviceBuffer k_perm =
        w.k_perm ? DeviceBuffer::upload(device, w.k_perm, k * sizeof(int32_t), stream) : DeviceBuffer{};
    DeviceBuffer out(device, static_cast<size_t>(rows) * k * sizeof(uint16_t));
    check_cuda(cudaMemsetAsync(out.get(), 0, out.bytes(), stream), "cudaMemsetAsync (INT8 weight padding)");
    const int rc = gpu::dequant_int8(codes.get<int8_t>(), scales.get<uint16_t>(),
                                     w.k_perm ? k_perm.get<int32_t>() : nullptr, out.get<uint16_t>(), w.n, w.k,
                                     w.group_size, Dtype::F16, stream);
    if (rc > 0) check_cuda(static_cast<cudaError_t>(rc), "dequantizing '" + w.name + "' (INT8) to FP16");
    if (rc < 0) fail(TL_ERR_INTERNAL, "the INT8 dequantizer refused '" + w.name + "' (rc " + std::to_string(rc) + ")");
    // The uploads are freed when this returns: they must be done with first.
    check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize (INT8 dequantize)");
    return out;
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

uint64_t attach_rounding_channels(DeviceWeight &dw, const Linear &first, const Linear *second, void *stream) {
    const Linear *parts[2] = {&first, second};
    const int32_t n_parts = second != nullptr ? 2 : 1;
    const bool frac4 = first.frac4 != nullptr, sign_bit = first.sign_bit != nullptr;
    int32_t rows = 0;
    for (int32_t p = 0; p < n_parts; ++p) {
        const Linear &w = *parts[p];
        if ((w.frac4 != nullptr) != frac4 || (w.sign_bit != nullptr) != sign_bit || w.k != dw.k) {
            fail(TL_ERR_INTERNAL, "attach_rounding_channels: '" + w.name + "' does not match '" + dw.name + "'");
        }
        rows += w.n;
    }
    if (!frac4 && !sign_bit) return 0;
    if (rows != dw.n) fail(TL_ERR_INTERNAL, "attach_rounding_channels: the rows of '" + dw.name + "' differ");
    // The codes' padded layout: rows n_padded, columns k_padded; padding cells get no channel (nothing they hold
    // reaches the output: padding rows are not read, padding columns meet zero inputs).
    const size_t kp = static_cast<size_t>(dw.k_padded);
    std::vector<uint8_t> f(frac4 ? dw.n_padded * kp / 2 : 0), sb(sign_bit ? dw.n_padded * kp / 8 : 0);
    size_t row0 = 0;
    for (int32_t p = 0; p < n_parts; ++p) {
        const Linear &w = *parts[p];
        const size_t k = static_cast<size_t>(w.k);
        for (size_t nn = 0; nn < static_cast<size_t>(w.n); ++nn) {
            if (frac4) std::copy_n(w.frac4 + nn * k / 2, k / 2, f.data() + (row0 + nn) * kp / 2);
            if (sign_bit) std::copy_n(w.sign_bit + nn * k / 8, k / 8, sb.data() + (row0 + nn) * kp / 8);
        }
        row0 += static_cast<size_t>(w.n);
    }
    auto st = static_cast<cudaStream_t>(stream);
    if (frac4) dw.round_frac4 = DeviceBuffer::upload(dw.device, f.data(), f.size(), st);
    if (sign_bit) dw.round_sign = DeviceBuffer::upload(dw.device, sb.data(), sb.size(), st);
    dw.round_row_split = n_parts == 2 ? first.n : 0;
    // The host vectors go out of scope on return: the copies must be done by then.
    check_cuda(cudaStreamSynchronize(st), "cudaStreamSynchronize (rounding channels)");
    return dw.round_frac4.bytes() + dw.round_sign.bytes();
}

bool has_rounding_channels(const DeviceWeight &dw) { return dw.round_frac4 || dw.round_sign; }

void dequantize_weight_iteration(const DeviceWeight &dw, int32_t iteration, int32_t loops, uint16_t *dst,
                                 void *stream) {
    DeviceScope scope(dw.device);
    gpu::RoundingChannels rounding;
    rounding.frac4 = dw.round_frac4 ? dw.round_frac4.get<uint8_t>() : nullptr;
    rounding.sign_bit = dw.round_sign ? dw.round_sign.get<uint8_t>() : nullptr;
    rounding.k_perm = dw.k_perm ? dw.k_perm.get<int32_t>() : nullptr;
    rounding.k_real = dw.k;
    rounding.row_split = dw.round_row_split;
    rounding.iteration = iteration;
    rounding.loops = loops;
    const int rc = gpu::dequant_int4_iteration(dw.codes.get<uint8_t>(), dw.scales.get<uint16_t>(),
                                               dw.zeros.get<uint16_t>(), rounding, dst, dw.n_padded, dw.k_padded,
                                               dw.group_size, static_cast<cudaStream_t>(stream));
    if (rc > 0) check_cuda(static_cast<cudaError_t>(rc), "dequantizing '" + dw.name + "' for an iteration");
    if (rc < 0) {
        fail(TL_ERR_INTERNAL, "the dequantizer refused '" + dw.name + "' for iteration " + std::to_string(iteration) +
                                  " (rc " + std::to_string(rc) + ")");
    }
}

#endif  // TL_WITH_CUDA

}  // namespace tl
