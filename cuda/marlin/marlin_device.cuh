// Device helpers shared by the Marlin-class kernels (marlin_stream.cuh for M <= 16, marlin_wgmma.cu above on Hopper,
// marlin_kernel.cuh, the classic kernel), and the classic kernel's host launch routine (launch_kernel; the stream and
// wgmma kernels launch themselves).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>

#include "../gpu_common.cuh"
#include "marlin.cuh"
#include "marlin_schedule.hpp"  // share_owner

namespace tl::gpu::marlin {

// The classic kernel's stream-K arrival of a block that added its partial sums of a cut tile (the stream and wgmma
// kernels have no counters: a fix-up grid writes their cut tiles): the additions are made visible before thread 0
// adds this block's k slices to the tile's counter. Returns, in every thread, whether this block completed the count
// (and so must read the sums back and write the tile); the fence after makes the other blocks' additions visible to
// that read. `flag` is the caller's __shared__ int; `sync` is the barrier of the threads that hold the tile (the
// 4-argument form: the whole block).
template <class Sync>
__device__ __forceinline__ bool arrive_last(int *counter, int iters, int k_tiles, int &flag, Sync sync) {
    __threadfence();
    sync();
    if (threadIdx.x == 0) flag = atomicAdd(counter, iters) + iters == k_tiles;
    sync();
    if (!flag) return false;
    __threadfence();
    return true;
}
__device__ __forceinline__ bool arrive_last(int *counter, int iters, int k_tiles, int &flag) {
    return arrive_last(counter, iters, k_tiles, flag, [] { __syncthreads(); });
}

// Hopper's programmatic dependent launch (PTX griddepcontrol, sm_90): a main kernel lets its fix-up grid launch at
// once; the fix-up waits for the main grid to complete and flush its memory before it reads the sums. Elsewhere the
// fix-up is an ordinary launch and both are no-ops.
__device__ __forceinline__ void launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wait_for_primary() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

__device__ __forceinline__ uint32_t smem_addr(const void *p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Plain cp.async.cg (L2 only, no L1 allocation for streamed data). No L2 cache-policy hint: the
// createpolicy + .L2::cache_hint pair faults with an illegal instruction on the project's H200.
__device__ __forceinline__ void cp_async16(uint32_t dst, const void *src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
}
// Copies 16 bytes, or writes 16 zero bytes when !valid (src must still be a valid address).
__device__ __forceinline__ void cp_async16_zfill(uint32_t dst, const void *src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0)
                 : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
// wait_group takes an immediate; the pipeline depth is a launch parameter (it depends on the device's shared
// memory), so pick the immediate with a block-uniform switch.
__device__ __forceinline__ void cp_async_wait_pending(int pending) {
    switch (pending) {
        case 0: cp_async_wait<0>(); break;
        case 1: cp_async_wait<1>(); break;
        case 2: cp_async_wait<2>(); break;
        case 3: cp_async_wait<3>(); break;
        case 4: cp_async_wait<4>(); break;
        case 5: cp_async_wait<5>(); break;
        default: cp_async_wait<6>(); break;
    }
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

__device__ __forceinline__ void ldmatrix_x2(uint32_t (&r)[2], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(addr));
}

// mma.sync m16n8k16, FP32 accumulation, on FP16 or BF16 operands. FIRST: a zero accumulator input.
#define TL_MMA_16816(TYPE, C_IN)                                                                                  \
    "mma.sync.aligned.m16n8k16.row.col.f32." TYPE "." TYPE ".f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, " C_IN \
    ";\n"
template <Dtype D, bool FIRST = false>
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    if constexpr (FIRST) {
        if constexpr (D == Dtype::F16) {
            asm(TL_MMA_16816("f16", "{%10, %10, %10, %10}")
                : "=f"(c[0]), "=f"(c[1]), "=f"(c[2]), "=f"(c[3])
                : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(0.0f));
        } else {
            asm(TL_MMA_16816("bf16", "{%10, %10, %10, %10}")
                : "=f"(c[0]), "=f"(c[1]), "=f"(c[2]), "=f"(c[3])
                : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(0.0f));
        }
    } else if constexpr (D == Dtype::F16) {
        asm(TL_MMA_16816("f16", "{%0, %1, %2, %3}")
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    } else {
        asm(TL_MMA_16816("bf16", "{%0, %1, %2, %3}")
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
}
#undef TL_MMA_16816

// (a & b) | c in one instruction.
__device__ __forceinline__ uint32_t and_or(uint32_t a, uint32_t b, uint32_t c) {
    uint32_t d;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;\n" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

__device__ __forceinline__ half2 as_h2(uint32_t u) {
    half2 h;
    memcpy(&h, &u, sizeof h);
    return h;
}
__device__ __forceinline__ uint32_t as_u32(half2 h) {
    uint32_t u;
    memcpy(&u, &h, sizeof u);
    return u;
}

__device__ __forceinline__ __nv_bfloat162 as_bf2(uint32_t u) {
    __nv_bfloat162 h;
    memcpy(&h, &u, sizeof h);
    return h;
}
__device__ __forceinline__ uint32_t as_u32(__nv_bfloat162 h) {
    uint32_t u;
    memcpy(&u, &h, sizeof u);
    return u;
}

// One packed word -> the B registers of two n8 tiles: b[0], b[2] (b0, b1 of tile 2w) and b[1], b[3] (tile 2w + 1);
// read as the wgmma kernel does, b[0..3] is the A fragment {a0, a1, a2, a3} of the word's 16 x 16 tile. Nibbles 0 and
// 4 go to b[0], 1 and 5 to b[1], 2 and 6 to b[2], 3 and 7 to b[3]. s0, z0 / s1, z1: the (s, s) and (z, z) pairs of
// b[0], b[2] / b[1], b[3] as load_group gives them. FUSED: w = q*s + z in one FMA (FP16: one rounding of the exact
// weight); symmetric: (q - 8)*s. BF16, FUSED: w = (q - 8)*s + c with c = z + 8s (see load_group).
// FP16: (q & 0x000F000F) | 0x6400 6400 is the pair (1024 + q0, 1024 + q4); the 0x00F0 mask gives 1024 + 16 q, undone
// by an FMA with 1/16 and -64, all exact.
// BF16 (7 mantissa bits: a nibble fits below 128.0's exponent only in bits 0-3): each nibble pair is shifted down
// first, (q >> 4i & 0x000F000F) | 0x4300 4300 = (128 + q_i, 128 + q_i+4), minus 136 exact: q - 8 in both forms.
template <bool FUSED, Dtype D>
__device__ __forceinline__ void dequant_word(uint32_t q, uint32_t s0, uint32_t s1, uint32_t z0, uint32_t z1,
                                             uint32_t (&b)[4]) {
    constexpr uint32_t kLo = 0x000F000Fu;
    if constexpr (D == Dtype::F16) {
        constexpr uint32_t kHi = 0x00F000F0u, kMagic = 0x64006400u;
        const half2 lo_bias = as_h2(FUSED ? 0x64006400u : 0x64086408u);  // 1024 or 1032
        const half2 inv16 = as_h2(0x2C002C00u);                          // 1/16
        const half2 hi_bias = as_h2(FUSED ? 0xD400D400u : 0xD480D480u);  // -64 or -72
        const uint32_t lo0 = and_or(q, kLo, kMagic), hi0 = and_or(q, kHi, kMagic);
        q >>= 8;
        const uint32_t lo1 = and_or(q, kLo, kMagic), hi1 = and_or(q, kHi, kMagic);
        const half2 v0 = __hsub2(as_h2(lo0), lo_bias), v2 = __hsub2(as_h2(lo1), lo_bias);
        const half2 v1 = __hfma2(as_h2(hi0), inv16, hi_bias), v3 = __hfma2(as_h2(hi1), inv16, hi_bias);
        if constexpr (FUSED) {
            b[0] = as_u32(__hfma2(v0, as_h2(s0), as_h2(z0)));
            b[2] = as_u32(__hfma2(v2, as_h2(s0), as_h2(z0)));
            b[1] = as_u32(__hfma2(v1, as_h2(s1), as_h2(z1)));
            b[3] = as_u32(__hfma2(v3, as_h2(s1), as_h2(z1)));
        } else {
            b[0] = as_u32(__hmul2(v0, as_h2(s0)));
            b[2] = as_u32(__hmul2(v2, as_h2(s0)));
            b[1] = as_u32(__hmul2(v1, as_h2(s1)));
            b[3] = as_u32(__hmul2(v3, as_h2(s1)));
        }
    } else {
        constexpr uint32_t kMagic = 0x43004300u;
        const __nv_bfloat162 bias = as_bf2(0x43084308u);  // 136: v = q - 8 in both forms
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const __nv_bfloat162 v = __hsub2(as_bf2(and_or(q >> (4 * i), kLo, kMagic)), bias);
            const uint32_t s = i % 2 == 0 ? s0 : s1;
            if constexpr (FUSED) {
                b[i] = as_u32(__hfma2(v, as_bf2(s), as_bf2(i % 2 == 0 ? z0 : z1)));
            } else {
                b[i] = as_u32(__hmul2(v, as_bf2(s)));
            }
        }
    }
}

// The packed FP16 scales (and zeros) of 2 * WORDS columns (WORDS = 4: columns 8j + lane/4 of a warp's strip, j = 0..7;
// one 16-byte load each, 8 bytes for WORDS = 2) -> the (v, v) pairs in D that dequant_word takes.
// FP16: (s, s) and (z, z) as packed. BF16: s rounded to BF16, and in place of z the offset c = z + 8s, computed in
// FP32 and rounded to BF16, for w = (q - 8)*s + c. Why not q*s + z with z rounded: z is about -8s, so its rounding
// error (|z| 2^-9) would dominate the weight's; c is about s / 2 and |q - 8| <= 8, which keeps the weight's error
// near that of one BF16 rounding (MarlinPrecision.WithinCublasError measures it against cuBLAS BF16).
template <int WORDS, bool FUSED, Dtype D>
__device__ __forceinline__ void load_group(const uint16_t *s_src, const uint16_t *z_src, uint32_t (&s)[2 * WORDS],
                                           uint32_t (&z)[2 * WORDS]) {
    uint32_t sw[WORDS], zw[WORDS];  // FP16 pairs
    if constexpr (WORDS == 4) {
        const uint4 sv = *reinterpret_cast<const uint4 *>(s_src);
        sw[0] = sv.x, sw[1] = sv.y, sw[2] = sv.z, sw[3] = sv.w;
        if constexpr (FUSED) {
            const uint4 zv = *reinterpret_cast<const uint4 *>(z_src);
            zw[0] = zv.x, zw[1] = zv.y, zw[2] = zv.z, zw[3] = zv.w;
        }
    } else {
        static_assert(WORDS == 2, "2 or 4 words");
        const uint2 sv = *reinterpret_cast<const uint2 *>(s_src);
        sw[0] = sv.x, sw[1] = sv.y;
        if constexpr (FUSED) {
            const uint2 zv = *reinterpret_cast<const uint2 *>(z_src);
            zw[0] = zv.x, zw[1] = zv.y;
        }
    }
#pragma unroll
    for (int i = 0; i < WORDS; ++i) {
        if constexpr (D == Dtype::F16) {
            s[2 * i] = __byte_perm(sw[i], 0, 0x1010);
            s[2 * i + 1] = __byte_perm(sw[i], 0, 0x3232);
            z[2 * i] = FUSED ? __byte_perm(zw[i], 0, 0x1010) : 0u;
            z[2 * i + 1] = FUSED ? __byte_perm(zw[i], 0, 0x3232) : 0u;
        } else {
            const float2 sf = __half22float2(as_h2(sw[i]));
            s[2 * i] = as_u32(__float2bfloat162_rn(sf.x));
            s[2 * i + 1] = as_u32(__float2bfloat162_rn(sf.y));
            if constexpr (FUSED) {
                const float2 zf = __half22float2(as_h2(zw[i]));
                z[2 * i] = as_u32(__float2bfloat162_rn(fmaf(8.0f, sf.x, zf.x)));
                z[2 * i + 1] = as_u32(__float2bfloat162_rn(fmaf(8.0f, sf.y, zf.y)));
            } else {
                z[2 * i] = z[2 * i + 1] = 0u;
            }
        }
    }
}

// Partial sums into the FP32 workspace as reductions without a result (red): the vector atomicAdd overloads compile
// to ATOMG, whose destination registers stay reserved until the round trip (~1-2 us under load) ends. (Timing of the
// stream kernel unchanged by it on the H200.)
__device__ __forceinline__ void add_partial(float *dst, float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("red.relaxed.gpu.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(dst), "f"(a), "f"(b) : "memory");
#else
    atomicAdd(dst, a);
    atomicAdd(dst + 1, b);
#endif
}

// Two adjacent outputs, or one, rounded to D.
template <Dtype D>
__device__ __forceinline__ void store_pair(uint16_t *y, float a, float b) {
    if constexpr (D == Dtype::F16) {
        *reinterpret_cast<half2 *>(y) = __floats2half2_rn(a, b);
    } else {
        *reinterpret_cast<__nv_bfloat162 *>(y) = __floats2bfloat162_rn(a, b);
    }
}
template <Dtype D>
__device__ __forceinline__ void store_one(uint16_t *y, float v) {
    if constexpr (D == Dtype::F16) {
        *reinterpret_cast<__half *>(y) = __float2half_rn(v);
    } else {
        *reinterpret_cast<__nv_bfloat16 *>(y) = __float2bfloat16_rn(v);
    }
}

__device__ __forceinline__ void add_partial4(float *dst, float a, float b, float c, float d) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("red.relaxed.gpu.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(dst), "f"(a), "f"(b), "f"(c),
                 "f"(d)
                 : "memory");
#else
    add_partial(dst, a, b);
    add_partial(dst + 2, c, d);
#endif
}

// The epilogues of the swapped-operand kernels (stream, wgmma) deal in a thread's four outputs of a tile: rows r, r + 1
// and columns c, c + 8, in the order (r, c), (r, c + 8), (r + 1, c), (r + 1, c + 8); `rows` of the two are inside M
// (0, 1 or 2; quad_rows). (The classic kernel stores pairs of columns: store_pair.)
__device__ __forceinline__ int quad_rows(int row, int m) { return row + 1 < m ? 2 : row < m ? 1 : 0; }

// Stores the four outputs in D at out = &Y[r][c] (row stride n).
template <Dtype D>
__device__ __forceinline__ void store_quad(uint16_t *out, int n, float rc, float rc8, float r1c, float r1c8, int rows) {
    if (rows >= 1) {
        store_one<D>(out, rc);
        store_one<D>(out + 8, rc8);
    }
    if (rows == 2) {
        store_one<D>(out + n, r1c);
        store_one<D>(out + n + 8, r1c8);
    }
}

// A cut tile's contributor adds its four sums to the workspace (FP32, in the quad's order).
__device__ __forceinline__ void add_partial_quad(float *at, float rc, float rc8, float r1c, float r1c8, int rows) {
    if (rows == 2) {
        add_partial4(at, rc, rc8, r1c, r1c8);
    } else if (rows == 1) {
        add_partial(at, rc, rc8);
    }
}

template <int R>
__device__ __forceinline__ void zero(float (&a)[R][4]) {
#pragma unroll
    for (int i = 0; i < R; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) a[i][e] = 0.0f;
}


// The classic kernel's host side: pipeline depth for the wanted residency (cached per device), grid size, workspace
// check, launch. `stages_cache` belongs to one instantiation: 0 = not set up, -1 = does not fit. min_iters bounds the
// k slices per block from below, so that a small layer does not cut each tile between dozens of blocks (their
// same-address FP32 additions serialize in L2: 44 us were measured for a 2048 x 2048 layer at M = 64 with 32
// contributors per tile).
template <class Kernel>
int launch_kernel(Kernel kernel, Params p, const LaunchEnv &env, int stage_bytes, int wanted_per_sm,
                  long long min_iters, int partial_floats, std::atomic<int> (&stages_cache)[64][2],
                  int threads = kThreads) {
    if (env.device < 0 || env.device >= 64) return static_cast<int>(cudaErrorInvalidDevice);
    for (int per_sm = wanted_per_sm; per_sm >= 1; --per_sm) {
        std::atomic<int> &cached = stages_cache[env.device][per_sm - 1];
        int stages = cached.load(std::memory_order_relaxed);
        if (stages == 0) {
            // As deep as shared memory allows for this residency (up to kMaxStages).
            const int budget = std::min(env.max_smem_optin, env.smem_per_sm / per_sm - kPerBlockSystemSmem) -
                               kStaticSmemReserve;
            stages = std::min(kMaxStages, budget / stage_bytes);
            const int deepest = std::min(kMaxStages, (env.max_smem_optin - kStaticSmemReserve) / stage_bytes);
            if (stages >= kMinStages) {
                TL_GPU_CHECK(
                    cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, deepest * stage_bytes));
                int resident = 0;
                TL_GPU_CHECK(
                    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, kernel, threads, stages * stage_bytes));
                if (resident < per_sm) stages = -1;
            } else {
                stages = -1;
            }
            cached.store(stages, std::memory_order_relaxed);
        }
        if (stages < 0) continue;
        p.stages = stages;
        const long long grid =
            std::max(1LL, std::min(static_cast<long long>(env.sm_count) * per_sm, p.total_iters / min_iters));
        const size_t counter_bytes = (static_cast<size_t>(grid) * sizeof(int) + 255) / 256 * 256;
        if (counter_bytes + static_cast<size_t>(grid) * partial_floats * sizeof(float) > env.workspace_bytes) {
            return kRcWorkspace;
        }
        p.counters = static_cast<int *>(env.workspace);
        p.partials = reinterpret_cast<float *>(static_cast<uint8_t *>(env.workspace) + counter_bytes);
        kernel<<<static_cast<unsigned>(grid), threads, stages * stage_bytes, env.stream>>>(p);
        TL_GPU_CHECK_LAUNCH();
        return 0;
    }
    return kRcUnsupported;
}

}  // namespace tl::gpu::marlin
