// The driver's tensor-map encoder (cuTensorMapEncodeTiled) for the kernels that feed TMA copies, reached through the
// runtime's driver entry point so that the library does not link the driver library.
#pragma once

#include <cuda.h>  // CUtensorMap and its enums (types only)
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <cstdint>
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

// A row-major matrix of `rows` x `cols` elements (`row_bytes` apart) as boxes of box_rows x box_cols, 128-byte
// swizzle (box_cols elements are 128 bytes) unless told otherwise, elements outside read as zeros. False where the
// driver lacks the encoder or refuses the shape.
inline bool encode_rows_map(CUtensorMap &map, CUtensorMapDataType type, const void *base, uint64_t rows,
                            uint64_t cols, uint64_t row_bytes, uint32_t box_rows, uint32_t box_cols,
                            CUtensorMapSwizzle swizzle = CU_TENSOR_MAP_SWIZZLE_128B) {
    const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
    if (encode == nullptr) return false;
    const cuuint64_t dims[2] = {cols, rows};
    const cuuint64_t strides[1] = {row_bytes};
    const cuuint32_t box[2] = {box_cols, box_rows}, elem_strides[2] = {1, 1};
    return encode(&map, type, 2, const_cast<void *>(base), dims, strides, box, elem_strides,
                  CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                  CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

}  // namespace tl::gpu
