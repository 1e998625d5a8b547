// The Marlin-class INT4 x FP16/BF16 GEMM on Hopper's warpgroup MMA (wgmma.mma_async; sm_90a only, so this file is
// compiled for that target alone: CMakeLists.txt, cuda/sources_sm90a.txt). Same packed weights as the other
// kernels (marlin_layout.hpp); used on compute capability 9.0 from 17 rows, in the tile form plan_marlin
// chooses (marlin_plan.hpp).
//
// Operands swapped, as in the M <= 16 kernel: Y^T = W^T X^T. A block tile is 256 columns (four 64-column strips, one
// per warp of a warpgroup) x R rows of X (R = 32 on one warpgroup or two, 64 or 128 on two). Per k16 step, warp j of a
// warpgroup reads its strip's cell, whose word w (of 4) is the mma A fragment of the 16 x 16 tile of columns 16w .. 16w
// + 15, and dequantizes its warpgroup's share of the words (all 4, or 2 each with two warpgroups) to the activations'
// type in registers (dequant_word: q*s + z, or (q - 8)*s). Word w of the four warps is the 64-row A operand of one
// wgmma m64nRk16 whose B operand (all R rows of X, 16 deep) the tensor cores read from shared memory through a
// descriptor; each word has its own 64 x R FP32 accumulator (rows: the strip's columns 16w + L/4 and 16w + 8 + L/4;
// columns: activation rows, as in the stream kernel's swapped mma): R / 2 registers a thread per word. Splitting the
// words between warpgroups (rather than the rows) dequantizes each weight once per tile and issues half as many, twice
// as large wgmma. wgmma runs asynchronously: step i + 1 is dequantized while the tensor cores work on steps i, i - 1,
// ... (A fragments in 2 or 4 buffers; wait_group frees the oldest).
//
// X in shared memory: [row][64 k] FP16 or BF16, 128-byte rows whose 16-byte chunks are XOR-swizzled by row % 8, which
// is the hardware's 128-byte swizzle for K-major operands (descriptor mode 1): the cp.async copies and the tensor cores
// agree on it and neither meets bank conflicts. Stages start on 1024-byte boundaries (the swizzle repeats every 8
// rows). A stage is refilled two slices after it was consumed, because the last wgmma reading it may still run during
// the next slice. Stream-K partitioning and the reduction of cut tiles as in the other kernels; with many tiles, whole
// tiles round robin instead (see launch_wgmma_kernel).
//
// One mainloop (WgmmaCopier copies a stage, WgmmaTile computes it and writes the tile), scheduled two ways:
// marlin_wgmma_kernel, where every thread copies and computes and one block barrier per slice orders the ring (32-row
// tiles, and 64-row tiles of small weights), and marlin_wgmma_ws_kernel, warp-specialized: a third warpgroup issues
// the copies, the tile's two warpgroups only compute, and the ring is handed over by mbarriers (measured on the H200:
// 0.97-1.14x on the Llama layers from M = 128, mostly 1.01-1.07x, against every warp copying). One warpgroup cannot
// be specialized that way: at two blocks per SM, ptxas would hold the consumers to 128 registers.
#include "../mbarrier.cuh"
#include "../wgmma.cuh"
#include "marlin_device.cuh"

