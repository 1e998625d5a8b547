// The Marlin-class INT4 x FP16 GEMM on Hopper's warpgroup MMA (wgmma.mma_async; sm_90a only, so this file is
// compiled for that target alone: CMakeLists.txt, cuda/sources_sm90a.txt). Same packed weights as the other
// kernels (cpp/marlin_pack.hpp); used on the H200 from 33 rows, or 17 for small weights (marlin_wgmma_min_m_for).
//
// Operands swapped, as in the M <= 16 kernel: Y^T = W^T X^T. A block tile is 256 columns (four 64-column strips, one
// per warp of a warpgroup) x R rows of X (R = 64 on one warpgroup, or on two for small weights; R = 128 on two). Per
// k16 step, warp j of a warpgroup reads its strip's cell, whose word w (of 4) is the mma A fragment of the 16 x 16 tile
// of columns 16w .. 16w + 15, and dequantizes its warpgroup's share of the words (all 4, or 2 each with two warpgroups)
// to FP16 in registers (dequant_word: q*s + z, or (q - 8)*s). Word w of the four warps is the 64-row A operand of one
// wgmma m64nRk16 whose B operand (all R rows of X, 16 deep) the tensor cores read from shared memory through a
// descriptor; each word has its own 64 x R FP32 accumulator (rows: the strip's columns 16w + L/4 and 16w + 8 + L/4;
// columns: activation rows, as in the skinny kernel's swapped mma): 128 registers a thread (64 for the 64-row tile on
// two warpgroups). Splitting the words between warpgroups (rather than the rows) dequantizes each weight once per
// tile and issues half as many, twice as large wgmma. wgmma runs asynchronously: step i + 1 is dequantized while the
// tensor cores work on steps i, i - 1, ... (A fragments in 2 or 4 buffers; wait_group frees the oldest).
//
// X in shared memory: [row][64 k] FP16, 128-byte rows whose 16-byte chunks are XOR-swizzled by row % 8, which is
// the hardware's 128-byte swizzle for K-major operands (descriptor mode 1): the cp.async copies and the tensor
// cores agree on it and neither meets bank conflicts. Stages start on 1024-byte boundaries (the swizzle repeats
// every 8 rows). A stage is refilled two slices after it was consumed, because the last wgmma reading it may still
// run during the next slice. Stream-K partitioning and the reduction of cut tiles as in the other kernels; with many
// tiles, whole tiles round robin instead (see launch_wgmma_kernel).
#include "marlin_device.cuh"

namespace tl::gpu::marlin {

#if defined(TL_HAVE_SM90A)
namespace {

constexpr int kWgTileN = 256;  // columns per block tile: one 64-column strip per warp of a warpgroup
constexpr int kWholeTileWaves = 4;  // tiles per resident block from which whole-tile scheduling is used

template <int WGS, int ROWS, bool FUSED, int GPT>
struct WgmmaLayout {
    static constexpr int kThreads = 128 * WGS;
    static constexpr int kRows = ROWS;                // activation rows per tile (64 or 128)
    static constexpr int kX = kRows * 128;            // activations first: 1024-aligned
    static constexpr int kW = kTileK * kWgTileN / 2;  // weights: [strip][k16][lane][16 B], as in global memory
    static constexpr int kS = GPT * kWgTileN * 2;     // scales [GPT][256] (permuted as in global), then zeros
    static constexpr int kStage = (kX + kW + kS * (FUSED ? 2 : 1) + 1023) / 1024 * 1024;
    // Pipeline depth: what Hopper's 227 KB per block / 228 KB per SM hold at the residency below (checked at launch).
    static constexpr int kStages = WGS == 1 ? 6 : ROWS == 128 ? 8 : 10;
    static constexpr int kWords = 4 / WGS;  // words (16-column tiles of a strip) per warp
    static constexpr int kNB = kRows / 8;   // 8-row blocks of the accumulator (wgmma N / 8)
    // A-fragment buffers = wgmma groups (k16 steps) in flight + 1: as many as the registers allow (4 divides the
    // 4 steps of a slice, so a step's buffer is a compile-time index).
    static constexpr int kFragBufs = WGS == 1 ? 2 : 4;
    static constexpr int kPartialFloats = WGS * 4 * kWords * kNB * 32 * 4;  // cut-tile sums: [warp][w][nb][lane][4]
};

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// Keeps the compiler from moving reads or writes of an accumulator across the asynchronous wgmma's boundaries.
template <int R>
__device__ __forceinline__ void pin(float (&d)[R]) {
#pragma unroll
    for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// Descriptor of a K-major operand in the 128-byte swizzle: start address >> 4, leading byte offset (unused by this
// layout; 16), stride byte offset 1024 (from one 8-row group to the next), layout type 1 in bits 62-63.
__device__ __forceinline__ uint64_t desc_sw128(uint32_t addr) {
    return static_cast<uint64_t>((addr & 0x3FFFFu) >> 4) | (static_cast<uint64_t>(16 >> 4) << 16) |
           (static_cast<uint64_t>(1024 >> 4) << 32) | (static_cast<uint64_t>(1) << 62);
}

// D[64 x 64] += A[64 x 16] (registers: this warp's 16 rows) * B[16 x 64] (shared memory, K-major).
__device__ __forceinline__ void wgmma_64x64x16(float (&d)[32], const uint32_t (&a)[4], uint64_t desc) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n"
        "}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1)
        : "memory");
}

// D[64 x 128] += A[64 x 16] (registers) * B[16 x 128] (shared memory, K-major).
__device__ __forceinline__ void wgmma_64x128x16(float (&d)[64], const uint32_t (&a)[4], uint64_t desc) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, 0;\n"
        "}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1)
        : "memory");
}

