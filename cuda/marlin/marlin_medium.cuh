// The Marlin-class INT4 x FP16 GEMM for 16 < M <= 64 ("medium", SM 8.0 - 9.0): Y[M, N] = X[M, K] @ W[K, N], the
// same packed weights, 512-column tiles, 64-deep cp.async ring and stream-K reduction as the other two kernels.
//
// Operands swapped as in marlin_skinny.cuh: the packed word of lane L is the A fragment of mma.m16n8k16 for a
// 16 x 16 weight tile (rows = 16 columns of the strip), the activations are B, 8 rows per n8 tile. Each dequantized
// A fragment feeds NB mma's (NB = 3 or 4 activation tiles), so the weights, the dominant traffic, are read and
// dequantized once per 8 * NB rows.
//
// What differs from the skinny kernel: the scale is applied to every weight (marlin_device.cuh's dequant_word:
// exact q, then one HFMA2 q*s + z, 13 instructions per 8 weights) instead of folding unscaled sums per group. The
// fold needs three accumulator sets (sums, activation sums, output: 36 NB registers), which does not fit at NB = 4;
// here one set (16 NB) does, and at 3-4 mma per word the dequantization is cheap next to the tensor work.
//
// Warps: WM * 8 per block (WM = 1: 256 threads, two blocks per SM; WM = 2: 512 threads, one block per SM), so 16
// warps per SM either way at <= 128 registers. Warp w owns strip w % 8 of the tile and activation rows
// [(w / 8) * NB * 8, + NB * 8): with WM = 2 two warps share each strip (each dequantizes it; the alternative, one
// warp holding 64 rows, needs 128 accumulator registers and leaves 8 warps per SM, what the M > 16 kernel does).
#pragma once

#include "marlin_device.cuh"

namespace tl::gpu::marlin {

template <int NB, int WM, bool FUSED, int GPT>
struct MediumSmem {
    static constexpr int kRows = WM * NB * 8;        // activation rows of a tile
    static constexpr int kRow = kTileK * 2;          // bytes of one activation row of a slice
    static constexpr int kB = kTileK * kTileN / 2;   // weights: [strip][k16][lane][16 B], as in global memory
    static constexpr int kA = kRows * kRow;          // activations: 16-byte chunks XOR-swizzled by row
    static constexpr int kS = GPT * kTileN * 2;      // scales, then zeros: [GPT][512] FP16, permuted as in global
    static constexpr int kStage = medium_stage_bytes(kRows, FUSED, GPT);
    static constexpr int kPartialFloats = kRows * kTileN;  // FP32 partial sums of one tile
    static_assert(kStage == kB + kA + kS * (FUSED ? 2 : 1), "stage layout: [weights | activations | scales | zeros]");
};

__device__ __forceinline__ uint4 lds128(const void *p) {
    uint4 v;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "r"(smem_addr(p)));
    return v;
}

__device__ __forceinline__ uint4 lds128_addr(uint32_t addr) {
    uint4 v;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
    return v;
}