namespace tl::gpu::marlin {

#if defined(TL_HAVE_SM90A)
namespace {

constexpr int kWgTileN = 256;  // columns per block tile: one 64-column strip per warp of a warpgroup

template <int WGS, int ROWS, bool FUSED, int GPT, Dtype D>
struct WgmmaLayout {
    static constexpr int kThreads = 128 * WGS;
    static constexpr bool kFused = FUSED;
    static constexpr Dtype kDtype = D;
    static constexpr int kGpt = GPT;
    static constexpr int kRows = ROWS;                // activation rows per tile (32, 64 or 128)
    static constexpr int kX = kRows * 128;            // activations first: 1024-aligned
    static constexpr int kW = kTileK * kWgTileN / 2;  // weights: [strip][k16][lane][16 B], as in global memory
    static constexpr int kS = GPT * kWgTileN * 2;     // scales [GPT][256] (permuted as in global), then zeros
    static constexpr int kStage = (kX + kW + kS * (FUSED ? 2 : 1) + 1023) / 1024 * 1024;
    // Pipeline depth: what Hopper's 227 KB per block / 228 KB per SM hold at the residency below (checked at launch).
    static constexpr int kStages = WGS == 1 ? 6 : ROWS == 128 ? 8 : ROWS == 64 ? 10 : 12;
    static constexpr int kWords = 4 / WGS;  // words (16-column tiles of a strip) per warp
    static constexpr int kNB = kRows / 8;   // 8-row blocks of the accumulator (wgmma N / 8)
    // A-fragment buffers = wgmma groups (k16 steps) in flight + 1: as many as the registers allow (4 divides the
    // 4 steps of a slice, so a step's buffer is a compile-time index).
    static constexpr int kFragBufs = WGS == 1 ? 2 : 4;
    static constexpr int kPartialFloats = WGS * 4 * kWords * kNB * 32 * 4;  // cut-tile sums: [warp][w][nb][lane][4]
};

// The copy side of a wgmma kernel, for NT copying threads (t = 0 .. NT - 1): per stage, 4 strips x 2 KB of weights
// (contiguous in global memory), kRows x 8 activation chunks (8 consecutive threads read one row's 128 bytes), GPT
// rows of 256 scales (and zeros). The sources are 32-bit element offsets, set per tile by locate() (the divisions)
// and stepped per slice by advance().
template <class L, int NT>
struct WgmmaCopier {
    static constexpr int kWChunks = L::kW / 16 / NT;
    static constexpr int kXChunks = L::kRows * 8 / NT;
    static constexpr int kXRowStep = NT / 8;  // a multiple of 8: every copy of a thread has the same swizzle
    static constexpr int kStripStep = NT / 128;

    const Params &p;
    const int t, tile_step, strips, k16s;
    const int x_row, x_chunk;
    const uint32_t x_dst;
    const int s_part, s_idx;
    const bool copies_s;
    const uint16_t *const s_base;
    int f_tile = 0, f_kt = 0, f_k_left = 0;  // the next slice to fetch; k left in its group (GPT = 1)
    uint32_t f_w = 0, f_x = 0, f_x0 = 0, f_s = 0;  // offsets: uint4 of words, x (this row; row 0), scales
    unsigned w_ok = 0, x_ok = 0;                  // which of the thread's weight / activation copies are in range
    bool s_ok = false;

    __device__ __forceinline__ WgmmaCopier(const Params &params, int thread, int step)
        : p(params), t(thread), tile_step(step), strips(params.n / 64), k16s(params.k / 16), x_row(thread / 8),
          x_chunk(thread % 8), x_dst(x_row * 128 + ((x_chunk ^ (x_row % 8)) * 16)), s_part(thread / 64),
          s_idx(thread % 64), copies_s(s_idx < L::kGpt * 32 && (s_part == 0 || (L::kFused && s_part == 1))),
          s_base(s_part == 0 ? params.scales : params.zeros) {}

