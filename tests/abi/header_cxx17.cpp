// The header on its own, as strict C++17 (-std=c++17 -pedantic -Wall -Wextra -Werror), plus compile-time
// checks of what the ABI promises: plain standard-layout structs that start with a uint32_t struct_size, and
// constants that never change value.
#include "tinyloop.h"

#include <cstddef>
#include <cstdint>
#include <type_traits>

#define CHECK_VERSIONED_STRUCT(type)                                                                          \
    static_assert(std::is_standard_layout<type>::value, #type " must be standard-layout");                   \
    static_assert(std::is_trivial<type>::value, #type " must be a trivial C struct");                        \
    static_assert(std::is_same<decltype(type::struct_size), uint32_t>::value, #type "::struct_size must be uint32_t"); \
    static_assert(offsetof(type, struct_size) == 0, #type "::struct_size must be the first member")

CHECK_VERSIONED_STRUCT(tl_load_options);
CHECK_VERSIONED_STRUCT(tl_model_properties);
CHECK_VERSIONED_STRUCT(tl_weight_desc);
CHECK_VERSIONED_STRUCT(tl_quantize_options);
CHECK_VERSIONED_STRUCT(tl_weight_properties);
CHECK_VERSIONED_STRUCT(tl_score_options);
CHECK_VERSIONED_STRUCT(tl_score_result);

static_assert(std::is_same<tl_status, int32_t>::value, "tl_status is an int32_t");

// Published values: renumbering any of them breaks every compiled caller.
static_assert(TL_OK == 0 && TL_ERR_INVALID_ARGUMENT == -1 && TL_ERR_OUT_OF_MEMORY == -2 && TL_ERR_IO == -3 &&
                  TL_ERR_FORMAT == -4 && TL_ERR_UNSUPPORTED == -5 && TL_ERR_NO_DEVICE == -6 && TL_ERR_CUDA == -7 &&
                  TL_ERR_INTERNAL == -8 && TL_ERR_BUFFER_TOO_SMALL == -9 && TL_ERR_NOT_FOUND == -10 &&
                  TL_ERR_CANCELLED == -11,
              "status values changed");
static_assert(TL_LOG_ERROR == 0 && TL_LOG_WARN == 1 && TL_LOG_INFO == 2 && TL_LOG_DEBUG == 3, "log levels changed");
static_assert(TL_QUANT_ASYMMETRIC == 0 && TL_QUANT_SYMMETRIC == 1, "quantization methods changed");
static_assert(TL_BACKEND_AUTO == 0 && TL_BACKEND_CPU == 1 && TL_BACKEND_CUDA == 2, "backends changed");

// The opaque handles stay opaque.
static_assert(!std::is_same<tl_model, tl_weight>::value, "distinct handle types");

int main() { return 0; }
