// Host packer for the Marlin-class INT4 x FP16 GEMM (cuda/marlin/): turns a Linear in the file's layout
// (codes [N][K/2], scales/zeros [N][G], W[k,n] = q*s + z) into the kernel's offline-permuted layout, and back.
// Pure C++ (no CUDA), so packing is tested where there is no GPU.
// The layout itself, and the shapes the kernels take, are the kernels' contract: cuda/marlin/marlin_layout.hpp.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "format/model.hpp"
#include "marlin/marlin_layout.hpp"

namespace tl {

enum class MarlinMode : int32_t {
    // Codes as stored, per-(group, column) s and z; the kernel dequantizes q*s + z in registers (one HFMA2).
    Fused = 0,
    // The seed's form: the kernel computes (q - 8)*s and the caller adds a_sum @ delta, delta = z + 8s.
    Symmetric = 1,
};

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