template <int NB, int WM, bool FUSED, int GPT>
__global__ void __launch_bounds__(kThreads * WM, 2 / WM) marlin_medium_kernel(const Params p) {
    static_assert((NB == 3 || NB == 4) && (WM == 1 || WM == 2), "tiles of 24, 32, 48 or 64 rows");
    using L = MediumSmem<NB, WM, FUSED, GPT>;
    extern __shared__ __align__(128) uint8_t smem[];
    __shared__ int last_contributor;

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int strip_in_tile = warp % kWarps, row_part = warp / kWarps;
    const long long begin = static_cast<long long>(blockIdx.x) * p.total_iters / gridDim.x;
    const long long end = (static_cast<long long>(blockIdx.x) + 1) * p.total_iters / gridDim.x;
    if (begin >= end) return;  // more blocks than k slices: nobody waits for an empty block
    const int strips = p.n / 64;
    const int first_tile = static_cast<int>(begin / p.k_tiles), first_kt = static_cast<int>(begin % p.k_tiles);
    // A cut tile's workspace slot is the block that holds its first k slice (marlin_kernel.cuh): this block for
    // every tile but the first of its range. Computed here, before the accumulators are live: the 64-bit division
    // is a call whose registers made finish_tile spill.
    const int first_slot =
        static_cast<int>(((static_cast<long long>(first_tile) * p.k_tiles + 1) * gridDim.x - 1) / p.total_iters);
    const int total = static_cast<int>(end - begin);  // this block's k slices

    // ---- Copy side. Warp w copies k16 cells [row_part * kCells, + kCells) of strip w % 8 (kK16 / WM cells of 512
    // bytes); threads < kRows * 8 one activation chunk (row tid / 8, chunk tid % 8, zero-filled past M); threads
    // [0, GPT*64) one chunk of scales, [128, 128 + GPT*64) one of zeros. Source offsets step by increments within a
    // tile; the divisions happen once per tile.
    constexpr int kCells = kK16 / WM;
    const int a_row = tid / 8, a_chunk = tid % 8;
    const bool copies_x = tid < L::kRows * 8;
    const int sz_part = tid / 128, sz_idx = tid % 128;
    const bool copies_sz = sz_idx < GPT * 64 && (sz_part == 0 || (FUSED && sz_part == 1));
    const uint32_t w_dst = strip_in_tile * (kK16 * 512) + row_part * (kCells * 512) + lane * 16;
    const uint32_t x_dst = L::kB + a_row * L::kRow + ((a_chunk ^ (a_row % 8)) * 16);
    const uint32_t sz_dst = L::kB + L::kA + (sz_part % 2) * L::kS + (sz_idx / 64) * (kTileN * 2) + (sz_idx % 64) * 16;
    // Offsets (not pointers: fewer registers) of this thread's sources, in elements of words (uint4), x, scales.
    int f_tile = 0, f_kt = 0, f_k_left = 0;
    uint32_t f_w = 0, f_x = 0, f_sz = 0;
    // Which of this thread's copies are real for the current tile (one register): weights, activations (else
    // zero-fill), scales or zeros.
    constexpr int kCopyW = 1, kCopyX = 2, kCopySz = 4;
    int f_ok = 0;
    auto locate = [&](int tile, int kt) {
        f_tile = tile;
        f_kt = kt;
        const int n_tile = tile;  // one tile covers every row (m_slices == 1)
        const int strip = n_tile * kWarps + strip_in_tile;
        const bool w_ok = strip < strips;
        f_w = (strip * (p.k / 16) + kt * kK16 + row_part * kCells) * 32 + lane;
        const int row = a_row;
        const bool x_ok = copies_x && row < p.m;  // else the zero-fill copy reads nothing; row 0 keeps the address valid
        f_x = (x_ok ? row * p.k : 0) + kt * kTileK + a_chunk * 8;
        const int ch = sz_idx % 64;
        const bool sz_ok = copies_sz && n_tile * kWarps + ch / 8 < strips;
        f_ok = (w_ok ? kCopyW : 0) | (x_ok ? kCopyX : 0) | (sz_ok ? kCopySz : 0);
        const int group = GPT == 2 ? kt * 2 + sz_idx / 64 : kt * kTileK / p.group_size;
        f_sz = group * p.n + n_tile * kTileN + ch * 8;
        f_k_left = p.group_size - kt * kTileK % p.group_size;  // k left in the group (GPT = 1)
    };
    auto advance = [&]() {
        if (++f_kt == p.k_tiles) {
            locate(f_tile + 1, 0);
            return;
        }
        f_w += kK16 * 32;
        f_x += kTileK;
        if constexpr (GPT == 2) {
            f_sz += 2 * p.n;
        } else if ((f_k_left -= kTileK) == 0) {
            f_k_left = p.group_size;
            f_sz += p.n;
        }
    };
    const uint32_t smem_base = smem_addr(smem);
    auto load_stage = [&](int stage) {
        const uint32_t st = smem_base + stage * L::kStage;
        if (f_ok & kCopyW) {
            const uint4 *src = reinterpret_cast<const uint4 *>(p.words) + f_w;
#pragma unroll
            for (int j = 0; j < kCells; ++j) cp_async16(st + w_dst + j * 512, src + 32 * j);
        }
        if (copies_x) cp_async16_zfill(st + x_dst, p.x + f_x, (f_ok & kCopyX) != 0);
        if (f_ok & kCopySz) cp_async16(st + sz_dst, (sz_part == 0 ? p.scales : p.zeros) + f_sz);
    };

    // ---- Compute side. In the swapped mma, lane L holds rows (= columns 16w + L/4, 16w + 8 + L/4 of the strip) x
    // activation rows nb*8 + 2(L%4) + {0, 1}: c[0], c[1] the first column, c[2], c[3] the second.
    const int g = lane / 4;
    float acc[4][NB][4];
#pragma unroll
    for (int w = 0; w < 4; ++w) zero(acc[w]);
    // ldmatrix .x2: lane L < 16 addresses row L%8 of matrix L/8 (b0, b1 of one k16 step: chunks 2 k16 + L/8), at the
    // swizzled offset ((2 k16 + j) ^ r) * 16 = ((j ^ r) * 16) ^ 32 k16 (j = L/8 % 2, r = L%8); lanes >= 16 repeat
    // lanes < 16 (their addresses are unused but stay valid).
    const uint32_t x_lane = (lane % 8) * L::kRow + ((((lane / 8) % 2) ^ (lane % 8)) * 16) + row_part * (NB * 8 * L::kRow);

    auto compute_stage = [&](int stage) {
        const uint8_t *st = smem + stage * L::kStage;
        const uint4 *w_src = reinterpret_cast<const uint4 *>(st) + strip_in_tile * (kK16 * 32) + lane;
        const uint32_t x_base = smem_base + stage * L::kStage + L::kB;
        // The lane's scale (and zero) pairs: 32-bit word w holds columns 16w + L/4 and 16w + 8 + L/4 (the permuted
        // layout); broadcast to (s, s) pairs at use.
        const uint16_t *s_src = reinterpret_cast<const uint16_t *>(st + L::kB + L::kA) + strip_in_tile * 64 + g * 8;
#pragma unroll
        for (int k16 = 0; k16 < kK16; ++k16) {
            // Read again every k16 step (volatile: not merged into one load held across the steps): 8 registers
            // fewer in the loop, for two 16-byte shared loads per step.
            const int row = GPT == 2 ? k16 / (kK16 / 2) : 0;
            const uint4 sv = lds128(s_src + row * kTileN);
            const uint4 zv = FUSED ? lds128(s_src + GPT * kTileN + row * kTileN) : make_uint4(0u, 0u, 0u, 0u);
            uint32_t b[NB][2];  // this k16 step's activation fragments (b0, b1) of each 8-row tile
#pragma unroll
            for (int nb = 0; nb < NB; ++nb) ldmatrix_x2(b[nb], x_base + nb * 8 * L::kRow + (x_lane ^ (32 * k16)));
            const uint4 wq = w_src[k16 * 32];
            const uint32_t words[4] = {wq.x, wq.y, wq.z, wq.w};
            const uint32_t s_pairs[4] = {sv.x, sv.y, sv.z, sv.w};
            const uint32_t z_pairs[4] = {zv.x, zv.y, zv.z, zv.w};
#pragma unroll
            for (int w = 0; w < 4; ++w) {
                uint32_t a[4];
                dequant_word<FUSED>(words[w], __byte_perm(s_pairs[w], 0, 0x1010), __byte_perm(s_pairs[w], 0, 0x3232),
                                    FUSED ? __byte_perm(z_pairs[w], 0, 0x1010) : 0u,
                                    FUSED ? __byte_perm(z_pairs[w], 0, 0x3232) : 0u, a);
#pragma unroll
                for (int nb = 0; nb < NB; ++nb) mma_16816(acc[w][nb], a, b[nb][0], b[nb][1]);
            }
        }
    };

    // Writes (or, for a tile cut between blocks, reduces) the finished tile `tile`, of which this block did `iters`
    // k slices. The reduction is that of marlin_kernel.cuh; workspace layout [warp][nb][w][lane][4] with the four
    // values ordered (row r, column c), (r, c + 8), (r + 1, c), (r + 1, c + 8).
    auto finish_tile = [&](int tile, int iters) {
        const int n_tile = tile;
        const bool warp_active = n_tile * kWarps + strip_in_tile < strips;
        const int row0 = row_part * NB * 8 + 2 * (lane % 4);
        // N through a volatile move: the output offsets below then cannot be hoisted out of the main loop into
        // registers held across it (they made NB = 4 spill).
        int n;
        asm volatile("mov.b32 %0, %1;\n" : "=r"(n) : "r"(p.n));
        uint16_t *y0 = p.y + static_cast<size_t>(row0) * n + n_tile * kTileN + strip_in_tile * 64 + g;
        if (iters == p.k_tiles) {  // the whole tile is ours
            if (!warp_active) return;
#pragma unroll
            for (int nb = 0; nb < NB; ++nb) {
                const int row = row0 + nb * 8;
#pragma unroll
                for (int w = 0; w < 4; ++w) {
                    store_quad(y0 + static_cast<size_t>(nb * 8) * n + 16 * w, n, acc[w][nb][0], acc[w][nb][2],
                               acc[w][nb][1], acc[w][nb][3], quad_rows(row, p.m));
                }
            }
            return;
        }
        const int slot = tile == first_tile ? first_slot : static_cast<int>(blockIdx.x);
        float *part = p.partials + static_cast<size_t>(slot) * L::kPartialFloats + warp * (NB * 512) + lane * 4;
        if (warp_active) {
#pragma unroll
            for (int nb = 0; nb < NB; ++nb) {
                const int row = row0 + nb * 8;
#pragma unroll
                for (int w = 0; w < 4; ++w) {
                    add_partial_quad(part + (nb * 4 + w) * 128, acc[w][nb][0], acc[w][nb][2], acc[w][nb][1],
                                     acc[w][nb][3], quad_rows(row, p.m));
                }
            }
        }
        if (!arrive_last(p.counters + slot, iters, p.k_tiles, last_contributor)) return;
        if (warp_active) {
#pragma unroll
            for (int nb = 0; nb < NB; ++nb) {
                const int row = row0 + nb * 8;
#pragma unroll
                for (int w = 0; w < 4; ++w) {
                    const int rows = quad_rows(row, p.m);
                    const float4 v = take_partial_quad(part + (nb * 4 + w) * 128, rows);
                    store_quad(y0 + static_cast<size_t>(nb * 8) * n + 16 * w, n, v.x, v.y, v.z, v.w, rows);
                }
            }
        }
        if (tid == 0) p.counters[slot] = 0;
    };

    locate(first_tile, first_kt);
    int to_fetch = total;
    for (int s = 0; s < p.stages - 1; ++s) {
        if (to_fetch > 0) {
            load_stage(s);
            advance();
            --to_fetch;
        }
        cp_async_commit();  // empty groups keep the group count uniform for wait_group
    }

    // Outer loop: the tile segments of our range; inner loop: their k slices (the hot loop, kept free of the
    // epilogue so that the register allocator sees the accumulators and the fragments only).
    int stage = 0;
    for (int tile = first_tile, kt_begin = first_kt, left = total; left > 0; ++tile, kt_begin = 0) {
        const int kt_end = std::min(kt_begin + left, p.k_tiles);
        const bool warp_active = tile * kWarps + strip_in_tile < strips;
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
            if (warp_active) compute_stage(stage);
            stage = stage == p.stages - 1 ? 0 : stage + 1;
        }
        finish_tile(tile, kt_end - kt_begin);
#pragma unroll
        for (int w = 0; w < 4; ++w) zero(acc[w]);
        left -= kt_end - kt_begin;
    }
    cp_async_wait<0>();
}

