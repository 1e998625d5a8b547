// Instantiations of the M > 16 Marlin-class kernel, fused zero-point mode (q*s + z).
#include "marlin_kernel.cuh"

namespace tl::gpu::marlin {
template int launch<2, true, 1>(Params, const LaunchEnv &);
template int launch<2, true, 2>(Params, const LaunchEnv &);
template int launch<4, true, 1>(Params, const LaunchEnv &);
template int launch<4, true, 2>(Params, const LaunchEnv &);
}  // namespace tl::gpu::marlin
