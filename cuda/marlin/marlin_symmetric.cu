// Instantiations of the M > 16 Marlin-class kernel, symmetric mode ((q - 8)*s; the caller adds the correction).
#include "marlin_kernel.cuh"

namespace tl::gpu::marlin {
template int launch<2, false, 1>(Params, const LaunchEnv &);
template int launch<2, false, 2>(Params, const LaunchEnv &);
template int launch<4, false, 1>(Params, const LaunchEnv &);
template int launch<4, false, 2>(Params, const LaunchEnv &);
}  // namespace tl::gpu::marlin
