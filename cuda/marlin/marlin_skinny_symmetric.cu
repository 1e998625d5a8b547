// Instantiations of the M <= 16 Marlin-class kernel, symmetric mode ((q - 8)*s; the caller adds the correction).
#include "marlin_skinny.cuh"

namespace tl::gpu::marlin {
template int launch_skinny<1, false, 1, 4>(Params, const LaunchEnv &);
template int launch_skinny<1, false, 2, 4>(Params, const LaunchEnv &);
template int launch_skinny<1, false, 1, 8>(Params, const LaunchEnv &);
template int launch_skinny<2, false, 1, 4>(Params, const LaunchEnv &);
template int launch_skinny<2, false, 2, 4>(Params, const LaunchEnv &);
}  // namespace tl::gpu::marlin
