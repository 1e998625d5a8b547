// The Marlin-class INT4 x FP16/BF16 GEMM for M <= 16 without any block barrier ("stream" kernel, SM 8.0 - 9.0). The
// arithmetic is marlin_swapped.cuh's (swapped operands: the packed words are mma A fragments; nibbles unscaled and
// left biased; scale and zero applied per group on the FP32 sums); this file is how work and data reach the warps.
//
// Why: where a block's warps meet at one block barrier per slice (a stage holds activations and scales that other
// threads copied, as in the classic kernel), the slowest warp sets the pace and all warps issue their loads in bursts
// (measured on the H200: barrier and data waits). Here every warp is independent. It streams its own share of the
// weights through a private cp.async ring in shared memory; a stage holds the warp's 64-column strip x 128 k of packed
// words (each lane copies exactly the 16-byte pieces it later reads), the strip's scales (and zeros) and the M
// activation rows of those 128 k; the pieces that other lanes read are ordered by __syncwarp alone. Activations are
// re-read by every warp (from L2; M x 256 bytes per 4 KB of weights).
//
// Work split: stream-K at warp granularity. The (strip, 128-deep slice) pairs, strip-major, are one sequence (the
// packed words lie in memory in that order); warp i of W takes the contiguous share [i T / W, (i + 1) T / W), so every
// warp of the grid streams the same number of slices within one. A warp holding a whole strip stores it directly; a
// strip cut between warps (only a warp's first and last strip can be) is added into an FP32 workspace by reductions
// without a result (`red`), and a second, small kernel (marlin_stream_fixup_kernel) writes each cut strip's sums to Y
// and re-zeroes them. Why not the usual stream-K arrival counter, the last arriving warp writing Y: while the grid
// streams, an L2 round trip waits behind the DRAM traffic for microseconds, and the counter costs three in a row
// (fence, atomic, read-back) at the end of each cut strip, mid-stream for every warp that crosses a strip: on the
// H200 ~7 us on each such warp (per-warp timelines) and ~11 us on the kernel (ablation).
// The kernel boundary orders the reductions before the fix-up's reads for free.
// Requires K % 128 == 0 and a group size of 32, 64 or a multiple of 128 (per column included); else the launcher
// refuses and marlin_gemm runs the classic kernel.
#pragma once

#include "marlin_swapped.cuh"

