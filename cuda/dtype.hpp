// The element type of a GEMM's activations and output (x and y), and so of the tensor cores' operands. Pure C++ (no
// CUDA headers), so that the host side includes it in every build; the C API translates TL_DTYPE_* into it.
#pragma once

namespace tl {

enum class Dtype : int { F16 = 0, BF16 = 1 };

}  // namespace tl
