// Where the INT8 tensor-core GEMM (int8_gemm.cu) finds each INT4 code of a weight it takes as W4A8: pure functions,
// host and device, shared by the packer (cpp/gpu/w4a8_pack.cpp), the kernel and the tests.
//
// The kernel hands the codes to wgmma as its register operand, widened to bytes. A thread's register for one row n
// and one k32 step holds the bytes k0 .. k0 + 3 (k0 = 32 c + 4 (lane % 4)) and, in another register, k0 + 16 ..
// k0 + 19. So one packed word holds both: byte j's low nibble is code k0 + j, its high nibble code k0 + 16 + j, and
// `w & 0x0F0F0F0F`, `(w >> 4) & 0x0F0F0F0F` are the two registers. Words are grouped per 128-deep k slice and
// 64-column strip (4 KB) as the consumer threads read them from shared memory, 16 contiguous bytes a lane:
//   [k slice][strip][warp w (16 columns)][half h (k32 steps 2h, 2h + 1)][lane][step c % 2][row r]  (uint32 words)
// with column n = 64 strip + 16 w + lane / 4 + 8 r. Strips and slices cover N and K rounded up to 128; codes past
// N or K are 0.
#pragma once

#include <cstddef>
#include <cstdint>

#include "host_device.hpp"

namespace tl::gpu::w4a8 {

constexpr int kSliceK = 128;       // k per slice: one 128-byte row of INT8 in shared memory
constexpr int kTileColumns = 128;  // weight columns per tile: two 64-column strips
constexpr int kStripBytes = 64 * kSliceK / 2;

TL_HOST_DEVICE inline int64_t padded_n(int64_t n) { return (n + kTileColumns - 1) / kTileColumns * kTileColumns; }
TL_HOST_DEVICE inline int64_t padded_k(int64_t k) { return (k + kSliceK - 1) / kSliceK * kSliceK; }
// Bytes of a packed weight.
TL_HOST_DEVICE inline size_t packed_bytes(int64_t n, int64_t k) {
    return static_cast<size_t>(padded_n(n)) * static_cast<size_t>(padded_k(k)) / 2;
}

// The word holding code (n, k), and the bit of its nibble, in a weight of n_padded columns.
struct CodeAt {
    size_t word;
    int shift;
};
TL_HOST_DEVICE inline CodeAt code_at(int64_t n, int64_t k, int64_t n_padded) {
    const int64_t slice = k / kSliceK, kk = k % kSliceK;
    const int64_t strip = n / 64, col = n % 64;
    const int c = static_cast<int>(kk / 32), in32 = static_cast<int>(kk % 32);
    const int high = in32 / 16, quad = (in32 % 16) / 4, j = in32 % 4;
    const int w = static_cast<int>(col / 16), r = static_cast<int>((col % 16) / 8);
    const int lane = static_cast<int>(col % 8) * 4 + quad;
    const int64_t strips = n_padded / 64;
    const size_t chunk = static_cast<size_t>(((slice * strips + strip) * 4 + w) * 2 + c / 2) * 32 + lane;
    return {chunk * 4 + (c % 2) * 2 + r, 8 * j + 4 * high};
}

// Grouped weights (group size G of 32, 64 or 128): the scales s and zeros z of each 128-column tile and group, FP32,
// in the order a consumer thread reads them: 256 floats per (tile, group), tiles outermost so that the groups of one k
// slice are one contiguous copy:
//   [tile][group][p][s(c), s(c + 8), z(c), z(c + 8)]  with column c = 128 tile + 64 (p / 32) + 16 (p / 8 % 4) + p % 8
// p = 32 warpgroup + 8 warp + lane / 4 is the thread's pair of columns, so one 16-byte load gives it all four values.
// Groups cover K rounded up to 128 and tiles N rounded up to 128; entries past N or K are 0.
constexpr int kGroupFloats = 256;  // per tile and group
TL_HOST_DEVICE inline int64_t padded_groups(int64_t k, int group) { return padded_k(k) / group; }
TL_HOST_DEVICE inline size_t group_floats(int64_t n, int64_t k, int group) {
    return static_cast<size_t>(padded_n(n) / kTileColumns) * static_cast<size_t>(padded_groups(k, group)) *
           kGroupFloats;
}
// The float holding s (zero = false) or z of column n in group g.
TL_HOST_DEVICE inline size_t group_param_at(int64_t n, int64_t g, bool zero, int64_t k, int group) {
    const int64_t tile = n / kTileColumns, col = n % kTileColumns;
    const int64_t p = (col / 64) * 32 + (col % 64) / 16 * 8 + col % 8;
    const int h = static_cast<int>((col % 16) / 8);
    return static_cast<size_t>((tile * padded_groups(k, group) + g) * kGroupFloats + p * 4 + (zero ? 2 : 0) + h);
}

}  // namespace tl::gpu::w4a8
