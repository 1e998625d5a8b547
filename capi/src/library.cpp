// The C API's functions of the library as a whole: status strings and the calling thread's error message, the
// version, the build, the log callback.
#include "tinyloop.h"

#include <string>

#include <nlohmann/json.hpp>

#include "barrier.hpp"
#include "build_info.hpp"
#include "util/log.hpp"

using namespace tl::capi;

namespace tl::capi {

ThreadError &thread_error() {
    thread_local ThreadError error;
    return error;
}

void clear_error() { thread_error().current = ""; }

void set_error(const char *message) {
    ThreadError &e = thread_error();
    try {
        e.text = message;
        e.current = e.text.c_str();
    } catch (...) {
        e.current = kOutOfMemoryMessage;
    }
}

}  // namespace tl::capi

namespace {

const char *build_info_json() {
    static const std::string text = [] {
        nlohmann::json info;
        info["version"] = tl_version_string();
        info["compiler"] = TL_BUILD_COMPILER;
        info["build_type"] = TL_BUILD_TYPE;
#if defined(TL_WITH_CUDA)
        info["cuda"] = true;
        info["cuda_version"] = TL_BUILD_CUDA_VERSION;
#else
        info["cuda"] = false;
        info["cuda_version"] = nullptr;
#endif
        nlohmann::json archs = nlohmann::json::array();
        const std::string list = TL_BUILD_CUDA_ARCHS;
        size_t start = 0;
        while (start < list.size()) {
            size_t end = list.find(',', start);
            if (end == std::string::npos) end = list.size();
            if (end > start) archs.push_back(std::stoi(list.substr(start, end - start)));
            start = end + 1;
        }
        info["cuda_architectures"] = archs;
        return info.dump();
    }();
    return text.c_str();
}

}  // namespace

extern "C" {

TL_API const char *tl_status_string(tl_status status) {
    switch (status) {
        case TL_OK: return "ok";
        case TL_ERR_INVALID_ARGUMENT: return "invalid argument";
        case TL_ERR_OUT_OF_MEMORY: return "out of memory";
        case TL_ERR_IO: return "I/O error";
        case TL_ERR_FORMAT: return "malformed model file";
        case TL_ERR_UNSUPPORTED: return "unsupported";
        case TL_ERR_NO_DEVICE: return "no CUDA device";
        case TL_ERR_CUDA: return "CUDA error";
        case TL_ERR_INTERNAL: return "internal error";
        case TL_ERR_BUFFER_TOO_SMALL: return "buffer too small";
        case TL_ERR_NOT_FOUND: return "not found";
        case TL_ERR_CANCELLED: return "cancelled";
        default: return "unknown status";
    }
}

TL_API const char *tl_last_error_message(void) { return thread_error().current; }

TL_API uint32_t tl_version(void) {
    return (TL_VERSION_MAJOR << 16) | (TL_VERSION_MINOR << 8) | TL_VERSION_PATCH;
}

TL_API const char *tl_version_string(void) {
#define TL_STR2(x) #x
#define TL_STR(x) TL_STR2(x)
    return TL_STR(TL_VERSION_MAJOR) "." TL_STR(TL_VERSION_MINOR) "." TL_STR(TL_VERSION_PATCH);
#undef TL_STR
#undef TL_STR2
}

TL_API const char *tl_build_info(void) {
    try {
        return build_info_json();
    } catch (...) {
        return "{}";
    }
}

TL_API tl_status tl_set_log_callback(tl_log_fn callback, void *user_data, int32_t max_level) {
    return guarded([&] {
        require(max_level >= TL_LOG_ERROR && max_level <= TL_LOG_DEBUG,
                "max_level must be TL_LOG_ERROR..TL_LOG_DEBUG, got " + std::to_string(max_level));
        tl::set_log_callback(callback, user_data, max_level);
    });
}

}  // extern "C"
