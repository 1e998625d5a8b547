#include "score/dispatch_settings.hpp"

#include <string>

#include "util/error.hpp"

namespace tl {

namespace {

std::array<std::atomic<int32_t>, kDispatchSettings> &defaults() {
    static std::array<std::atomic<int32_t>, kDispatchSettings> values = {1, 0, 0, 0, kDefaultCublasMinM, 0};
    return values;
}

size_t index_of(DispatchSetting setting) {
    const int32_t index = static_cast<int32_t>(setting);
    // The C API translates its values; this guards the arrays against a value cast from anything else.
    if (index < 0 || index >= kDispatchSettings) {
        fail(TL_ERR_INVALID_ARGUMENT, "setting " + std::to_string(index) + " is not a dispatcher setting");
    }
    return static_cast<size_t>(index);
}

}  // namespace

void check_dispatch_value(DispatchSetting setting, int32_t value) {
    index_of(setting);
    const int32_t max = setting == DispatchSetting::MarlinMode || setting == DispatchSetting::Attention ? 2
                        : setting == DispatchSetting::CublasMinM                                       ? INT32_MAX
                                                                                                       : 1;
    if (value < 0 || value > max) {
        fail(TL_ERR_INVALID_ARGUMENT,
             "value " + std::to_string(value) + " is out of range [0, " + std::to_string(max) + "] for setting " +
                 std::to_string(static_cast<int32_t>(setting)));
    }
}

void set_dispatch(DispatchSetting setting, int32_t value) {
    check_dispatch_value(setting, value);
    defaults()[index_of(setting)].store(value, std::memory_order_relaxed);
}

int32_t get_dispatch(DispatchSetting setting) { return defaults()[index_of(setting)].load(std::memory_order_relaxed); }

DispatchSettings default_dispatch_settings() {
    DispatchSettings s;
    for (size_t i = 0; i < s.values.size(); ++i) s.values[i] = defaults()[i].load(std::memory_order_relaxed);
    return s;
}

DispatchOverrides::DispatchOverrides() {
    for (std::atomic<int32_t> &v : own_) v.store(-1, std::memory_order_relaxed);
}

void DispatchOverrides::set(DispatchSetting setting, int32_t value) {
    if (value != -1) check_dispatch_value(setting, value);
    own_[index_of(setting)].store(value, std::memory_order_relaxed);
}

int32_t DispatchOverrides::get(DispatchSetting setting) const {
    const int32_t own = own_[index_of(setting)].load(std::memory_order_relaxed);
    return own >= 0 ? own : get_dispatch(setting);
}

DispatchSettings DispatchOverrides::resolve() const {
    DispatchSettings s = default_dispatch_settings();
    for (size_t i = 0; i < own_.size(); ++i) {
        const int32_t own = own_[i].load(std::memory_order_relaxed);
        if (own >= 0) s.values[i] = own;
    }
    return s;
}

}  // namespace tl
