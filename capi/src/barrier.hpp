// The C API's exception barrier for its source files other than capi.cpp (capi/src/tokenize.cpp): capi.cpp owns the
// barrier and the per-thread error message that tl_last_error_message reads, and lends them through guarded_call.
#pragma once

#include <type_traits>

#include "tinyloop.h"

namespace tl::capi {

// Runs body(context) behind capi.cpp's barrier: resets the thread's message, turns tl::Error into its status and
// message, std::bad_alloc into TL_ERR_OUT_OF_MEMORY, anything else into TL_ERR_INTERNAL; refuses a call from inside
// the log callback.
tl_status guarded_call(void (*body)(void *), void *context) noexcept;

// The same for a callable.
template <class Body>
tl_status run_guarded(Body &&body) noexcept {
    return guarded_call([](void *context) { (*static_cast<std::remove_reference_t<Body> *>(context))(); }, &body);
}

}  // namespace tl::capi
