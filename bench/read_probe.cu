// tl_read_probe: how fast can the H200 stream a layer's worth of packed weights, and with which access pattern?
// A kernel-development microbenchmark, not a GEMM: it reads the bytes of the Llama-70B
// gate+up INT4 weights (8192 x 57344 / 2 = 235 MB) and does nothing with them but XOR them together (plus, optionally,
// `delay` FMAs per 4 KB to stand in for the dequantization and mma work of the stream kernel).
//
//   tl_read_probe <out.csv> [bytes]
//
// Why: the M <= 16 stream kernel (cuda/marlin/marlin_stream.cuh) receives its weights at ~3.3 TB/s where a large
// FP16 GEMV reads at ~4.5 TB/s, and no change to its ring depth, residency or request size moved
// that. This separates the access pattern from the arithmetic: each kernel here reads 4 KB units ("a warp's stage"
// in the stream kernel) in one of these ways:
//   cp.async ring, per-warp range:  every warp streams its own contiguous range of units through a private
//                                   shared-memory ring (the stream kernel's data path, without its arithmetic);
//   cp.async ring, sweep:           the same ring, but unit u of step s is s * warps + warp: the whole grid walks
//                                   memory front to back together;
//   registers, per-warp range/sweep: each lane loads its 8 x 16 bytes of a unit into registers (ld.global.nc),
//                                   DEPTH units in flight per warp, no shared memory.
// Method: weights rotated through 4 copies (> 4 x the 60 MB L2), every configuration timed as 5 passes of 20
// back-to-back launches (each launch is >= 50 us, so launch gaps hide behind the previous kernel), median pass.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "check_cuda.hpp"
#include "marlin/marlin_device.cuh"

namespace {

using tl::gpu::marlin::cp_async16;
using tl::gpu::marlin::cp_async_commit;
using tl::gpu::marlin::smem_addr;

constexpr int kUnitBytes = 4096;
constexpr int kCopies = 4;
constexpr int kLaunches = 20;
constexpr int kPasses = 5;

__global__ void fill(uint32_t *p, size_t words) {
    for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < words;
         i += static_cast<size_t>(gridDim.x) * blockDim.x) {
        uint32_t x = static_cast<uint32_t>(i) * 0x9E3779B9u;
        x ^= x >> 15;
        p[i] = x * 0x85EBCA6Bu;
    }
}

// The units warp `gw` of `warps` reads, in order: a contiguous range (stream-K) or every warps-th unit (sweep).
struct UnitWalk {
    long long first, count, stride;
    __device__ UnitWalk(long long gw, long long warps, long long units, bool sweep) {
        if (sweep) {
            first = gw;
            count = gw < units ? (units - gw + warps - 1) / warps : 0;
            stride = warps;
        } else {
            first = gw * units / warps;
            count = (gw + 1) * units / warps - first;
            stride = 1;
        }
    }
    __device__ long long unit(long long i) const { return first + i * stride; }
};

// Stand-in for the arithmetic on one unit: `delay` FMAs in four independent chains (the dequantization work is
// mostly independent instructions, not one long dependency chain).
__device__ __forceinline__ uint32_t consume(const uint4 (&v)[8], int delay, uint32_t acc) {
#pragma unroll
    for (int j = 0; j < 8; ++j) acc ^= v[j].x ^ v[j].y ^ v[j].z ^ v[j].w;
    float f0 = __uint_as_float(acc & 0x3FFFFFu), f1 = f0 + 1.f, f2 = f0 + 2.f, f3 = f0 + 3.f;
#pragma unroll 1
    for (int d = 0; d < delay; d += 4) {
        f0 = fmaf(f0, 0.999f, 0.5f);
        f1 = fmaf(f1, 0.999f, 0.5f);
        f2 = fmaf(f2, 0.999f, 0.5f);
        f3 = fmaf(f3, 0.999f, 0.5f);
    }
    return acc ^ __float_as_uint(f0 + f1 + f2 + f3);
}

