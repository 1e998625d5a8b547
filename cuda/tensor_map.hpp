// The driver's tensor-map encoder (cuTensorMapEncodeTiled) for the kernels that feed TMA copies, reached through the
// runtime's driver entry point so that the library does not link the driver library.
#pragma once

#include <cuda.h>  // CUtensorMap and its enums (types only)
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <mutex>

namespace tl::gpu {

// Null where the driver lacks it. Looked up once per process: the address of a driver function never changes.
inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
    static PFN_cuTensorMapEncodeTiled_v12000 encoder = nullptr;
    static std::once_flag once;
    std::call_once(once, [] {
        void *fn = nullptr;
        cudaDriverEntryPointQueryResult found{};
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found) ==
                cudaSuccess &&
            found == cudaDriverEntryPointSuccess) {
            encoder = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
        }
    });
    return encoder;
}

}  // namespace tl::gpu
