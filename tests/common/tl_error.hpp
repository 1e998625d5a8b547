// What the tests check of a call that must fail: the tl::Error it throws, its status code and its message.
// Header-only, for every GoogleTest suite (included by relative path).
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "tinyloop.h"
#include "util/error.hpp"

namespace tlt {

struct ErrorOf {
    tl_status code = TL_OK;
    std::string message;
};

// The status and message of the tl::Error `call` throws; {TL_OK, ""} when it returns.
template <class Call>
ErrorOf error_of(Call &&call) {
    try {
        std::forward<Call>(call)();
    } catch (const tl::Error &e) {
        return {e.code(), e.what()};
    }
    return {};
}

// Whether `call` throws a tl::Error with `code` and a message containing each of `parts`:
// EXPECT_TRUE(tlt::throws(code, {"part"}, [&] { ... })).
template <class Call>
::testing::AssertionResult throws(tl_status code, const std::vector<std::string> &parts, Call &&call) {
    const ErrorOf e = error_of(std::forward<Call>(call));
    if (e.code == TL_OK) return ::testing::AssertionFailure() << "no error; expected status " << code;
    if (e.code != code) {
        return ::testing::AssertionFailure() << "status " << e.code << " instead of " << code << ": " << e.message;
    }
    for (const std::string &part : parts) {
        if (e.message.find(part) == std::string::npos) {
            return ::testing::AssertionFailure() << "the message lacks '" << part << "': " << e.message;
        }
    }
    return ::testing::AssertionSuccess();
}

}  // namespace tlt
