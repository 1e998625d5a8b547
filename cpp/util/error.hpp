// Errors inside the library: every failure is a tl::Error carrying a tl_status and a message; the C API's
// exception barrier (capi/src/barrier.hpp) turns it into the status and the thread's last error message. The library
// below the C API uses the header's status and constant values (never renumbered), none of its structs or functions.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

#include "tinyloop.h"

namespace tl {

class Error : public std::runtime_error {
public:
    Error(tl_status code, const std::string &message) : std::runtime_error(message), code_(code) {}
    tl_status code() const noexcept { return code_; }

private:
    tl_status code_;
};

[[noreturn]] inline void fail(tl_status code, const std::string &message) { throw Error(code, message); }

}  // namespace tl
