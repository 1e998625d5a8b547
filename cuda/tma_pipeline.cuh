// What the persistent, warp-specialized TMA kernels share (marlin/marlin_tma.cu, int8_gemm.cu; sm_90a sources only):
// the stage ring's barriers, the producer's walk over a block's (tile, k slice) pairs, the stream-K handshake between
// the blocks that share a cut tile, and the host's choice of grid.
//
// The handshake: each block's share (marlin_schedule.hpp's TmaWork) ends at most one tile it does not finish (it
// contributes its sums to the tile's finisher, the block holding the tile's last slice) and begins at most one it
// finishes after the others' slices. Sums go through the marlin workspace: a counter per block, then a slot of
// partial sums per block; whoever reads a slot leaves it zeroed, so the workspace stays as every kernel finds it.
#pragma once

#include <algorithm>
#include <atomic>
#include <utility>
#include <cstddef>
#include <cstdint>
#include <cuda/ptx>

#include "gpu_kernels.hpp"
#include "marlin/marlin.cuh"
#include "marlin/marlin_device.cuh"
#include "marlin/marlin_plan.hpp"
#include "marlin/marlin_schedule.hpp"

namespace tl::gpu::tma {

// A named barrier of `count` threads (ids 1 and 2: one consumer warpgroup; 3: both; 0 is __syncthreads).
__device__ __forceinline__ void named_sync(int id, int count) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

__device__ __forceinline__ void wait_parity(uint64_t *bar, uint32_t parity) {
    while (!cuda::ptx::mbarrier_try_wait_parity(bar, parity)) {
    }
}

// The ring's next stage; the barrier phase flips at each wrap.
template <int STAGES>
__device__ __forceinline__ void next_stage(int &stage, uint32_t &phase) {
    if (++stage == STAGES) {
        stage = 0;
        phase ^= 1u;
    }
}

// The producer's position in its block's work, in the consumers' order: slice kt of tile(j).
struct SliceCursor {
    int j = 0, tile = 0, kt = 0, hi = 0;
    __device__ __forceinline__ void start(const marlin::TmaWork &work, int k_tiles, int index) {
        j = index;
        tile = work.tile(j);
        kt = work.lo(tile, k_tiles);
        hi = work.hi(tile, k_tiles);
    }
    __device__ __forceinline__ void next(const marlin::TmaWork &work, int k_tiles) {
        if (++kt == hi && j + 1 < work.tiles) start(work, k_tiles, j + 1);
    }
};

// The producer thread's whole job: every slice's weights (copy_weights(stage, cursor)) and activations
// (copy_x(stage, cursor)) into the ring, each stage once the consumers have released its previous use. The ring's
// first fill asks for the weights before the previous kernel on the stream has finished (they do not depend on it),
// the activations once it has (programmatic dependent launch).
template <int STAGES, class CopyWeights, class CopyX>
__device__ __forceinline__ void produce(const marlin::TmaWork &work, int k_tiles, int total, uint64_t *empty_bar,
                                        CopyWeights &&copy_weights, CopyX &&copy_x) {
    const int first = total < STAGES ? total : STAGES;
    SliceCursor w;
    w.start(work, k_tiles, 0);
    SliceCursor x = w;
    for (int f = 0; f < first; ++f, w.next(work, k_tiles)) copy_weights(f, w);
    marlin::wait_for_primary();
    for (int f = 0; f < first; ++f, x.next(work, k_tiles)) copy_x(f, x);
    int stage = first % STAGES;
    uint32_t phase = 0;  // parity of the empty-barrier phase to wait for: the use one round back
#pragma unroll 1
    for (int f = first; f < total; ++f, w.next(work, k_tiles), x.next(work, k_tiles)) {
        wait_parity(&empty_bar[stage], phase);
        copy_weights(stage, w);
        copy_x(stage, x);
        next_stage<STAGES>(stage, phase);
    }
}

// A contributor's sums are in the workspace: count its slices on the finisher's counter (both consumer warpgroups,
// 256 threads, call it; `leader` is one of them).
__device__ __forceinline__ void signal_contribution(int *counter, int slices, bool leader) {
    __threadfence();
    named_sync(3, 256);
    if (leader) atomicAdd(counter, slices);
}

// The finisher: wait until the others have counted the tile's first `slices` slices, and reset the counter.
__device__ __forceinline__ void await_contributions(int *counter, int slices, bool leader) {
    if (leader) {
        while (atomicAdd(counter, 0) != slices) {
        }
        __threadfence();
        *counter = 0;
    }
    named_sync(3, 256);
    __threadfence();
}

// The grid of a launch over `tiles` tiles of `k_tiles` slices: whole tiles round robin where they fill the waves of
// one block per SM, else stream-K with at least 8 slices a block (or a whole tile), so that few blocks share each cut
// tile; then the counters (one per block) and slots of `slot_bytes` (one per block) in the workspace. rc
// kRcWorkspace where those do not fit.
struct PersistentGrid {
    long long blocks = 0;
    bool whole_tiles = false;
    int *counters = nullptr;
    void *slots = nullptr;
    int rc = 0;
};
inline PersistentGrid persistent_grid(long long tiles, int k_tiles, const marlin::LaunchEnv &env, size_t slot_bytes) {
    PersistentGrid g;
    g.whole_tiles = wgmma_whole_tiles(tiles, env.sm_count);
    g.blocks = std::min<long long>(tiles, env.sm_count);
    if (g.whole_tiles) return g;
    g.blocks = std::max(1LL, std::min<long long>(env.sm_count, tiles * k_tiles / std::min(8, k_tiles)));
    const size_t counter_bytes = (static_cast<size_t>(g.blocks) * sizeof(int) + 255) / 256 * 256;
    if (env.workspace == nullptr || env.workspace_bytes < counter_bytes + g.blocks * slot_bytes) {
        g.rc = kRcWorkspace;
        return g;
    }
    g.counters = static_cast<int *>(env.workspace);
    g.slots = static_cast<uint8_t *>(env.workspace) + counter_bytes;
    return g;
}

// A persistent kernel of 384 threads and `smem` bytes of dynamic shared memory, set up once per device: its
// shared-memory opt-in and whether one block fits an SM, remembered in `ready` (per kernel instantiation, by device:
// 0 = not set up, 1 = fits, -1 = does not). 0 when it can launch, kRcUnsupported when it cannot, else a CUDA error.
template <class Kernel>
int prepare_persistent(Kernel kernel, int smem, const marlin::LaunchEnv &env, std::atomic<int> (&ready)[64]) {
    if (env.device < 0 || env.device >= 64) return static_cast<int>(cudaErrorInvalidDevice);
    int state = ready[env.device].load(std::memory_order_relaxed);
    if (state == 0) {
        state = -1;
        if (smem + marlin::kStaticSmemReserve <= env.max_smem_optin) {
            TL_GPU_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
            int resident = 0;
            TL_GPU_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, kernel, 384, smem));
            state = resident >= 1 ? 1 : -1;
        }
        ready[env.device].store(state, std::memory_order_relaxed);
    }
    return state > 0 ? 0 : kRcUnsupported;
}

// Launches it on `grid.blocks` blocks, allowed to start before the previous kernel on the stream has finished
// (programmatic dependent launch: the kernel waits for it before reading what it wrote).
template <class... Params, class... Args>
int launch_persistent(void (*kernel)(Params...), const PersistentGrid &grid, int smem, cudaStream_t stream,
                      Args &&...args) {
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(static_cast<unsigned>(grid.blocks));
    config.blockDim = dim3(384);
    config.dynamicSmemBytes = smem;
    config.stream = stream;
    cudaLaunchAttribute early;
    allow_early_start(config, early);
    TL_GPU_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
    return 0;
}

}  // namespace tl::gpu::tma
