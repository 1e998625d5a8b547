// Conversion of one quantized linear layer from the two common INT4 checkpoint layouts (GPTQ "v1" and AutoAWQ's
// GEMM layout) into the library's own INT4 layout (QuantizedMatrix; docs/format.md, "Importing GPTQ / AWQ weights").
#pragma once

#include <cstdint>
#include <string>

#include "quant/quant.hpp"

namespace tl {

enum class Int4Layout { Gptq, Awq };

// The checkpoint's tensors, borrowed (row-major, as the checkpoint stores them). G = k / group_size.
//   GPTQ (AutoGPTQ / GPTQModel "v1"): qweight int32 [k/8][n], word [r][c] holds W's rows 8r..8r+7 of column c,
//     low nibble first; qzeros int32 [G][n/8], word [g][c] holds columns 8c..8c+7, low nibble first, each stored as
//     zero - 1 (v1's off-by-one: the zero point is nibble + 1); scales FP16 [G][n]; g_idx optional int32 [k].
//   AWQ (AutoAWQ GEMM): qweight int32 [k][n/8] and qzeros int32 [G][n/8] packed along n with AWQ's interleaved
//     order (see int4_import.cpp); no off-by-one; scales FP16 [G][n]; no g_idx.
//   Both: W[k, n] = (q[k, n] - z[g, n]) * s[g, n], g = g_idx[k] (or k / group_size).
struct Int4Checkpoint {
    Int4Layout layout = Int4Layout::Gptq;
    int32_t k = 0;
    int32_t n = 0;
    int32_t group_size = 0;  // 0 (or k) = per row: one group
    const int32_t *qweight = nullptr;
    const int32_t *qzeros = nullptr;
    const uint16_t *scales = nullptr;  // FP16 bit patterns
    const int32_t *g_idx = nullptr;    // optional (GPTQ only)
    // 4, or 8 for the GPTQ layout: qweight [k/4][n] and qzeros [G][n/4], 4 codes (bytes, low first) per int32. INT8 is
    // stored symmetric (docs/format.md): every zero point must be 128, and a code q becomes q - 128 (never 0: -128
    // is outside the format's codes), else TL_ERR_UNSUPPORTED.
    int32_t bits = 4;
    // Prefix for the field names in error messages (e.g. "desc->").
    std::string field_prefix;
};

// Validates the shapes, pointers and g_idx (TL_ERR_INVALID_ARGUMENT naming the field) and converts: codes copied as
// they are, scales kept, zeros z' = -z * s computed in FP32 and rounded once to FP16, so W = q * s + z' equals the
// checkpoint's (q - z) * s up to that rounding. A g_idx that is not k / group_size (act-order, desc_act) stores each
// group's rows together, in K order, and sets k_perm; it must give every group group_size rows (as GPTQ's does),
// else TL_ERR_UNSUPPORTED.
QuantizedMatrix import_int4(const Int4Checkpoint &checkpoint);

// INT8 GPTQ's zero point for symmetric weights (2^(bits-1)), which v1 stores as 127.
constexpr int kInt8GptqZero = 128;

}  // namespace tl
