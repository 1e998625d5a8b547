// The C API's weight functions (host side): a weight from raw INT4 arrays, from a GPTQ/AWQ checkpoint layer or
// quantized from FP32 values; its properties and values.
#include "tinyloop.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

#include "barrier.hpp"
#include "format/model.hpp"
#include "handles.hpp"
#include "import/int4_import.hpp"
#include "quant/quant.hpp"

using namespace tl::capi;

namespace {

bool all_finite_half(const uint16_t *p, size_t count, const char *what, std::string *message) {
    for (size_t i = 0; i < count; ++i) {
        if ((p[i] & 0x7C00u) == 0x7C00u) {
            *message = std::string(what) + "[" + std::to_string(i) + "] is not finite";
            return false;
        }
    }
    return true;
}

// Shared checks of tl_weight_create and tl_weight_quantize; returns the actual group size.
int32_t check_weight_shape(int32_t k, int32_t n, int32_t group_size, int32_t bits, const char *prefix) {
    const std::string p(prefix);
    require(bits == 4, p + "bits must be 4, got " + std::to_string(bits));
    require(k > 0 && k % 2 == 0 && k <= (1 << 20), p + "k must be even and in [2, 2^20], got " + std::to_string(k));
    require(n > 0 && n <= (1 << 24), p + "n must be in [1, 2^24], got " + std::to_string(n));
    require(group_size >= 0, p + "group_size must be >= 0, got " + std::to_string(group_size));
    const int32_t gs = group_size == 0 ? k : group_size;
    require(k % gs == 0,
            p + "group_size " + std::to_string(group_size) + " does not divide k = " + std::to_string(k));
    return gs;
}

}  // namespace

