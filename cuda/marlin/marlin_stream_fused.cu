// Instantiations of the M <= 16 stream kernel, fused zero-point mode (q*s + z).
#include "marlin_stream.cuh"

namespace tl::gpu::marlin {
template int launch_stream<1, true, 1>(Params, const LaunchEnv &);
template int launch_stream<1, true, 2>(Params, const LaunchEnv &);
template int launch_stream<1, true, 4>(Params, const LaunchEnv &);
template int launch_stream<2, true, 1>(Params, const LaunchEnv &);
template int launch_stream<2, true, 2>(Params, const LaunchEnv &);
template int launch_stream<2, true, 4>(Params, const LaunchEnv &);
}  // namespace tl::gpu::marlin
