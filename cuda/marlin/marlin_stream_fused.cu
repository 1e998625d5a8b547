// Instantiations of the M <= 16 stream kernel, fused zero-point mode (q*s + z), FP16 activations.
#include "marlin_stream.cuh"

namespace tl::gpu::marlin {
template int launch_stream<1, true, 1, Dtype::F16>(Params, const LaunchEnv &);
template int launch_stream<1, true, 2, Dtype::F16>(Params, const LaunchEnv &);
template int launch_stream<1, true, 4, Dtype::F16>(Params, const LaunchEnv &);
template int launch_stream<2, true, 1, Dtype::F16>(Params, const LaunchEnv &);
template int launch_stream<2, true, 2, Dtype::F16>(Params, const LaunchEnv &);
template int launch_stream<2, true, 4, Dtype::F16>(Params, const LaunchEnv &);
}  // namespace tl::gpu::marlin