    __device__ __forceinline__ void locate(int tile, int kt) {
        f_tile = tile;
        f_kt = kt;
        const int n_tile = tile / p.m_slices, m_slice = tile - n_tile * p.m_slices;
        const int strip0 = n_tile * 4 + t / 128;
        f_w = (static_cast<uint32_t>(strip0) * k16s + kt * 4) * 32 + t % 128;
        w_ok = 0;
#pragma unroll
        for (int i = 0; i < kWChunks; ++i) w_ok |= (strip0 + i * kStripStep < strips ? 1u : 0u) << i;
        const int row0 = m_slice * L::kRows + x_row;
        x_ok = 0;
#pragma unroll
        for (int i = 0; i < kXChunks; ++i) x_ok |= (row0 + i * kXRowStep < p.m ? 1u : 0u) << i;
        f_x0 = static_cast<uint32_t>(kt) * kTileK + x_chunk * 8;  // rows past M: zero-filled from row 0
        f_x = static_cast<uint32_t>(row0) * p.k + f_x0;
        const int r = s_idx / 32, cc = s_idx % 32;
        s_ok = copies_s && n_tile * 4 + cc / 8 < strips;
        const int group = L::kGpt == 2 ? kt * 2 + r : kt * kTileK / p.group_size;
        f_s = static_cast<uint32_t>(group) * p.n + n_tile * kWgTileN + cc * 8;
        f_k_left = p.group_size - kt * kTileK % p.group_size;
    }
    __device__ __forceinline__ void advance() {
        if (++f_kt == p.k_tiles) {
            locate(f_tile + tile_step, 0);
            return;
        }
        f_w += 4 * 32;
        f_x += kTileK;
        f_x0 += kTileK;
        if constexpr (L::kGpt == 2) {
            f_s += 2 * p.n;
        } else if ((f_k_left -= kTileK) == 0) {
            f_k_left = p.group_size;
            f_s += p.n;
        }
    }
    // Issues the cp.async copies of the located slice into the stage at shared address st.
    __device__ __forceinline__ void load(uint32_t st) const {
        const uint4 *words = reinterpret_cast<const uint4 *>(p.words);
        const uint32_t w_stride = static_cast<uint32_t>(kStripStep) * k16s * 32;  // uint4, one copy to the next
#pragma unroll
        for (int i = 0; i < kWChunks; ++i) {
            // Past N: zero-filled from a valid address (the warp of that strip still joins the warpgroup's wgmma;
            // its rows are dropped).
            const bool ok = w_ok >> i & 1u;
            cp_async16_zfill(st + L::kX + (t + i * NT) * 16, words + (ok ? f_w + i * w_stride : 0u), ok);
        }
        const uint32_t x_step = static_cast<uint32_t>(kXRowStep) * p.k;
#pragma unroll
        for (int i = 0; i < kXChunks; ++i) {
            const bool ok = x_ok >> i & 1u;
            cp_async16_zfill(st + x_dst + i * kXRowStep * 128, p.x + (ok ? f_x + i * x_step : f_x0), ok);
        }
        const int r = s_idx / 32, cc = s_idx % 32;
        if (s_ok) cp_async16(st + L::kX + L::kW + s_part * L::kS + r * (kWgTileN * 2) + cc * 16, s_base + f_s);
    }
};

// The compute side, per warp of a warpgroup: acc[wi] is the 64 x kRows accumulator of word wg * kWords + wi; a[] the
// A-fragment buffers (one per k16 step in flight).
template <class L>
struct WgmmaTile {
    float acc[L::kWords][L::kNB * 4];
    uint32_t a[L::kFragBufs][L::kWords][4];

    __device__ __forceinline__ void zero() {
#pragma unroll
        for (int wi = 0; wi < L::kWords; ++wi) {
#pragma unroll
            for (int i = 0; i < L::kNB * 4; ++i) acc[wi][i] = 0.0f;
            wgmma::pin(acc[wi]);
        }
    }
    __device__ __forceinline__ void pin_all() {
#pragma unroll
        for (int wi = 0; wi < L::kWords; ++wi) wgmma::pin(acc[wi]);
    }

    // The four k16 steps of the slice in the stage at st (generic pointer) / st_addr (shared address).
    __device__ __forceinline__ void compute(const uint8_t *st, uint32_t st_addr, int wg, int strip_in_tile, int lane) {
        constexpr int kWords = L::kWords;
        const int g = lane / 4;
        // The lane's 16-byte cell of each k16 step; this warpgroup's words start at byte wg * 4 * kWords.
        const uint8_t *w_src = st + L::kX + (strip_in_tile * 128 + lane) * 16 + wg * 4 * kWords;
        // The lane's scales are those of columns 8j + L/4 (j < 8, 16 bytes, permuted layout); this warpgroup's
        // words need j in [2 kWords wg, 2 kWords (wg + 1)).
        const uint16_t *s_src = reinterpret_cast<const uint16_t *>(st + L::kX + L::kW) + strip_in_tile * 64 + g * 8 +
                                wg * 2 * kWords;
        uint32_t s8[2 * kWords], z8[2 * kWords];  // (s, s) pairs of this warpgroup's columns (and zeros)
#pragma unroll
        for (int k16 = 0; k16 < 4; ++k16) {
            if (k16 == 0 || (L::kGpt == 2 && k16 == 2)) {  // this group's scales (and zeros)
                const int row = L::kGpt == 2 ? k16 / 2 : 0;
                load_group<kWords, L::kFused, L::kDtype>(s_src + row * kWgTileN, s_src + (L::kGpt + row) * kWgTileN,
                                                         s8, z8);
            }
            uint32_t(&frag)[kWords][4] = a[k16 % L::kFragBufs];
            uint32_t words[kWords];
            if constexpr (kWords == 4) {
                const uint4 wq = *reinterpret_cast<const uint4 *>(w_src + k16 * 512);
                words[0] = wq.x, words[1] = wq.y, words[2] = wq.z, words[3] = wq.w;
            } else {
                const uint2 wq = *reinterpret_cast<const uint2 *>(w_src + k16 * 512);
                words[0] = wq.x, words[1] = wq.y;
            }
#pragma unroll
            for (int wi = 0; wi < kWords; ++wi) {
                dequant_word<L::kFused, L::kDtype>(words[wi], s8[2 * wi], s8[2 * wi + 1], z8[2 * wi], z8[2 * wi + 1],
                                        frag[wi]);
            }
            wgmma::fence();
            const uint64_t desc = wgmma::desc_sw128(st_addr + k16 * 32);
#pragma unroll
            for (int wi = 0; wi < kWords; ++wi) wgmma::mma_rs<L::kDtype>(acc[wi], frag[wi], desc, true);
            wgmma::commit();
            // Step k16 + 1 - kFragBufs is done: its fragment buffer may be refilled. (At most 4 steps in flight, so
            // a stage is free two slices after it was consumed.)
            wgmma::wait<L::kFragBufs - 1>();
        }
    }

