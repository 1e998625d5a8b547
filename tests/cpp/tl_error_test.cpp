// The tests' own check of refusals (tests/common/tl_error.hpp) fails when it should.
#include <gtest/gtest.h>

#include <stdexcept>

#include "../common/tl_error.hpp"

TEST(TlErrorCheck, PassesOnlyOnTheStatusAndEveryPart) {
    auto refuse = [] { tl::fail(TL_ERR_FORMAT, "tensor 'w': shape [2, 3]"); };
    EXPECT_TRUE(tlt::throws(TL_ERR_FORMAT, {}, refuse));
    EXPECT_TRUE(tlt::throws(TL_ERR_FORMAT, {"tensor 'w'", "[2, 3]"}, refuse));
    EXPECT_FALSE(tlt::throws(TL_ERR_IO, {}, refuse));                        // another status
    EXPECT_FALSE(tlt::throws(TL_ERR_FORMAT, {"tensor 'w'", "[3, 2]"}, refuse));  // a part missing
    EXPECT_FALSE(tlt::throws(TL_ERR_FORMAT, {}, [] {}));                      // no error
    const tlt::ErrorOf e = tlt::error_of(refuse);
    EXPECT_EQ(e.code, TL_ERR_FORMAT);
    EXPECT_EQ(e.message, "tensor 'w': shape [2, 3]");
    EXPECT_EQ(tlt::error_of([] {}).code, TL_OK);
    // Other exceptions are not refusals: they propagate.
    EXPECT_THROW(tlt::error_of([] { throw std::logic_error("bug"); }), std::logic_error);
}
