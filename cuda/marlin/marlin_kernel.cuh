// The classic Marlin-class INT4 x FP16/BF16 GEMM kernel (mma.sync, SM 8.0 - 9.0): Y[M, N] = X[M, K] @ W[K, N], W
// packed by tl::marlin_pack in the layout of marlin_layout.hpp. It runs M > 16 on GPUs without the wgmma
// kernel, and any M where the stream or wgmma kernel refuses a call (marlin_plan.hpp). Written for this
// project; upstream Marlin was read to understand the technique, nothing was copied.
//
// Shape of the computation
//  - A block of 8 warps owns a tile of MB*16 rows x 512 columns; warp w owns the 64-column strip w of the tile
//    for the whole k range, so no intra-block reduction is ever needed.
//  - A pipeline stage is a k slice of 64: 16 KB of packed weights (each warp copies its own 2 KB strip), the
//    activations X[rows, 64] and the scales (and zeros) of the groups in the slice, all moved by cp.async into a ring
//    in shared memory as deep as one block per SM allows (3 to kMaxStages stages: launch_kernel), every stage but the
//    one being computed in flight.
//  - Weights are dequantized in registers with the magic-number trick (lop3 puts a nibble into the mantissa of
//    1024.0 in FP16, of 128.0 in BF16), then fed to mma.sync.m16n8k16 (FP16 or BF16 in, FP32 accumulation).
//    Activations come from ldmatrix.
//
// Partitioning (stream-K): the (tile, k slice) iterations of the whole problem are laid out in one line, tile major,
// and cut into gridDim.x equal ranges, one per block, with gridDim.x = one block per SM, or fewer where that would
// leave a block under kMinItersPerBlock k slices. Every block therefore gets the same number of k slices whatever M, N
// and K are (no wave quantization). A tile cut between blocks is reduced through an FP32 workspace: each contributor
// adds its partial sums (add_partial: red.global.add on Hopper, atomicAdd before), then bumps the tile's counter by the
// number of k slices it did (arrive_last); the block that brings the counter to k_tiles is the last one, reads the
// sums, writes Y (FP16 or BF16) and re-zeroes the workspace and counter for the next call. We chose this over Marlin's
// serialized in-place reduction because no block ever waits for another (no co-residency assumption: safe under MPS,
// compute-sanitizer or a partially busy GPU) and the contributors' reductions overlap each other. The price: the FP32
// summation order of a cut tile varies between runs (results may differ by FP32 rounding, at most about 1 FP16 ulp).
#pragma once

#include "marlin_device.cuh"