    // After a tile's last slice of the range: the wgmma drained, the tile written or its sums added (finish), the
    // accumulators zeroed for the next.
    __device__ __forceinline__ void end_tile(const Params &p, int tile, int iters, int warp, int lane) {
        wgmma::wait<0>();
        pin_all();
        finish(p, tile, iters, warp, lane);
        zero();
    }

    // Writes the finished tile `tile`, of which this block did `iters` k slices; for a tile cut between blocks, adds
    // this block's sums into the FP32 workspace of the tile's slot instead (reductions without a result, layout
    // [warp][w][nb][lane][4], the four values ordered (row r, column c), (r, c + 8), (r + 1, c), (r + 1, c + 8)), and
    // marlin_wgmma_fixup_kernel writes them after the grid. Why not an arrival counter, the last contributor writing
    // the tile: mid-stream the counter's fence, atomic and read-back each wait an L2 round trip behind the DRAM
    // traffic (the stream kernel's finding, marlin_stream.cuh). Measured on the H200 by leaving the reduction out
    // (results wrong by design): Llama-8B gate+up 41.6 -> 26.2 us at M = 17, 100.7 -> 48.0 at M = 128.
    __device__ __forceinline__ void finish(const Params &p, int tile, int iters, int warp, int lane) {
        constexpr int kWords = L::kWords, kNB = L::kNB;
        const int wg = warp / 4, strip_in_tile = warp % 4, g = lane / 4;
        const int n_tile = tile / p.m_slices, m_slice = tile - n_tile * p.m_slices;
        if (n_tile * 4 + strip_in_tile >= p.n / 64) return;  // a strip past N: its rows are dropped
        const int row0 = m_slice * L::kRows + 2 * (lane % 4);
        if (iters == p.k_tiles) {  // the whole tile is ours
            uint16_t *y0 = p.y + static_cast<size_t>(row0) * p.n + (n_tile * 4 + strip_in_tile) * 64 + g;
#pragma unroll
            for (int nb = 0; nb < kNB; ++nb) {
                const int row = row0 + nb * 8;
#pragma unroll
                for (int wi = 0; wi < kWords; ++wi) {
                    const float *d = &acc[wi][4 * nb];
                    store_quad<L::kDtype>(y0 + static_cast<size_t>(nb * 8) * p.n + 16 * (wg * kWords + wi), p.n, d[0],
                                          d[2], d[1], d[3], quad_rows(row, p.m));
                }
            }
            return;
        }
        const long long slot = share_owner(static_cast<long long>(tile) * p.k_tiles, gridDim.x, p.total_iters);
        float *part = p.partials + slot * L::kPartialFloats + warp * (kWords * kNB * 128) + lane * 4;
#pragma unroll
        for (int nb = 0; nb < kNB; ++nb) {
            const int row = row0 + nb * 8;
#pragma unroll
            for (int wi = 0; wi < kWords; ++wi) {
                const float *d = &acc[wi][4 * nb];
                add_partial_quad(part + (wi * kNB + nb) * 128, d[0], d[2], d[1], d[3], quad_rows(row, p.m));
            }
        }
    }
};

// After a stream-K grid of `grid` blocks: one block per tile; a tile cut between blocks gets its summed partials
// written to Y and re-zeroed for the next call. All of a thread's sums are loaded first, then zeroed, then stored (in
// the stream kernel's fix-up, ~10x faster than quad by quad); rows outside M hold zeros (nobody adds to them).
template <class L>
__global__ void __launch_bounds__(L::kThreads) marlin_wgmma_fixup_kernel(const Params p, int grid) {
    wait_for_primary();
    constexpr int kWords = L::kWords, kNB = L::kNB;
    const int tile = blockIdx.x;
    const long long first = static_cast<long long>(tile) * p.k_tiles;
    const long long slot = share_owner(first, grid, p.total_iters);
    if (slot == share_owner(first + p.k_tiles - 1, grid, p.total_iters)) return;  // one block held it and wrote it
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int wg = warp / 4, strip_in_tile = warp % 4;
    const int n_tile = tile / p.m_slices, m_slice = tile - n_tile * p.m_slices;
    if (n_tile * 4 + strip_in_tile >= p.n / 64) return;
    float *part = p.partials + slot * L::kPartialFloats + warp * (kWords * kNB * 128) + lane * 4;
    float4 sums[kWords][kNB];
#pragma unroll
    for (int wi = 0; wi < kWords; ++wi)
#pragma unroll
        for (int nb = 0; nb < kNB; ++nb) {
            sums[wi][nb] = __ldcg(reinterpret_cast<const float4 *>(part + (wi * kNB + nb) * 128));
        }
#pragma unroll
    for (int wi = 0; wi < kWords; ++wi)
#pragma unroll
        for (int nb = 0; nb < kNB; ++nb) {
            __stcg(reinterpret_cast<float4 *>(part + (wi * kNB + nb) * 128), make_float4(0.0f, 0.0f, 0.0f, 0.0f));
        }
    const int row0 = m_slice * L::kRows + 2 * (lane % 4);
    uint16_t *y0 = p.y + static_cast<size_t>(row0) * p.n + (n_tile * 4 + strip_in_tile) * 64 + lane / 4;
#pragma unroll
    for (int nb = 0; nb < kNB; ++nb)
#pragma unroll
        for (int wi = 0; wi < kWords; ++wi) {
            const float4 v = sums[wi][nb];
            store_quad<L::kDtype>(y0 + static_cast<size_t>(nb * 8) * p.n + 16 * (wg * kWords + wi), p.n, v.x, v.y,
                                  v.z, v.w, quad_rows(row0 + nb * 8, p.m));
        }
}

// This block's k slices, numbered 0 .. total - 1: stream-K, the range [begin, begin + total) of all (tile, k slice)
// pairs; whole tiles, tiles blockIdx.x + j * gridDim.x, all their slices. tile_step: from one tile of ours to the next.
struct WgmmaRange {
    long long begin, total;
    int tile_step;
};
__device__ __forceinline__ WgmmaRange wgmma_range(const Params &p) {
    WgmmaRange r;
    if (p.whole_tiles) {
        const long long tiles = p.total_iters / p.k_tiles;
        r.begin = static_cast<long long>(blockIdx.x) * p.k_tiles;
        r.total = (tiles - blockIdx.x + gridDim.x - 1) / gridDim.x * p.k_tiles;
        r.tile_step = gridDim.x;
    } else {
        r.begin = static_cast<long long>(blockIdx.x) * p.total_iters / gridDim.x;
        r.total = (static_cast<long long>(blockIdx.x) + 1) * p.total_iters / gridDim.x - r.begin;
        r.tile_step = 1;
    }
    return r;
}

// Walks the block's k slices tile by tile: slice() for each slice of the range, in order, then, after each tile's
// last one of the range, tile_done(tile, slices of it done here).
template <class Slice, class TileDone>
__device__ __forceinline__ void for_each_slice(const Params &p, const WgmmaRange &range, Slice slice,
                                               TileDone tile_done) {
    const int total = static_cast<int>(range.total);
    int tile = static_cast<int>(range.begin / p.k_tiles);
    for (int done = 0; done < total; tile += range.tile_step) {
        const int kt_begin = done == 0 ? static_cast<int>(range.begin % p.k_tiles) : 0;
        const int kt_end = std::min(kt_begin + total - done, p.k_tiles);
#pragma unroll 1
        for (int kt = kt_begin; kt < kt_end; ++kt) slice();
        tile_done(tile, kt_end - kt_begin);
        done += kt_end - kt_begin;
    }
}

// Every thread copies and computes: one block barrier per slice orders the ring.
template <int WGS, int ROWS, bool FUSED, int GPT, Dtype D>
__global__ void __launch_bounds__(128 * WGS, 1) marlin_wgmma_kernel(const Params p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using L = WgmmaLayout<WGS, ROWS, FUSED, GPT, D>;
    extern __shared__ uint8_t smem_raw[];
    const uint32_t raw_base = smem_addr(smem_raw);
    const uint32_t smem_base = (raw_base + 1023u) & ~1023u;  // the launch adds 1024 bytes of slack
    uint8_t *const smem = smem_raw + (smem_base - raw_base);

    launch_dependents();  // the fix-up grid may launch; it waits for this grid's end
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int wg = warp / 4, strip_in_tile = warp % 4;
    const WgmmaRange range = wgmma_range(p);
    if (range.total <= 0) return;

    WgmmaCopier<L, L::kThreads> copier(p, tid, range.tile_step);
    WgmmaTile<L> t;
    const int total = static_cast<int>(range.total);
    int to_fetch = total;
    auto fetch = [&](int stage) {
        if (to_fetch > 0) {
            copier.load(smem_base + stage * L::kStage);
            if (--to_fetch > 0) copier.advance();  // (never locates a tile past the last)
        }
        cp_async_commit();  // empty groups keep the group count uniform for wait_group
    };
    copier.locate(static_cast<int>(range.begin / p.k_tiles), static_cast<int>(range.begin % p.k_tiles));
#pragma unroll
    for (int s = 0; s < L::kStages - 2; ++s) fetch(s);

    t.zero();
    int stage = 0;
    for_each_slice(
        p, range,
        [&] {
            cp_async_wait<L::kStages - 3>();
            __syncthreads();  // stage `stage` landed for everyone; the stage refilled below is free for everyone
            fetch(stage >= 2 ? stage - 2 : stage + L::kStages - 2);
            t.compute(smem + stage * L::kStage, smem_base + stage * L::kStage, wg, strip_in_tile, lane);
            stage = stage == L::kStages - 1 ? 0 : stage + 1;
        },
        [&](int tile, int iters) {
            t.end_tile(p, tile, iters, warp, lane);
        });
    cp_async_wait<0>();
#endif
}

// Warp-specialized (64- and 128-row tiles): a third warpgroup copies, the two of the tile only compute. Stage s is
// handed over by two mbarriers: full[s] (each producer thread's cp.async arrival fires when its copies have landed)
// and empty[s] (one arrival per consumer thread once the wgmma reading the stage are done: after the next slice's
// last wait_group, as in the kernel above). The consumers never wait for copies they issued themselves, nor for each
// other. Registers: the copier runs on 40, the consumers on 232 (setmaxnreg; 128 * 40 + 256 * 232 fits the 64K
// register file of the SM).
constexpr int kProducerRegs = 40, kConsumerRegs = 232;

template <int ROWS, bool FUSED, int GPT, Dtype D>
__global__ void __launch_bounds__(384, 1) marlin_wgmma_ws_kernel(const Params p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using L = WgmmaLayout<2, ROWS, FUSED, GPT, D>;
    extern __shared__ uint8_t smem_raw[];
    __shared__ __align__(8) uint64_t full_bar[L::kStages], empty_bar[L::kStages];
    const uint32_t raw_base = smem_addr(smem_raw);
    const uint32_t smem_base = (raw_base + 1023u) & ~1023u;  // the launch adds 1024 bytes of slack
    uint8_t *const smem = smem_raw + (smem_base - raw_base);
    const uint32_t full0 = smem_addr(full_bar), empty0 = smem_addr(empty_bar);

    launch_dependents();  // the fix-up grid may launch; it waits for this grid's end
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const WgmmaRange range = wgmma_range(p);
    if (range.total <= 0) return;
    if (tid == 0) {
        for (int s = 0; s < L::kStages; ++s) {
            mbar::init(full0 + 8 * s, 128);
            mbar::init(empty0 + 8 * s, 256);
        }
    }
    __syncthreads();
    const int total = static_cast<int>(range.total);

    if (warp >= 8) {  // the producer warpgroup
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegs));
        WgmmaCopier<L, 128> copier(p, tid - 256, range.tile_step);
        copier.locate(static_cast<int>(range.begin / p.k_tiles), static_cast<int>(range.begin % p.k_tiles));
        int stage = 0;
        uint32_t phase = 0;  // of the round of stage uses this fetch belongs to
#pragma unroll 1
        for (int f = 0; f < total; ++f) {
            if (f >= L::kStages) mbar::wait(empty0 + 8 * stage, phase ^ 1u);  // the use one round back is released
            copier.load(smem_base + stage * L::kStage);
            mbar::arrive_cp_async(full0 + 8 * stage);
            if (f + 1 < total) copier.advance();  // (never locates a tile past the last)
            if (++stage == L::kStages) {
                stage = 0;
                phase ^= 1u;
            }
        }
        cp_async_wait<0>();
    } else {  // the two consumer warpgroups
        asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kConsumerRegs));
        const int wg = warp / 4, strip_in_tile = warp % 4;
        WgmmaTile<L> t;
        t.zero();
        int stage = 0, prev = -1;
        uint32_t phase = 0;
        for_each_slice(
            p, range,
            [&] {
                mbar::wait(full0 + 8 * stage, phase);
                // The copies were generic-proxy writes; the tensor cores read the stage through the async proxy.
                asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
                t.compute(smem + stage * L::kStage, smem_base + stage * L::kStage, wg, strip_in_tile, lane);
                // This slice's last wait_group left only its own steps in flight: the previous stage is read. Every
                // consumer thread releases its own reads of it (weights, scales).
                if (prev >= 0) mbar::arrive(empty0 + 8 * prev);
                prev = stage;
                if (++stage == L::kStages) {
                    stage = 0;
                    phase ^= 1u;
                }
            },
            [&](int tile, int iters) {
                t.end_tile(p, tile, iters, warp, lane);
            });
    }
