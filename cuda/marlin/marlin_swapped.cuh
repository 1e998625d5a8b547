// The swapped-operand arithmetic of the M <= 16 kernel (marlin_stream.cuh), on the packed weights of
// marlin_layout.hpp.
//
// Operands swapped: Y^T = W^T X^T. Lane L's packed word w (marlin_layout.hpp) is exactly the A fragment of
// mma.m16n8k16 for a 16 x 16 weight tile whose rows are the strip's columns 16w + L/4 (nibbles 0, 2, 4, 6) and
// 16w + 8 + L/4 (nibbles 1, 3, 5, 7). So the weights are A and the activations B, 8 rows per mma: M <= 8 needs
// one n8 tile (half the mma of a 16-row A tile), M <= 16 two.
//
// No per-weight scaling: nibbles reach the mma unscaled and left biased, 5 instructions per 8 weights in FP16 (rows L/4
// as 1024 + q, rows L/4 + 8 as 1024 + 16q: lop3 with the 0x6400 magic number) and 7 in BF16 (every row 128 + q).
// Scale and zero are applied per group on the FP32 sums instead:
//   T = sum_k x_k a_k over the group (a_k the biased nibble),  X = sum_k x_k (one more mma, A = ones),
//   y += s T + (z - 1024 s) X  (FP16 rows L/4),   y += (s / 16) T + (z - 64 s) X  (FP16 rows L/4 + 8),
//   y += s T + (z - 128 s) X  (BF16),   symmetric mode: z = -8 s.
// Sums are folded into the output accumulators at each group end, and at least every 128 k (per-column scales,
// groups longer than 128), so the bias inside T stays small next to FP32's precision.
#pragma once

#include "marlin_device.cuh"

