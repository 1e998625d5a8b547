// Hopper's warpgroup MMA (wgmma.mma_async; sm_90a code only) for the kernels that use it: the fence / commit / wait
// steps, shared-memory descriptors, and the m64nNk16 instructions with FP32 accumulators, A in registers (RS) or in
// shared memory (SS). Include only from sources listed in cuda/sources_sm90a.txt, inside `#if
// defined(__CUDA_ARCH_FEAT_SM90_ALL)` or a launcher that refuses other devices.
#pragma once

#include <cstdint>

#include "dtype.hpp"

namespace tl::gpu::wgmma {

__device__ __forceinline__ void fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// Waits until at most N committed groups of this warpgroup are still in flight.
template <int N>
__device__ __forceinline__ void wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// Keeps the compiler from moving reads or writes of an accumulator across the asynchronous wgmma's boundaries.
template <int R>
__device__ __forceinline__ void pin(float (&d)[R]) {
#pragma unroll
    for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// Descriptor of an operand in the 128-byte swizzle (layout type 1 in bits 62-63), rows of 128 bytes whose 16-byte
// chunks are XOR-ed with row % 8, 8-row groups 1024 bytes apart (the stride byte offset). K-major: a row is 64
// K-elements of one M/N index; the leading byte offset is unused (16). MN-major (an RS or SS wgmma with its
// TRANS_B): a row is 64 M/N-elements of one K index, and `leading` is the distance from one 64-element panel of
// M/N to the next. Start address and offsets in units of 16 bytes.
__device__ __forceinline__ uint64_t desc_sw128(uint32_t addr, uint32_t leading = 16) {
    return static_cast<uint64_t>((addr & 0x3FFFFu) >> 4) | (static_cast<uint64_t>((leading >> 4) & 0x3FFFu) << 16) |
           (static_cast<uint64_t>(1024 >> 4) << 32) | (static_cast<uint64_t>(1) << 62);
}

// D[64 x 32] (+)= A[64 x 16] (registers) * B[16 x 32] (shared memory, descriptor); TRANS_B: B is MN-major.
#define TL_WGMMA_RS_32(TYPE, TRANS_B) \
    asm volatile( \
        "{\n" \
        ".reg .pred p;\n" \
        "setp.ne.b32 p, %21, 0;\n" \
        "wgmma.mma_async.sync.aligned.m64n32k16.f32." TYPE "." TYPE " " \
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%16, %17, %18, %19}, %20, p, 1, 1, " TRANS_B ";\n" \
        "}\n" \
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]) \
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate ? 1 : 0) \
        : "memory")

// D[64 x 32] (+)= A[64 x 16] (shared memory, K-major) * B[16 x 32] (shared memory, K-major).
#define TL_WGMMA_SS_32(TYPE) \
    asm volatile( \
        "{\n" \
        ".reg .pred p;\n" \
        "setp.ne.b32 p, %18, 0;\n" \
        "wgmma.mma_async.sync.aligned.m64n32k16.f32." TYPE "." TYPE " " \
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, 0, 0;\n" \
        "}\n" \
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]) \
        : "l"(desc_a), "l"(desc_b), "r"(accumulate ? 1 : 0) \
        : "memory")

// D[64 x 64] (+)= A[64 x 16] (registers) * B[16 x 64] (shared memory, descriptor); TRANS_B: B is MN-major.
#define TL_WGMMA_RS_64(TYPE, TRANS_B) \
    asm volatile( \
        "{\n" \
        ".reg .pred p;\n" \
        "setp.ne.b32 p, %37, 0;\n" \
        "wgmma.mma_async.sync.aligned.m64n64k16.f32." TYPE "." TYPE " " \
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, " TRANS_B ";\n" \
        "}\n" \
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]) \
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate ? 1 : 0) \
        : "memory")

// D[64 x 64] (+)= A[64 x 16] (shared memory, K-major) * B[16 x 64] (shared memory, K-major).
#define TL_WGMMA_SS_64(TYPE) \
    asm volatile( \
        "{\n" \
        ".reg .pred p;\n" \
        "setp.ne.b32 p, %34, 0;\n" \
        "wgmma.mma_async.sync.aligned.m64n64k16.f32." TYPE "." TYPE " " \
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0;\n" \
        "}\n" \
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]) \
        : "l"(desc_a), "l"(desc_b), "r"(accumulate ? 1 : 0) \
        : "memory")

// D[64 x 128] (+)= A[64 x 16] (registers) * B[16 x 128] (shared memory, descriptor); TRANS_B: B is MN-major.
#define TL_WGMMA_RS_128(TYPE, TRANS_B) \
    asm volatile( \
        "{\n" \
        ".reg .pred p;\n" \
        "setp.ne.b32 p, %69, 0;\n" \
        "wgmma.mma_async.sync.aligned.m64n128k16.f32." TYPE "." TYPE " " \
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, " TRANS_B ";\n" \
        "}\n" \
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]) \
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate ? 1 : 0) \
        : "memory")

// D[64 x 128] (+)= A[64 x 16] (shared memory, K-major) * B[16 x 128] (shared memory, K-major).
#define TL_WGMMA_SS_128(TYPE) \
    asm volatile( \
        "{\n" \
        ".reg .pred p;\n" \
        "setp.ne.b32 p, %66, 0;\n" \
        "wgmma.mma_async.sync.aligned.m64n128k16.f32." TYPE "." TYPE " " \
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n" \
        "}\n" \
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]) \
        : "l"(desc_a), "l"(desc_b), "r"(accumulate ? 1 : 0) \
        : "memory")

// The instruction by the accumulator's size (N / 2 registers a thread: 16, 32 or 64) and the element type.
// accumulate false: D = A * B (the accumulator's old values are ignored).
template <Dtype D, bool TRANS_B = false>
__device__ __forceinline__ void mma_rs(float (&d)[16], const uint32_t (&a)[4], uint64_t desc_b, bool accumulate) {
    if constexpr (D == Dtype::F16) {
        if constexpr (TRANS_B) {
            TL_WGMMA_RS_32("f16", "1");
        } else {
            TL_WGMMA_RS_32("f16", "0");
        }
    } else {
        if constexpr (TRANS_B) {
            TL_WGMMA_RS_32("bf16", "1");
        } else {
            TL_WGMMA_RS_32("bf16", "0");
        }
    }
}
template <Dtype D, bool TRANS_B = false>
__device__ __forceinline__ void mma_rs(float (&d)[32], const uint32_t (&a)[4], uint64_t desc_b, bool accumulate) {
    if constexpr (D == Dtype::F16) {
        if constexpr (TRANS_B) {
            TL_WGMMA_RS_64("f16", "1");
        } else {
            TL_WGMMA_RS_64("f16", "0");
        }
    } else {
        if constexpr (TRANS_B) {
            TL_WGMMA_RS_64("bf16", "1");
        } else {
            TL_WGMMA_RS_64("bf16", "0");
        }
    }
}
template <Dtype D, bool TRANS_B = false>
__device__ __forceinline__ void mma_rs(float (&d)[64], const uint32_t (&a)[4], uint64_t desc_b, bool accumulate) {
    if constexpr (D == Dtype::F16) {
        if constexpr (TRANS_B) {
            TL_WGMMA_RS_128("f16", "1");
        } else {
            TL_WGMMA_RS_128("f16", "0");
        }
    } else {
        if constexpr (TRANS_B) {
            TL_WGMMA_RS_128("bf16", "1");
        } else {
            TL_WGMMA_RS_128("bf16", "0");
        }
    }
}
template <Dtype D>
__device__ __forceinline__ void mma_ss(float (&d)[16], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
    if constexpr (D == Dtype::F16) {
        TL_WGMMA_SS_32("f16");
    } else {
        TL_WGMMA_SS_32("bf16");
    }
}
template <Dtype D>
__device__ __forceinline__ void mma_ss(float (&d)[32], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
    if constexpr (D == Dtype::F16) {
        TL_WGMMA_SS_64("f16");
    } else {
        TL_WGMMA_SS_64("bf16");
    }
}
template <Dtype D>
__device__ __forceinline__ void mma_ss(float (&d)[64], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
    if constexpr (D == Dtype::F16) {
        TL_WGMMA_SS_128("f16");
    } else {
        TL_WGMMA_SS_128("bf16");
    }
}

#undef TL_WGMMA_RS_32
#undef TL_WGMMA_RS_64
#undef TL_WGMMA_RS_128
#undef TL_WGMMA_SS_32
#undef TL_WGMMA_SS_64
#undef TL_WGMMA_SS_128

}  // namespace tl::gpu::wgmma