template <int STAGES, bool SWEEP>
__global__ void ring_probe(const uint4 *src, long long units, int delay, uint32_t *sink) {
    extern __shared__ __align__(128) uint8_t smem[];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const long long warps = static_cast<long long>(gridDim.x) * (blockDim.x / 32);
    const UnitWalk walk(blockIdx.x * static_cast<long long>(blockDim.x / 32) + warp, warps, units, SWEEP);
    const uint32_t ring = smem_addr(smem) + warp * STAGES * kUnitBytes;
    auto load = [&](long long i, int slot) {
        const uint4 *s = src + walk.unit(i) * (kUnitBytes / 16) + lane;
#pragma unroll
        for (int j = 0; j < 8; ++j) cp_async16(ring + slot * kUnitBytes + j * 512 + lane * 16, s + 32 * j);
    };
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < walk.count) load(s, s);
        cp_async_commit();
    }
    uint32_t acc = 0;
    for (long long i = 0; i < walk.count; ++i) {
        asm volatile("cp.async.wait_group %0;\n" ::"n"(STAGES - 2) : "memory");
        __syncwarp();
        if (i + STAGES - 1 < walk.count) load(i + STAGES - 1, (i + STAGES - 1) % STAGES);
        cp_async_commit();
        const uint8_t *st = smem + (warp * STAGES + i % STAGES) * kUnitBytes;
        uint4 v[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) v[j] = *reinterpret_cast<const uint4 *>(st + j * 512 + lane * 16);
        acc = consume(v, delay, acc);
    }
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
    if (acc == 0x9E3779B9u) sink[0] = acc;  // keeps the reads alive; practically never true
}

template <int DEPTH, bool SWEEP>
__global__ void register_probe(const uint4 *src, long long units, int delay, uint32_t *sink) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const long long warps = static_cast<long long>(gridDim.x) * (blockDim.x / 32);
    const UnitWalk walk(blockIdx.x * static_cast<long long>(blockDim.x / 32) + warp, warps, units, SWEEP);
    uint4 r[DEPTH][8];
    auto load = [&](long long i, uint4(&v)[8]) {
        const uint4 *s = src + walk.unit(i) * (kUnitBytes / 16) + lane;
#pragma unroll
        for (int j = 0; j < 8; ++j) v[j] = __ldg(s + 32 * j);
    };
#pragma unroll
    for (int d = 0; d < DEPTH; ++d) {
        if (d < walk.count) load(d, r[d]);
    }
    uint32_t acc = 0;
    for (long long i = 0; i < walk.count; i += DEPTH) {
#pragma unroll
        for (int d = 0; d < DEPTH; ++d) {
            if (i + d < walk.count) {
                acc = consume(r[d], delay, acc);
                if (i + d + DEPTH < walk.count) load(i + d + DEPTH, r[d]);
            }
        }
    }
    if (acc == 0x9E3779B9u) sink[0] = acc;
}

struct Config {
    std::string pattern;  // ring-range, ring-sweep, reg-range, reg-sweep
    int depth;            // ring stages or register units in flight per warp
    int warps_per_block, blocks_per_sm, delay;
};

using ProbeKernel = void (*)(const uint4 *, long long, int, uint32_t *);

ProbeKernel pick(const Config &c) {
    const bool ring = c.pattern.rfind("ring", 0) == 0, sweep = c.pattern.find("sweep") != std::string::npos;
    if (ring) {
        switch (c.depth * 2 + sweep) {
            case 4: return ring_probe<2, false>;
            case 5: return ring_probe<2, true>;
            case 6: return ring_probe<3, false>;
            case 7: return ring_probe<3, true>;
            case 8: return ring_probe<4, false>;
            case 9: return ring_probe<4, true>;
            default: return nullptr;
        }
    }
    switch (c.depth * 2 + sweep) {
        case 2: return register_probe<1, false>;
        case 3: return register_probe<1, true>;
        case 4: return register_probe<2, false>;
        case 5: return register_probe<2, true>;
        default: return nullptr;
    }
}

}  // namespace