#endif
}

// WS: the warp-specialized kernel (WGS = 2 only).
template <int WGS, int ROWS, bool FUSED, int GPT, Dtype D, bool WS = false>
int launch_wgmma_kernel(Params p, const LaunchEnv &env) {
    using L = WgmmaLayout<WGS, ROWS, FUSED, GPT, D>;
    static_assert(!WS || WGS == 2, "the warp-specialized kernel has two compute warpgroups");
    // One warpgroup per block: two blocks per SM wanted (their wgmma interleave); two warpgroups: one block.
    constexpr int kPerSm = WGS == 1 ? 2 : 1;
    constexpr int kBlockThreads = WS ? L::kThreads + 128 : L::kThreads;
    // Resident blocks per SM (registers and shared memory), cached per device: 0 = not set up, -1 = none fits.
    static std::atomic<int> resident_cache[64];
    if (env.device < 0 || env.device >= 64) return static_cast<int>(cudaErrorInvalidDevice);
    const auto kernel = [] {  // (only the form asked for is instantiated)
        if constexpr (WS) {
            return marlin_wgmma_ws_kernel<ROWS, FUSED, GPT, D>;
        } else {
            return marlin_wgmma_kernel<WGS, ROWS, FUSED, GPT, D>;
        }
    }();
    constexpr int kSmem = L::kStages * L::kStage + 1024;  // + the slack that aligns the ring to 1024 bytes
    int resident = resident_cache[env.device].load(std::memory_order_relaxed);
    if (resident == 0) {
        resident = -1;
        if (kSmem + kStaticSmemReserve <= env.max_smem_optin) {
            TL_GPU_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
            TL_GPU_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, kernel, kBlockThreads, kSmem));
            resident = resident >= 1 ? std::min(resident, kPerSm) : -1;
        }
        resident_cache[env.device].store(resident, std::memory_order_relaxed);
    }
    if (resident < 0) return kRcUnsupported;
    // 32-bit element offsets inside the kernel.
    if (static_cast<long long>(p.m) * p.k >= (1LL << 31) || static_cast<long long>(p.n) * p.k >= (1LL << 35)) {
        return kRcUnsupported;
    }
    const int n_tiles = (p.n + kWgTileN - 1) / kWgTileN;
    p.m_slices = (p.m + L::kRows - 1) / L::kRows;
    p.k_tiles = p.k / kTileK;
    p.total_iters = static_cast<long long>(p.m_slices) * n_tiles * p.k_tiles;
    const long long slots = static_cast<long long>(env.sm_count) * resident;
    p.whole_tiles = wgmma_whole_tiles(static_cast<long long>(p.m_slices) * n_tiles, slots) ? 1 : 0;
    // Stream-K: at least 8 k slices per block (or a whole tile), fewer contributors to each cut tile's FP32 sums.
    const long long min_iters = std::min(8, p.k_tiles);
    long long grid = std::max(1LL, std::min(slots, p.total_iters / min_iters));
    // The cut tiles' partial sums, one slot per block, from the workspace's start (no arrival counters: the fix-up
    // grid writes the cut tiles); as many blocks as the workspace holds slots.
    const size_t partial_bytes = static_cast<size_t>(L::kPartialFloats) * sizeof(float);
    grid = std::min(grid, static_cast<long long>(env.workspace_bytes / partial_bytes));
    if (grid < 1) return kRcWorkspace;
    p.counters = nullptr;
    p.partials = static_cast<float *>(env.workspace);
    kernel<<<static_cast<unsigned>(grid), kBlockThreads, kSmem, env.stream>>>(p);
    TL_GPU_CHECK_LAUNCH();
    if (p.whole_tiles) return 0;
    // Stream-K: the fix-up grid writes the tiles cut between blocks (a programmatic dependent launch).
    cudaLaunchConfig_t fixup{};
    fixup.gridDim = dim3(static_cast<unsigned>(p.total_iters / p.k_tiles));
    fixup.blockDim = dim3(L::kThreads);
    fixup.stream = env.stream;
    cudaLaunchAttribute early;
    allow_early_start(fixup, early);
    const cudaError_t fixup_rc =
        cudaLaunchKernelEx(&fixup, marlin_wgmma_fixup_kernel<L>, static_cast<const Params>(p), static_cast<int>(grid));
    if (fixup_rc != cudaSuccess) {
        (void)cudaGetLastError();
        // The workspace holds this call's sums: leave it zeroed for the next call.
        (void)cudaMemsetAsync(p.partials, 0, static_cast<size_t>(grid) * partial_bytes, env.stream);
        return static_cast<int>(fixup_rc);
    }
    return 0;
}

