// Cross-iteration rounding: the rounding channels a quantizer writes next to the INT4 codes, and the rule
// that rounds the looped block's weights differently on each loop iteration so that their average over the
// `loops` iterations approaches the unquantized weight (docs/quality.md, docs/format.md).
#pragma once

#include <cstdint>

#include "format/model.hpp"
#include "quant/quant.hpp"

namespace tl {

// Fills m.frac4 and/or m.sign_bit from the unquantized weights w[n][k] that m was quantized from. With
// x = (w - z)/s the unrounded code and r = x - q the residual of the stored code q:
//   frac4    = clamp(floor((r + 1/2) * 16), 0, 15): the 4 bits of x + 1/2 below its integer part, which is q
//              when q is x rounded to nearest (codes' nibble layout);
//   sign_bit = 1 where r < 0, bit kk % 8 of byte [n][kk / 8] (needs k % 8 == 0).
void add_rounding_channels(const float *w, QuantizedMatrix &m, bool frac4, bool sign_bit);

// The residual code units the rule assumes for one cell, times 32 (an odd number in [-15, 15]): from frac4
// the centre of its 1/16 bucket, (2·frac4 - 15)/32; from sign_bit alone ±1/4 (8/32), the mean |r| of
// round-to-nearest.
inline int32_t cross_iter_residual32(int32_t frac4, bool has_frac4, bool sign_bit) {
    if (has_frac4) return 2 * frac4 - 15;
    return sign_bit ? -8 : 8;
}

// The code cell (nn, kk) uses on loop iteration `iteration` of `loops`, given its stored code q and its
// residual estimate r̂ = residual32/32. The cell moves one step toward r̂ (clamped to [0, 15]) on
// m = round(loops·|r̂|) of the iterations, namely those with (iteration + nn + kk) mod loops < m: the average
// code is then q + m/loops·sign(r̂), and the phase nn + kk spreads the moved cells evenly over the iterations.
inline uint8_t cross_iter_code(uint8_t q, int32_t residual32, int32_t nn, int32_t kk, int32_t iteration,
                               int32_t loops) {
    const int32_t magnitude = residual32 < 0 ? -residual32 : residual32;
    const int32_t moves = (loops * magnitude + 16) / 32;  // round(loops * |r̂|), halves up
    const int32_t phase = static_cast<int32_t>((static_cast<int64_t>(iteration) + nn + kk) % loops);
    if (phase >= moves) return q;
    const int32_t moved = q + (residual32 < 0 ? -1 : 1);
    return static_cast<uint8_t>(moved < 0 ? 0 : moved > 15 ? 15 : moved);
}

// Whether w carries a channel the rule reads.
inline bool has_rounding_channels(const Linear &w) {
    return w.quantized && (w.frac4 != nullptr || w.sign_bit != nullptr);
}

// A quantized Linear holding the codes of `iteration` (of `loops`) and no channels; `w` itself when it has no
// channels. The returned Linear owns its codes and shares the scales and zeros with `w`.
Linear cross_iter_linear(const Linear &w, int32_t iteration, int32_t loops);

// The looped block as applied on `iteration`: every linear through cross_iter_linear, the norms copied.
Block cross_iter_block(const Block &loop, int32_t iteration, int32_t loops);

}  // namespace tl
