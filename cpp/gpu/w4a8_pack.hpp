// Host packer for the INT8 tensor-core GEMM's INT4 weights (W4A8, cuda/int8_gemm.cu): the file's codes ([N][K/2],
// low nibble = even k) into the kernel's order (cuda/int8_gemm_layout.hpp), N and K padded to 128 with zero codes; and
// a grouped weight's scales and zeros.
// Pure C++ (no CUDA), tested where there is no GPU.
#pragma once

#include <cstdint>
#include <vector>

namespace tl {

// `codes`: n rows of (k + 1) / 2 bytes. Fails with TL_ERR_INVALID_ARGUMENT on a null pointer or n, k < 1.
std::vector<uint32_t> w4a8_pack(const uint8_t *codes, int32_t n, int32_t k);
// Code (row, col) of a packed weight of n columns (tests).
uint8_t w4a8_code(const std::vector<uint32_t> &packed, int32_t n, int32_t col, int32_t k_index);
// A grouped weight's scales and zeros (the file's FP16 [N][K / group], bits as uint16_t) as FP32 in the kernel's order
// (int8_gemm_layout.hpp, group_param_at), padding 0. Fails with TL_ERR_INVALID_ARGUMENT on a null pointer, n, k < 1,
// a group other than 32, 64 or 128, or K not a multiple of it.
std::vector<float> w4a8_pack_groups(const uint16_t *scales, const uint16_t *zeros, int32_t n, int32_t k, int32_t group);

}  // namespace tl
