#include "util/json.hpp"

#include <cstdio>

#include "util/error.hpp"

namespace tl {

namespace {

std::string hex_byte(unsigned char byte) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "0x%02x", byte);
    return buf;
}

}  // namespace

nlohmann::json parse_json(const char *data, size_t size, const JsonLimits &limits, const std::string &what) {
    if (size > limits.max_bytes) {
        fail(TL_ERR_FORMAT, what + " is " + std::to_string(size) + " bytes, over the limit of " +
                                std::to_string(limits.max_bytes) + " bytes");
    }
    // One pass over the text before the parser: brackets and commas inside strings do not count.
    bool in_string = false, escaped = false;
    int64_t depth = 0;
    uint64_t values = 1;  // commas and openings, plus the top value: at least the elements and members parsed
    for (size_t i = 0; i < size; ++i) {
        const unsigned char c = static_cast<unsigned char>(data[i]);
        if (c < 0x20 && c != '\t' && c != '\n' && c != '\r') {
            fail(TL_ERR_FORMAT, what + " has control byte " + hex_byte(c) + " at byte " + std::to_string(i) +
                                    " (JSON text has none; strings escape them)");
        }
        if (in_string) {
            if (escaped) escaped = false;
            else if (c == '\\') escaped = true;
            else if (c == '"') in_string = false;
            continue;
        }
        switch (c) {
        case '"': in_string = true; break;
        case '[':
        case '{':
            if (++depth > limits.max_depth) {
                fail(TL_ERR_FORMAT, what + " nests arrays and objects deeper than " +
                                        std::to_string(limits.max_depth) + " levels (at byte " + std::to_string(i) +
                                        ")");
            }
            ++values;
            break;
        case ']':
        case '}': --depth; break;  // unbalanced text is the parser's to report
        case ',': ++values; break;
        default: break;
        }
        if (values > limits.max_values) {
            fail(TL_ERR_FORMAT, what + " holds more than " + std::to_string(limits.max_values) +
                                    " values (array elements and object members)");
        }
    }
    try {
        // An iterator range: the parser must reach its end, so anything after the value but whitespace is an error.
        return nlohmann::json::parse(data, data + size);
    } catch (const nlohmann::json::exception &e) {
        fail(TL_ERR_FORMAT, what + " is not valid JSON: " + e.what());
    }
}

}  // namespace tl
