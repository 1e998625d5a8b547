// cuBLAS resolved at run time (dlopen), so that the library loads, and runs on the CPU, on a host without the CUDA
// libraries: the CUDA runtime is linked statically and finds the driver itself, and cuBLAS is the only CUDA library
// left. Compiled only with the CUDA backend (cuda/sources.txt).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <string>

namespace tl::gpu {

// The cuBLAS functions the library calls.
struct CublasApi {
    cublasStatus_t (*create)(cublasHandle_t *handle);
    cublasStatus_t (*destroy)(cublasHandle_t handle);
    cublasStatus_t (*set_stream)(cublasHandle_t handle, cudaStream_t stream);
    cublasStatus_t (*set_workspace)(cublasHandle_t handle, void *workspace, size_t bytes);
    cublasStatus_t (*gemm_ex)(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                              int k, const void *alpha, const void *a, cudaDataType a_type, int lda, const void *b,
                              cudaDataType b_type, int ldb, const void *beta, void *c, cudaDataType c_type, int ldc,
                              cublasComputeType_t compute_type, cublasGemmAlgo_t algo);
};

// The functions of the cuBLAS this build was compiled against (its major version's soname), loaded on first use and
// kept for the process; nullptr when it cannot be loaded, with the reason in *why (when not null).
const CublasApi *cublas_api(std::string *why = nullptr);

}  // namespace tl::gpu
