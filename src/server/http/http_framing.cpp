#include "server/http/http_framing.h"

#include <algorithm>

#include "server/api/api_error.h"

namespace skippy::server {

namespace {
char lower(char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; }
}  // namespace

bool iequals(std::string_view a, std::string_view b) {
    return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(),
                                              [](char x, char y) { return lower(x) == lower(y); });
}

std::string_view trim(std::string_view s) {
    while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\r')) {
        s.remove_prefix(1);
    }
    while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) {
        s.remove_suffix(1);
    }
    return s;
}

namespace {

// True when the comma-separated list `value` holds `token` (case-insensitive).
bool has_token(std::string_view value, std::string_view token) {
    while (!value.empty()) {
        const size_t comma = value.find(',');
        if (iequals(trim(value.substr(0, comma)), token)) {
            return true;
        }
        if (comma == std::string_view::npos) {
            break;
        }
        value.remove_prefix(comma + 1);
    }
    return false;
}

int hex_value(char c) {
    if (c >= '0' && c <= '9') {
        return c - '0';
    }
    if (c >= 'a' && c <= 'f') {
        return c - 'a' + 10;
    }
    if (c >= 'A' && c <= 'F') {
        return c - 'A' + 10;
    }
    return -1;
}

const char* reason_phrase(int status) {
    switch (status) {
        case 400:
            return "Bad Request";
        case 408:
            return "Request Timeout";
        case 413:
            return "Payload Too Large";
        case 431:
            return "Request Header Fields Too Large";
        case 503:
            return "Service Unavailable";
        default:
            return "Error";
    }
}

}  // namespace

size_t find_head_end(std::string_view data) {
    for (size_t i = data.find('\n'); i != std::string_view::npos; i = data.find('\n', i + 1)) {
        if (i + 1 < data.size() && data[i + 1] == '\n') {
            return i + 2;
        }
        if (i + 2 < data.size() && data[i + 1] == '\r' && data[i + 2] == '\n') {
            return i + 3;
        }
    }
    return 0;
}

RequestFraming parse_framing(std::string_view head, const HeadLimits& limits) {
    RequestFraming out;
    bool have_length = false;
    bool conflicting_length = false;
    std::string transfer_encoding;
    bool http10 = false;
    size_t count = 0;
    bool request_line = true;
    while (!head.empty()) {
        const size_t nl = head.find('\n');
        std::string_view line = head.substr(0, nl);
        head.remove_prefix(nl == std::string_view::npos ? head.size() : nl + 1);
        if (!line.empty() && line.back() == '\r') {
            line.remove_suffix(1);
        }
        if (line.size() > limits.max_line) {
            out.problem = RequestFraming::Problem::HeaderLineTooLong;
            return out;
        }
        if (request_line) {
            if (line.empty()) {
                continue;  // empty lines before the request line
            }
            request_line = false;
            http10 = line.size() >= 8 && line.substr(line.size() - 8) == "HTTP/1.0";
            continue;
        }
        if (line.empty()) {
            break;  // end of the head
        }
        if (++count > limits.max_count) {
            out.problem = RequestFraming::Problem::TooManyHeaders;
            return out;
        }
        const size_t colon = line.find(':');
        if (colon == std::string_view::npos || line.front() == ' ' || line.front() == '\t') {
            out.body = RequestFraming::Body::HandOver;  // malformed or folded: httplib answers
            continue;
        }
        const std::string_view name = line.substr(0, colon);
        const std::string_view value = trim(line.substr(colon + 1));
        if (iequals(name, "content-length")) {
            const bool digits = !value.empty() && value.size() <= 19 &&
                                value.find_first_not_of("0123456789") == std::string_view::npos;
            if (!digits) {
                conflicting_length = true;
                continue;
            }
            const uint64_t n = std::stoull(std::string(value));
            if (have_length && n != out.content_length) {
                conflicting_length = true;
            }
            have_length = true;
            out.content_length = n;
        } else if (iequals(name, "transfer-encoding")) {
            if (!transfer_encoding.empty()) {
                transfer_encoding += ',';
            }
            transfer_encoding += value;
        } else if (iequals(name, "expect")) {
            out.expect_continue = has_token(value, "100-continue");
        }
    }
    out.expect_continue = out.expect_continue && !http10;
    if (out.body == RequestFraming::Body::HandOver || conflicting_length) {
        out.body = RequestFraming::Body::HandOver;
        return out;
    }
    if (!transfer_encoding.empty()) {
        const size_t last = transfer_encoding.rfind(',');
        const std::string_view final_coding = trim(
            std::string_view(transfer_encoding).substr(last == std::string::npos ? 0 : last + 1));
        out.body = !have_length && iequals(final_coding, "chunked")
                       ? RequestFraming::Body::Chunked
                       : RequestFraming::Body::HandOver;
        return out;
    }
    out.body = have_length && out.content_length > 0 ? RequestFraming::Body::ContentLength
                                                     : RequestFraming::Body::None;
    return out;
}

