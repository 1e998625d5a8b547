// The dispatcher settings: which GEMM paths a call may take, cross-iteration rounding, and GPU scoring's attention
// kernel. A call runs with one DispatchSettings, resolved from the handle it goes through (a model, an owned weight):
// each setting the handle has not set follows the process-wide default (set_dispatch). Nothing here reads the
// environment; the CLI maps its variables onto a model's settings.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>

namespace tl {

// The numbers are the C API's TL_DISPATCH_* values (capi/ translates them), so a message names a setting by the
// number the caller passed.
enum class DispatchSetting : int32_t {
    UseMarlin = 0,       // 1 / 0: the Marlin-class kernel
    Fp16Body = 1,        // 0 / 1: a weight's FP16 body first (and pack one)
    CrossIterRound = 2,  // 0 / 1: cross-iteration rounding (CPU backend)
    MarlinMode = 3,      // 0 the faster form, 1 fused, 2 correction
    CublasMinM = 4,      // rows from which dequantize + cuBLAS replaces the Marlin-class kernel; 0 = never
    Attention = 5,       // 0 the fastest tensor-core attention that runs, 1 the FP32 SIMT kernel, 2 the mma.sync one
};
constexpr int32_t kDispatchSettings = 6;

// CublasMinM's default: between 256 rows, where the wgmma kernel still beats dequantize + cuBLAS (which pays a full
// extra pass over the weights), and 1024, where it loses. Without the wgmma kernel the crossover is nearer 128 rows.
constexpr int32_t kDefaultCublasMinM = 512;

// The values one call runs with.
struct DispatchSettings {
    std::array<int32_t, kDispatchSettings> values{};
    int32_t operator[](DispatchSetting s) const { return values[static_cast<size_t>(s)]; }
    int32_t &operator[](DispatchSetting s) { return values[static_cast<size_t>(s)]; }
    bool operator==(const DispatchSettings &other) const { return values == other.values; }
    bool operator!=(const DispatchSettings &other) const { return values != other.values; }
};

// TL_ERR_INVALID_ARGUMENT for a setting that is not one, or a value out of its range (MarlinMode 0-2, CublasMinM
// >= 0, the others 0 or 1).
void check_dispatch_value(DispatchSetting setting, int32_t value);

// The process-wide defaults, initially the built-in ones: a handle's unset settings follow them.
void set_dispatch(DispatchSetting setting, int32_t value);
int32_t get_dispatch(DispatchSetting setting);
DispatchSettings default_dispatch_settings();

// A handle's own settings. Thread-safe: a setting may change while calls that resolved the old value run.
class DispatchOverrides {
public:
    DispatchOverrides();
    DispatchOverrides(const DispatchOverrides &) = delete;
    DispatchOverrides &operator=(const DispatchOverrides &) = delete;
    // value -1 returns the setting to the process-wide default.
    void set(DispatchSetting setting, int32_t value);
    // The value a call through this handle uses now: its own, else the process-wide default.
    int32_t get(DispatchSetting setting) const;
    DispatchSettings resolve() const;

private:
    std::array<std::atomic<int32_t>, kDispatchSettings> own_;  // -1: not set
};

}  // namespace tl