template <int NB, int WM, bool FUSED, int GPT>
int launch_medium(Params p, const LaunchEnv &env) {
    using L = MediumSmem<NB, WM, FUSED, GPT>;
    if (p.m > L::kRows || p.m_slices != 1) return kRcUnsupported;  // the kernel assumes one tile covers every row
    static std::atomic<int> stages_cache[64][2];
    return launch_kernel(marlin_medium_kernel<NB, WM, FUSED, GPT>, p, env, L::kStage, 2 / WM, kMinItersPerBlock,
                         L::kPartialFloats, stages_cache, kThreads * WM);
}


// ================================================================================================================
// The "wide-warp" medium kernel (the default since the second H200 timing of the kernel above: 262 us for the 70B
// gate+up layer at M = 64, ~2.4x the mma.sync floor). What the SASS of the kernel above showed, per warp and 64-deep
// slice (NB = 4, WM = 2, fused): 450 instructions for 64 HMMA: 224 of dequantization (every strip dequantized by
// both of its warps), ~120 of copy bookkeeping, barrier and wait switch, and every k16 step's shared loads issued
// right before their use; 16 warps leave the slice barrier together and then all dequantize, then all wait on the
// tensor pipe. Here:
//  - One warp per strip holds all NB * 8 rows (NB = 4, 6, 8; 128 accumulators at 64 rows), so each weight is
//    dequantized once per block and feeds NB mma: ~2.8 instead of ~6 other instructions per HMMA. 8 warps per SM
//    (one block of 256 threads, up to 255 registers); the latency that 16 warps used to hide is hidden inside the warp:
//  - the next k16 step's fragments (one 16-byte weight load, NB/2 ldmatrix.x4) are loaded while this step's mma run
//    (two register sets), and
//  - the slice barrier sits inside the last k16 step, after its dequantization and before its 8 * NB mma: the wait
//    and the next slice's first loads overlap those mma instead of stalling every warp at the top of the slice.
//  - The copy side is one 64-bit-free offset per stream, stepped by additions.
//  - Stream-K: a block that finds a cut tile's other contributors all arrived (the usual case for a block's last
//    segment, which ends with the kernel) folds its sums in registers: no 128 KB of red.add, fence and read-back of
//    its own partial sums in the kernel's tail.
// ================================================================================================================

