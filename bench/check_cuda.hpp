// The benchmark programs' CUDA error check: a failed call is a broken measurement, so it prints where and exits.
// (Programs only: the library itself turns every CUDA error into a status.)
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#define CHECK_CUDA(call)                                                                              \
    do {                                                                                              \
        const cudaError_t e = (call);                                                                 \
        if (e != cudaSuccess) {                                                                       \
            std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e)); \
            std::exit(1);                                                                             \
        }                                                                                             \
    } while (0)
