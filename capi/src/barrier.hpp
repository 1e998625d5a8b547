// What the exported functions of the C API (capi/src/*.cpp) share: the one exception barrier (guarded) around the C++
// core, with the calling thread's error message; the argument checks; reading and writing the versioned structs.
// Nothing in the C API aborts; every failure becomes a tl_status plus the calling thread's error message.
#pragma once

#include "tinyloop.h"

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <new>
#include <string>

#include "util/error.hpp"
#include "util/log.hpp"

namespace tl::capi {

// ---- The calling thread's error message (library.cpp). Out-of-memory is reported without allocating. ----

inline constexpr const char *kOutOfMemoryMessage = "out of memory";

struct ThreadError {
    std::string text;
    const char *current = "";
};

ThreadError &thread_error();
void clear_error();
void set_error(const char *message);

// Runs `body` behind the barrier: tl::Error keeps its status, bad_alloc is TL_ERR_OUT_OF_MEMORY, anything else
// is TL_ERR_INTERNAL.
template <class Body>
tl_status guarded(Body &&body) noexcept {
    // From inside the log callback: refused, and the thread's message is left to the call that logged.
    if (tl::inside_log_callback()) return TL_ERR_UNSUPPORTED;
    clear_error();
    try {
        body();
        return TL_OK;
    } catch (const tl::Error &e) {
        set_error(e.what());
        return e.code();
    } catch (const std::bad_alloc &) {
        thread_error().current = kOutOfMemoryMessage;
        return TL_ERR_OUT_OF_MEMORY;
    } catch (const std::exception &e) {
        set_error(e.what());
        return TL_ERR_INTERNAL;
    } catch (...) {
        set_error("unknown C++ exception");
        return TL_ERR_INTERNAL;
    }
}

inline void require(bool ok, const std::string &message) {
    if (!ok) tl::fail(TL_ERR_INVALID_ARGUMENT, message);
}

template <class T>
void require_not_null(const T *p, const char *name) {
    if (p == nullptr) tl::fail(TL_ERR_INVALID_ARGUMENT, std::string(name) + " is NULL");
}

// The size of each struct's first version: the smallest struct_size accepted. A struct that appends fields keeps
// its old size here (tl_score_options gained max_memory_bytes, tl_score_result the setup and capture times, after
// their first versions).
template <class T>
inline constexpr uint32_t kFirstVersionSize = 0;  // 0: not listed, and the helpers below refuse to compile
template <> inline constexpr uint32_t kFirstVersionSize<tl_load_options> = sizeof(tl_load_options);
template <> inline constexpr uint32_t kFirstVersionSize<tl_weight_desc> = sizeof(tl_weight_desc);
template <> inline constexpr uint32_t kFirstVersionSize<tl_int4_import_desc> = sizeof(tl_int4_import_desc);
template <> inline constexpr uint32_t kFirstVersionSize<tl_import_options> = sizeof(tl_import_options);
template <> inline constexpr uint32_t kFirstVersionSize<tl_quantize_options> = sizeof(tl_quantize_options);
template <> inline constexpr uint32_t kFirstVersionSize<tl_pack_options> = sizeof(tl_pack_options);
template <> inline constexpr uint32_t kFirstVersionSize<tl_pack_report> = sizeof(tl_pack_report);
template <>
inline constexpr uint32_t kFirstVersionSize<tl_score_options> = offsetof(tl_score_options, max_memory_bytes);
template <>
inline constexpr uint32_t kFirstVersionSize<tl_compare_options> = offsetof(tl_compare_options, activations_reference);
template <> inline constexpr uint32_t kFirstVersionSize<tl_compare_result> = sizeof(tl_compare_result);
template <> inline constexpr uint32_t kFirstVersionSize<tl_score_result> = offsetof(tl_score_result, setup_seconds);
template <>
inline constexpr uint32_t kFirstVersionSize<tl_model_properties> = offsetof(tl_model_properties, bos_token_id);
template <> inline constexpr uint32_t kFirstVersionSize<tl_weight_properties> = sizeof(tl_weight_properties);
template <> inline constexpr uint32_t kFirstVersionSize<tl_device_properties> = sizeof(tl_device_properties);
template <> inline constexpr uint32_t kFirstVersionSize<tl_dispatch_counts> = sizeof(tl_dispatch_counts);

// The sizes of a struct's versions between its first and its current one (0: none): tl_score_options before top_k,
// before empty_context_bos, and with empty_context_bos (its tail padded to 8 bytes, as `activations` and `reserved`
// were appended).
template <class T>
inline constexpr std::array<uint32_t, 3> kMiddleVersionSizes = {0, 0, 0};
template <>
inline constexpr std::array<uint32_t, 3> kMiddleVersionSizes<tl_score_options> = {
    offsetof(tl_score_options, top_k), offsetof(tl_score_options, empty_context_bos),
    (offsetof(tl_score_options, activations) + alignof(tl_score_options) - 1) / alignof(tl_score_options) *
        alignof(tl_score_options)};
static_assert(kMiddleVersionSizes<tl_score_options>[2] < sizeof(tl_score_options),
              "tl_score_options' fifth version must be larger than its fourth");

// The struct sizes an input struct may have: one per version.
template <class T>
bool is_version_size(uint32_t size) {
    static_assert(kFirstVersionSize<T> > 0, "list the struct's first-version size in kFirstVersionSize");
    if (size == kFirstVersionSize<T> || size == sizeof(T)) return true;
    for (uint32_t middle : kMiddleVersionSizes<T>) {
        if (middle != 0 && size == middle) return true;
    }
    return false;
}
template <class T>
std::string version_sizes() {
    if (kFirstVersionSize<T> == sizeof(T)) return std::to_string(sizeof(T));
    std::string sizes = std::to_string(kFirstVersionSize<T>);
    for (uint32_t middle : kMiddleVersionSizes<T>) {
        if (middle != 0) sizes += ", " + std::to_string(middle);
    }
    return sizes + " or " + std::to_string(sizeof(T));
}

// An input struct from the caller, of one of the struct's versions, laid over the defaults its *_init function
// writes, so fields an older caller lacks keep their defaults. `in` may be NULL (all defaults) where `optional`.
template <class T>
T read_input_struct(const T *in, const char *name, tl_status (*init)(T *, uint32_t), bool optional = false) {
    T defaults;
    init(&defaults, sizeof defaults);
    if (in == nullptr && optional) return defaults;
    require_not_null(in, name);
    const uint32_t size = in->struct_size;
    if (!is_version_size<T>(size)) {
        tl::fail(TL_ERR_INVALID_ARGUMENT, std::string(name) + "->struct_size is " + std::to_string(size) +
                                              ", expected " + version_sizes<T>() + " (use the _init function)");
    }
    std::memcpy(&defaults, in, size);
    defaults.struct_size = sizeof(T);
    return defaults;
}

// An output struct of the caller's: any struct_size from the first version on. A caller built against an older
// header gets the fields it knows; one built against a newer, larger header gets every field this library knows,
// and its struct_size is set to the bytes written so it can tell which fields hold values.
template <class T>
void require_output_struct(const T *out, const char *name) {
    static_assert(kFirstVersionSize<T> > 0, "list the struct's first-version size in kFirstVersionSize");
    require_not_null(out, name);
    if (out->struct_size < kFirstVersionSize<T>) {
        tl::fail(TL_ERR_INVALID_ARGUMENT, std::string(name) + "->struct_size is " + std::to_string(out->struct_size) +
                                              ", expected at least " + std::to_string(kFirstVersionSize<T>) +
                                              " (set it to sizeof the struct)");
    }
}
template <class T>
void write_output_struct(T *out, T value) {
    const uint32_t size = std::min<uint32_t>(out->struct_size, sizeof(T));
    value.struct_size = size;
    std::memcpy(out, &value, size);
}

// Shared body of the *_init functions. The defaults are built in a full local struct and only the caller's
// struct_size bytes are copied out, so a caller compiled against an older, smaller struct is never overrun.
template <class T, class SetDefaults>
tl_status init_struct(T *out, uint32_t struct_size, const char *name, SetDefaults set_defaults) {
    return guarded([&] {
        static_assert(kFirstVersionSize<T> > 0, "list the struct's first-version size in kFirstVersionSize");
        require_not_null(out, name);
        if (!is_version_size<T>(struct_size)) {
            tl::fail(TL_ERR_INVALID_ARGUMENT, "struct_size is " + std::to_string(struct_size) + ", expected " +
                                                  version_sizes<T>() + " (pass sizeof(*" + name + "))");
        }
        T full;
        std::memset(&full, 0, sizeof full);
        set_defaults(full);
        full.struct_size = struct_size;
        std::memcpy(out, &full, struct_size);
    });
}

inline int32_t bool_flag(int32_t v, const char *name) {
    require(v == 0 || v == 1, std::string(name) + " must be 0 or 1, got " + std::to_string(v));
    return v;
}

}  // namespace tl::capi
