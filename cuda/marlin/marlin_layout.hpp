// The layout of the weights the Marlin-class kernels read, and the shapes they take: the contract between the kernels
// and the host packer that writes it (tl::marlin_pack). Pure C++ (no CUDA headers), included in every build.
//
// Weight layout, designed for one 128-bit load per lane feeding mma.sync.m16n8k16 B fragments:
//   words [N/64][K/16][32 lanes][4]  (uint32, 8 codes each)
// A (64-column strip, 16-deep k block) cell is 512 contiguous bytes that one warp reads with one 16-byte load per
// lane. Word w of lane L holds the 16 x 16 sub-tile of columns [16w, 16w + 16) of the strip: nibble p (bits 4p..4p+3)
// is the code of
//   column n = 8 * (2w + (p & 1)) + L / 4,   row k = 8 * ((p >> 1) & 1) + 2 * (L % 4) + (p >> 2)
// so that the lop3 / 0x6400 magic-number dequantization of nibble pairs (p, p + 4) yields, without any shuffle,
// the FP16x2 B registers b0 (p = 0, 1) and b1 (p = 2, 3) of the two n8 tiles 2w and 2w + 1 (the classic kernel).
// Read the other way, the same word is the A fragment {a0, a1, a2, a3} (nibble pairs (p, p + 4), p = 0..3) of the
// 16 x 16 tile whose rows are columns 16w .. 16w + 15 and whose columns are k: the stream (M <= 16) and wgmma kernels
// multiply W^T X^T with it. In FP16 the stream kernel takes pairs p = 0, 2 as 1024 + q and pairs p = 1, 3 as
// 1024 + 16q (lop3 with 0x000F000F / 0x00F000F0); BF16 shifts each pair down first (marlin_device.cuh, dequant_word).
//
// Scales (and zeros) layout: [G][N] FP16, columns permuted within each 64-column strip so that lane L reads its
// eight scales (columns 8j + L/4, j = 0..7) with one 16-byte load: strip offset 8 * (c % 8) + c / 8 holds column c.
#pragma once

#include <cstdint>

namespace tl {

// Shape rules shared by the packer and the kernel's launcher. Returns nullptr when (k, n, group_size) is
// supported, else a static message naming the rule. group_size is the actual group size (== k for per row).
inline const char *marlin_shape_error(int32_t k, int32_t n, int32_t group_size) {
    if (k <= 0 || k % 64 != 0) return "K must be a positive multiple of 64 (the kernel's k tile)";
    if (n <= 0 || n % 64 != 0) return "N must be a positive multiple of 64 (one warp's column strip)";
    if (group_size <= 0 || k % group_size != 0) return "the group size must divide K";
    // A k tile (64) holds either two whole groups of 32 or lies inside one group.
    if (group_size != 32 && group_size % 64 != 0) return "the group size must be 32 or a multiple of 64";
    return nullptr;
}

// The kernel's group-size argument: -1 (per-column scales) when one group spans K, else the group size.
inline int32_t marlin_kernel_group_size(int32_t k, int32_t group_size) { return group_size == k ? -1 : group_size; }

}  // namespace tl