namespace tl::gpu::marlin {

// One packed word -> the A fragment {a0, a1, a2, a3} of its 16 x 16 weight tile, every value left biased.
// FP16: a0, a2 (rows L/4) hold 1024 + q, a1, a3 (rows L/4 + 8) 1024 + 16q; 5 instructions per 8 weights. BF16 (whose
// 7 mantissa bits hold a nibble only in bits 0-3, see dequant_word): every row 128 + q, 7 instructions. The fold
// removes the biases through the activation sums (fold_sums). Precision: T carries 1024 X (FP16) or 128 X (BF16), so
// FP32 keeps ~2^-23 x 1024 |X| of absolute error per 128-k fold, about 1e-5 of a typical sum; measured by
// MarlinPrecision.PerRowLongK.
template <Dtype D>
__device__ __forceinline__ void unpack_word_biased(uint32_t q, uint32_t (&a)[4]) {
    constexpr uint32_t kLo = 0x000F000Fu;
    if constexpr (D == Dtype::F16) {
        constexpr uint32_t kHi = 0x00F000F0u, kMagic = 0x64006400u;
        a[0] = and_or(q, kLo, kMagic);
        a[1] = and_or(q, kHi, kMagic);
        q >>= 8;
        a[2] = and_or(q, kLo, kMagic);
        a[3] = and_or(q, kHi, kMagic);
    } else {
#pragma unroll
        for (int i = 0; i < 4; ++i) a[i] = and_or(q >> (4 * i), kLo, 0x43004300u);
    }
}

// The biases unpack_word_biased leaves: rows L/4 hold kLoBias + q; rows L/4 + 8 hold kHiBias + q times 1 / kHiScale.
template <Dtype D>
struct UnpackBias {
    static constexpr float kLoBias = D == Dtype::F16 ? 1024.0f : 128.0f;
    static constexpr float kHiScale = D == Dtype::F16 ? 0.0625f : 1.0f;
    static constexpr float kHiBias = D == Dtype::F16 ? 64.0f : 128.0f;
};

// y += s T + (z - kLoBias s) X on rows L/4 and y += (s kHiScale) T + (z - kHiBias s) X on rows L/4 + 8 (UnpackBias),
// per column; symmetric mode z = -8 s. `scales` / `zeros`: the lane's 8 FP16 values, (column 16w + L/4, column 16w +
// 8 + L/4) for w = 0..3.
template <int NB, bool FUSED, Dtype D>
__device__ __forceinline__ void fold_sums(float (&acc)[4][NB][4], const float (&t)[4][NB][4], const float (&xs)[NB][4],
                                          const uint8_t *scales, const uint8_t *zeros) {
    using B = UnpackBias<D>;
    const uint4 sv = *reinterpret_cast<const uint4 *>(scales);
    const uint32_t s_pairs[4] = {sv.x, sv.y, sv.z, sv.w};
    uint32_t z_pairs[4] = {0u, 0u, 0u, 0u};
    if constexpr (FUSED) {
        const uint4 zv = *reinterpret_cast<const uint4 *>(zeros);
        z_pairs[0] = zv.x, z_pairs[1] = zv.y, z_pairs[2] = zv.z, z_pairs[3] = zv.w;
    }
#pragma unroll
    for (int w = 0; w < 4; ++w) {
        const float2 s = __half22float2(as_h2(s_pairs[w]));
        const float s_lo = s.x, s_hi = s.y * B::kHiScale;
        float c_lo, c_hi;
        if constexpr (FUSED) {
            const float2 z = __half22float2(as_h2(z_pairs[w]));
            c_lo = fmaf(-B::kLoBias, s.x, z.x);
            c_hi = fmaf(-B::kHiBias, s.y, z.y);
        } else {
            c_lo = -(8.0f + B::kLoBias) * s.x;
            c_hi = -(8.0f + B::kHiBias) * s.y;
        }
#pragma unroll
        for (int nb = 0; nb < NB; ++nb) {
            float(&a)[4] = acc[w][nb];
            const float(&u)[4] = t[w][nb];
            a[0] = fmaf(s_lo, u[0], fmaf(c_lo, xs[nb][0], a[0]));
            a[1] = fmaf(s_lo, u[1], fmaf(c_lo, xs[nb][1], a[1]));
            a[2] = fmaf(s_hi, u[2], fmaf(c_hi, xs[nb][0], a[2]));
            a[3] = fmaf(s_hi, u[3], fmaf(c_hi, xs[nb][1], a[3]));
        }
    }
}

// The epilogue of a warp's strip x NB activation tiles (shared with marlin_stream.cuh). y0 = &Y[row0][column 16w +
// L/4 of w = 0], row0 = the lane's first activation row (2(L%4) in the tile); partial sums laid out [nb][w][lane][4]
// from `part` = the strip's base + 4 L, in the quad order of marlin_device.cuh.
template <int NB, Dtype D>
__device__ __forceinline__ void store_strip(uint16_t *y0, int n, const float (&acc)[4][NB][4], int row0, int m) {
#pragma unroll
    for (int nb = 0; nb < NB; ++nb) {
#pragma unroll
        for (int w = 0; w < 4; ++w) {
            store_quad<D>(y0 + static_cast<size_t>(nb * 8) * n + 16 * w, n, acc[w][nb][0], acc[w][nb][2], acc[w][nb][1],
                       acc[w][nb][3], quad_rows(row0 + nb * 8, m));
        }
    }
}
template <int NB>
__device__ __forceinline__ void add_strip_partials(float *part, const float (&acc)[4][NB][4], int row0, int m) {
#pragma unroll
    for (int nb = 0; nb < NB; ++nb) {
#pragma unroll
        for (int w = 0; w < 4; ++w) {
            add_partial_quad(part + (nb * 4 + w) * 128, acc[w][nb][0], acc[w][nb][2], acc[w][nb][1], acc[w][nb][3],
                             quad_rows(row0 + nb * 8, m));
        }
    }
}
// One k16 step of a warp's strip: the four packed words of the step against NB activation tiles (b[nb][h],
// b[nb][h + 1] are b0, b1), into the unscaled sums t, and the activation sums xs (A = ones). first: the step opens a
// fold period (zero-input mma).
template <int NB, Dtype D>
__device__ __forceinline__ void unscaled_k16_step(float (&t)[4][NB][4], float (&xs)[NB][4], uint4 wq,
                                                  const uint32_t (&b)[NB][4], int h, bool first) {
    constexpr uint32_t kOnes = D == Dtype::F16 ? 0x3C003C00u : 0x3F803F80u;  // (1, 1)
    const uint32_t ones[4] = {kOnes, kOnes, kOnes, kOnes};
    const uint32_t words[4] = {wq.x, wq.y, wq.z, wq.w};
    auto mma = [&](float(&c)[4], const uint32_t(&a)[4], int nb) {
        if (first) {
            mma_16816<D, true>(c, a, b[nb][h], b[nb][h + 1]);
        } else {
            mma_16816<D>(c, a, b[nb][h], b[nb][h + 1]);
        }
    };
#pragma unroll
    for (int w = 0; w < 4; ++w) {
        uint32_t a[4];
        unpack_word_biased<D>(words[w], a);
#pragma unroll
        for (int nb = 0; nb < NB; ++nb) mma(t[w][nb], a, nb);
    }
#pragma unroll
    for (int nb = 0; nb < NB; ++nb) mma(xs[nb], ones, nb);
}

}  // namespace tl::gpu::marlin
