// Declarations shared by the Marlin-class kernels' translation units: tile constants, kernel parameters and the
// per-instantiation launch functions of the three mainloops (marlin_plan.hpp): marlin_stream.cuh (M <= 16)
// and marlin_kernel.cuh (the classic mma.sync kernel, any M), instantiated in marlin_{,stream_}{fused,symmetric}.cu so
// that they compile in parallel; marlin_wgmma.cu (M > 16 on Hopper).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "../dtype.hpp"
#include "../gpu_common.cuh"
#include "marlin_plan.hpp"

namespace tl::gpu::marlin {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kTileK = 64;             // k per pipeline stage
constexpr int kTileN = kWarps * 64;    // one 64-column strip per warp
constexpr int kK16 = kTileK / 16;
constexpr int kMinStages = 3;
constexpr int kMaxStages = 8;          // wait_group immediates cover up to 6 pending stages
constexpr int kStaticSmemReserve = 128;  // the kernel's static shared memory
constexpr int kPerBlockSystemSmem = 1024;  // shared memory the driver reserves per resident block
constexpr int kMinItersPerBlock = 4;
constexpr int kPartialFloats = kWarps * 8 * 32 * 4;  // FP32 partial sums of one 16-row block of a tile

// Shared memory of one pipeline stage: packed weights, MB*16 activation rows, GPT groups of scales (and zeros).
constexpr int stage_bytes(int mb, bool fused, int gpt) {
    return kTileK * kTileN / 2 + mb * 16 * kTileK * 2 + gpt * kTileN * 2 * (fused ? 2 : 1);
}

struct Params {
    const uint16_t *x;
    const uint32_t *words;
    const uint16_t *scales;
    const uint16_t *zeros;
    uint16_t *y;
    float *partials;  // [grid][MB * kPartialFloats], zero between calls
    int *counters;    // [grid], zero between calls (the classic kernel's stream-K arrivals)
    int m, n, k;
    int group_size;   // effective: K for per-column scales
    int m_slices, k_tiles;
    long long total_iters;  // m_slices * n_tiles * k_tiles
    int stages;             // pipeline depth (shared memory ring of stage_bytes each)
    // wgmma kernel: 0 = stream-K (each block a contiguous range of k slices); 1 = whole tiles, block b taking
    // tiles b, b + grid, ... (blocks running at once share weight and activation panels in L2).
    int whole_tiles;
};

struct LaunchEnv {
    int device;
    int compute_capability;  // major * 10 + minor
    int sm_count;
    int max_smem_optin;
    int smem_per_sm;
    void *workspace;
    size_t workspace_bytes;
    cudaStream_t stream;
};
inline LaunchEnv launch_env(const DeviceInfo &dev, void *workspace, size_t workspace_bytes, cudaStream_t stream) {
    return LaunchEnv{dev.device,    dev.compute_capability, dev.sm_count, dev.max_smem_optin,
                     dev.smem_per_sm, workspace,            workspace_bytes, stream};
}

// The classic kernel: MB = 16-row blocks per tile (2: 32 rows, 4: 64); FUSED: q*s + z vs (q - 8)*s; GPT: groups per
// 64-deep k slice (1, or 2 for group size 32); D: the type of x and y (every kernel: BF16 with FUSED alone). Returns
// an rc as in gpu_kernels.hpp.
template <int MB, bool FUSED, int GPT, Dtype D>
int launch(Params p, const LaunchEnv &env);
// M <= 16 without block barriers (marlin_stream.cuh): NB = 8-row activation tiles (1: M <= 8, 2: M <= 16); FUSED as
// above; GPS = groups per 128-deep stage (1: group size a
// multiple of 128 or per column, 2: 64, 4: 32). Requires K % 128 == 0 and M <= NB * 8, else kRcUnsupported;
// kRcWorkspace if the per-strip partial sums (N / 64 x NB x 512 floats) do not fit. Two launches: the main kernel and
// the fix-up of the strips cut between warps (a programmatic dependent launch on compute capability 9.0).
template <int NB, bool FUSED, int GPS, Dtype D>
int launch_stream(Params p, const LaunchEnv &env);

// M > 16 on compute capability 9.0 (marlin_wgmma.cu, built for sm_90a): wgmma with the weights dequantized in
// registers; tiles of 256 columns x 32, 64 or 128 rows. Sets p.m_slices, k_tiles and total_iters itself (its
// pipeline depth is a compile-time constant). The tile form is the plan's (rows, wgmma_warpgroups,
// wgmma_warp_specialized). kRcUnsupported where the library was built without sm_90a, the device is not 9.0, or the
// plan names a form the kernel does not have.
int launch_wgmma(Params p, const LaunchEnv &env, const MarlinPlan &plan, bool fused, int gpt, Dtype dtype);
// Many rows on compute capability 9.0 (marlin_tma.cu, built for sm_90a): TMA copies, a producer warp and two consumer
// warpgroups, each weight tile dequantized once into shared memory for wgmma; tiles of 128 columns x 256 rows
// (plan.rows) on at most one block per SM, whole tiles or stream-K with the cut tiles reduced inside the kernel
// (workspace: counters and FP32 sums, left zeroed). Sets p.m_slices, k_tiles, total_iters and whole_tiles itself.
// kRcUnsupported as for launch_wgmma, and where the tensor-map encoder is missing. The packed codes, scales and zeros
// must not be written by the kernel just before on the stream: their loads start before that kernel has finished.
int launch_tma(Params p, const LaunchEnv &env, const MarlinPlan &plan, bool fused, int gpt, Dtype dtype);

}  // namespace tl::gpu::marlin
