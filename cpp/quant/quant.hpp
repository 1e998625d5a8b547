// Host-side INT4 / INT8 quantization and dequantization.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "format/model.hpp"

namespace tl {

enum class QuantMethod { Asymmetric, Symmetric };

// Owned INT4 or INT8 storage in the file's layout (see Linear).
struct QuantizedMatrix {
    int32_t k = 0;
    int32_t n = 0;
    int32_t group_size = 0;  // actual, == k for per-row
    int32_t bits = 4;
    std::vector<uint8_t> codes;    // bits 4: [n][k/2] nibbles; bits 8: [n][k] int8 (two's complement)
    std::vector<uint16_t> scales;  // [n][k/group_size] FP16 bits
    std::vector<uint16_t> zeros;   // bits 4: [n][k/group_size] FP16 bits; bits 8: empty
    std::vector<uint8_t> frac4;    // empty or [n][k/2]
    std::vector<uint8_t> sign_bit; // empty or [n][k/8]
    std::vector<int32_t> k_perm;   // empty or [k] (see Linear::k_perm)
};

// Min-max quantization of w[n][k] (row n = output column n). group_size 0 means per row.
//   Asymmetric: s = (max - min) / 15, z = min, q = clamp(round((w - z) / s), 0, 15)  =>  W = q*s + z.
//   Symmetric:  s = max(max / 7, -min / 8) (the second source document's maxq/minq rule), q = clamp(round(w / s),
//               -8, 7) + 8, stored with z = -8*s so that W = q*s + z = (q - 8)*s holds for both.
// s and z are rounded to FP16 first and q is computed against the rounded values. A constant group gets
// s = 0 only if its range is 0 (then W = z exactly).
// bits 8 (symmetric only; Asymmetric is TL_ERR_INVALID_ARGUMENT): s = max|w| / 127 rounded to FP16, q = clamp(round(w
// / s), -127, 127), W = q*s with no zero. K need not be even.
QuantizedMatrix quantize_minmax(const float *w, int32_t k, int32_t n, int32_t group_size, QuantMethod method,
                                int32_t bits = 4);

// INT8's nearest code of x for the FP16 scale s (0 when s is: the group is all zeros), and what it dequantizes to:
// q*s in FP32, exact (a 7-bit integer times an 11-bit significand).
inline int8_t int8_code(double x, float s) {
    return s == 0.0f ? 0 : static_cast<int8_t>(std::clamp(std::nearbyint(x / s), -127.0, 127.0));
}
inline float int8_value(int8_t q, float s) { return static_cast<float>(q) * s; }

// A Linear that owns `m` (through keepalive).
Linear make_quantized_linear(std::string name, QuantizedMatrix m);
// A dense F32 Linear that owns a copy of w[n][k].
Linear make_dense_linear(std::string name, const float *w, int32_t k, int32_t n);

// The INT4 code of W[kk, nn].
inline uint8_t code_at(const Linear &w, int32_t kk, int32_t nn) {
    const uint8_t byte = w.codes[static_cast<size_t>(nn) * (w.k / 2) + kk / 2];
    return (kk & 1) ? (byte >> 4) : (byte & 0x0F);
}

// Throws TL_ERR_INVALID_ARGUMENT "<what>: '<name>' is not a complete INT4 weight" unless w is 4-bit with codes,
// scales and zeros, an even K and whole groups.
void require_complete_int4(const Linear &w, const char *what);
// The same for any width: INT4 as above, or INT8 with codes, scales, no zeros or rounding channels and whole groups.
void require_complete_quantized(const Linear &w, const char *what);
// One quantized Linear whose rows (output columns) are a's then b's: N = a.n + b.n. The storage is out-major, so
// codes, scales and zeros are concatenations. a and b must agree on K, bits, group size and k_perm.
Linear concat_linear_rows(const Linear &a, const Linear &b, std::string name);
// A quantized Linear with N rounded up to a multiple of `multiple`; the padding rows have zero codes, scales and
// zeros (W = 0), and w's k_perm. Returns a copy when N already is a multiple.
Linear pad_linear_rows(const Linear &w, int32_t multiple);
// A quantized Linear with K rounded up to a multiple of `multiple`, for inputs padded with zero columns: each row's
// codes end in zero codes, and a grouped weight gains whole groups of zero scales and zeros (the group size must
// divide the padded K, else TL_ERR_INVALID_ARGUMENT); a per-row weight stays one group spanning the padded K. A
// k_perm is extended with the identity on the new rows. Returns a copy when K already is a multiple.
Linear pad_linear_cols(const Linear &w, int32_t multiple);

// Dequantizes (or converts, for dense) rows [n0, n1) of W into out[(nn - n0) * k + kk] = W[kk, nn], exactly:
// q*s + z (INT8: q*s) computed in FP32 from the FP16 s and z. kk is the input column: a k_perm is undone.
void dequantize_rows(const Linear &w, int32_t n0, int32_t n1, float *out);

}  // namespace tl
