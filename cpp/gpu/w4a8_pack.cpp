#include "gpu/w4a8_pack.hpp"

#include <string>

#include "int8_gemm_layout.hpp"
#include "util/error.hpp"
#include "util/half.hpp"

namespace tl {

std::vector<uint32_t> w4a8_pack(const uint8_t *codes, int32_t n, int32_t k) {
    if (codes == nullptr || n < 1 || k < 1) {
        fail(TL_ERR_INVALID_ARGUMENT, "w4a8_pack: null codes or a shape below 1 x 1");
    }
    const int64_t n_padded = gpu::w4a8::padded_n(n);
    std::vector<uint32_t> packed(gpu::w4a8::packed_bytes(n, k) / 4, 0u);
    const size_t row_bytes = (static_cast<size_t>(k) + 1) / 2;
    for (int32_t col = 0; col < n; ++col) {
        const uint8_t *row = codes + static_cast<size_t>(col) * row_bytes;
        for (int32_t kk = 0; kk < k; ++kk) {
            const uint32_t q = (row[kk / 2] >> (4 * (kk % 2))) & 0xFu;
            const gpu::w4a8::CodeAt at = gpu::w4a8::code_at(col, kk, n_padded);
            packed[at.word] |= q << at.shift;
        }
    }
    return packed;
}

uint8_t w4a8_code(const std::vector<uint32_t> &packed, int32_t n, int32_t col, int32_t k_index) {
    const gpu::w4a8::CodeAt at = gpu::w4a8::code_at(col, k_index, gpu::w4a8::padded_n(n));
    return static_cast<uint8_t>((packed.at(at.word) >> at.shift) & 0xFu);
}

std::vector<float> w4a8_pack_groups(const uint16_t *scales, const uint16_t *zeros, int32_t n, int32_t k,
                                    int32_t group) {
    if (scales == nullptr || zeros == nullptr || n < 1 || k < 1) {
        fail(TL_ERR_INVALID_ARGUMENT, "w4a8_pack_groups: null scales or zeros, or a shape below 1 x 1");
    }
    if ((group != 32 && group != 64 && group != 128) || k % group != 0) {
        fail(TL_ERR_INVALID_ARGUMENT, "w4a8_pack_groups: group " + std::to_string(group) + " with K = " +
                                          std::to_string(k) + " (groups of 32, 64 or 128 dividing K)");
    }
    std::vector<float> out(gpu::w4a8::group_floats(n, k, group), 0.0f);
    const int32_t groups = k / group;
    for (int32_t col = 0; col < n; ++col) {
        for (int32_t g = 0; g < groups; ++g) {
            const size_t at = static_cast<size_t>(col) * groups + g;
            out[gpu::w4a8::group_param_at(col, g, false, k, group)] = half_to_float(scales[at]);
            out[gpu::w4a8::group_param_at(col, g, true, k, group)] = half_to_float(zeros[at]);
        }
    }
    return out;
}

}  // namespace tl
