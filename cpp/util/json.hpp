// The one way the library and its tools parse JSON that comes from outside (a .tinyloop header, a checkpoint's
// config.json, a score-batch request line): size, nesting depth and value count are bounded before the parser
// runs, so memory and stack stay proportional to the text, and the whole text must be one JSON value.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace tl {

struct JsonLimits {
    uint64_t max_bytes;  // the text's size
    // Arrays and objects inside one another. Parsing is iterative, but printing and comparing a value recurse.
    int32_t max_depth = 64;
    // Array elements plus object members: each costs 16 bytes to ~100 bytes in memory, so this bounds a parse's
    // memory whatever the text's shape (a text of small values would otherwise cost ~20x its size).
    uint64_t max_values = uint64_t{1} << 20;
};

// Parses `size` bytes as exactly one JSON value. Refused, with tl::Error(TL_ERR_FORMAT) and a message that begins
// with `what`: a text over a limit, a control byte anywhere (JSON escapes them inside strings; nlohmann's parser
// would take a NUL for the end of the text and accept what follows), invalid JSON, or anything but whitespace
// after the value.
nlohmann::json parse_json(const char *data, size_t size, const JsonLimits &limits, const std::string &what);

inline nlohmann::json parse_json(const std::string &text, const JsonLimits &limits, const std::string &what) {
    return parse_json(text.data(), text.size(), limits, what);
}

}  // namespace tl
