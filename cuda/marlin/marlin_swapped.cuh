// The swapped-operand arithmetic of the M <= 16 kernel (marlin_stream.cuh), on the packed weights of
// cpp/gpu/marlin_pack.hpp.
//
// Operands swapped: Y^T = W^T X^T. Lane L's packed word w (cpp/gpu/marlin_pack.hpp) is exactly the A fragment of
// mma.m16n8k16 for a 16 x 16 weight tile whose rows are the strip's columns 16w + L/4 (nibbles 0, 2, 4, 6) and
// 16w + 8 + L/4 (nibbles 1, 3, 5, 7). So the weights are A and the activations B, 8 rows per mma: M <= 8 needs
// one n8 tile (half the mma of a 16-row A tile), M <= 16 two.
//
// No per-weight scaling: nibbles reach the mma unscaled, 7 instructions per 8 weights (one shift, 4 lop3 with the
// 0x6400 magic number, 2 HADD2): rows L/4 as q (1024 + q minus 1024, exact), rows L/4 + 8 as 1024 + 16q (the
// 0x00F000F0 mask, left biased). Scale and zero are applied per group on the FP32 sums instead:
//   T = sum_k x_k a_k over the group (a_k = q_k or 1024 + 16 q_k),  X = sum_k x_k (one more mma, A = ones),
//   y += s T + z X  (rows L/4),   y += (s / 16) T + (z - 64 s) X  (rows L/4 + 8),   symmetric mode: z = -8 s.
// Sums are folded into the output accumulators at each group end, and at least every 128 k (per-column scales,
// groups longer than 128), so the 1024 X bias inside T stays small next to FP32's precision.
#pragma once

#include "marlin_device.cuh"

namespace tl::gpu::marlin {

// One packed word -> the A fragment {a0, a1, a2, a3} of its 16 x 16 weight tile: a0, a2 (rows L/4) hold q exactly,
// a1, a3 (rows L/4 + 8) hold 1024 + 16q.
__device__ __forceinline__ void unpack_word(uint32_t q, uint32_t (&a)[4]) {
    constexpr uint32_t kLo = 0x000F000Fu, kHi = 0x00F000F0u, kMagic = 0x64006400u;
    const half2 minus1024 = as_h2(0xE400E400u);
    a[0] = as_u32(__hadd2(as_h2(and_or(q, kLo, kMagic)), minus1024));
    a[1] = and_or(q, kHi, kMagic);
    q >>= 8;
    a[2] = as_u32(__hadd2(as_h2(and_or(q, kLo, kMagic)), minus1024));
    a[3] = and_or(q, kHi, kMagic);
}

// One packed word -> the A fragment of its 16 x 16 weight tile, both row halves left biased: a0, a2 (rows L/4) hold
// 1024 + q, a1, a3 (rows L/4 + 8) 1024 + 16q; 5 instructions per 8 weights (unpack_word spends two more to remove the
// first bias). The fold removes both through the activation sums: y += s T + (z - 1024 s) X
// on rows L/4. Precision: T carries 1024 X, so FP32 keeps ~2^-23 x 1024 |X| of absolute error per 128-k fold, about
// 1e-5 of a typical sum; measured by MarlinPrecision.PerRowLongK.
__device__ __forceinline__ void unpack_word_biased(uint32_t q, uint32_t (&a)[4]) {
    constexpr uint32_t kLo = 0x000F000Fu, kHi = 0x00F000F0u, kMagic = 0x64006400u;
    a[0] = and_or(q, kLo, kMagic);
    a[1] = and_or(q, kHi, kMagic);
    q >>= 8;
    a[2] = and_or(q, kLo, kMagic);
    a[3] = and_or(q, kHi, kMagic);
}

// mma_16816 with a zero accumulator input (the first k16 step of a fold period).
__device__ __forceinline__ void mma_16816_first(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%10, %10, %10, %10};\n"
        : "=f"(c[0]), "=f"(c[1]), "=f"(c[2]), "=f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(0.0f));
}

