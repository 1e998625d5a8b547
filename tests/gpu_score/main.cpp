// Entry point of the GPU forward-pass tests: exits 77 (CTest: skipped) when there is no usable CUDA device, unless
// the filter selects only the host-side tests (Host*), which need no device.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>

#include "test_util.hpp"

namespace tlt {

namespace {
uint64_t g_seed = 0;
}

std::mt19937_64 &rng() {
    static std::mt19937_64 engine(g_seed);
    return engine;
}

}  // namespace tlt

int main(int argc, char **argv) {
    ::testing::InitGoogleTest(&argc, argv);
    // Fresh inputs on every run; TL_TEST_SEED=<seed> replays a run.
    const char *seed_text = std::getenv("TL_TEST_SEED");
    tlt::g_seed = seed_text != nullptr ? std::strtoull(seed_text, nullptr, 10)
                                       : (static_cast<uint64_t>(std::random_device{}()) << 32) | std::random_device{}();
    const std::string filter = ::testing::GTEST_FLAG(filter);
    const bool host_only = filter.rfind("Host", 0) == 0 && filter.find(':') == std::string::npos;
    if (!::testing::GTEST_FLAG(list_tests) && !host_only) {
        int count = 0;
        if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
            std::printf("no usable CUDA device: GPU forward-pass tests skipped\n");
            return 77;
        }
        cudaDeviceProp prop{};
        if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess) {
            std::printf("device: %s, SM %d.%d, %d SMs\n", prop.name, prop.major, prop.minor, prop.multiProcessorCount);
        }
    }
    std::printf("random seed: %llu\n", static_cast<unsigned long long>(tlt::g_seed));
    return RUN_ALL_TESTS();
}
