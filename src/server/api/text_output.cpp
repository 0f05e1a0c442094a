#include "server/api/text_output.h"

#include <algorithm>
#include <cstdint>

#include "nlohmann/json.hpp"

namespace skippy::server {

TextOutput::TextOutput(std::vector<std::string> stop_strings) {
    for (auto& stop : stop_strings) {
        if (!stop.empty()) {
            max_stop_len_ = std::max(max_stop_len_, stop.size());
            stop_strings_.push_back(std::move(stop));
        }
    }
}

bool TextOutput::append(std::string_view piece) {
    const size_t search_from = text_.size() > max_stop_len_ ? text_.size() - max_stop_len_ : 0;
    text_.append(piece);
    size_t best = std::string::npos;
    for (const auto& stop : stop_strings_) {
        const size_t found = text_.find(stop, search_from);
        if (found != std::string::npos && found < best) {
            best = found;
            matched_stop_ = stop;
        }
    }
    if (best != std::string::npos) {
        text_.resize(best);
        sent_ = std::min(sent_, text_.size());
        return true;
    }
    return false;
}

std::string TextOutput::take_streamable() {
    size_t safe = utf8_complete_prefix_length(text_);
    // Hold back a tail that could still grow into a stop string.
    for (const auto& stop : stop_strings_) {
        const size_t max_overlap = std::min(stop.size() - 1, text_.size());
        for (size_t n = max_overlap; n > 0; --n) {
            if (text_.compare(text_.size() - n, n, stop, 0, n) == 0) {
                safe = std::min(safe, text_.size() - n);
                break;
            }
        }
    }
    if (safe <= sent_) {
        return {};
    }
    std::string out = text_.substr(sent_, safe - sent_);
    sent_ = safe;
    return out;
}

std::string TextOutput::take_rest() {
    std::string out = text_.substr(sent_);
    sent_ = text_.size();
    return out;
}

size_t utf8_complete_prefix_length(std::string_view text) {
    // Look at most 3 bytes back for the start of an unfinished sequence.
    const size_t n = text.size();
    for (size_t back = 1; back <= std::min<size_t>(4, n); ++back) {
        const auto c = static_cast<unsigned char>(text[n - back]);
        if ((c & 0xC0) == 0x80) {
            continue;  // continuation byte
        }
        size_t need = 1;
        if ((c & 0xE0) == 0xC0) {
            need = 2;
        } else if ((c & 0xF0) == 0xE0) {
            need = 3;
        } else if ((c & 0xF8) == 0xF0) {
            need = 4;
        }
        return back < need ? n - back : n;
    }
    return n;
}

bool is_valid_utf8(std::string_view text) {
    size_t i = 0;
    while (i < text.size()) {
        const auto c = static_cast<unsigned char>(text[i]);
        size_t len = 0;
        uint32_t cp = 0;
        if (c < 0x80) {
            ++i;
            continue;
        } else if ((c & 0xE0) == 0xC0) {
            len = 2;
            cp = c & 0x1F;
        } else if ((c & 0xF0) == 0xE0) {
            len = 3;
            cp = c & 0x0F;
        } else if ((c & 0xF8) == 0xF0) {
            len = 4;
            cp = c & 0x07;
        } else {
            return false;
        }
        if (i + len > text.size()) {
            return false;
        }
        for (size_t k = 1; k < len; ++k) {
            const auto cc = static_cast<unsigned char>(text[i + k]);
            if ((cc & 0xC0) != 0x80) {
                return false;
            }
            cp = (cp << 6) | (cc & 0x3F);
        }
        if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) ||
            cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
            return false;
        }
        i += len;
    }
    return true;
}

std::string as_sent_utf8(const std::string& text) {
    if (is_valid_utf8(text)) {
        return text;
    }
    const std::string dumped =
        nlohmann::json(text).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    return nlohmann::json::parse(dumped).get<std::string>();
}

}  // namespace skippy::server
