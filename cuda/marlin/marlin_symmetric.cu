// Instantiations of the classic Marlin-class kernel, symmetric mode ((q - 8)*s; the caller adds the correction),
// FP16 activations (the correction form has no BF16 path).
#include "marlin_kernel.cuh"

namespace tl::gpu::marlin {
template int launch<2, false, 1, Dtype::F16>(Params, const LaunchEnv &);
template int launch<2, false, 2, Dtype::F16>(Params, const LaunchEnv &);
template int launch<4, false, 1, Dtype::F16>(Params, const LaunchEnv &);
template int launch<4, false, 2, Dtype::F16>(Params, const LaunchEnv &);
}  // namespace tl::gpu::marlin
