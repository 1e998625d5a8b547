// Instantiations of the 16 < M <= 64 Marlin-class kernel, symmetric mode ((q - 8)*s; the caller adds the correction).
#include "marlin_medium.cuh"

namespace tl::gpu::marlin {
template int launch_medium<3, 1, false, 1>(Params, const LaunchEnv &);
template int launch_medium<3, 1, false, 2>(Params, const LaunchEnv &);
template int launch_medium<4, 1, false, 1>(Params, const LaunchEnv &);
template int launch_medium<4, 1, false, 2>(Params, const LaunchEnv &);
template int launch_medium<3, 2, false, 1>(Params, const LaunchEnv &);
template int launch_medium<3, 2, false, 2>(Params, const LaunchEnv &);
template int launch_medium<4, 2, false, 1>(Params, const LaunchEnv &);
template int launch_medium<4, 2, false, 2>(Params, const LaunchEnv &);
// The wide-warp kernel (one warp per strip holds every row; the default, see marlin_gemm.cu).
template int launch_medium_wide<4, false, 1>(Params, const LaunchEnv &);
template int launch_medium_wide<4, false, 2>(Params, const LaunchEnv &);
template int launch_medium_wide<6, false, 1>(Params, const LaunchEnv &);
template int launch_medium_wide<6, false, 2>(Params, const LaunchEnv &);
template int launch_medium_wide<8, false, 1>(Params, const LaunchEnv &);
template int launch_medium_wide<8, false, 2>(Params, const LaunchEnv &);
}  // namespace tl::gpu::marlin