// The kernel for the weight's groups per 64-deep slice (GPT: 2 for group size 32, else 1).
template <int WGS, int ROWS, bool FUSED, Dtype D, bool WS = false>
int launch_for_groups(int gpt, const Params &p, const LaunchEnv &env) {
    return gpt == 2 ? launch_wgmma_kernel<WGS, ROWS, FUSED, 2, D, WS>(p, env)
                    : launch_wgmma_kernel<WGS, ROWS, FUSED, 1, D, WS>(p, env);
}

// The forms plan_marlin uses: 32-row tiles on one warpgroup or two, 64-row tiles on two with or without the copying
// warpgroup, 128-row tiles with it.
template <bool FUSED, Dtype D>
int pick_wgmma(const Params &p, const LaunchEnv &env, const MarlinPlan &plan, int gpt) {
    const bool ws = plan.wgmma_warp_specialized;
    if (plan.rows == 32 && !ws) {
        return plan.wgmma_warpgroups == 1 ? launch_for_groups<1, 32, FUSED, D>(gpt, p, env)
                                          : launch_for_groups<2, 32, FUSED, D>(gpt, p, env);
    }
    if (plan.wgmma_warpgroups != 2) return kRcUnsupported;
    if (plan.rows == 64) {
        return ws ? launch_for_groups<2, 64, FUSED, D, true>(gpt, p, env)
                  : launch_for_groups<2, 64, FUSED, D>(gpt, p, env);
    }
    if (plan.rows == 128 && ws) return launch_for_groups<2, 128, FUSED, D, true>(gpt, p, env);
    return kRcUnsupported;
}

}  // namespace

int launch_wgmma(Params p, const LaunchEnv &env, const MarlinPlan &plan, bool fused, int gpt, Dtype dtype) {
    if (env.compute_capability != 90) return kRcUnsupported;  // sm_90a code runs on 9.0 alone
    if (dtype == Dtype::BF16) return fused ? pick_wgmma<true, Dtype::BF16>(p, env, plan, gpt) : kRcUnsupported;
    return fused ? pick_wgmma<true, Dtype::F16>(p, env, plan, gpt) : pick_wgmma<false, Dtype::F16>(p, env, plan, gpt);
}

#else  // built without sm_90a: the dispatcher falls through to the other kernels

int launch_wgmma(Params, const LaunchEnv &, const MarlinPlan &, bool, int, Dtype) { return kRcUnsupported; }

#endif

}  // namespace tl::gpu::marlin

namespace tl::gpu {
#if defined(TL_HAVE_SM90A)
bool marlin_wgmma_built() { return true; }
#else
bool marlin_wgmma_built() { return false; }
#endif
}  // namespace tl::gpu