ChunkedBodyScanner::Result ChunkedBodyScanner::feed(std::string_view bytes) {
    constexpr size_t kMaxLine = 4096;
    bool too_large = false;
    auto size_line_done = [&] {
        digits_ = 0;
        line_bytes_ = 0;
        if (chunk_left_ > max_body_bytes_ - body_bytes_) {
            too_large = true;
            return false;
        }
        body_bytes_ += chunk_left_;
        state_ = chunk_left_ == 0 ? State::Trailer : State::Data;
        return true;
    };
    size_t i = 0;
    while (i < bytes.size() && result_ == Result::NeedMore) {
        const char c = bytes[i];
        bool ok = true;
        switch (state_) {
            case State::Size:
                if (const int v = hex_value(c); v >= 0) {
                    ok = digits_ < 16;
                    chunk_left_ = chunk_left_ * 16 + static_cast<uint64_t>(v);
                    ++digits_;
                } else if (c == ';' || c == ' ' || c == '\t') {
                    ok = digits_ > 0;
                    state_ = State::Extension;
                } else if (c == '\r') {
                    ok = digits_ > 0;
                    state_ = State::SizeLf;
                } else if (c == '\n') {
                    ok = digits_ > 0 && size_line_done();
                } else {
                    ok = false;
                }
                break;
            case State::Extension:
                ok = ++line_bytes_ <= kMaxLine;
                if (c == '\r') {
                    state_ = State::SizeLf;
                } else if (c == '\n') {
                    ok = ok && size_line_done();
                }
                break;
            case State::SizeLf:
                ok = c == '\n' && size_line_done();
                break;
            case State::Data: {
                const size_t n =
                    static_cast<size_t>(std::min<uint64_t>(chunk_left_, bytes.size() - i));
                chunk_left_ -= n;
                i += n;
                if (chunk_left_ == 0) {
                    state_ = State::DataCr;
                }
                continue;
            }
            case State::DataCr:
                if (c == '\r') {
                    state_ = State::DataLf;
                } else {
                    ok = c == '\n';
                    state_ = State::Size;
                }
                break;
            case State::DataLf:
                ok = c == '\n';
                state_ = State::Size;
                break;
            case State::Trailer:
                if (c == '\n') {
                    state_ = State::Done;
                } else if (c == '\r') {
                    state_ = State::TrailerLine;
                    line_bytes_ = 0;
                } else {
                    state_ = State::TrailerLine;
                    line_bytes_ = 1;
                }
                ok = ++trailer_bytes_ <= kMaxLine * 4;
                break;
            case State::TrailerLine:
                // A "\r" at the start of a trailer line with nothing after it but "\n" ends
                // the trailers; any other line is a trailer field.
                if (c == '\n') {
                    state_ = line_bytes_ == 0 ? State::Done : State::Trailer;
                } else if (c != '\r') {
                    ++line_bytes_;
                }
                ok = ++trailer_bytes_ <= kMaxLine * 4;
                break;
            case State::Done:
                break;
        }
        if (!ok) {
            result_ = too_large ? Result::TooLarge : Result::Invalid;
        } else if (state_ == State::Done) {
            result_ = Result::Complete;
        }
        ++i;
    }
    return result_;
}

std::string canned_error_response(int status, const std::string& type, const std::string& message,
                                  const std::string& code, int retry_after_seconds) {
    const std::string body = dump_json(error_body(status, type, message, "", code));
    std::string out =
        "HTTP/1.1 " + std::to_string(status) + " " + reason_phrase(status) +
        "\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
        "\r\nConnection: close\r\n";
    if (retry_after_seconds > 0) {
        out += "Retry-After: " + std::to_string(retry_after_seconds) + "\r\n";
    }
    out += "\r\n";
    out += body;
    return out;
}

}  // namespace skippy::server
