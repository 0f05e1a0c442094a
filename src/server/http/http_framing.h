// Just enough HTTP/1.1 framing for the connection loop to know when a request has fully
// arrived (so that no handler thread ever waits on a slow client), and the canned responses
// the loop answers by itself. Parsing proper (request line, headers, body decoding, routing)
// stays in cpp-httplib: when anything here looks wrong, the request is handed over as is and
// httplib gives its answer.
//
// Pure functions and a small state machine; no sockets, no threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace skippy::server {

// ASCII case-insensitive equality (header names, tokens, schemes).
bool iequals(std::string_view a, std::string_view b);
// `s` without leading and trailing spaces, tabs and carriage returns (header values).
std::string_view trim(std::string_view s);

struct HeadLimits {
    size_t max_bytes = 32 * 1024;  // request line + headers + the empty line
    size_t max_count = 100;        // header fields (cpp-httplib's own limit)
    size_t max_line = 8192;        // one header line (cpp-httplib's own limit)
};

// Where the request head in `data` ends (just past its empty line), or 0 when it has not
// fully arrived. Lines end in CRLF or a bare LF.
size_t find_head_end(std::string_view data);

struct RequestFraming {
    enum class Body {
        None,           // no body: the request is complete with its head
        ContentLength,  // `content_length` bytes follow the head
        Chunked,        // chunked transfer coding, complete when the last chunk has arrived
        HandOver,       // ambiguous or refused framing: httplib decides (and answers)
    };
    enum class Problem { None, TooManyHeaders, HeaderLineTooLong };
    Body body = Body::None;
    uint64_t content_length = 0;
    bool expect_continue = false;  // "Expect: 100-continue": the client waits for a 100
    Problem problem = Problem::None;
};

// Reads the framing of a complete request head (as found by find_head_end).
RequestFraming parse_framing(std::string_view head, const HeadLimits& limits);

// Follows the chunked transfer coding of a body as its bytes arrive.
class ChunkedBodyScanner {
  public:
    enum class Result { NeedMore, Complete, Invalid, TooLarge };
    explicit ChunkedBodyScanner(uint64_t max_body_bytes = UINT64_MAX)
        : max_body_bytes_(max_body_bytes) {}
    // Feeds the next bytes; after Complete or Invalid, further calls return the same.
    Result feed(std::string_view bytes);

  private:
    enum class State { Size, Extension, SizeLf, Data, DataCr, DataLf, Trailer, TrailerLine, Done };
    State state_ = State::Size;
    Result result_ = Result::NeedMore;
    uint64_t chunk_left_ = 0;
    uint64_t body_bytes_ = 0;
    uint64_t max_body_bytes_;
    size_t digits_ = 0;
    size_t line_bytes_ = 0;
    size_t trailer_bytes_ = 0;
};

// A complete response with an OpenAI error body and "Connection: close".
std::string canned_error_response(int status, const std::string& type, const std::string& message,
                                  const std::string& code, int retry_after_seconds = 0);

}  // namespace skippy::server
