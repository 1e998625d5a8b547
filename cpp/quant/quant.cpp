#include "quant/quant.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <utility>

#include "util/error.hpp"
#include "util/half.hpp"

namespace tl {

namespace {

constexpr uint16_t kSmallestHalf = 0x0001;  // 2^-24, the smallest positive subnormal

// FP16 bits of a finite value that must fit in FP16; `what` names it in the error.
uint16_t to_half_checked(double value, const std::string &what) {
    const uint16_t h = float_to_half(static_cast<float>(value));
    if ((h & 0x7C00u) == 0x7C00u) {
        fail(TL_ERR_INVALID_ARGUMENT, what + " = " + std::to_string(value) + " does not fit in FP16");
    }
    return h;
}

}  // namespace

namespace {

// A zero-filled matrix of this shape and width: codes, scales and (INT4) zeros sized.
QuantizedMatrix blank_matrix(int32_t k, int32_t n, int32_t gs, int32_t bits) {
    QuantizedMatrix m;
    m.k = k;
    m.n = n;
    m.group_size = gs;
    m.bits = bits;
    m.codes.assign(static_cast<size_t>(n) * (bits == 8 ? k : k / 2), 0);
    m.scales.assign(static_cast<size_t>(n) * (k / gs), 0);
    if (bits == 4) m.zeros.assign(m.scales.size(), 0);
    return m;
}

// quantize_minmax for bits 8 (its shape and values already checked).
QuantizedMatrix quantize_minmax_int8(const float *w, int32_t k, int32_t n, int32_t gs) {
    QuantizedMatrix m = blank_matrix(k, n, gs, 8);
    const int32_t groups = k / gs;
    for (int32_t row = 0; row < n; ++row) {
        for (int32_t g = 0; g < groups; ++g) {
            const size_t first = static_cast<size_t>(row) * k + static_cast<size_t>(g) * gs;
            double amax = 0.0;
            for (int32_t i = 0; i < gs; ++i) amax = std::max(amax, std::fabs(static_cast<double>(w[first + i])));
            uint16_t s_bits = to_half_checked(amax / 127.0, "scale[" + std::to_string(row) + "][" +
                                                                std::to_string(g) + "]");
            if (s_bits == 0 && amax != 0.0) s_bits = kSmallestHalf;  // s = 0 only for an all-zero group
            m.scales[static_cast<size_t>(row) * groups + g] = s_bits;
            const float s = half_to_float(s_bits);
            for (int32_t i = 0; i < gs; ++i) m.codes[first + i] = static_cast<uint8_t>(int8_code(w[first + i], s));
        }
    }
    return m;
}

}  // namespace

QuantizedMatrix quantize_minmax(const float *w, int32_t k, int32_t n, int32_t group_size, QuantMethod method,
                                int32_t bits) {
    if (bits != 4 && bits != 8) {
        fail(TL_ERR_INVALID_ARGUMENT, "quantize_minmax: bits = " + std::to_string(bits) + " (4 or 8)");
    }
    if (bits == 8 && method != QuantMethod::Symmetric) {
        fail(TL_ERR_INVALID_ARGUMENT, "quantize_minmax: INT8 weights are symmetric (W = q * s); asymmetric 8-bit "
                                      "quantization has no storage in the format");
    }
    if (k <= 0 || n <= 0 || (bits == 4 && k % 2 != 0)) {
        fail(TL_ERR_INVALID_ARGUMENT, "quantize_minmax: shape k = " + std::to_string(k) + ", n = " +
                                          std::to_string(n) + " (need k > 0, even for INT4, and n > 0)");
    }
    const int32_t gs = group_size == 0 ? k : group_size;
    if (gs < 0 || k % gs != 0) {
        fail(TL_ERR_INVALID_ARGUMENT, "quantize_minmax: group_size = " + std::to_string(group_size) +
                                          " does not divide k = " + std::to_string(k));
    }
    if (w == nullptr) fail(TL_ERR_INVALID_ARGUMENT, "quantize_minmax: weights are NULL");
    if (bits == 8) {
        for (size_t i = 0; i < static_cast<size_t>(k) * n; ++i) {
            if (!std::isfinite(w[i])) {
                fail(TL_ERR_INVALID_ARGUMENT, "quantize_minmax: w[" + std::to_string(i / k) + "][" +
                                                  std::to_string(i % k) + "] is not finite");
            }
        }
        return quantize_minmax_int8(w, k, n, gs);
    }

    QuantizedMatrix m = blank_matrix(k, n, gs, 4);
    const int32_t groups = k / gs;

    for (int32_t row = 0; row < n; ++row) {
        const float *wr = w + static_cast<size_t>(row) * k;
        uint8_t *codes = m.codes.data() + static_cast<size_t>(row) * (k / 2);
        for (int32_t g = 0; g < groups; ++g) {
            const float *wg = wr + static_cast<size_t>(g) * gs;
            float lo = wg[0], hi = wg[0];
            for (int32_t i = 0; i < gs; ++i) {
                if (!std::isfinite(wg[i])) {
                    fail(TL_ERR_INVALID_ARGUMENT, "quantize_minmax: w[" + std::to_string(row) + "][" +
                                                      std::to_string(g * gs + i) + "] is not finite");
                }
                lo = std::min(lo, wg[i]);
                hi = std::max(hi, wg[i]);
            }
            const std::string where = "[" + std::to_string(row) + "][" + std::to_string(g) + "]";
            const bool asym = method == QuantMethod::Asymmetric;
            uint16_t s_bits = to_half_checked(asym ? (static_cast<double>(hi) - lo) / 15.0
                                                   : std::max(hi / 7.0, -static_cast<double>(lo) / 8.0),
                                              "scale" + where);
            // s = 0 is kept for groups z alone represents (asymmetric: constant; symmetric: all zero); any
            // other group whose scale underflows FP16 gets the smallest nonzero one.
            if (s_bits == 0 && (asym ? hi != lo : (hi != 0.0f || lo != 0.0f))) s_bits = kSmallestHalf;
            // Symmetric: -8*s is exact in FP16 whenever it is finite, so W = (q - 8)*s holds bit for bit
            // (an all-zero group keeps z = +0 rather than -0).
            const uint16_t z_bits = asym ? to_half_checked(lo, "zero" + where)
                                  : s_bits == 0 ? uint16_t{0}
                                                : to_half_checked(-8.0 * half_to_float(s_bits), "zero" + where);
            m.scales[static_cast<size_t>(row) * groups + g] = s_bits;
            m.zeros[static_cast<size_t>(row) * groups + g] = z_bits;

            const double s = half_to_float(s_bits);
            const double z = half_to_float(z_bits);
            for (int32_t i = 0; i < gs; ++i) {
                // s == 0 only for a constant group, which z alone represents.
                const double q = s == 0.0 ? 0.0 : std::clamp(std::nearbyint((wg[i] - z) / s), 0.0, 15.0);
                const int32_t kk = g * gs + i;
                codes[kk / 2] |= static_cast<uint8_t>(static_cast<uint8_t>(q) << ((kk & 1) * 4));
            }
        }
    }
    return m;
}

Linear make_quantized_linear(std::string name, QuantizedMatrix m) {
    auto owned = std::make_shared<QuantizedMatrix>(std::move(m));
    Linear lin;
    lin.name = std::move(name);
    lin.k = owned->k;
    lin.n = owned->n;
    lin.quantized = true;
    lin.bits = owned->bits;
    lin.group_size = owned->group_size;
    lin.codes = owned->codes.data();
    lin.scales = owned->scales.data();
    lin.zeros = owned->zeros.empty() ? nullptr : owned->zeros.data();
    lin.frac4 = owned->frac4.empty() ? nullptr : owned->frac4.data();
    lin.sign_bit = owned->sign_bit.empty() ? nullptr : owned->sign_bit.data();
    lin.k_perm = owned->k_perm.empty() ? nullptr : owned->k_perm.data();
    lin.keepalive = std::move(owned);
    return lin;
}

Linear make_dense_linear(std::string name, const float *w, int32_t k, int32_t n) {
    if (k <= 0 || n <= 0 || w == nullptr) {
        fail(TL_ERR_INVALID_ARGUMENT, "make_dense_linear " + name + ": bad shape or NULL weights");
    }
    auto owned = std::make_shared<std::vector<float>>(w, w + static_cast<size_t>(k) * n);
    Linear lin;
    lin.name = std::move(name);
    lin.k = k;
    lin.n = n;
    lin.quantized = false;
    lin.dense_dtype = DType::F32;
    lin.dense = owned->data();
    lin.keepalive = std::move(owned);
    return lin;
}

void dequantize_rows(const Linear &w, int32_t n0, int32_t n1, float *out) {
    if (n0 < 0 || n1 < n0 || n1 > w.n) {
        fail(TL_ERR_INVALID_ARGUMENT, "dequantize_rows " + w.name + ": rows [" + std::to_string(n0) + ", " +
                                          std::to_string(n1) + ") outside [0, " + std::to_string(w.n) + ")");
    }
    const size_t k = static_cast<size_t>(w.k);
    if (!w.quantized) {
        const size_t begin = static_cast<size_t>(n0) * k, count = static_cast<size_t>(n1 - n0) * k;
        if (w.dense_dtype == DType::F32) {
            std::memcpy(out, static_cast<const float *>(w.dense) + begin, count * sizeof(float));
        } else {
            for (size_t i = 0; i < count; ++i) out[i] = load_float(w.dense_dtype, w.dense, begin + i);
        }
        return;
    }
    const int32_t gs = w.group_size, groups = w.n_groups();
    if (w.bits == 8) {
        for (int32_t nn = n0; nn < n1; ++nn) {
            const auto *codes = reinterpret_cast<const int8_t *>(w.codes) + static_cast<size_t>(nn) * k;
            float *row = out + static_cast<size_t>(nn - n0) * k;
            for (int32_t g = 0; g < groups; ++g) {
                const float s = half_to_float(w.scales[static_cast<size_t>(nn) * groups + g]);
                for (int32_t kk = g * gs; kk < (g + 1) * gs; ++kk) {
                    row[w.k_perm ? w.k_perm[kk] : kk] = int8_value(codes[kk], s);
                }
            }
        }
        return;
    }
    for (int32_t nn = n0; nn < n1; ++nn) {
        const uint8_t *codes = w.codes + static_cast<size_t>(nn) * (k / 2);
        float *row = out + static_cast<size_t>(nn - n0) * k;
        for (int32_t g = 0; g < groups; ++g) {
            const float s = half_to_float(w.scales[static_cast<size_t>(nn) * groups + g]);
            const float z = half_to_float(w.zeros[static_cast<size_t>(nn) * groups + g]);
            // The 16 possible values of the group, each q*s + z rounded once in FP32.
            float value[16];
            for (int q = 0; q < 16; ++q) value[q] = static_cast<float>(q) * s + z;
            for (int32_t kk = g * gs; kk < (g + 1) * gs; ++kk) {
                row[w.k_perm ? w.k_perm[kk] : kk] = value[(codes[kk / 2] >> ((kk & 1) * 4)) & 0x0F];
            }
        }
    }
}

void require_complete_int4(const Linear &w, const char *what) {
    if (!w.quantized || w.bits != 4 || w.codes == nullptr || w.scales == nullptr || w.zeros == nullptr ||
        w.group_size <= 0 || w.k % 2 != 0 || w.k % w.group_size != 0) {
        fail(TL_ERR_INVALID_ARGUMENT, std::string(what) + ": '" + w.name + "' is not a complete INT4 weight");
    }
}

void require_complete_quantized(const Linear &w, const char *what) {
    if (w.bits != 8) return require_complete_int4(w, what);
    if (!w.quantized || w.codes == nullptr || w.scales == nullptr || w.zeros != nullptr || w.frac4 != nullptr ||
        w.sign_bit != nullptr || w.group_size <= 0 || w.k % w.group_size != 0) {
        fail(TL_ERR_INVALID_ARGUMENT, std::string(what) + ": '" + w.name + "' is not a complete INT8 weight");
    }
}

namespace {

// A copy of w's rows [0, n) into out rows [row0, row0 + n) of a QuantizedMatrix with the same K and groups.
void copy_rows(const Linear &w, QuantizedMatrix &out, int32_t row0) {
    const size_t row_bytes = static_cast<size_t>(w.k) / 2, groups = static_cast<size_t>(w.n_groups());
    const size_t n = static_cast<size_t>(w.n);
    std::memcpy(out.codes.data() + row0 * row_bytes, w.codes, n * row_bytes);
    std::memcpy(out.scales.data() + row0 * groups, w.scales, n * groups * sizeof(uint16_t));
    std::memcpy(out.zeros.data() + row0 * groups, w.zeros, n * groups * sizeof(uint16_t));
}

// An empty (zero-filled) QuantizedMatrix shaped like w but with n rows and K = k >= w.k (a per-row weight stays one
// group spanning k), reading its input in w's K order, extended with the identity on the new inputs.
QuantizedMatrix zero_matrix(const Linear &w, int32_t n, int32_t k) {
    QuantizedMatrix m;
    m.k = k;
    m.n = n;
    m.group_size = w.group_size == w.k ? k : w.group_size;
    m.bits = w.bits;
    m.codes.assign(static_cast<size_t>(n) * (k / 2), 0);
    m.scales.assign(static_cast<size_t>(n) * (k / m.group_size), 0);
    m.zeros.assign(m.scales.size(), 0);
    if (w.k_perm != nullptr) {
        m.k_perm.assign(w.k_perm, w.k_perm + w.k);
        for (int32_t i = w.k; i < k; ++i) m.k_perm.push_back(i);
    }
    return m;
}

}  // namespace

Linear concat_linear_rows(const Linear &a, const Linear &b, std::string name) {
    require_complete_int4(a, "concat_linear_rows");
    require_complete_int4(b, "concat_linear_rows");
    if (a.k != b.k || a.group_size != b.group_size || !same_k_perm(a, b)) {
        fail(TL_ERR_INVALID_ARGUMENT, "concat_linear_rows: '" + a.name + "' and '" + b.name +
                                          "' differ in K, group size or K order");
    }
    QuantizedMatrix m = zero_matrix(a, a.n + b.n, a.k);
    copy_rows(a, m, 0);
    copy_rows(b, m, a.n);
    return make_quantized_linear(std::move(name), std::move(m));
}

Linear pad_linear_rows(const Linear &w, int32_t multiple) {
    require_complete_int4(w, "pad_linear_rows");
    if (multiple < 1) fail(TL_ERR_INVALID_ARGUMENT, "pad_linear_rows: multiple must be >= 1");
    QuantizedMatrix m = zero_matrix(w, (w.n + multiple - 1) / multiple * multiple, w.k);
    copy_rows(w, m, 0);
    return make_quantized_linear(w.name, std::move(m));
}

Linear pad_linear_cols(const Linear &w, int32_t multiple) {
    require_complete_int4(w, "pad_linear_cols");
    if (multiple < 2 || multiple % 2 != 0) fail(TL_ERR_INVALID_ARGUMENT, "pad_linear_cols: multiple must be even");
    const int32_t k = (w.k + multiple - 1) / multiple * multiple;
    const bool per_row = w.group_size == w.k;
    if (!per_row && k % w.group_size != 0) {
        fail(TL_ERR_INVALID_ARGUMENT, "pad_linear_cols: '" + w.name + "': the group size " +
                                          std::to_string(w.group_size) + " does not divide the padded K = " +
                                          std::to_string(k));
    }
    QuantizedMatrix m = zero_matrix(w, w.n, k);
    const size_t groups = static_cast<size_t>(w.n_groups()), padded_groups = static_cast<size_t>(k / m.group_size);
    const size_t row_bytes = static_cast<size_t>(w.k) / 2, padded_row_bytes = static_cast<size_t>(k) / 2;
    for (size_t nn = 0; nn < static_cast<size_t>(w.n); ++nn) {
        std::memcpy(m.codes.data() + nn * padded_row_bytes, w.codes + nn * row_bytes, row_bytes);
        std::memcpy(m.scales.data() + nn * padded_groups, w.scales + nn * groups, groups * sizeof(uint16_t));
        std::memcpy(m.zeros.data() + nn * padded_groups, w.zeros + nn * groups, groups * sizeof(uint16_t));
    }
    return make_quantized_linear(w.name, std::move(m));
}

}  // namespace tl