extern "C" {

TL_API tl_status tl_weight_desc_init(tl_weight_desc *desc, uint32_t struct_size) {
    return init_struct(desc, struct_size, "desc", [](tl_weight_desc &d) { d.bits = 4; });
}

TL_API tl_status tl_weight_create(const tl_weight_desc *desc, tl_weight **out_weight) {
    return guarded([&] {
        require_not_null(out_weight, "out_weight");
        *out_weight = nullptr;
        const tl_weight_desc desc_copy = read_input_struct(desc, "desc", tl_weight_desc_init);
        desc = &desc_copy;
        const int32_t gs = check_weight_shape(desc->k, desc->n, desc->group_size, desc->bits, "desc->");
        require_not_null(desc->codes, "desc->codes");
        require_not_null(desc->scales, "desc->scales");
        require_not_null(desc->zeros, "desc->zeros");
        require(desc->sign_bit == nullptr || desc->k % 8 == 0,
                "desc->sign_bit needs k divisible by 8, got k = " + std::to_string(desc->k));
        const size_t k = static_cast<size_t>(desc->k), n = static_cast<size_t>(desc->n);
        const size_t groups = n * (k / static_cast<size_t>(gs));
        std::string message;
        if (!all_finite_half(desc->scales, groups, "desc->scales", &message) ||
            !all_finite_half(desc->zeros, groups, "desc->zeros", &message)) {
            tl::fail(TL_ERR_INVALID_ARGUMENT, message);
        }
        tl::QuantizedMatrix m;
        m.k = desc->k;
        m.n = desc->n;
        m.group_size = gs;
        m.bits = 4;
        m.codes.assign(desc->codes, desc->codes + n * k / 2);
        m.scales.assign(desc->scales, desc->scales + groups);
        m.zeros.assign(desc->zeros, desc->zeros + groups);
        if (desc->frac4 != nullptr) m.frac4.assign(desc->frac4, desc->frac4 + n * k / 2);
        if (desc->sign_bit != nullptr) m.sign_bit.assign(desc->sign_bit, desc->sign_bit + n * k / 8);
        auto w = std::make_unique<tl_weight>();
        w->linear = tl::make_quantized_linear(desc->name != nullptr ? desc->name : "", std::move(m));
        *out_weight = w.release();
    });
}

TL_API tl_status tl_int4_import_desc_init(tl_int4_import_desc *desc, uint32_t struct_size) {
    return init_struct(desc, struct_size, "desc", [](tl_int4_import_desc &d) { d.layout = TL_INT4_LAYOUT_GPTQ; });
}

TL_API tl_status tl_weight_import_int4(const tl_int4_import_desc *desc, tl_weight **out_weight) {
    return guarded([&] {
        require_not_null(out_weight, "out_weight");
        *out_weight = nullptr;
        const tl_int4_import_desc d = read_input_struct(desc, "desc", tl_int4_import_desc_init);
        require(d.layout == TL_INT4_LAYOUT_GPTQ || d.layout == TL_INT4_LAYOUT_AWQ,
                "desc->layout must be TL_INT4_LAYOUT_GPTQ or TL_INT4_LAYOUT_AWQ, got " + std::to_string(d.layout));
        tl::Int4Checkpoint checkpoint;
        checkpoint.layout = d.layout == TL_INT4_LAYOUT_GPTQ ? tl::Int4Layout::Gptq : tl::Int4Layout::Awq;
        checkpoint.k = d.k;
        checkpoint.n = d.n;
        checkpoint.group_size = d.group_size;
        checkpoint.qweight = d.qweight;
        checkpoint.qzeros = d.qzeros;
        checkpoint.scales = d.scales;
        checkpoint.g_idx = d.g_idx;
        checkpoint.field_prefix = "desc->";
        auto w = std::make_unique<tl_weight>();
        w->linear = tl::make_quantized_linear(d.name != nullptr ? d.name : "", tl::import_int4(checkpoint));
        *out_weight = w.release();
    });
}

TL_API tl_status tl_quantize_options_init(tl_quantize_options *options, uint32_t struct_size) {
    return init_struct(options, struct_size, "options", [](tl_quantize_options &o) {
        o.method = TL_QUANT_ASYMMETRIC;
        o.group_size = 0;
        o.bits = 4;
    });
}

TL_API tl_status tl_weight_quantize(const float *w, int32_t k, int32_t n, const tl_quantize_options *options,
                                    tl_weight **out_weight) {
    return guarded([&] {
        require_not_null(out_weight, "out_weight");
        *out_weight = nullptr;
        require_not_null(w, "w");
        const tl_quantize_options opts = read_input_struct(options, "options", tl_quantize_options_init, true);
        require(opts.method == TL_QUANT_ASYMMETRIC || opts.method == TL_QUANT_SYMMETRIC,
                "options->method must be TL_QUANT_ASYMMETRIC or TL_QUANT_SYMMETRIC, got " + std::to_string(opts.method));
        check_weight_shape(k, n, opts.group_size, opts.bits, "");
        const size_t count = static_cast<size_t>(k) * static_cast<size_t>(n);
        for (size_t i = 0; i < count; ++i) {
            if (!std::isfinite(w[i])) tl::fail(TL_ERR_INVALID_ARGUMENT, "w[" + std::to_string(i) + "] is not finite");
        }
        auto weight = std::make_unique<tl_weight>();
        weight->linear = tl::make_quantized_linear(
            "", tl::quantize_minmax(w, k, n, opts.group_size,
                                    opts.method == TL_QUANT_SYMMETRIC ? tl::QuantMethod::Symmetric
                                                                      : tl::QuantMethod::Asymmetric));
        *out_weight = weight.release();
    });
}

TL_API void tl_weight_free(tl_weight *weight) {
    if (weight != nullptr && !weight->borrowed) delete weight;
}

TL_API tl_status tl_weight_info(const tl_weight *weight, tl_weight_properties *out) {
    return guarded([&] {
        require_not_null(weight, "weight");
        require_output_struct(out, "out");
        const tl::Linear &l = weight->linear;
        tl_weight_properties p;
        std::memset(&p, 0, sizeof p);
        p.struct_size = sizeof p;
        p.k = l.k;
        p.n = l.n;
        p.group_size = l.group_size;
        p.n_groups = l.n_groups();
        p.bits = l.bits;
        p.has_frac4 = l.frac4 != nullptr;
        p.has_sign_bit = l.sign_bit != nullptr;
        p.borrowed = weight->borrowed;
        p.bytes = l.quant_bytes();
        p.name = l.name.c_str();
        write_output_struct(out, p);
    });
}

TL_API tl_status tl_weight_dequantize(const tl_weight *weight, float *out, size_t out_len) {
    return guarded([&] {
        require_not_null(weight, "weight");
        require_not_null(out, "out");
        const tl::Linear &l = weight->linear;
        const size_t needed = static_cast<size_t>(l.k) * static_cast<size_t>(l.n);
        if (out_len < needed) {
            tl::fail(TL_ERR_BUFFER_TOO_SMALL, "out_len is " + std::to_string(out_len) + ", the weight needs k*n = " +
                                                  std::to_string(needed) + " floats");
        }
        tl::dequantize_rows(l, 0, l.n, out);
    });
}

}  // extern "C"
