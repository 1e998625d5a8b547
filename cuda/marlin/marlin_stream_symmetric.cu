// Instantiations of the M <= 16 stream kernel, symmetric mode ((q - 8)*s; the caller adds the correction), FP16
// activations (the correction form has no BF16 path).
#include "marlin_stream.cuh"

namespace tl::gpu::marlin {
template int launch_stream<1, false, 1, Dtype::F16>(Params, const LaunchEnv &);
template int launch_stream<1, false, 2, Dtype::F16>(Params, const LaunchEnv &);
template int launch_stream<1, false, 4, Dtype::F16>(Params, const LaunchEnv &);
template int launch_stream<2, false, 1, Dtype::F16>(Params, const LaunchEnv &);
template int launch_stream<2, false, 2, Dtype::F16>(Params, const LaunchEnv &);
template int launch_stream<2, false, 4, Dtype::F16>(Params, const LaunchEnv &);
}  // namespace tl::gpu::marlin
