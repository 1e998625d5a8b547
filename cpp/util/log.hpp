// Library-wide logging: one process-global callback (set through tl_set_log_callback) and a most verbose level.
#pragma once

#include <cstdint>
#include <string>

namespace tl {

using LogFn = void (*)(void *user_data, int32_t level, const char *message);

// Sets the callback (nullptr: logging off) and the most verbose level passed to it. Calls already under way may
// still reach the previous callback.
void set_log_callback(LogFn callback, void *user_data, int32_t max_level);
// Whether a message at `level` would reach a callback (to skip building messages nobody reads).
bool log_enabled(int32_t level);
// Passes `message` to the callback when one is set for `level`.
void log(int32_t level, const std::string &message);
// True on a thread while it runs the callback. The callback runs under the sink's lock, often under a model's lock
// too, so the C API refuses calls made from inside it instead of deadlocking.
bool inside_log_callback();

}  // namespace tl
