// The JSON parsing helper every outside input goes through (cpp/util/json.hpp): its limits and what it refuses.
#include <gtest/gtest.h>

#include <string>

#include "util/error.hpp"
#include "util/json.hpp"

namespace {

const tl::JsonLimits kLimits{1 << 20, 64, 1000};

// The message of the tl::Error that parsing `text` throws ("" when it parses).
std::string refusal(const std::string &text, const tl::JsonLimits &limits = kLimits) {
    try {
        tl::parse_json(text, limits, "input");
    } catch (const tl::Error &e) {
        EXPECT_EQ(e.code(), TL_ERR_FORMAT);
        return e.what();
    }
    return "";
}

std::string nested(int depth) { return std::string(depth, '[') + "1" + std::string(depth, ']'); }

TEST(Json, ParsesOneValue) {
    const nlohmann::json j = tl::parse_json(std::string("{\"a\": [1, 2, {\"b\": \"[[{,\"}]}\n"), kLimits, "input");
    EXPECT_EQ(j["a"][1], 2);
    EXPECT_EQ(j["a"][2]["b"], "[[{,");
    EXPECT_EQ(refusal(" \t\r\n[1]\t\r\n "), "");  // whitespace around the value is JSON
}

TEST(Json, RefusesDeepNesting) {
    EXPECT_EQ(refusal(nested(64)), "");
    EXPECT_EQ(refusal(nested(65)), "input nests arrays and objects deeper than 64 levels (at byte 64)");
    // The case that once overflowed the stack: 100k levels, refused before the parser or a printer sees it.
    EXPECT_NE(refusal(nested(100000)).find("deeper than 64 levels"), std::string::npos);
    EXPECT_EQ(refusal("[\"" + std::string(100, '[') + "\"]"), "");  // brackets inside a string are text
}

TEST(Json, RefusesControlBytesAndTrailingBytes) {
    EXPECT_EQ(refusal(std::string("{\"tokens\":[1,2]}\0junk", 21)),
              "input has control byte 0x00 at byte 16 (JSON text has none; strings escape them)");
    EXPECT_NE(refusal(std::string("[\"a\x01\"]")).find("control byte 0x01 at byte 3"), std::string::npos);
    EXPECT_NE(refusal("{} {}").find("input is not valid JSON"), std::string::npos);
    EXPECT_NE(refusal("[1] x").find("input is not valid JSON"), std::string::npos);
    EXPECT_NE(refusal("").find("input is not valid JSON"), std::string::npos);
}

TEST(Json, RefusesOverSizeAndOverManyValues) {
    EXPECT_EQ(refusal("[1, 2, 3]", tl::JsonLimits{8}), "input is 9 bytes, over the limit of 8 bytes");
    std::string many = "[0";
    for (int i = 0; i < 998; ++i) many += ",0";
    EXPECT_EQ(refusal(many + "]"), "");  // 999 commas + openings + 1 = 1000 values
    EXPECT_EQ(refusal(many + ",0]"), "input holds more than 1000 values (array elements and object members)");
}

}  // namespace
