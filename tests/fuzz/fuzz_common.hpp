// What the fuzz targets that go through the public C API share: reading a failure's message, a log sink that runs
// the logging code but drops its text, and writing an input to a scratch file.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "tinyloop.h"

namespace fuzz {

// A status is fine; its message must still be a readable string.
inline void read_message(tl_status status) {
    if (status == TL_OK) return;
    volatile size_t n = std::strlen(tl_last_error_message()) + std::strlen(tl_status_string(status));
    (void)n;
}

// The logging code runs too; the text itself is dropped.
inline void discard_log(void *, int32_t, const char *message) {
    volatile size_t n = std::strlen(message);
    (void)n;
}

// Writes `size` bytes to `path` (created or truncated); false when that fails (a full disk is no finding).
inline bool write_file(const std::string &path, const void *data, size_t size) {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return false;
    const auto *bytes = static_cast<const uint8_t *>(data);
    size_t done = 0;
    while (done < size) {
        const ssize_t n = ::write(fd, bytes + done, size - done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        done += static_cast<size_t>(n);
    }
    ::close(fd);
    return done == size;
}

}  // namespace fuzz
