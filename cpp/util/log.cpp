#include "util/log.hpp"

#include <atomic>
#include <mutex>

namespace tl {

namespace {

struct LogSink {
    std::mutex mutex;
    LogFn callback = nullptr;
    void *user_data = nullptr;
    std::atomic<int32_t> max_level{-1};
};

LogSink &log_sink() {
    static LogSink sink;
    return sink;
}

thread_local bool t_inside_callback = false;

}  // namespace

void set_log_callback(LogFn callback, void *user_data, int32_t max_level) {
    LogSink &sink = log_sink();
    std::lock_guard<std::mutex> lock(sink.mutex);
    sink.callback = callback;
    sink.user_data = user_data;
    sink.max_level.store(callback != nullptr ? max_level : -1);
}

bool log_enabled(int32_t level) { return level <= log_sink().max_level.load(std::memory_order_relaxed); }

void log(int32_t level, const std::string &message) {
    if (!log_enabled(level)) return;
    LogSink &sink = log_sink();
    std::lock_guard<std::mutex> lock(sink.mutex);
    if (sink.callback == nullptr || level > sink.max_level.load()) return;
    t_inside_callback = true;
    sink.callback(sink.user_data, level, message.c_str());
    t_inside_callback = false;
}

bool inside_log_callback() { return t_inside_callback; }

}  // namespace tl