namespace tl::gpu::marlin {

template <int MB, bool FUSED, int GPT>
struct Smem {
    static constexpr int kB = kTileK * kTileN / 2;
    static constexpr int kA = MB * 16 * kTileK * 2;
    static constexpr int kS = GPT * kTileN * 2;
    static constexpr int kStage = stage_bytes(MB, FUSED, GPT);
    static_assert(kStage == kB + kA + kS * (FUSED ? 2 : 1), "stage layout: [weights | activations | scales | zeros]");
};

struct Cursor {
    int tile;
    int kt;
    __device__ void advance(int k_tiles) {
        if (++kt == k_tiles) {
            kt = 0;
            ++tile;
        }
    }
};

template <int MB, bool FUSED, int GPT, Dtype D>
__global__ void __launch_bounds__(kThreads, 1) marlin_gemm_kernel(const Params p) {
    using L = Smem<MB, FUSED, GPT>;
    extern __shared__ __align__(128) uint8_t smem[];
    __shared__ int last_contributor;

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const long long begin = static_cast<long long>(blockIdx.x) * p.total_iters / gridDim.x;
    const long long end = (static_cast<long long>(blockIdx.x) + 1) * p.total_iters / gridDim.x;
    if (begin >= end) return;  // more blocks than k slices: nobody waits for an empty block
    const int strips = p.n / 64;
    const int k16s = p.k / 16;
    // Issues the cp.async copies of iteration `c` into stage `stage`.
    auto load_stage = [&](int stage, Cursor c) {
        uint8_t *st = smem + stage * L::kStage;
        const int n_tile = c.tile / p.m_slices, m_slice = c.tile - n_tile * p.m_slices;
        const int strip = n_tile * kWarps + warp;
        const int group0 = GPT == 2 ? c.kt * 2 : c.kt * kTileK / p.group_size;
        if (strip < strips) {  // this warp's strip: kK16 cells of 512 bytes, contiguous in global memory
            const uint4 *src = reinterpret_cast<const uint4 *>(p.words) +
                               (static_cast<size_t>(strip) * k16s + c.kt * kK16) * 32;
            const uint32_t dst = smem_addr(st) + warp * (kK16 * 512);
#pragma unroll
            for (int j = 0; j < kK16; ++j) cp_async16(dst + (lane + 32 * j) * 16, src + lane + 32 * j);
        }
        // Activations: MB*16 rows x 8 chunks of 16 bytes, chunk index XOR-swizzled by row so ldmatrix is
        // conflict-free; rows past M are zero-filled.
        const uint32_t a_dst = smem_addr(st + L::kB);
#pragma unroll
        for (int i = tid; i < MB * 16 * 8; i += kThreads) {
            const int r = i / 8, ch = i % 8;
            const int row = m_slice * MB * 16 + r;
            const bool valid = row < p.m;
            const uint16_t *src = p.x + (valid ? static_cast<size_t>(row) * p.k + c.kt * kTileK + ch * 8 : 0);
            cp_async16_zfill(a_dst + r * 128 + ((ch ^ (r % 8)) * 16), src, valid);
        }
        // Scales (threads 0..127) and zeros (threads 128..255) of the GPT groups of this k slice.
        const int part = tid / 128, idx = tid % 128;
        if (idx < GPT * 64 && (part == 0 || FUSED)) {
            const int r = idx / 64, ch = idx % 64;
            if (n_tile * kWarps + ch / 8 < strips) {
                const uint16_t *base = part == 0 ? p.scales : p.zeros;
                const uint16_t *src = base + static_cast<size_t>(group0 + r) * p.n + n_tile * kTileN + ch * 8;
                cp_async16(smem_addr(st + L::kB + L::kA + part * L::kS) + r * (kTileN * 2) + ch * 16, src);
            }
        }
    };

    float acc[MB][8][4];
    auto zero_acc = [&]() {
#pragma unroll
        for (int mb = 0; mb < MB; ++mb)
#pragma unroll
            for (int j = 0; j < 8; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[mb][j][e] = 0.0f;
    };
    zero_acc();

    // Multiplies the stage into acc (this warp's strip, all MB row blocks).
    auto compute_stage = [&](int stage) {
        const uint8_t *st = smem + stage * L::kStage;
        const uint4 *b_src = reinterpret_cast<const uint4 *>(st) + warp * kK16 * 32 + lane;
        const uint32_t a_base = smem_addr(st + L::kB);
        const uint16_t *s_src = reinterpret_cast<const uint16_t *>(st + L::kB + L::kA) + warp * 64 + (lane / 4) * 8;
        uint32_t s[8], z[8];
#pragma unroll
        for (int k16 = 0; k16 < kK16; ++k16) {
            if (k16 == 0 || (GPT == 2 && k16 == kK16 / 2)) {
                const int row = GPT == 2 ? k16 / (kK16 / 2) : 0;
                load_group<4, FUSED, D>(s_src + row * kTileN, s_src + GPT * kTileN + row * kTileN, s, z);
            }
            // Dequantize the whole 16 x 64 slice first, then stream the row blocks through it: only one A
            // fragment is live at a time, which keeps MB = 4 within the register file.
            const uint4 bw = b_src[k16 * 32];
            const uint32_t words[4] = {bw.x, bw.y, bw.z, bw.w};
            uint32_t b[4][4];
#pragma unroll
            for (int w = 0; w < 4; ++w) {
                dequant_word<FUSED, D>(words[w], s[2 * w], s[2 * w + 1], z[2 * w], z[2 * w + 1], b[w]);
            }
#pragma unroll
            for (int mb = 0; mb < MB; ++mb) {
                uint32_t a[4];
                const int r = mb * 16 + ((lane / 8) % 2) * 8 + lane % 8;
                const int ch = k16 * 2 + lane / 16;
                ldmatrix_x4(a, a_base + r * 128 + ((ch ^ (lane % 8)) * 16));
#pragma unroll
                for (int w = 0; w < 4; ++w) {
                    mma_16816<D>(acc[mb][2 * w], a, b[w][0], b[w][2]);
                    mma_16816<D>(acc[mb][2 * w + 1], a, b[w][1], b[w][3]);
                }
            }
        }
    };

    // Writes (or, for a tile cut between blocks, reduces) the finished tile `tile`, of which this block did
    // `iters` k slices. Addresses are one base pointer plus compile-time offsets, so that the compiler does not
    // hoist 32 loop-invariant offsets into registers across the main loop.
    auto finish_tile = [&](int tile, int iters) {
        const int n_tile = tile / p.m_slices, m_slice = tile - n_tile * p.m_slices;
        const bool warp_active = n_tile * kWarps + warp < strips;
        const int row0 = m_slice * MB * 16 + lane / 4;
        uint16_t *y0 = p.y + static_cast<size_t>(row0) * p.n + n_tile * kTileN + warp * 64 + 2 * (lane % 4);
        const size_t ystride8 = 8 * static_cast<size_t>(p.n);
        if (iters == p.k_tiles) {  // the whole tile is ours
            if (!warp_active) return;
#pragma unroll
            for (int mb = 0; mb < MB; ++mb) {
                const int row = row0 + mb * 16;
                uint16_t *out = y0 + 2 * mb * ystride8;
#pragma unroll
                for (int j = 0; j < 8; ++j) {
                    if (row < p.m) store_pair<D>(out + j * 8, acc[mb][j][0], acc[mb][j][1]);
                    if (row + 8 < p.m) store_pair<D>(out + ystride8 + j * 8, acc[mb][j][2], acc[mb][j][3]);
                }
            }
            return;
        }
        // The tile's workspace slot is the block that holds its first k slice: distinct cut tiles have distinct
        // first blocks, so slots never collide. Layout [warp][mb][j][lane][4]: coalesced, and only this block
        // geometry ever reads it.
        const long long first = static_cast<long long>(tile) * p.k_tiles;
        const int slot = static_cast<int>(((first + 1) * gridDim.x - 1) / p.total_iters);
        float *part = p.partials + static_cast<size_t>(slot) * (MB * kPartialFloats) + warp * (MB * 8 * 128) + lane * 4;
        if (warp_active) {
#pragma unroll
            for (int mb = 0; mb < MB; ++mb) {
                const int row = row0 + mb * 16;
#pragma unroll
                for (int j = 0; j < 8; ++j) {
                    float *at = part + (mb * 8 + j) * 128;
                    if (row < p.m) add_partial(at, acc[mb][j][0], acc[mb][j][1]);
                    if (row + 8 < p.m) add_partial(at + 2, acc[mb][j][2], acc[mb][j][3]);
                }
            }
        }
        if (!arrive_last(p.counters + slot, iters, p.k_tiles, last_contributor)) return;
        if (warp_active) {
#pragma unroll
            for (int mb = 0; mb < MB; ++mb) {
                const int row = row0 + mb * 16;
                uint16_t *out = y0 + 2 * mb * ystride8;
#pragma unroll
                for (int j = 0; j < 8; ++j) {
                    float2 *sum = reinterpret_cast<float2 *>(part + (mb * 8 + j) * 128);
                    if (row < p.m) {
                        const float2 v = __ldcg(sum);
                        __stcg(sum, make_float2(0.0f, 0.0f));
                        store_pair<D>(out + j * 8, v.x, v.y);
                    }
                    if (row + 8 < p.m) {
                        const float2 v = __ldcg(sum + 1);
                        __stcg(sum + 1, make_float2(0.0f, 0.0f));
                        store_pair<D>(out + ystride8 + j * 8, v.x, v.y);
                    }
                }
            }
        }
        if (tid == 0) p.counters[slot] = 0;
    };

    const Cursor start{static_cast<int>(begin / p.k_tiles), static_cast<int>(begin % p.k_tiles)};
    Cursor fetch = start;
    long long fetched = begin;
    for (int s = 0; s < p.stages - 1; ++s) {
        if (fetched < end) {
            load_stage(s, fetch);
            fetch.advance(p.k_tiles);
            ++fetched;
        }
        cp_async_commit();  // empty groups keep the group count uniform for wait_group
    }

    // Outer loop: the tile segments of our range; inner loop: their k slices (the hot loop, kept free of the
    // epilogue so that the register allocator sees the accumulators and the fragments only).
    int stage = 0;
    for (long long it = begin; it < end;) {
        const int tile = static_cast<int>(it / p.k_tiles);
        const long long seg_end = std::min(end, static_cast<long long>(tile + 1) * p.k_tiles);
        const bool warp_active = (tile / p.m_slices) * kWarps + warp < strips;
#pragma unroll 1
        for (; it < seg_end; ++it) {
            cp_async_wait_pending(p.stages - 2);
            __syncthreads();  // stage `stage` landed for everyone; everyone is done with the stage refilled below
            if (fetched < end) {
                load_stage(stage == 0 ? p.stages - 1 : stage - 1, fetch);
                fetch.advance(p.k_tiles);
                ++fetched;
            }
            cp_async_commit();
            if (warp_active) compute_stage(stage);
            stage = stage == p.stages - 1 ? 0 : stage + 1;
        }
        finish_tile(tile, static_cast<int>(seg_end - std::max(begin, static_cast<long long>(tile) * p.k_tiles)));
        zero_acc();
    }
    cp_async_wait<0>();
}

template <int MB, bool FUSED, int GPT, Dtype D>
int launch(Params p, const LaunchEnv &env) {
    static_assert(MB == 2 || MB == 4, "tiles of 32 or 64 rows");
    static std::atomic<int> stages_cache[64][2];
    return launch_kernel(marlin_gemm_kernel<MB, FUSED, GPT, D>, p, env, stage_bytes(MB, FUSED, GPT), 1,
                         kMinItersPerBlock, MB * kPartialFloats, stages_cache);
}

}  // namespace tl::gpu::marlin
