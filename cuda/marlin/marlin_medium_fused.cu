// Instantiations of the 16 < M <= 64 Marlin-class kernel, fused zero-point mode (q*s + z).
#include "marlin_medium.cuh"

namespace tl::gpu::marlin {
template int launch_medium<3, 1, true, 1>(Params, const LaunchEnv &);
template int launch_medium<3, 1, true, 2>(Params, const LaunchEnv &);
template int launch_medium<4, 1, true, 1>(Params, const LaunchEnv &);
template int launch_medium<4, 1, true, 2>(Params, const LaunchEnv &);
template int launch_medium<3, 2, true, 1>(Params, const LaunchEnv &);
template int launch_medium<3, 2, true, 2>(Params, const LaunchEnv &);
template int launch_medium<4, 2, true, 1>(Params, const LaunchEnv &);
template int launch_medium<4, 2, true, 2>(Params, const LaunchEnv &);
// The wide-warp kernel (one warp per strip holds every row; the default, see marlin_gemm.cu).
template int launch_medium_wide<4, true, 1>(Params, const LaunchEnv &);
template int launch_medium_wide<4, true, 2>(Params, const LaunchEnv &);
template int launch_medium_wide<6, true, 1>(Params, const LaunchEnv &);
template int launch_medium_wide<6, true, 2>(Params, const LaunchEnv &);
template int launch_medium_wide<8, true, 1>(Params, const LaunchEnv &);
template int launch_medium_wide<8, true, 2>(Params, const LaunchEnv &);
}  // namespace tl::gpu::marlin