template <int NB, bool FUSED, int GPT>
struct WideSmem {
    static constexpr int kRows = NB * 8;             // activation rows of a tile (all of them)
    static constexpr int kRow = kTileK * 2;          // bytes of one activation row of a slice
    static constexpr int kB = kTileK * kTileN / 2;   // weights: [strip][k16][lane][16 B], as in global memory
    static constexpr int kA = kRows * kRow;          // activations: 16-byte chunks XOR-swizzled by row
    static constexpr int kS = GPT * kTileN * 2;      // scales, then zeros: [GPT][512] FP16, permuted as in global
    static constexpr int kStage = medium_stage_bytes(kRows, FUSED, GPT);
    static constexpr int kPartialFloats = kRows * kTileN;  // FP32 partial sums of one tile
    static constexpr int kXCopies = (kRows * 8 + kThreads - 1) / kThreads;  // activation chunks per thread
    static_assert(kStage == kB + kA + kS * (FUSED ? 2 : 1), "stage layout: [weights | activations | scales | zeros]");
};

// One k16 step's operands of a warp: lane's packed word quad (4 A fragments) and the B fragments of NB row tiles.
template <int NB>
struct WideFrag {
    uint4 w;
    uint32_t b[NB][2];
};

// Blocks per SM of the wide kernel: one. (Two at NB = 4 would cap registers at 128: ptxas then spills 56 bytes
// in the fused mode; one block also halves the cut tiles of stream-K.)
template <int NB>
constexpr int wide_blocks_per_sm() {
    return 1;
}