// y += s T + (z - LO_BIAS s) X on rows L/4 and y += (s / 16) T + (z - 64 s) X on rows L/4 + 8, per column; symmetric
// mode z = -8 s. `scales` / `zeros`: the lane's 8 FP16 values, (column 16w + L/4, column 16w + 8 + L/4) for w = 0..3.
template <int NB, bool FUSED, int LO_BIAS>
__device__ __forceinline__ void fold_sums(float (&acc)[4][NB][4], const float (&t)[4][NB][4], const float (&xs)[NB][4],
                                          const uint8_t *scales, const uint8_t *zeros) {
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
        const float s_lo = s.x, s_hi = s.y * 0.0625f;
        float c_lo, c_hi;
        if constexpr (FUSED) {
            const float2 z = __half22float2(as_h2(z_pairs[w]));
            c_lo = LO_BIAS == 0 ? z.x : fmaf(-static_cast<float>(LO_BIAS), s.x, z.x);
            c_hi = fmaf(-64.0f, s.y, z.y);
        } else {
            c_lo = -static_cast<float>(8 + LO_BIAS) * s.x;
            c_hi = -72.0f * s.y;
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
template <int NB>
__device__ __forceinline__ void store_strip(uint16_t *y0, int n, const float (&acc)[4][NB][4], int row0, int m) {
#pragma unroll
    for (int nb = 0; nb < NB; ++nb) {
#pragma unroll
        for (int w = 0; w < 4; ++w) {
            store_quad(y0 + static_cast<size_t>(nb * 8) * n + 16 * w, n, acc[w][nb][0], acc[w][nb][2], acc[w][nb][1],
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
// The last contributor: the reduced sums to Y, the workspace re-zeroed.
template <int NB>
__device__ __forceinline__ void take_strip_partials(float *part, uint16_t *y0, int n, int row0, int m) {
#pragma unroll
    for (int nb = 0; nb < NB; ++nb) {
#pragma unroll
        for (int w = 0; w < 4; ++w) {
            const int rows = quad_rows(row0 + nb * 8, m);
            const float4 v = take_partial_quad(part + (nb * 4 + w) * 128, rows);
            store_quad(y0 + static_cast<size_t>(nb * 8) * n + 16 * w, n, v.x, v.y, v.z, v.w, rows);
        }
    }
}

// One k16 step of a warp's strip: the four packed words of the step against NB
// activation tiles (b[nb][h], b[nb][h + 1] are b0, b1), into the unscaled sums t, and the activation sums xs (A =
// ones). FIRST: the step opens a fold period (zero-input mma). BIASED: rows L/4 keep their 1024 bias
// (unpack_word_biased, 5 instructions per word instead of 7; the fold removes it).
template <int NB, bool BIASED>
__device__ __forceinline__ void unscaled_k16_step(float (&t)[4][NB][4], float (&xs)[NB][4], uint4 wq,
                                                  const uint32_t (&b)[NB][4], int h, bool first) {
    constexpr uint32_t kOnes = 0x3C003C00u;  // FP16 (1, 1)
    const uint32_t ones[4] = {kOnes, kOnes, kOnes, kOnes};
    const uint32_t words[4] = {wq.x, wq.y, wq.z, wq.w};
#pragma unroll
    for (int w = 0; w < 4; ++w) {
        uint32_t a[4];
        if constexpr (BIASED) {
            unpack_word_biased(words[w], a);
        } else {
            unpack_word(words[w], a);
        }
#pragma unroll
        for (int nb = 0; nb < NB; ++nb) {
            if (first) {
                mma_16816_first(t[w][nb], a, b[nb][h], b[nb][h + 1]);
            } else {
                mma_16816(t[w][nb], a, b[nb][h], b[nb][h + 1]);
            }
        }
    }
#pragma unroll
    for (int nb = 0; nb < NB; ++nb) {
        if (first) {
            mma_16816_first(xs[nb], ones, b[nb][h], b[nb][h + 1]);
        } else {
            mma_16816(xs[nb], ones, b[nb][h], b[nb][h + 1]);
        }
    }
}

}  // namespace tl::gpu::marlin
