// Instantiations of the M <= 16 Marlin-class kernel, fused zero-point mode (q*s + z).
#include "marlin_skinny.cuh"

namespace tl::gpu::marlin {
template int launch_skinny<1, true, 1, 4>(Params, const LaunchEnv &);
template int launch_skinny<1, true, 2, 4>(Params, const LaunchEnv &);
template int launch_skinny<1, true, 1, 8>(Params, const LaunchEnv &);
template int launch_skinny<2, true, 1, 4>(Params, const LaunchEnv &);
template int launch_skinny<2, true, 2, 4>(Params, const LaunchEnv &);
}  // namespace tl::gpu::marlin
