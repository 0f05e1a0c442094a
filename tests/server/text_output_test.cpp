#include "server/api/text_output.h"

#include <gtest/gtest.h>

#include "server/http/http_server.h"

namespace skippy::server {
namespace {

TEST(TextOutput, StreamsEverythingWithoutStops) {
    TextOutput out({});
    EXPECT_FALSE(out.append("Hello"));
    EXPECT_EQ(out.take_streamable(), "Hello");
    EXPECT_FALSE(out.append(" world"));
    EXPECT_EQ(out.take_streamable(), " world");
    EXPECT_EQ(out.take_rest(), "");
}

TEST(TextOutput, StopStringAcrossPiecesCutsBeforeIt) {
    TextOutput out({"STOP"});
    EXPECT_FALSE(out.append("abc S"));
    EXPECT_EQ(out.take_streamable(), "abc ");  // "S" could start "STOP": held back
    EXPECT_FALSE(out.append("T"));
    EXPECT_EQ(out.take_streamable(), "");
    EXPECT_TRUE(out.append("OP and more"));
    EXPECT_EQ(out.text(), "abc ");
    EXPECT_EQ(out.take_rest(), "");
}

TEST(TextOutput, HeldBackPrefixIsReleasedWhenItDiverges) {
    TextOutput out({"STOP"});
    out.append("xST");
    EXPECT_EQ(out.take_streamable(), "x");
    out.append("ART");
    EXPECT_EQ(out.take_streamable(), "START");
}

TEST(TextOutput, EarliestOfSeveralStopsWins) {
    TextOutput out({"bb", "a"});
    EXPECT_TRUE(out.append("xxbbya"));
    EXPECT_EQ(out.text(), "xx");
}

TEST(TextOutput, NeverSplitsUtf8Characters) {
    TextOutput out({});
    const std::string euro = "\xE2\x82\xAC";
    out.append("a" + euro.substr(0, 1));
    EXPECT_EQ(out.take_streamable(), "a");
    out.append(euro.substr(1, 1));
    EXPECT_EQ(out.take_streamable(), "");
    out.append(euro.substr(2));
    EXPECT_EQ(out.take_streamable(), euro);
}

TEST(Utf8, Validation) {
    EXPECT_TRUE(is_valid_utf8("plain"));
    EXPECT_TRUE(is_valid_utf8("\xE2\x82\xAC \xF0\x9F\x98\x80"));
    EXPECT_FALSE(is_valid_utf8("\xFF"));
    EXPECT_FALSE(is_valid_utf8("\xE2\x82"));      // truncated
    EXPECT_FALSE(is_valid_utf8("\xC0\xAF"));      // overlong
    EXPECT_FALSE(is_valid_utf8("\xED\xA0\x80"));  // surrogate
    EXPECT_EQ(utf8_complete_prefix_length("ab\xF0\x9F"), 2u);
    EXPECT_EQ(utf8_complete_prefix_length("ab\xF0\x9F\x98\x80"), 6u);
}

TEST(Secrets, ConstantTimeCompare) {
    EXPECT_TRUE(secrets_equal("secret", "secret"));
    EXPECT_FALSE(secrets_equal("secret", "secreT"));
    EXPECT_FALSE(secrets_equal("secret", "secret2"));
    EXPECT_FALSE(secrets_equal("", "x"));
    EXPECT_TRUE(secrets_equal("", ""));
}

}  // namespace
}  // namespace skippy::server
