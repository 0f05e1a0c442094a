// The connection loop's request framing: where a head ends, what body follows, chunked
// bodies arriving in pieces.
#include "server/http/http_framing.h"

#include <gtest/gtest.h>

#include <string>

namespace skippy::server {
namespace {

using Body = RequestFraming::Body;
using Result = ChunkedBodyScanner::Result;

TEST(HttpFraming, HeadEndsAtTheFirstEmptyLine) {
    EXPECT_EQ(find_head_end("GET / HTTP/1.1\r\nHost: x\r\n"), 0u);
    EXPECT_EQ(find_head_end("GET / HTTP/1.1\r\nHost: x\r\n\r"), 0u);
    const std::string head = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    EXPECT_EQ(find_head_end(head), head.size());
    EXPECT_EQ(find_head_end(head + "body"), head.size());
    EXPECT_EQ(find_head_end("GET / HTTP/1.1\nHost: x\n\nrest"), 24u);
    EXPECT_EQ(find_head_end(""), 0u);
}

TEST(HttpFraming, BodyKinds) {
    HeadLimits limits;
    EXPECT_EQ(parse_framing("GET / HTTP/1.1\r\nHost: x\r\n\r\n", limits).body, Body::None);
    auto f = parse_framing("POST / HTTP/1.1\r\ncontent-LENGTH:  12 \r\n\r\n", limits);
    EXPECT_EQ(f.body, Body::ContentLength);
    EXPECT_EQ(f.content_length, 12u);
    EXPECT_EQ(parse_framing("POST / HTTP/1.1\r\nContent-Length: 0\r\n\r\n", limits).body,
              Body::None);
    EXPECT_EQ(parse_framing("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", limits).body,
              Body::Chunked);
    EXPECT_EQ(
        parse_framing("POST / HTTP/1.1\r\nTransfer-Encoding: gzip, Chunked\r\n\r\n", limits).body,
        Body::Chunked);
}

TEST(HttpFraming, AmbiguousFramingIsHandedOver) {
    HeadLimits limits;
    for (const char* head : {
             "POST / HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
             "POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
             "POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
             "POST / HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n",
             "POST / HTTP/1.1\r\nTransfer-Encoding: chunked, gzip\r\n\r\n",
             "POST / HTTP/1.1\r\nno colon here\r\n\r\n",
             "POST / HTTP/1.1\r\nX: a\r\n folded\r\n\r\n",
         }) {
        EXPECT_EQ(parse_framing(head, limits).body, Body::HandOver) << head;
    }
    // The same length twice is fine.
    EXPECT_EQ(
        parse_framing("POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n", limits)
            .body,
        Body::ContentLength);
}

TEST(HttpFraming, ExpectContinueOnlyForHttp11) {
    HeadLimits limits;
    EXPECT_TRUE(parse_framing(
                    "POST / HTTP/1.1\r\nExpect: 100-Continue\r\nContent-Length: 3\r\n\r\n", limits)
                    .expect_continue);
    EXPECT_FALSE(parse_framing(
                     "POST / HTTP/1.0\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\n", limits)
                     .expect_continue);
}

TEST(HttpFraming, HeaderLimits) {
    HeadLimits limits;
    limits.max_count = 3;
    limits.max_line = 64;
    EXPECT_EQ(parse_framing("GET / HTTP/1.1\r\nA: 1\r\nB: 2\r\nC: 3\r\n\r\n", limits).problem,
              RequestFraming::Problem::None);
    EXPECT_EQ(
        parse_framing("GET / HTTP/1.1\r\nA: 1\r\nB: 2\r\nC: 3\r\nD: 4\r\n\r\n", limits).problem,
        RequestFraming::Problem::TooManyHeaders);
    EXPECT_EQ(
        parse_framing("GET / HTTP/1.1\r\nA: " + std::string(100, 'a') + "\r\n\r\n", limits).problem,
        RequestFraming::Problem::HeaderLineTooLong);
}

TEST(HttpFraming, ChunkedBodyInAnySplit) {
    const std::string body = "5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\nTrailer: x\r\n\r\n";
    for (size_t split = 0; split <= body.size(); ++split) {
        ChunkedBodyScanner scanner;
        const auto first = scanner.feed(std::string_view(body).substr(0, split));
        if (split < body.size()) {
            EXPECT_EQ(first, Result::NeedMore) << split;
        }
        EXPECT_EQ(scanner.feed(std::string_view(body).substr(split)), Result::Complete) << split;
    }
    ChunkedBodyScanner bare_lf;
    EXPECT_EQ(bare_lf.feed("3\nabc\n0\n\n"), Result::Complete);
}

TEST(HttpFraming, BadChunkSizes) {
    for (const char* body :
         {"zz\r\nabc\r\n", "\r\n", "-1\r\n", "3\r\nabcX", "12345678901234567\r\n", "3 ; x\rY"}) {
        ChunkedBodyScanner scanner;
        EXPECT_EQ(scanner.feed(body), Result::Invalid) << body;
        EXPECT_EQ(scanner.feed("0\r\n\r\n"), Result::Invalid) << "stays invalid";
    }
    ChunkedBodyScanner limited(10);
    EXPECT_EQ(limited.feed("8\r\n12345678\r\n"), Result::NeedMore);
    EXPECT_EQ(limited.feed("3\r\n"), Result::TooLarge);
    ChunkedBodyScanner huge(1 << 20);
    EXPECT_EQ(huge.feed("ffffffffffffffff\r\n"), Result::TooLarge);
}

TEST(HttpFraming, CannedResponseIsComplete) {
    const std::string r = canned_error_response(503, "server_error", "busy", "too_many", 2);
    EXPECT_EQ(r.rfind("HTTP/1.1 503 Service Unavailable\r\n", 0), 0u);
    EXPECT_NE(r.find("Connection: close\r\n"), std::string::npos);
    EXPECT_NE(r.find("Retry-After: 2\r\n"), std::string::npos);
    const size_t head = find_head_end(r);
    ASSERT_GT(head, 0u);
    const std::string body = r.substr(head);
    EXPECT_NE(r.find("Content-Length: " + std::to_string(body.size()) + "\r\n"), std::string::npos);
    EXPECT_NE(body.find("\"too_many\""), std::string::npos);
}

}  // namespace
}  // namespace skippy::server
