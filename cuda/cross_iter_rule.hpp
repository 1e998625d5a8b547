// Cross-iteration rounding's per-cell rule, for the kernels that dequantize the looped block per iteration. It is the
// rule of cpp/quant/cross_iter.hpp (cuda/ includes nothing from cpp/); tests/cpp/cross_iter_rule_test.cpp checks
// that the two give the same code for every input.
#pragma once

#include <cstdint>

#include "host_device.hpp"

namespace tl::gpu {

// The residual the rule assumes, times 32: from frac4 the centre of its 1/16 bucket, from sign_bit alone ±1/4.
TL_HOST_DEVICE inline int32_t cross_iter_residual32(int32_t frac4, bool has_frac4, bool sign_bit) {
    if (has_frac4) return 2 * frac4 - 15;
    return sign_bit ? -8 : 8;
}

// The code of cell (nn, input) on `iteration` of `loops`: one step toward the residual's sign, clamped to [0, 15], on
// round(loops·|residual|) of the iterations, those with (iteration + nn + input) mod loops below that count.
TL_HOST_DEVICE inline uint32_t cross_iter_code(uint32_t q, int32_t residual32, int32_t nn, int32_t input,
                                               int32_t iteration, int32_t loops) {
    const int32_t magnitude = residual32 < 0 ? -residual32 : residual32;
    const int32_t moves = (loops * magnitude + 16) / 32;
    const int32_t phase = static_cast<int32_t>((static_cast<int64_t>(iteration) + nn + input) % loops);
    if (phase >= moves) return q;
    const int32_t moved = static_cast<int32_t>(q) + (residual32 < 0 ? -1 : 1);
    return static_cast<uint32_t>(moved < 0 ? 0 : moved > 15 ? 15 : moved);
}

}  // namespace tl::gpu
