// Instantiations of the classic Marlin-class kernel, fused zero-point mode (q*s + z), BF16 activations.
#include "marlin_kernel.cuh"

namespace tl::gpu::marlin {
template int launch<2, true, 1, Dtype::BF16>(Params, const LaunchEnv &);
template int launch<2, true, 2, Dtype::BF16>(Params, const LaunchEnv &);
template int launch<4, true, 1, Dtype::BF16>(Params, const LaunchEnv &);
template int launch<4, true, 2, Dtype::BF16>(Params, const LaunchEnv &);
}  // namespace tl::gpu::marlin
