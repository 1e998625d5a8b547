// Host packer for the Marlin-class INT4 x FP16 GEMM (cuda/marlin/): turns a Linear in the file's layout
// (codes [N][K/2], scales/zeros [N][G], W[k,n] = q*s + z) into the kernel's offline-permuted layout, and back.
// Pure C++ (no CUDA), so packing is tested where there is no GPU.
//
// Weight layout, designed for one 128-bit load per lane feeding mma.sync.m16n8k16 B fragments:
//   words [N/64][K/16][32 lanes][4]  (uint32, 8 codes each)
// A (64-column strip, 16-deep k block) cell is 512 contiguous bytes that one warp reads with one 16-byte load per
// lane. Word w of lane L holds the 16 x 16 sub-tile of columns [16w, 16w + 16) of the strip: nibble p (bits 4p..4p+3)
// is the code of
//   column n = 8 * (2w + (p & 1)) + L / 4,   row k = 8 * ((p >> 1) & 1) + 2 * (L % 4) + (p >> 2)
// so that the lop3 / 0x6400 magic-number dequantization of nibble pairs (p, p + 4) yields, without any shuffle,
// the FP16x2 B registers b0 (p = 0, 1) and b1 (p = 2, 3) of the two n8 tiles 2w and 2w + 1 (the M > 16 kernel).
// Read the other way, the same word is the A fragment {a0, a1, a2, a3} (nibble pairs (p, p + 4), p = 0..3) of the
// 16 x 16 tile whose rows are columns 16w .. 16w + 15 and whose columns are k: the M <= 16 kernel multiplies W^T X^T
// with it, and takes pairs p = 0, 2 as exact q and pairs p = 1, 3 as 1024 + 16q (lop3 with 0x000F000F / 0x00F000F0).
//
// Scales (and zeros) layout: [G][N] FP16, columns permuted within each 64-column strip so that lane L reads its
// eight scales (columns 8j + L/4, j = 0..7) with one 16-byte load: strip offset 8 * (c % 8) + c / 8 holds column c.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "format/model.hpp"

namespace tl {

enum class MarlinMode : int32_t {
    // Codes as stored, per-(group, column) s and z; the kernel dequantizes q*s + z in registers (one HFMA2).
    Fused = 0,
    // The seed's form: the kernel computes (q - 8)*s and the caller adds a_sum @ delta, delta = z + 8s.
    Symmetric = 1,
};

// Shape rules shared by the packer and the kernel's launcher. Returns nullptr when (k, n, group_size) is
// supported, else a static message naming the rule. group_size is the actual group size (== k for per row).
const char *marlin_shape_error(int32_t k, int32_t n, int32_t group_size);

// The kernel's group-size argument: -1 (per-column scales) when one group spans K, else the group size.
inline int32_t marlin_kernel_group_size(int32_t k, int32_t group_size) { return group_size == k ? -1 : group_size; }

struct MarlinPacked {
    MarlinMode mode = MarlinMode::Fused;
    int32_t k = 0;
    int32_t n = 0;
    int32_t group_size = 0;  // actual, == k for per row
    std::vector<uint32_t> words;   // [N/64][K/16][32][4]
    std::vector<uint16_t> scales;  // [G][N] permuted, FP16 bits
    std::vector<uint16_t> zeros;   // Fused: [G][N] permuted, FP16 bits; Symmetric: empty
    std::vector<float> delta;      // Symmetric: [G][N] natural column order, z + 8s; Fused: empty

    int32_t n_groups() const { return k / group_size; }
    int32_t kernel_group_size() const { return marlin_kernel_group_size(k, group_size); }
    size_t device_bytes() const;  // words + scales + zeros + delta
};

// Packs raw arrays in the file's layout (codes [n][k/2], scales/zeros [n][k/group_size] FP16 bits).
// Fails with TL_ERR_INVALID_ARGUMENT when marlin_shape_error() is not null or a pointer is null.
MarlinPacked marlin_pack(const uint8_t *codes, const uint16_t *scales, const uint16_t *zeros, int32_t k, int32_t n,
                         int32_t group_size, MarlinMode mode);
// Same from a quantized Linear (bits == 4); TL_ERR_UNSUPPORTED for dense or other bit widths.
MarlinPacked marlin_pack(const Linear &w, MarlinMode mode);

// The inverse of the layout: codes [n][k/2] and scales [n][G] in the file's layout, and
//   Fused: zeros [n][G] (FP16 bits);  Symmetric: delta [n][G] (FP32; zeros are z = delta - 8s).
struct MarlinUnpacked {
    std::vector<uint8_t> codes;
    std::vector<uint16_t> scales;
    std::vector<uint16_t> zeros;
    std::vector<float> delta;
};
MarlinUnpacked marlin_unpack(const MarlinPacked &packed);

// Index helpers for the layouts above (used by the packer, the unpacker and the tests).
struct MarlinNibble {
    size_t word;
    int32_t shift;
};
MarlinNibble marlin_code_position(int32_t k, int32_t n, int32_t kk, int32_t nn);
size_t marlin_scale_position(int32_t n, int32_t g, int32_t nn);

}  // namespace tl
