// main() of tl_cpp_tests: GoogleTest's, plus --portable-cpu-kernel, which runs the CPU backend on its portable kernel
// (CTest's cpp.baseline_isa.* tests), since AVX2 machines would otherwise never run it.
#include <gtest/gtest.h>

#include <cstring>

#include "cpu/cpu_forward.hpp"

int main(int argc, char **argv) {
    int kept = 1;
    for (int i = 1; i < argc; ++i) {
        if (std::strcmp(argv[i], "--portable-cpu-kernel") == 0) tl::use_portable_cpu_kernel(true);
        else argv[kept++] = argv[i];
    }
    argc = kept;
    ::testing::InitGoogleTest(&argc, argv);
    return RUN_ALL_TESTS();
}
