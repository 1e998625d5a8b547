// TL_HOST_DEVICE: marks the pure functions that run both in the kernels and in the host code and CPU tests that check
// them (__host__ __device__ under nvcc, nothing elsewhere).
#pragma once

#if defined(__CUDACC__)
#define TL_HOST_DEVICE __host__ __device__
#else
#define TL_HOST_DEVICE
#endif
