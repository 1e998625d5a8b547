// Instantiations of the M <= 16 stream kernel, symmetric mode ((q - 8)*s; the caller adds the correction).
#include "marlin_stream.cuh"

namespace tl::gpu::marlin {
template int launch_stream<1, false, 1>(Params, const LaunchEnv &);
template int launch_stream<1, false, 2>(Params, const LaunchEnv &);
template int launch_stream<1, false, 4>(Params, const LaunchEnv &);
template int launch_stream<2, false, 1>(Params, const LaunchEnv &);
template int launch_stream<2, false, 2>(Params, const LaunchEnv &);
template int launch_stream<2, false, 4>(Params, const LaunchEnv &);
}  // namespace tl::gpu::marlin