namespace tl::gpu::marlin {

constexpr int kStreamStageK = 128;                          // k per stage (8 k16 steps)
constexpr int kStreamWeightBytes = kStreamStageK * 64 / 2;  // one warp's packed weights per stage: 4 KB
constexpr int kStreamMaxStages = 8;                         // cp_async_wait_pending covers 6 pending stages

// Bytes of one warp's stage: weights, then per group 8 pieces of scales (and 8 of zeros), then M activation rows of
// 128 k; pieces of 16 bytes.
constexpr int stream_stage_bytes(bool fused, int gps, int m) {
    return kStreamWeightBytes + gps * (fused ? 16 : 8) * 16 + m * kStreamStageK * 2;
}

// GPS: groups per 128-deep stage (1: group size a multiple of 128 or per column; 2: 64; 4: 32).
// NB = 2 runs one block per SM: its 16 activation rows need more than 128 registers without spills in the hot loop.
template <int NB, bool FUSED, int GPS, Dtype D>
__global__ void __launch_bounds__(kThreads, NB == 1 ? 2 : 1) marlin_stream_kernel(const Params p) {
    constexpr int kSteps = kStreamStageK / 16;
    // Scales 0-7, zeros 8-15: piece j % 8 holds the strip's columns j % 8 + 8i, i = 0..7 (marlin_layout.hpp).
    constexpr int kPiecesPerGroup = FUSED ? 16 : 8;
    constexpr int kPieces = GPS * kPiecesPerGroup;
    constexpr int kXOffset = kStreamWeightBytes + kPieces * 16;
    constexpr int kStepsPerGroup = kSteps / GPS;
    extern __shared__ __align__(128) uint8_t smem[];

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const long long warps = static_cast<long long>(gridDim.x) * kWarps, gw = blockIdx.x * kWarps + warp;
    launch_dependents();
    const long long begin = gw * p.total_iters / warps, end = (gw + 1) * p.total_iters / warps;
    if (begin >= end) return;  // more warps than slices: the fix-up knows (share_owner) that it holds no strip
    const int slices = p.k_tiles, stages = p.stages;
    const int stage_bytes = stream_stage_bytes(FUSED, GPS, p.m);

    // Shared memory: [16 zero bytes per warp (ldmatrix rows past M) | this block's rings, warp-major].
    const uint32_t smem_base = smem_addr(smem);
    const uint32_t zero_piece = smem_base + 16 * warp, ring = smem_base + 128 + warp * stages * stage_bytes;
    if (lane == 0) *reinterpret_cast<uint4 *>(smem + 16 * warp) = make_uint4(0u, 0u, 0u, 0u);  // 8 x 16 <= 128
    __syncwarp();

    // ---- Copy side: the (strip, slice) position of the next stage to fetch, and this lane's source offsets, stepped
    // per stage by additions (no division in the loop: the copy bookkeeping shares the issue slots with the
    // dequantization; a first version spent ~560 instructions per warp and stage, this one ~420, ncu).
    long long f_it = begin;
    int f_slice = 0;
    uint32_t w_off = static_cast<uint32_t>(begin) * (kSteps * 32) + lane;  // uint4 units; strips are consecutive
    // Activations: lane L copies pieces L + 32i = row L/16 + 2i, piece L%16 of the stage's 128 k.
    const int x_c = lane % 16;
    const uint16_t *x_lane = p.x + static_cast<size_t>(lane / 16) * p.k + x_c * 8;
    int x_k0 = 0;
    // Scales / zeros: lane L copies pieces L (and L + 32); sz_off = group row x N + strip x 64 of the next stage.
    constexpr int kSzPerLane = (kPieces + 31) / 32;
    const uint16_t *sz_src[kSzPerLane];
    uint32_t sz_lane[kSzPerLane];
#pragma unroll
    for (int i = 0; i < kSzPerLane; ++i) {
        const int piece = lane + 32 * i, group = piece / kPiecesPerGroup, j = piece % kPiecesPerGroup;
        sz_src[i] = FUSED && j >= 8 ? p.zeros : p.scales;
        sz_lane[i] = group * p.n + (j % 8) * 8;
    }
    const int group_slices = GPS == 1 ? p.group_size / kStreamStageK : 1;  // stages per group (GPS = 1)
    uint32_t sz_off = 0;
    int sz_left = 0;  // GPS = 1: stages left in the current group
    auto locate = [&](long long it) {
        const int f_strip = static_cast<int>(it / slices);
        f_slice = static_cast<int>(it % slices);
        x_k0 = f_slice * kStreamStageK;
        sz_off = (GPS == 1 ? f_slice / group_slices : f_slice * GPS) * p.n + f_strip * 64;
        sz_left = group_slices - f_slice % group_slices;
    };
    locate(begin);
    auto load_stage = [&](int slot) {
        const uint32_t dst = ring + slot * stage_bytes;
        const uint4 *src = reinterpret_cast<const uint4 *>(p.words) + w_off;
#pragma unroll
        for (int j = 0; j < kSteps; ++j) cp_async16(dst + j * 512 + lane * 16, src + 32 * j);
#pragma unroll
        for (int i = 0; i < kSzPerLane; ++i) {
            if (lane + 32 * i < kPieces) {
                cp_async16(dst + kStreamWeightBytes + (lane + 32 * i) * 16, sz_src[i] + sz_lane[i] + sz_off);
            }
        }
        // Activation rows, pieces XOR-swizzled by row within the 256-byte row (conflict-free ldmatrix).
#pragma unroll
        for (int i = 0; i < NB * 4; ++i) {
            const int row = lane / 16 + 2 * i;
            if (row >= p.m) break;
            cp_async16(dst + kXOffset + row * (kStreamStageK * 2) + ((x_c ^ (row % 8)) * 16),
                       x_lane + static_cast<size_t>(2 * i) * p.k + x_k0);
        }
        w_off += kSteps * 32;
        ++f_it;
        if (++f_slice == slices) {
            locate(f_it);  // the next strip (a division per strip, not per stage)
        } else {
            x_k0 += kStreamStageK;
            if (GPS > 1) {
                sz_off += GPS * p.n;
            } else if (--sz_left == 0) {
                sz_left = group_slices;
                sz_off += p.n;
            }
        }
    };
    for (int s = 0; s < stages - 1; ++s) {
        if (f_it < end) load_stage(s);
        cp_async_commit();  // empty groups keep the group count uniform for wait_group
    }

    // ---- Compute side: t = unscaled sums of the current group, xs = activation sums, acc = folded output (as in
    // marlin_swapped.cuh: lane L holds columns 16w + L/4, 16w + 8 + L/4 x activation rows nb*8 + 2(L%4) + {0, 1}).
    const int g = lane / 4;
    float acc[4][NB][4], t[4][NB][4], xs[NB][4];
    // ldmatrix: lane L addresses row nb*8 + L%8, piece 4p + L/8 of the k32 step p, swizzled as stored; rows past M
    // read the zero piece.
    auto x_addr = [&](uint32_t st, int nb, int k32) {
        const int row = nb * 8 + lane % 8;
        return row < p.m ? st + kXOffset + row * (kStreamStageK * 2) + (((4 * k32 + lane / 8) ^ (lane % 8)) * 16)
                         : zero_piece;
    };
    auto fold = [&](uint32_t st, int group) {
        const uint8_t *pieces = smem + (st - smem_base) + kStreamWeightBytes + group * kPiecesPerGroup * 16;
        fold_sums<NB, FUSED, D>(acc, t, xs, pieces + g * 16, pieces + (8 + g) * 16);
    };

    // Writes the finished strip, or adds it to the workspace (a strip cut between warps; the fix-up writes it): `done`
    // of its slices are this warp's. Workspace: [strip][nb][w][lane][4], the quad order of marlin_device.cuh.
    auto finish_strip = [&](int strip, int done) {
        const int row0 = 2 * (lane % 4);
        if (done == slices) {
            store_strip<NB, D>(p.y + static_cast<size_t>(row0) * p.n + strip * 64 + g, p.n, acc, row0, p.m);
        } else {
            add_strip_partials<NB>(p.partials + static_cast<size_t>(strip) * (NB * 512) + lane * 4, acc, row0, p.m);
        }
    };

    int slot = 0, load_slot = stages - 1;
    // Outer loop: the strips of this warp's share; inner loop: their slices (the hot loop, free of the epilogue).
    for (long long it = begin; it < end;) {
        const int strip = static_cast<int>(it / slices), s_begin = static_cast<int>(it % slices);
        const int s_end = static_cast<int>(std::min<long long>(slices, s_begin + (end - it)));
#pragma unroll
        for (int w = 0; w < 4; ++w) zero(acc[w]);
#pragma unroll 1
        for (int s = s_begin; s < s_end; ++s) {
            cp_async_wait_pending(stages - 2);
            __syncwarp();  // every lane's pieces of this stage landed; every lane is done with the slot refilled below
            if (f_it < end) load_stage(load_slot);
            cp_async_commit();
            load_slot = load_slot == stages - 1 ? 0 : load_slot + 1;

            const uint32_t st = ring + slot * stage_bytes;
            uint32_t b[NB][4];
#pragma unroll
            for (int k16 = 0; k16 < kSteps; ++k16) {
                if (k16 % 2 == 0) {
#pragma unroll
                    for (int nb = 0; nb < NB; ++nb) ldmatrix_x4(b[nb], x_addr(st, nb, k16 / 2));
                }
                const uint4 wq = *reinterpret_cast<const uint4 *>(smem + (st - smem_base) + k16 * 512 + lane * 16);
                // A group's sums start from zero-input mma at its first step.
                unscaled_k16_step<NB, D>(t, xs, wq, b, 2 * (k16 % 2), k16 % kStepsPerGroup == 0);
                if (k16 % kStepsPerGroup == kStepsPerGroup - 1) fold(st, k16 / kStepsPerGroup);
            }
            slot = slot == stages - 1 ? 0 : slot + 1;
        }
        finish_strip(strip, s_end - s_begin);
        it += s_end - s_begin;
    }
    cp_async_wait<0>();
}

// The fix-up of the strips cut between warps: one warp per strip writes the strip's sums to Y and re-zeroes them.
// `warps`: the main grid's warps (which strips were cut follows from the shares, share_owner).
constexpr int kStreamFixupWarps = 4;
template <int NB, Dtype D>
__global__ void __launch_bounds__(kStreamFixupWarps * 32) marlin_stream_fixup_kernel(const Params p, long long warps) {
    wait_for_primary();
    const int lane = threadIdx.x % 32, strip = blockIdx.x * kStreamFixupWarps + threadIdx.x / 32;
    if (strip >= p.n / 64) return;
    const long long first_u = static_cast<long long>(strip) * p.k_tiles;
    if (share_owner(first_u, warps, p.total_iters) == share_owner(first_u + p.k_tiles - 1, warps, p.total_iters)) {
        return;  // one warp held the whole strip and stored it
    }
    // All of the strip's sums are loaded first, then re-zeroed, then written to Y, each lane always a whole quad
    // (sums of rows outside M are zero: nobody adds to them). An earlier version that loaded, zeroed and stored quad
    // by quad, each lane only the rows inside M, took 11-13 us instead of ~1 on Llama-70B gate+up at M = 1.
    float *part = p.partials + static_cast<size_t>(strip) * (NB * 512) + lane * 4;
    float4 sums[NB][4];
#pragma unroll
    for (int nb = 0; nb < NB; ++nb)
#pragma unroll
        for (int w = 0; w < 4; ++w) sums[nb][w] = __ldcg(reinterpret_cast<const float4 *>(part + (nb * 4 + w) * 128));
#pragma unroll
    for (int nb = 0; nb < NB; ++nb)
#pragma unroll
        for (int w = 0; w < 4; ++w) {
            __stcg(reinterpret_cast<float4 *>(part + (nb * 4 + w) * 128), make_float4(0.0f, 0.0f, 0.0f, 0.0f));
        }
    const int row0 = 2 * (lane % 4);
    uint16_t *y0 = p.y + static_cast<size_t>(row0) * p.n + strip * 64 + lane / 4;
#pragma unroll
    for (int nb = 0; nb < NB; ++nb)
#pragma unroll
        for (int w = 0; w < 4; ++w) {
            const float4 v = sums[nb][w];
            store_quad<D>(y0 + static_cast<size_t>(nb * 8) * p.n + 16 * w, p.n, v.x, v.y, v.z, v.w,
                       quad_rows(row0 + nb * 8, p.m));
        }
}

// The launch shape: blocks per SM (NB = 1: two, or one when two would get fewer than three stages per warp; NB = 2:
// one), stages per warp ring (as many as fit, up to kStreamMaxStages), and every warp slot of the GPU (no more warps
// than slices). False if not even a 2-stage ring fits.
inline bool stream_shape(const LaunchEnv &env, int nb, int stage_bytes, long long total, int &stages, long long &grid) {
    auto stages_for = [&](int blocks) {
        const int budget = std::min(env.max_smem_optin, env.smem_per_sm / blocks - kPerBlockSystemSmem) - 128;
        return std::min(kStreamMaxStages, budget / (kWarps * stage_bytes));
    };
    const int per_sm = nb == 1 && stages_for(2) >= 3 ? 2 : 1;
    stages = stages_for(per_sm);
    if (stages < 2) return false;
    const long long warps = static_cast<long long>(env.sm_count) * per_sm * kWarps;
    grid = (std::min(warps, total) + kWarps - 1) / kWarps;
    return true;
}

template <int NB, bool FUSED, int GPS, Dtype D>
int launch_stream(Params p, const LaunchEnv &env) {
    if (p.k % kStreamStageK != 0 || p.m > NB * 8) return kRcUnsupported;
    if (env.device < 0 || env.device >= 64) return static_cast<int>(cudaErrorInvalidDevice);
    static std::atomic<int> attr_set[64];
    const int stage_bytes = stream_stage_bytes(FUSED, GPS, p.m);
    const int strips = p.n / 64;
    p.k_tiles = p.k / kStreamStageK;
    p.total_iters = static_cast<long long>(strips) * p.k_tiles;
    long long grid = 0;
    if (!stream_shape(env, NB, stage_bytes, p.total_iters, p.stages, grid)) return kRcUnsupported;
    if (static_cast<size_t>(strips) * NB * 512 * sizeof(float) > env.workspace_bytes) return kRcWorkspace;
    p.partials = static_cast<float *>(env.workspace);
    auto kernel = marlin_stream_kernel<NB, FUSED, GPS, D>;
    if (attr_set[env.device].load(std::memory_order_relaxed) == 0) {
        TL_GPU_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, env.max_smem_optin));
        attr_set[env.device].store(1, std::memory_order_relaxed);
    }
    kernel<<<static_cast<unsigned>(grid), kThreads, 128 + kWarps * p.stages * stage_bytes, env.stream>>>(p);
    TL_GPU_CHECK_LAUNCH();
    cudaLaunchConfig_t fixup{};
    fixup.gridDim = dim3(static_cast<unsigned>((strips + kStreamFixupWarps - 1) / kStreamFixupWarps));
    fixup.blockDim = dim3(kStreamFixupWarps * 32);
    fixup.stream = env.stream;
    cudaLaunchAttribute early;
    allow_early_start(fixup, early, env.compute_capability >= 90);
    const cudaError_t fixup_rc = cudaLaunchKernelEx(&fixup, marlin_stream_fixup_kernel<NB, D>, p, grid * kWarps);
    if (fixup_rc != cudaSuccess) {
        (void)cudaGetLastError();
        // The workspace holds this call's sums: leave it zeroed for the kernel the caller falls back to.
        (void)cudaMemsetAsync(env.workspace, 0, static_cast<size_t>(strips) * NB * 512 * sizeof(float), env.stream);
        return static_cast<int>(fixup_rc);
    }
    return 0;
}

}  // namespace tl::gpu::marlin
