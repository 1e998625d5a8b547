// Quantized activations on the CPU backend: each linear input row (token) quantized to INT8 or FP8 e4m3 with one
// scale, then multiplied with the weight's integer codes in exact integer (INT8) or exact (FP8) group sums, the
// scales and zero offsets applied once per group in FP32 in a fixed order. The reference for GPU kernels that
// quantize activations; the rule is in docs/quality.md, "Activation precision".
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "format/model.hpp"
#include "score/score_plan.hpp"

namespace tl {

// x rounded to the nearest integer, ties to even, whatever the floating-point rounding mode. |x| < 2^31.
float round_half_even(float x);

// The FP8 e4m3 (OCP "e4m3fn": no infinities, max 448, subnormals down to 2^-9) value nearest v, ties to even,
// saturating to +-448 beyond it. -0 and 0 give 0. v must not be NaN.
float round_to_e4m3(float v);

// One row's INT8 quantization: s = max|x| / 127 (FP32), q[k] = clamp(round_half_even(x[k] / s), -127, 127).
// An all-zero row gives s = 0 and q = 0; a row holding Inf or NaN gives s = NaN and q = 0 (its outputs are NaN).
float quantize_row_int8(const float *x, int32_t k, int8_t *q);
// One row's FP8 quantization: s = max|x| / 448 (FP32), e[k] = round_to_e4m3(x[k] / s) (a float holding an e4m3
// value). Zero and non-finite rows as quantize_row_int8.
float quantize_row_fp8(const float *x, int32_t k, float *e);

// The inputs of one linear call, quantized per row, in the weight's stored K order (k_perm applied), with each row's
// sums over the weight's groups: INT8's exact int32 sums, FP8's exact sums rounded once to FP32.
struct QuantizedInput {
    ActivationMode mode = ActivationMode::Int8;
    int32_t rows = 0, k = 0, group_size = 0, groups = 0;
    std::vector<int8_t> q;            // INT8: [rows][k]
    std::vector<float> e;             // FP8: [rows][k]
    // FP8: [rows][2k], e * 2^9 (every e4m3 value is an integer multiple of 2^-9) split as 512 * hi + lo, lo in
    // [0, 512): each row's k his, then its k los.
    std::vector<int16_t> e_units;
    std::vector<float> scale;         // [rows]
    std::vector<int32_t> group_sum;   // INT8: [rows][groups]
    std::vector<float> group_sum_f;   // FP8: [rows][groups]
};

// Sizes `in` for `rows` rows of w's input in `mode` (Int8 or Fp8). TL_ERR_UNSUPPORTED for a weight the integer path
// cannot take exactly (a quantized weight that is not 4-bit, a dense K above 2^17: its int32 sums could overflow).
void prepare_quantized_input(const Linear &w, int32_t rows, ActivationMode mode, QuantizedInput &in);
// Quantizes rows [r0, r1) of x ([rows][w.k]) into `in` (sized by prepare_quantized_input). Different threads may
// quantize disjoint row ranges at once.
void quantize_input_rows(const Linear &w, const float *x, int32_t r0, int32_t r1, QuantizedInput &in);

// One worker's weight scratch for a column tile: codes (INT4 codes, or a dense weight's INT8 codes), FP8 values,
// per-group scales and zero offsets as FP32.
struct QuantTileScratch {
    std::vector<int8_t> codes;   // [cols][k]
    std::vector<float> values;   // [cols][k]
    std::vector<float> scales;   // [cols][groups]
    std::vector<float> zeros;    // [cols][groups]
};

// Columns [n0, n1) of y ([in.rows][ldy]) for every row of `in`: y[m][n] = s_x * sum_g (s[g,n] * D[g] + z[g,n] * S[g])
// in FP32, g in order, plus the bias; see docs/quality.md. A dense weight is first quantized per output column
// (symmetric INT8 or e4m3 with s = max|W[:,n]| / 127 or 448, z = 0).
void quantized_input_tile(const Linear &w, const QuantizedInput &in, int32_t n0, int32_t n1, float *y, size_t ldy,
                          QuantTileScratch &scratch);

// Makes quantized_input_tile use its portable dot products instead of AVX2 (tests; use_portable_cpu_kernel sets it).
void use_portable_act_quant_kernel(bool portable);

// Bytes quantized activations add to a scoring call's working memory: `rows` rows of K up to k_max, and each
// worker's tile scratch.
uint64_t act_quant_bytes(int32_t rows, int32_t k_max, int32_t workers, int32_t tile_cols);

}  // namespace tl