template <int NB, bool FUSED, int GPT>
__global__ void __launch_bounds__(kThreads, wide_blocks_per_sm<NB>()) marlin_medium_wide_kernel(const Params p) {
    static_assert(NB == 4 || NB == 6 || NB == 8, "tiles of 32, 48 or 64 rows (ldmatrix.x4: row tiles in pairs)");
    using L = WideSmem<NB, FUSED, GPT>;
    extern __shared__ __align__(128) uint8_t smem[];
    __shared__ int last_contributor;

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const long long begin = static_cast<long long>(blockIdx.x) * p.total_iters / gridDim.x;
    const long long end = (static_cast<long long>(blockIdx.x) + 1) * p.total_iters / gridDim.x;
    if (begin >= end) return;  // more blocks than k slices: nobody waits for an empty block
    const int strips = p.n / 64;
    const int first_tile = static_cast<int>(begin / p.k_tiles), first_kt = static_cast<int>(begin % p.k_tiles);
    // A cut tile's workspace slot is the block that holds its first k slice (marlin_kernel.cuh): this block for
    // every tile but the first of its range. Computed before the accumulators are live (64-bit division).
    const int first_slot =
        static_cast<int>(((static_cast<long long>(first_tile) * p.k_tiles + 1) * gridDim.x - 1) / p.total_iters);
    const int total = static_cast<int>(end - begin);  // this block's k slices

    // ---- Copy side. Lane L of warp w copies its 16 bytes of the 4 k16 cells of strip w; thread t the activation
    // chunks t + 256 i (row / 8, chunk % 8, zero-filled past M); threads [0, GPT*64) one chunk of scales,
    // [128, 128 + GPT*64) one of zeros. The activations' source does not depend on the tile (one tile covers every
    // row): row offsets are fixed, the k offset is kt * 64.
    const int sz_part = tid / 128, sz_idx = tid % 128;
    const bool copies_sz = sz_idx < GPT * 64 && (sz_part == 0 || (FUSED && sz_part == 1));
    const uint32_t w_dst = warp * (kK16 * 512) + lane * 16;
    const uint32_t sz_dst = L::kB + L::kA + sz_part * L::kS + (sz_idx / 64) * (kTileN * 2) + (sz_idx % 64) * 16;
    uint32_t x_src[L::kXCopies];  // element offset of the chunk's row start (0 for a zero-filled row)
    uint32_t x_valid = 0;         // bit i: chunk i is a real row (else zero-filled)
#pragma unroll
    for (int i = 0; i < L::kXCopies; ++i) {
        const int c = tid + kThreads * i, row = c / 8;
        const bool ok = c < L::kRows * 8 && row < p.m;
        x_src[i] = ok ? row * p.k + (c % 8) * 8 : 0;
        x_valid |= ok ? 1u << i : 0u;
    }
    int f_tile = 0, f_kt = 0, f_k_left = 0;
    uint32_t f_w = 0, f_sz = 0;
    bool f_w_ok = false, f_sz_ok = false;
    auto locate = [&](int tile, int kt) {
        f_tile = tile;
        f_kt = kt;
        const int strip = tile * kWarps + warp;
        f_w_ok = strip < strips;
        f_w = (strip * (p.k / 16) + kt * kK16) * 32 + lane;
        const int ch = sz_idx % 64;
        f_sz_ok = copies_sz && tile * kWarps + ch / 8 < strips;
        const int group = GPT == 2 ? kt * 2 + sz_idx / 64 : kt * kTileK / p.group_size;
        f_sz = group * p.n + tile * kTileN + ch * 8;
        f_k_left = p.group_size - kt * kTileK % p.group_size;  // k left in the group (GPT = 1)
    };
    auto advance = [&]() {
        if (++f_kt == p.k_tiles) {
            locate(f_tile + 1, 0);
            return;
        }
        f_w += kK16 * 32;
        if constexpr (GPT == 2) {
            f_sz += 2 * p.n;
        } else if ((f_k_left -= kTileK) == 0) {
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
            for (int j = 0; j < kK16; ++j) cp_async16(st + w_dst + j * 512, src + 32 * j);
        }
#pragma unroll
        for (int i = 0; i < L::kXCopies; ++i) {
            const int c = tid + kThreads * i;
            if (L::kRows * 8 % kThreads == 0 || c < L::kRows * 8) {
                const int row = c / 8;
                const uint32_t dst = L::kB + row * L::kRow + (((c % 8) ^ (row % 8)) * 16);
                const bool ok = (x_valid >> i) & 1u;
                cp_async16_zfill(st + dst, p.x + (ok ? x_src[i] + f_kt * kTileK : 0u), ok);
            }
        }
        if (f_sz_ok) cp_async16(st + sz_dst, (sz_part == 0 ? p.scales : p.zeros) + f_sz);
    };

    // ---- Compute side. In the swapped mma, lane L holds rows (= columns 16w + L/4, 16w + 8 + L/4 of the strip) x
    // activation rows nb*8 + 2(L%4) + {0, 1}: c[0], c[1] the first column, c[2], c[3] the second.
    const int g = lane / 4;
    float acc[4][NB][4];
#pragma unroll
    for (int w = 0; w < 4; ++w) zero(acc[w]);
    // ldmatrix .x4 for row tiles 2p, 2p + 1: lane L addresses row L%8 of matrix j = L/8 (tile 2p + j/2, chunk
    // 2 k16 + j%2), at the swizzled offset ((2 k16 + j%2) ^ r) * 16 = (((j%2) ^ r) * 16) ^ 32 k16 (r = L%8).
    const uint32_t x_lane = ((lane / 16) * 8 + lane % 8) * L::kRow + ((((lane / 8) % 2) ^ (lane % 8)) * 16);
    const uint32_t w_lane = warp * (kK16 * 512) + lane * 16;
    const uint32_t s_lane = L::kB + L::kA + (warp * 64 + g * 8) * 2;  // the lane's 8 scales (permuted layout)

    auto load_frag = [&](int stage, int k16, WideFrag<NB> &f) {
        const uint32_t st = smem_base + stage * L::kStage;
        f.w = lds128_addr(st + w_lane + k16 * 512);
#pragma unroll
        for (int pr = 0; pr < NB / 2; ++pr) {
            uint32_t r[4];
            ldmatrix_x4(r, st + L::kB + pr * 16 * L::kRow + (x_lane ^ (32 * k16)));
            f.b[2 * pr][0] = r[0];
            f.b[2 * pr][1] = r[1];
            f.b[2 * pr + 1][0] = r[2];
            f.b[2 * pr + 1][1] = r[3];
        }
    };
    // The lane's scale (and zero) pairs of group row `row` of the stage: word w holds columns 16w + L/4 and
    // 16w + 8 + L/4; broadcast to (s, s) pairs at use (ptxas folds the broadcast into the HFMA2 operand).
    uint4 sv[GPT], zv[GPT];
    auto load_scales = [&](int stage) {
        const uint32_t st = smem_base + stage * L::kStage + s_lane;
#pragma unroll
        for (int r = 0; r < GPT; ++r) {
            sv[r] = lds128_addr(st + r * (kTileN * 2));
            zv[r] = FUSED ? lds128_addr(st + L::kS + r * (kTileN * 2)) : make_uint4(0u, 0u, 0u, 0u);
        }
    };
    auto dequant4 = [&](const uint4 &wq, int k16, uint32_t (&a)[4][4]) {
        const int r = GPT == 2 ? k16 / (kK16 / 2) : 0;
        const uint32_t words[4] = {wq.x, wq.y, wq.z, wq.w};
        const uint32_t s_pairs[4] = {sv[r].x, sv[r].y, sv[r].z, sv[r].w};
        const uint32_t z_pairs[4] = {zv[r].x, zv[r].y, zv[r].z, zv[r].w};
#pragma unroll
        for (int w = 0; w < 4; ++w) {
            dequant_word<FUSED>(words[w], __byte_perm(s_pairs[w], 0, 0x1010), __byte_perm(s_pairs[w], 0, 0x3232),
                                FUSED ? __byte_perm(z_pairs[w], 0, 0x1010) : 0u,
                                FUSED ? __byte_perm(z_pairs[w], 0, 0x3232) : 0u, a[w]);
        }
    };

    // Writes (or, for a tile cut between blocks, reduces) the finished tile `tile`, of which this block did `iters`
    // k slices. Workspace layout [warp][nb][w][lane][4], the four values ordered (row r, column c), (r, c + 8),
    // (r + 1, c), (r + 1, c + 8).
    auto finish_tile = [&](int tile, int iters) {
        const bool warp_active = tile * kWarps + warp < strips;
        const int row0 = 2 * (lane % 4);
        // N through a volatile move: the output offsets below then cannot be hoisted out of the main loop into
        // registers held across it.
        int n;
        asm volatile("mov.b32 %0, %1;\n" : "=r"(n) : "r"(p.n));
        uint16_t *y0 = p.y + static_cast<size_t>(row0) * n + tile * kTileN + warp * 64 + g;
        auto store = [&](int nb, int w, float v0, float v2, float v1, float v3) {
            store_quad(y0 + static_cast<size_t>(nb * 8) * n + 16 * w, n, v0, v2, v1, v3, quad_rows(row0 + nb * 8, p.m));
        };
        if (iters == p.k_tiles) {  // the whole tile is ours
            if (!warp_active) return;
#pragma unroll
            for (int nb = 0; nb < NB; ++nb)
#pragma unroll
                for (int w = 0; w < 4; ++w) store(nb, w, acc[w][nb][0], acc[w][nb][2], acc[w][nb][1], acc[w][nb][3]);
            return;
        }
        const int slot = tile == first_tile ? first_slot : static_cast<int>(blockIdx.x);
        float *part = p.partials + static_cast<size_t>(slot) * L::kPartialFloats + warp * (NB * 512) + lane * 4;
        // Have all other contributors arrived (their sums added and fenced before they counted)? Then this block is
        // the last: nobody touches the tile's slot or counter any more, and its own sums need not go through it.
        if (tid == 0) last_contributor = atomicAdd(p.counters + slot, 0) + iters == p.k_tiles;
        __syncthreads();
        const bool fold_here = last_contributor != 0;
        if (fold_here) {
            __threadfence();  // as arrive_last: the others' additions are visible to the reads below
        } else {
            if (warp_active) {
#pragma unroll
                for (int nb = 0; nb < NB; ++nb) {
                    const int row = 2 * (lane % 4) + nb * 8;
#pragma unroll
                    for (int w = 0; w < 4; ++w) {
                        add_partial_quad(part + (nb * 4 + w) * 128, acc[w][nb][0], acc[w][nb][2], acc[w][nb][1],
                                         acc[w][nb][3], quad_rows(row, p.m));
                    }
                }
            }
            // (arrive_last's first barrier also orders every thread's read of last_contributor before its rewrite.)
            if (!arrive_last(p.counters + slot, iters, p.k_tiles, last_contributor)) return;
        }
        if (warp_active) {
#pragma unroll
            for (int nb = 0; nb < NB; ++nb) {
                const int row = 2 * (lane % 4) + nb * 8;
#pragma unroll
                for (int w = 0; w < 4; ++w) {
                    float *at = part + (nb * 4 + w) * 128;
                    // Folding here: this block's sums are in registers, not in the workspace.
                    const float4 own = fold_here ? make_float4(acc[w][nb][0], acc[w][nb][2], acc[w][nb][1],
                                                               acc[w][nb][3])
                                                 : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                    const float4 v = take_partial_quad(at, quad_rows(row, p.m));
                    store(nb, w, v.x + own.x, v.y + own.y, v.z + own.z, v.w + own.w);
                }
            }
        }
        if (tid == 0) p.counters[slot] = 0;
    };

    locate(first_tile, first_kt);
    int to_fetch = total;
    for (int s = 0; s < p.stages - 1; ++s) {
        if (to_fetch > 0) {
            load_stage(s);
            advance();
            --to_fetch;
        }
        cp_async_commit();  // empty groups keep the group count uniform for wait_group
    }
    cp_async_wait_pending(p.stages - 2);
    __syncthreads();  // stage 0 landed for everyone
    WideFrag<NB> frag[2];
    load_scales(0);
    load_frag(0, 0, frag[0]);

    // Outer loop: the tile segments of our range; inner loop: their k slices. Iteration `left` (slices left in the
    // range, this one included) consumes stage `stage`, whose scales and first fragments are already in registers.
    int stage = 0, left = total;
    for (int tile = first_tile, kt_begin = first_kt; left > 0; ++tile, kt_begin = 0) {
        const int kt_end = std::min(kt_begin + left, p.k_tiles);
        const int seg = kt_end - kt_begin;
#pragma unroll 1
        for (int kt = kt_begin; kt < kt_end; ++kt, --left) {
            // Refill the stage consumed by the previous iteration: every warp loaded its last fragments before that
            // iteration's barrier.
            if (to_fetch > 0) {
                load_stage(stage == 0 ? p.stages - 1 : stage - 1);
                advance();
                --to_fetch;
            }
            cp_async_commit();
            const int next = stage == p.stages - 1 ? 0 : stage + 1;
#pragma unroll
            for (int k16 = 0; k16 < kK16; ++k16) {
                WideFrag<NB> &cur = frag[k16 % 2];
                if (k16 + 1 < kK16) load_frag(stage, k16 + 1, frag[(k16 + 1) % 2]);
                uint32_t a[4][4];
                dequant4(cur.w, k16, a);
                if (k16 + 1 == kK16) {
                    // The next slice: wait for its stage, then load its scales (this step's weights are already
                    // dequantized) and first fragments, whose latency this step's mma hide. Unconditional (after the
                    // range's last slice the loads read a stale stage, unused): no branch around the hot code.
                    cp_async_wait_pending(p.stages - 2);
                    __syncthreads();
                    load_scales(next);
                    load_frag(next, 0, frag[0]);
                }
                // Every warp multiplies, also one whose strip lies past N (its stage bytes are stale, its sums are
                // never written): a branch here would keep ptxas from interleaving the next step's dequantization.
#pragma unroll
                for (int w = 0; w < 4; ++w)
#pragma unroll
                    for (int nb = 0; nb < NB; ++nb) mma_16816(acc[w][nb], a[w], cur.b[nb][0], cur.b[nb][1]);
            }
            stage = next;
        }
        finish_tile(tile, seg);
#pragma unroll
        for (int w = 0; w < 4; ++w) zero(acc[w]);
    }
    cp_async_wait<0>();
}

template <int NB, bool FUSED, int GPT>
int launch_medium_wide(Params p, const LaunchEnv &env) {
    using L = WideSmem<NB, FUSED, GPT>;
    if (p.m > L::kRows || p.m_slices != 1) return kRcUnsupported;  // the kernel assumes one tile covers every row
    static std::atomic<int> stages_cache[64][2];
    return launch_kernel(marlin_medium_wide_kernel<NB, FUSED, GPT>, p, env, L::kStage, wide_blocks_per_sm<NB>(),
                         kMinItersPerBlock, L::kPartialFloats, stages_cache, kThreads);
}

}  // namespace tl::gpu::marlin
