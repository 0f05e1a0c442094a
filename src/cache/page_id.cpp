#include "cache/page_id.h"

namespace skippy::cache {

std::string PageId::str() const {
    static constexpr char kHex[] = "0123456789abcdef";
    std::string out(16, '0');
    for (size_t i = 0; i < 16; ++i) {
        out[15 - i] = kHex[(value_ >> (4 * i)) & 0xf];
    }
    return out;
}

std::optional<PageId> PageId::parse(std::string_view text) {
    if (text.size() != 16) {
        return std::nullopt;
    }
    uint64_t v = 0;
    for (char c : text) {
        uint64_t nibble = 0;
        if (c >= '0' && c <= '9') {
            nibble = static_cast<uint64_t>(c - '0');
        } else if (c >= 'a' && c <= 'f') {
            nibble = static_cast<uint64_t>(c - 'a' + 10);
        } else if (c >= 'A' && c <= 'F') {
            nibble = static_cast<uint64_t>(c - 'A' + 10);
        } else {
            return std::nullopt;
        }
        v = (v << 4) | nibble;
    }
    return PageId(v);
}

}  // namespace skippy::cache
