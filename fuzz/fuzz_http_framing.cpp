// Fuzz target: the connection loop's framing of raw request bytes (server/http/http_framing.h).
//
// Input: byte 0 picks a split point, the rest is what a client sent. Checks that nothing
// crashes or reads out of bounds, that the head end is found where the first empty line is,
// and that a chunked body scanned in two pieces gives the same result as in one.
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz_models.h"
#include "server/http/http_framing.h"

using namespace skippy::server;
using skippy::fuzz::fail;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size < 1) {
        return 0;
    }
    const std::string_view bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
    const size_t split = size > 1 ? data[0] % bytes.size() : 0;

    const size_t end = find_head_end(bytes);
    if (end > bytes.size()) {
        fail("head end past the data");
    }
    if (end > 0) {
        const std::string_view head = bytes.substr(0, end);
        if (head.back() != '\n' || find_head_end(head) != end) {
            fail("head end is not at an empty line");
        }
        HeadLimits limits;
        limits.max_count = 8;
        limits.max_line = 64;
        const RequestFraming f = parse_framing(head, limits);
        if (f.body == RequestFraming::Body::ContentLength && f.content_length == 0) {
            fail("empty Content-Length body");
        }
    }

    // The same chunked body fed whole and in two pieces.
    const std::string_view body = end > 0 ? bytes.substr(end) : bytes;
    ChunkedBodyScanner whole(1 << 16);
    const auto a = whole.feed(body);
    ChunkedBodyScanner pieces(1 << 16);
    const size_t cut = body.empty() ? 0 : split % (body.size() + 1);
    auto b = pieces.feed(body.substr(0, cut));
    if (b == ChunkedBodyScanner::Result::NeedMore) {
        b = pieces.feed(body.substr(cut));
    }
    if (a != b) {
        fail("chunked scan depends on how the bytes arrive");
    }
    const std::string response = canned_error_response(
        400 + static_cast<int>(split % 100), "t", std::string(bytes.substr(0, 64)), "c", 1);
    if (find_head_end(response) == 0) {
        fail("canned response has no head");
    }
    return 0;
}
