// Entry point of the GPU parity tests: exits 77 (CTest: skipped) when there is no usable CUDA device, so a
// machine without a GPU reports these tests as skipped, never as passed. `--quick` keeps to small shapes.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>

#include "gpu_test_util.hpp"

int main(int argc, char **argv) {
    ::testing::InitGoogleTest(&argc, argv);
    for (int i = 1; i < argc; ++i) {
        if (std::strcmp(argv[i], "--quick") == 0) tlt::g_quick = true;
    }
    if (!::testing::GTEST_FLAG(list_tests)) {
        int count = 0;
        if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
            std::printf("no usable CUDA device: GPU tests skipped\n");
            return 77;
        }
        cudaDeviceProp prop{};
        if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess) {
            std::printf("device: %s, SM %d.%d, %d SMs%s\n", prop.name, prop.major, prop.minor,
                        prop.multiProcessorCount, tlt::g_quick ? " (quick shapes)" : "");
        }
    }
    return RUN_ALL_TESTS();
}