// 2 * WORDS FP16 values -> (v, v) pairs: one 16-byte load for 4 words (load_broadcast8), 8 bytes for 2.
template <int WORDS>
__device__ __forceinline__ void load_broadcast(const uint16_t *src, uint32_t (&out)[2 * WORDS]) {
    if constexpr (WORDS == 4) {
        load_broadcast8(src, out);
    } else {
        const uint2 raw = *reinterpret_cast<const uint2 *>(src);
        out[0] = __byte_perm(raw.x, 0, 0x1010);
        out[1] = __byte_perm(raw.x, 0, 0x3232);
        out[2] = __byte_perm(raw.y, 0, 0x1010);
        out[3] = __byte_perm(raw.y, 0, 0x3232);
    }
}

// The shape by the accumulator's size: 32 registers = m64n64k16, 64 = m64n128k16.
__device__ __forceinline__ void wgmma_64xRx16(float (&d)[32], const uint32_t (&a)[4], uint64_t desc) {
    wgmma_64x64x16(d, a, desc);
}
__device__ __forceinline__ void wgmma_64xRx16(float (&d)[64], const uint32_t (&a)[4], uint64_t desc) {
    wgmma_64x128x16(d, a, desc);
}

template <int WGS, int ROWS, bool FUSED, int GPT>
__global__ void __launch_bounds__(128 * WGS, 1) marlin_wgmma_kernel(const Params p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using L = WgmmaLayout<WGS, ROWS, FUSED, GPT>;
    extern __shared__ uint8_t smem_raw[];
    __shared__ int last_contributor;
    const uint32_t raw_base = smem_addr(smem_raw);
    const uint32_t smem_base = (raw_base + 1023u) & ~1023u;  // the launch adds 1024 bytes of slack
    uint8_t *const smem = smem_raw + (smem_base - raw_base);

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int wg = warp / 4, strip_in_tile = warp % 4;
    // This block's k slices, numbered 0 .. total - 1: stream-K, the range [begin, end) of all (tile, k slice) pairs;
    // whole tiles, tiles blockIdx.x + j * gridDim.x, all their slices. tile_step: from one tile of ours to the next.
    long long begin, total_ll;
    int tile_step;
    if (p.whole_tiles) {
        const long long tiles = p.total_iters / p.k_tiles;
        begin = static_cast<long long>(blockIdx.x) * p.k_tiles;
        total_ll = (tiles - blockIdx.x + gridDim.x - 1) / gridDim.x * p.k_tiles;
        tile_step = gridDim.x;
    } else {
        begin = static_cast<long long>(blockIdx.x) * p.total_iters / gridDim.x;
        total_ll = (static_cast<long long>(blockIdx.x) + 1) * p.total_iters / gridDim.x - begin;
        tile_step = 1;
    }
    if (total_ll <= 0) return;
    const int strips = p.n / 64;
    const int k16s = p.k / 16;

    // ---- Copy side: per stage, 4 strips x 2 KB of weights (contiguous in global memory), kRows x 8 activation
    // chunks (8 consecutive threads read one row's 128 bytes), GPT rows of 256 scales (and zeros). The sources are
    // 32-bit element offsets, set per tile by locate() (the divisions) and stepped per slice by advance().
    constexpr int kWChunks = L::kW / 16 / L::kThreads;
    constexpr int kXChunks = L::kRows * 8 / L::kThreads;
    constexpr int kXRowStep = L::kThreads / 8;  // a multiple of 8: every copy of a thread has the same swizzle
    const int x_row = tid / 8, x_chunk = tid % 8;
    const uint32_t x_dst = x_row * 128 + ((x_chunk ^ (x_row % 8)) * 16);
    const int s_part = tid / 64, s_idx = tid % 64;
    const bool copies_s = s_idx < GPT * 32 && (s_part == 0 || (FUSED && s_part == 1));
    const uint32_t w_stride = static_cast<uint32_t>(WGS) * k16s * 32;  // uint4 from one of a thread's strips to the next
    const uint16_t *const s_base = s_part == 0 ? p.scales : p.zeros;
    int f_tile = 0, f_kt = 0, f_k_left = 0;  // the next slice to fetch; k left in its group (GPT = 1)
    uint32_t f_w = 0, f_x[kXChunks], f_s = 0;  // offsets: uint4 of words, elements of x and of scales
    unsigned w_ok = 0, x_ok = 0;             // which of the thread's weight / activation copies are in range
    bool s_ok = false;
    auto locate = [&](int tile, int kt) {
        f_tile = tile;
        f_kt = kt;
        const int n_tile = tile / p.m_slices, m_slice = tile - n_tile * p.m_slices;
        const int strip0 = n_tile * 4 + tid / 128;
        f_w = (static_cast<uint32_t>(strip0) * k16s + kt * 4) * 32 + tid % 128;
        w_ok = 0;
#pragma unroll
        for (int i = 0; i < kWChunks; ++i) w_ok |= (strip0 + i * WGS < strips ? 1u : 0u) << i;
        x_ok = 0;
#pragma unroll
        for (int i = 0; i < kXChunks; ++i) {
            const int row = m_slice * L::kRows + x_row + i * kXRowStep;
            const bool ok = row < p.m;  // else zero-filled from row 0 (a valid address)
            x_ok |= (ok ? 1u : 0u) << i;
            f_x[i] = static_cast<uint32_t>(ok ? row : 0) * p.k + kt * kTileK + x_chunk * 8;
        }
        const int r = s_idx / 32, cc = s_idx % 32;
        s_ok = copies_s && n_tile * 4 + cc / 8 < strips;
        const int group = GPT == 2 ? kt * 2 + r : kt * kTileK / p.group_size;
        f_s = static_cast<uint32_t>(group) * p.n + n_tile * kWgTileN + cc * 8;
        f_k_left = p.group_size - kt * kTileK % p.group_size;
    };
    auto advance = [&]() {
        if (++f_kt == p.k_tiles) {
            locate(f_tile + tile_step, 0);
            return;
        }
        f_w += 4 * 32;
#pragma unroll
        for (int i = 0; i < kXChunks; ++i) f_x[i] += kTileK;
        if constexpr (GPT == 2) {
            f_s += 2 * p.n;
        } else if ((f_k_left -= kTileK) == 0) {
            f_k_left = p.group_size;
            f_s += p.n;
        }
    };
    auto load_stage = [&](int stage) {
        const uint32_t st = smem_base + stage * L::kStage;
        const uint4 *words = reinterpret_cast<const uint4 *>(p.words);
#pragma unroll
        for (int i = 0; i < kWChunks; ++i) {
            // Past N: zero-filled from a valid address (the warp of that strip still joins the warpgroup's wgmma;
            // its rows are dropped).
            const bool ok = w_ok >> i & 1u;
            cp_async16_zfill(st + L::kX + (tid + i * L::kThreads) * 16, words + (ok ? f_w + i * w_stride : 0u), ok);
        }
#pragma unroll
        for (int i = 0; i < kXChunks; ++i) {
            cp_async16_zfill(st + x_dst + i * kXRowStep * 128, p.x + f_x[i], x_ok >> i & 1u);
        }
        const int r = s_idx / 32, cc = s_idx % 32;
        if (s_ok) cp_async16(st + L::kX + L::kW + s_part * L::kS + r * (kWgTileN * 2) + cc * 16, s_base + f_s);
    };

    // ---- Compute side. This warp's words: wg * kWords + wi, wi < kWords.
    constexpr int kWords = L::kWords, kNB = L::kNB;
    const int g = lane / 4;
    float acc[kWords][kNB * 4];
    uint32_t a[L::kFragBufs][kWords][4];
    auto zero_acc = [&]() {
#pragma unroll
        for (int wi = 0; wi < kWords; ++wi) {
#pragma unroll
            for (int i = 0; i < kNB * 4; ++i) acc[wi][i] = 0.0f;
            pin(acc[wi]);
        }
    };
    auto compute_stage = [&](int stage) {
        const uint8_t *st = smem + stage * L::kStage;
        const uint32_t x_addr = smem_base + stage * L::kStage;
        // The lane's 16-byte cell of each k16 step; this warpgroup's words start at byte wg * 4 * kWords.
        const uint8_t *w_src = st + L::kX + (strip_in_tile * 128 + lane) * 16 + wg * 4 * kWords;
        // The lane's scales are those of columns 8j + L/4 (j < 8, 16 bytes, permuted layout); this warpgroup's
        // words need j in [2 kWords wg, 2 kWords (wg + 1)).
        const uint16_t *s_src = reinterpret_cast<const uint16_t *>(st + L::kX + L::kW) + strip_in_tile * 64 + g * 8 +
                                wg * 2 * kWords;
        uint32_t s8[2 * kWords], z8[2 * kWords];  // (s, s) pairs of this warpgroup's columns (and zeros)
#pragma unroll
        for (int k16 = 0; k16 < 4; ++k16) {
            if (k16 == 0 || (GPT == 2 && k16 == 2)) {  // this group's scales (and zeros)
                const int row = GPT == 2 ? k16 / 2 : 0;
                load_broadcast<kWords>(s_src + row * kWgTileN, s8);
                if constexpr (FUSED) {
                    load_broadcast<kWords>(s_src + (GPT + row) * kWgTileN, z8);
                } else {
#pragma unroll
                    for (int i = 0; i < 2 * kWords; ++i) z8[i] = 0u;
                }
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
                dequant_word<FUSED>(words[wi], s8[2 * wi], s8[2 * wi + 1], z8[2 * wi], z8[2 * wi + 1], frag[wi]);
            }
            wgmma_fence();
            const uint64_t desc = desc_sw128(x_addr + k16 * 32);
#pragma unroll
            for (int wi = 0; wi < kWords; ++wi) wgmma_64xRx16(acc[wi], frag[wi], desc);
            wgmma_commit();
            // Step k16 + 1 - kFragBufs is done: its fragment buffer may be refilled. (At most 4 steps in flight, so
            // a stage is free two slices after it was consumed.)
            wgmma_wait<L::kFragBufs - 1>();
        }
    };

    // Writes (or, for a tile cut between blocks, reduces) the finished tile `tile`, of which this block did `iters`
    // k slices; the reduction is the skinny kernel's, workspace layout [warp][w][nb][lane][4] with the four values
    // ordered (row r, column c), (r, c + 8), (r + 1, c), (r + 1, c + 8).
    auto finish_tile = [&](int tile, int iters) {
        const int n_tile = tile / p.m_slices, m_slice = tile - n_tile * p.m_slices;
        const bool warp_active = n_tile * 4 + strip_in_tile < strips;
        const int row0 = m_slice * L::kRows + 2 * (lane % 4);
        uint16_t *y0 = p.y + static_cast<size_t>(row0) * p.n + (n_tile * 4 + strip_in_tile) * 64 + g;
        if (iters == p.k_tiles) {  // the whole tile is ours
            if (!warp_active) return;
#pragma unroll
            for (int nb = 0; nb < kNB; ++nb) {
                const int row = row0 + nb * 8;
#pragma unroll
                for (int wi = 0; wi < kWords; ++wi) {
                    const float *d = &acc[wi][4 * nb];
                    store_quad(y0 + static_cast<size_t>(nb * 8) * p.n + 16 * (wg * kWords + wi), p.n, d[0], d[2], d[1],
                               d[3], quad_rows(row, p.m));
                }
            }
            return;
        }
        const long long first = static_cast<long long>(tile) * p.k_tiles;
        const int slot = static_cast<int>(((first + 1) * gridDim.x - 1) / p.total_iters);
        float *part =
            p.partials + static_cast<size_t>(slot) * L::kPartialFloats + warp * (kWords * kNB * 128) + lane * 4;
        if (warp_active) {
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
        if (!arrive_last(p.counters + slot, iters, p.k_tiles, last_contributor)) return;
        if (warp_active) {
#pragma unroll
            for (int nb = 0; nb < kNB; ++nb) {
                const int row = row0 + nb * 8;
#pragma unroll
                for (int wi = 0; wi < kWords; ++wi) {
                    const int rows = quad_rows(row, p.m);
                    const float4 v = take_partial_quad(part + (wi * kNB + nb) * 128, rows);
                    store_quad(y0 + static_cast<size_t>(nb * 8) * p.n + 16 * (wg * kWords + wi), p.n, v.x, v.y, v.z,
                               v.w, rows);
                }
            }
        }
        if (tid == 0) p.counters[slot] = 0;
    };

    const int total = static_cast<int>(total_ll);
    int to_fetch = total;
    auto fetch = [&](int stage) {
        if (to_fetch > 0) {
            load_stage(stage);
            if (--to_fetch > 0) advance();  // (never locates a tile past the last)
        }
        cp_async_commit();  // empty groups keep the group count uniform for wait_group
    };
    locate(static_cast<int>(begin / p.k_tiles), static_cast<int>(begin % p.k_tiles));
#pragma unroll
    for (int s = 0; s < L::kStages - 2; ++s) fetch(s);

    zero_acc();
    int stage = 0;
    int tile = static_cast<int>(begin / p.k_tiles);
    for (int done = 0; done < total; tile += tile_step) {
        const int kt_begin = done == 0 ? static_cast<int>(begin % p.k_tiles) : 0;
        const int kt_end = std::min(kt_begin + total - done, p.k_tiles);
#pragma unroll 1
        for (int kt = kt_begin; kt < kt_end; ++kt) {
            cp_async_wait<L::kStages - 3>();
            __syncthreads();  // stage `stage` landed for everyone; the stage refilled below is free for everyone
            fetch(stage >= 2 ? stage - 2 : stage + L::kStages - 2);
            compute_stage(stage);
            stage = stage == L::kStages - 1 ? 0 : stage + 1;
        }
        wgmma_wait<0>();
#pragma unroll
        for (int wi = 0; wi < kWords; ++wi) pin(acc[wi]);
        finish_tile(tile, kt_end - kt_begin);
        zero_acc();
        done += kt_end - kt_begin;
    }
    cp_async_wait<0>();
#endif
}

template <int WGS, int ROWS, bool FUSED, int GPT>
int launch_wgmma_kernel(Params p, const LaunchEnv &env) {
    using L = WgmmaLayout<WGS, ROWS, FUSED, GPT>;
    // One warpgroup per block: two blocks per SM wanted (their wgmma interleave); two warpgroups: one block.
    constexpr int kPerSm = WGS == 1 ? 2 : 1;
    // Resident blocks per SM (registers and shared memory), cached per device: 0 = not set up, -1 = none fits.
    static std::atomic<int> resident_cache[64];
    if (env.device < 0 || env.device >= 64) return static_cast<int>(cudaErrorInvalidDevice);
    auto kernel = marlin_wgmma_kernel<WGS, ROWS, FUSED, GPT>;
    constexpr int kSmem = L::kStages * L::kStage + 1024;  // + the slack that aligns the ring to 1024 bytes
    int resident = resident_cache[env.device].load(std::memory_order_relaxed);
    if (resident == 0) {
        resident = -1;
        if (kSmem + kStaticSmemReserve <= env.max_smem_optin) {
            TL_GPU_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
            TL_GPU_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, kernel, L::kThreads, kSmem));
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
    // Many tiles (at least kWholeTileWaves per resident block): whole tiles, round robin. The blocks running at
    // once then hold neighbouring tiles (rows fastest), so the weights they read are shared through L2; stream-K
    // ranges would put every column panel in flight at once and read each panel from HBM once per row slice.
    p.whole_tiles = static_cast<long long>(p.m_slices) * n_tiles >= kWholeTileWaves * slots ? 1 : 0;
    // Stream-K: at least 8 k slices per block (or a whole tile), fewer contributors to each cut tile's FP32 sums.
    const long long min_iters = std::min(8, p.k_tiles);
    long long grid = std::max(1LL, std::min(slots, p.total_iters / min_iters));
    const size_t partial_bytes = static_cast<size_t>(L::kPartialFloats) * sizeof(float);
    auto counter_bytes = [](long long blocks) { return (static_cast<size_t>(blocks) * sizeof(int) + 255) / 256 * 256; };
    // As many blocks as the workspace holds (counters rounded up to 256 bytes: at most 256 more than 4 per block).
    if (env.workspace_bytes > 256) {
        grid = std::min(grid, static_cast<long long>((env.workspace_bytes - 256) / (sizeof(int) + partial_bytes)));
    }
    if (grid < 1 || counter_bytes(grid) + static_cast<size_t>(grid) * partial_bytes > env.workspace_bytes) {
        return kRcWorkspace;
    }
    p.counters = static_cast<int *>(env.workspace);
    p.partials = reinterpret_cast<float *>(static_cast<uint8_t *>(env.workspace) + counter_bytes(grid));
    kernel<<<static_cast<unsigned>(grid), L::kThreads, kSmem, env.stream>>>(p);
    TL_GPU_CHECK_LAUNCH();
    return 0;
}

// Whether `device` is compute capability 9.0, the only one that runs sm_90a code (cached per device).
template <bool FUSED>
int pick_wgmma(Params p, const LaunchEnv &env, int gpt) {
    if (p.m <= 64) {
        // Up to 64 rows: one warpgroup per block, two blocks per SM; or, for a weight of at most
        // env.wgmma_split_max_kn elements, two warpgroups per block splitting the tile's words (each weight still
        // dequantized once), one block per SM. Measured on the H200 (gpu-notes.md, sixth shift) at M = 33-64: the
        // split is 6-22% faster on weights up to 8B down (K.N = 58.7M: 4096 or fewer 64-deep slices in all), 3-17%
        // slower on 8B gate+up and the 70B layers, where two independent blocks per SM keep more in flight.
        if (static_cast<long long>(p.k) * p.n <= env.wgmma_split_max_kn) {
            return gpt == 2 ? launch_wgmma_kernel<2, 64, FUSED, 2>(p, env)
                            : launch_wgmma_kernel<2, 64, FUSED, 1>(p, env);
        }
        return gpt == 2 ? launch_wgmma_kernel<1, 64, FUSED, 2>(p, env) : launch_wgmma_kernel<1, 64, FUSED, 1>(p, env);
    }
    return gpt == 2 ? launch_wgmma_kernel<2, 128, FUSED, 2>(p, env) : launch_wgmma_kernel<2, 128, FUSED, 1>(p, env);
}

}  // namespace

int launch_wgmma(Params p, const LaunchEnv &env, bool fused, int gpt) {
    if (env.compute_capability != 90) return kRcUnsupported;  // sm_90a code runs on 9.0 alone
    return fused ? pick_wgmma<true>(p, env, gpt) : pick_wgmma<false>(p, env, gpt);
}

#else  // built without sm_90a: the dispatcher falls through to the other kernels

int launch_wgmma(Params, const LaunchEnv &, bool, int) { return kRcUnsupported; }

#endif

}  // namespace tl::gpu::marlin

namespace tl::gpu {
#if defined(TL_HAVE_SM90A)
bool marlin_wgmma_built() { return true; }
#else
bool marlin_wgmma_built() { return false; }
#endif
}  // namespace tl::gpu