int main(int argc, char **argv) {
    if (argc < 2) {
        std::fprintf(stderr, "usage: %s <out.csv> [bytes]\n", argv[0]);
        return 2;
    }
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
        std::fprintf(stderr, "tl_read_probe: no CUDA device\n");
        return 77;
    }
    const size_t bytes = argc > 2 ? std::strtoull(argv[2], nullptr, 10) / kUnitBytes * kUnitBytes
                                  : 8192ull * 57344 / 2;  // Llama-70B gate+up, INT4
    const long long units = static_cast<long long>(bytes / kUnitBytes);
    cudaDeviceProp prop{};
    CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
    uint4 *buf = nullptr;
    uint32_t *sink = nullptr;
    CHECK_CUDA(cudaMalloc(&buf, bytes * kCopies));
    CHECK_CUDA(cudaMalloc(&sink, sizeof(uint32_t)));
    fill<<<prop.multiProcessorCount * 8, 256>>>(reinterpret_cast<uint32_t *>(buf), bytes * kCopies / 4);
    CHECK_CUDA(cudaGetLastError());

    std::vector<Config> configs;
    for (int delay : {0, 400}) {
        for (const char *pattern : {"ring-range", "ring-sweep"}) {
            for (auto [wpb, bps] : {std::pair{8, 1}, {8, 2}, {16, 1}, {8, 4}, {16, 2}}) {
                for (int stages : {2, 3, 4}) configs.push_back({pattern, stages, wpb, bps, delay});
            }
        }
        for (const char *pattern : {"reg-range", "reg-sweep"}) {
            for (int bps : {2, 4, 8}) {
                for (int depth : {1, 2}) configs.push_back({pattern, depth, 8, bps, delay});
            }
        }
    }

    FILE *csv = std::fopen(argv[1], "w");
    if (!csv) {
        std::fprintf(stderr, "tl_read_probe: cannot write %s\n", argv[1]);
        return 1;
    }
    std::fprintf(csv, "pattern,depth,warps_per_block,blocks_per_sm,delay,smem_bytes,us,tb_per_s\n");
    std::printf("%s, %d SMs; %zu bytes per launch, %d copies\n", prop.name, prop.multiProcessorCount, bytes, kCopies);
    cudaEvent_t t0, t1;
    CHECK_CUDA(cudaEventCreate(&t0));
    CHECK_CUDA(cudaEventCreate(&t1));
    for (const Config &c : configs) {
        const ProbeKernel kernel = pick(c);
        const bool ring = c.pattern.rfind("ring", 0) == 0;
        const int smem = ring ? c.warps_per_block * c.depth * kUnitBytes : 0;
        if (smem > prop.sharedMemPerBlockOptin ||
            static_cast<size_t>(smem + 1024) * c.blocks_per_sm > prop.sharedMemPerMultiprocessor) {
            continue;  // does not fit at this residency
        }
        CHECK_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        int resident = 0;
        CHECK_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, kernel, c.warps_per_block * 32, smem));
        if (resident < c.blocks_per_sm) continue;
        const int grid = prop.multiProcessorCount * c.blocks_per_sm;
        auto launch = [&](int i) {
            kernel<<<grid, c.warps_per_block * 32, smem>>>(buf + (i % kCopies) * (bytes / 16), units, c.delay, sink);
        };
        for (int i = 0; i < 3; ++i) launch(i);
        std::vector<float> pass_ms;
        for (int p = 0; p < kPasses; ++p) {
            CHECK_CUDA(cudaEventRecord(t0));
            for (int i = 0; i < kLaunches; ++i) launch(i);
            CHECK_CUDA(cudaEventRecord(t1));
            CHECK_CUDA(cudaEventSynchronize(t1));
            float ms = 0;
            CHECK_CUDA(cudaEventElapsedTime(&ms, t0, t1));
            pass_ms.push_back(ms);
        }
        CHECK_CUDA(cudaGetLastError());
        std::sort(pass_ms.begin(), pass_ms.end());
        const double us = 1000.0 * pass_ms[kPasses / 2] / kLaunches;
        const double tbs = bytes / (us * 1e-6) / 1e12;
        std::fprintf(csv, "%s,%d,%d,%d,%d,%d,%.2f,%.3f\n", c.pattern.c_str(), c.depth, c.warps_per_block,
                     c.blocks_per_sm, c.delay, smem, us, tbs);
        std::printf("%-10s depth %d  %2d warps x %d blocks/SM  delay %3d: %8.2f us  %.2f TB/s\n", c.pattern.c_str(),
                    c.depth, c.warps_per_block, c.blocks_per_sm, c.delay, us, tbs);
    }
    std::fclose(csv);
    CHECK_CUDA(cudaFree(buf));
    CHECK_CUDA(cudaFree(sink));
    return 0;
}
