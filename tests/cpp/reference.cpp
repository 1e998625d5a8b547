#include "reference.hpp"

#include <cstdlib>
#include <string>

namespace ref {

uint64_t fresh_seed() {
    if (const char *fixed = std::getenv("TL_TEST_SEED")) return std::stoull(fixed);
    std::random_device device;
    return (static_cast<uint64_t>(device()) << 32) ^ device();
}

}  // namespace ref
