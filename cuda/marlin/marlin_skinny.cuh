// The Marlin-class INT4 x FP16 GEMM for M <= 16 ("skinny", SM 8.0 - 9.0): Y[M, N] = X[M, K] @ W[K, N], the same
// packed weights, tiles (8 warps x 64-column strips = 512 columns), cp.async ring and stream-K reduction as the
// M > 16 kernel in marlin_kernel.cuh. What differs is how the weights meet the tensor cores.
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
//
// Slices (pipeline stages) are 64 deep, or 128 (KS = 8) for M <= 8 when 128 divides K and the group size: half the
// per-slice overhead (barrier, copy bookkeeping, loop), and every slice ends with a fold.
#pragma once

#include "marlin_device.cuh"

namespace tl::gpu::marlin {

constexpr int kSkinnyPartialFloats = kWarps * 4 * 32 * 4;  // FP32 partial sums of one 8-row block of a tile

template <int NB, bool FUSED, int GPT, int KS>
struct SkinnySmem {
    static constexpr int kSliceK = KS * 16;
    static constexpr int kRow = kSliceK * 2;         // bytes of one activation row of a slice
    static constexpr int kB = kSliceK * kTileN / 2;  // weights: [warp][k16][lane][16 B], as in global memory
    static constexpr int kA = NB * 8 * kRow;         // activations: NB*8 rows, 16-byte chunks XOR-swizzled by row
    static constexpr int kS = GPT * kTileN * 2;      // scales, then zeros: [GPT][512] FP16, permuted as in global
    static constexpr int kStage = skinny_stage_bytes(NB, FUSED, GPT, KS);
    static_assert(kStage == kB + kA + kS * (FUSED ? 2 : 1), "stage layout: [weights | activations | scales | zeros]");
};

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

// One k16 step of a warp's strip (shared with marlin_stream.cuh): the four packed words of the step against NB
// activation tiles (b[nb][h], b[nb][h + 1] are b0, b1), into the unscaled sums t, and the activation sums xs (A =
// ones). FIRST: the step opens a fold period (zero-input mma). BIASED: rows L/4 keep their 1024 bias
// (unpack_word_biased, 5 instructions per word instead of 7; the fold removes it).
template <int NB, bool BIASED>
__device__ __forceinline__ void unscaled_k16_step(float (&t)[4][NB][4], float (&xs)[NB][4], uint4 wq,
                                                  const uint32_t (&b)[NB][4], int h, bool first);

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

template <int NB, bool FUSED, int GPT, int KS>
__global__ void __launch_bounds__(kThreads, 2) marlin_skinny_kernel(const Params p) {
    static_assert(KS == 4 || (KS == 8 && GPT == 1), "128-deep slices need a group size that 128 divides");
    using L = SkinnySmem<NB, FUSED, GPT, KS>;
    // A fold at the end of every slice (then the next slice starts its sums from zero-input mma): 128-deep slices.
    constexpr bool kFoldEverySlice = KS == 8;
    extern __shared__ __align__(128) uint8_t smem[];
    __shared__ int last_contributor;

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const long long begin = static_cast<long long>(blockIdx.x) * p.total_iters / gridDim.x;
    const long long end = (static_cast<long long>(blockIdx.x) + 1) * p.total_iters / gridDim.x;
    if (begin >= end) return;  // more blocks than k slices: nobody waits for an empty block
    const int strips = p.n / 64;

    // ---- Copy side. Every lane copies KS x 16 B of its warp's strip; threads < NB*16*KS one activation chunk (row
    // tid / (2KS), chunk tid % (2KS), zero-filled past M); threads [0, GPT*64) one chunk of scales, [128,
    // 128 + GPT*64) one of zeros. The source offsets of the next slice to fetch step by increments within a tile;
    // the divisions happen once per tile.
    const int a_row = tid / (2 * KS), a_chunk = tid % (2 * KS);
    const bool copies_x = tid < NB * 16 * KS;
    const int sz_part = tid / 128, sz_idx = tid % 128;
    const bool copies_sz = sz_idx < GPT * 64 && (sz_part == 0 || FUSED);
    const uint32_t w_dst = warp * (KS * 512) + lane * 16;
    const uint32_t x_dst = L::kB + a_row * L::kRow + ((a_chunk ^ (a_row % 8)) * 16);
    const uint32_t sz_dst = L::kB + L::kA + sz_part * L::kS + (sz_idx / 64) * (kTileN * 2) + (sz_idx % 64) * 16;
    // Offsets (not pointers: fewer registers) of this thread's sources, in elements of words (uint4), x, scales.
    int f_tile = 0, f_kt = 0, f_k_left = 0;
    uint32_t f_w = 0, f_x = 0, f_sz = 0;
    bool f_w_ok = false, f_x_ok = false, f_sz_ok = false;
    auto locate = [&](int tile, int kt) {
        f_tile = tile;
        f_kt = kt;
        const int n_tile = tile / p.m_slices, m_slice = tile - n_tile * p.m_slices;
        const int strip = n_tile * kWarps + warp;
        f_w_ok = strip < strips;
        f_w = (strip * (p.k / 16) + kt * KS) * 32 + lane;
        const int row = m_slice * NB * 8 + a_row;
        f_x_ok = row < p.m;  // else the zero-fill copy reads nothing; row 0 keeps the address valid
        f_x = (f_x_ok ? row * p.k : 0) + kt * L::kSliceK + a_chunk * 8;
        const int ch = sz_idx % 64;
        f_sz_ok = copies_sz && n_tile * kWarps + ch / 8 < strips;
        const int group = GPT == 2 ? kt * 2 + sz_idx / 64 : kt * L::kSliceK / p.group_size;
        f_sz = group * p.n + n_tile * kTileN + ch * 8;
        f_k_left = p.group_size - kt * L::kSliceK % p.group_size;  // k left in the group (GPT = 1)
    };
    auto advance = [&]() {
        if (++f_kt == p.k_tiles) {
            locate(f_tile + 1, 0);
            return;
        }
        f_w += KS * 32;
        f_x += L::kSliceK;
        if constexpr (GPT == 2) {
            f_sz += 2 * p.n;
        } else if ((f_k_left -= L::kSliceK) == 0) {
            f_k_left = p.group_size;
            f_sz += p.n;
        }
    };
    const uint32_t smem_base = smem_addr(smem);
    auto load_stage = [&](int stage) {
        const uint32_t st = smem_base + stage * L::kStage;
        if (f_w_ok) {
            const uint4 *src = reinterpret_cast<const uint4 *>(p.words) + f_w;
#pragma unroll
            for (int j = 0; j < KS; ++j) cp_async16(st + w_dst + j * 512, src + 32 * j);
        }
        if (copies_x) cp_async16_zfill(st + x_dst, p.x + f_x, f_x_ok);
        if (f_sz_ok) cp_async16(st + sz_dst, (sz_part == 0 ? p.scales : p.zeros) + f_sz);
    };

    // ---- Compute side. t: this group's unscaled sums, xs: its activation sums, acc: the folded output. In the
    // swapped mma, lane L holds rows (= columns 16w + L/4, 16w + 8 + L/4 of the strip) x activation rows
    // nb*8 + 2(L%4) + {0, 1}: c[0], c[1] the first column, c[2], c[3] the second.
    const int g = lane / 4;
    float acc[4][NB][4], t[4][NB][4], xs[NB][4];
#pragma unroll
    for (int w = 0; w < 4; ++w) {
        zero(acc[w]);
        zero(t[w]);
    }
    zero(xs);
    // ldmatrix: lane L addresses row L%8 of matrix L/8, i.e. chunk 4p + L/8 for the k16 pair p, at the swizzled
    // offset ((4p + L/8) ^ L%8) * 16 = (((L/8) ^ L%8) * 16) ^ 64p.
    const uint32_t x_lane = (lane % 8) * L::kRow + (((lane / 8) ^ (lane % 8)) * 16);

    // y += s T + c X per column (see the top of the file), from the scale (and zero) row `row` of the stage.
    auto fold = [&](const uint8_t *st, int row) {
        const uint8_t *scales = st + L::kB + L::kA + (row * kTileN + warp * 64 + g * 8) * 2;
        fold_sums<NB, FUSED, 0>(acc, t, xs, scales, scales + GPT * kTileN * 2);
        if constexpr (!kFoldEverySlice) {
#pragma unroll
            for (int w = 0; w < 4; ++w) zero(t[w]);
            zero(xs);
        }
    };

    auto compute_stage = [&](int stage, bool fold_now) {
        const uint8_t *st = smem + stage * L::kStage;
        const uint4 *w_src = reinterpret_cast<const uint4 *>(st) + warp * (KS * 32) + lane;
        const uint32_t x_base = smem_base + stage * L::kStage + L::kB;
        uint32_t b[NB][4];  // activation fragments of two k16 steps, loaded at the even one (fewer live registers)
#pragma unroll
        for (int k16 = 0; k16 < KS; ++k16) {
            if (k16 % 2 == 0) {
#pragma unroll
                for (int nb = 0; nb < NB; ++nb) ldmatrix_x4(b[nb], x_base + nb * 8 * L::kRow + (x_lane ^ (32 * k16)));
            }
            unscaled_k16_step<NB, false>(t, xs, w_src[k16 * 32], b, 2 * (k16 % 2), kFoldEverySlice && k16 == 0);
            if (GPT == 2 && k16 == KS / 2 - 1) fold(st, 0);  // group size 32: the first group ends here
        }
        if (fold_now) fold(st, GPT - 1);
    };

    // Writes (or, for a tile cut between blocks, reduces) the finished tile `tile`, of which this block did `iters`
    // k slices. The reduction is that of marlin_kernel.cuh; workspace layout [warp][nb][w][lane][4] with the four
    // values ordered (row r, column c), (r, c + 8), (r + 1, c), (r + 1, c + 8).
    auto finish_tile = [&](int tile, int iters) {
        const int n_tile = tile / p.m_slices, m_slice = tile - n_tile * p.m_slices;
        const bool warp_active = n_tile * kWarps + warp < strips;
        const int row0 = m_slice * NB * 8 + 2 * (lane % 4);
        uint16_t *y0 = p.y + static_cast<size_t>(row0) * p.n + n_tile * kTileN + warp * 64 + g;
        if (iters == p.k_tiles) {  // the whole tile is ours
            if (warp_active) store_strip<NB>(y0, p.n, acc, row0, p.m);
            return;
        }
        const long long first = static_cast<long long>(tile) * p.k_tiles;
        const int slot = static_cast<int>(((first + 1) * gridDim.x - 1) / p.total_iters);
        float *part = p.partials + static_cast<size_t>(slot) * (NB * kSkinnyPartialFloats) + warp * (NB * 512) +
                      lane * 4;
        if (warp_active) add_strip_partials<NB>(part, acc, row0, p.m);
        if (!arrive_last(p.counters + slot, iters, p.k_tiles, last_contributor)) return;
        if (warp_active) take_strip_partials<NB>(part, y0, p.n, row0, p.m);
        if (tid == 0) p.counters[slot] = 0;
    };

    locate(static_cast<int>(begin / p.k_tiles), static_cast<int>(begin % p.k_tiles));
    const int total = static_cast<int>(end - begin);  // this block's k slices
    int to_fetch = total;
    for (int s = 0; s < p.stages - 1; ++s) {
        if (to_fetch > 0) {
            load_stage(s);
            advance();
            --to_fetch;
        }
        cp_async_commit();  // empty groups keep the group count uniform for wait_group
    }

    // 64-deep slices: fold every slice, or every second one (at odd k slices) when 128 divides the group size.
    const int fold_mask = !kFoldEverySlice && GPT == 1 && p.group_size % 128 == 0 ? 1 : 0;
    // Outer loop: the tile segments of our range; inner loop: their k slices (the hot loop, kept free of the
    // epilogue so that the register allocator sees the accumulators and the fragments only).
    int stage = 0;
    for (int done = 0; done < total;) {
        const long long it = begin + done;
        const int tile = static_cast<int>(it / p.k_tiles);
        const int kt_begin = static_cast<int>(it - static_cast<long long>(tile) * p.k_tiles);
        const int kt_end = std::min(kt_begin + total - done, p.k_tiles);
        const bool warp_active = (tile / p.m_slices) * kWarps + warp < strips;
#pragma unroll 1
        for (int kt = kt_begin; kt < kt_end; ++kt) {
            cp_async_wait_pending(p.stages - 2);
            __syncthreads();  // stage `stage` landed for everyone; everyone is done with the stage refilled below
            if (to_fetch > 0) {
                load_stage(stage == 0 ? p.stages - 1 : stage - 1);
                advance();
                --to_fetch;
            }
            cp_async_commit();
            if (warp_active) {
                compute_stage(stage, kFoldEverySlice || (kt & fold_mask) == fold_mask || kt + 1 == kt_end);
            }
            stage = stage == p.stages - 1 ? 0 : stage + 1;
        }
        finish_tile(tile, kt_end - kt_begin);
#pragma unroll
        for (int w = 0; w < 4; ++w) zero(acc[w]);
        done += kt_end - kt_begin;
    }
    cp_async_wait<0>();
}

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

template <int NB, bool FUSED, int GPT, int KS>
int launch_skinny(Params p, const LaunchEnv &env) {
    static std::atomic<int> stages_cache[64][2];
    // Each contributor to a cut tile adds rows x 512 FP32 partial sums to the same addresses: as M grows, fewer
    // contributors per tile (at least ceil(M / 4) k slices per block, up to 4).
    const long long min_iters = std::max(1, std::min(4, (p.m + 3) / 4));
    return launch_kernel(marlin_skinny_kernel<NB, FUSED, GPT, KS>, p, env, skinny_stage_bytes(NB, FUSED, GPT, KS),
                         env.max_blocks_per_sm, min_iters, NB * kSkinnyPartialFloats, stages_cache);
}

}  // namespace tl::gpu::marlin
