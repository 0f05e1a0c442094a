#include "cache/digest.h"

#include <stdexcept>

namespace skippy::cache {

std::string Digest::hex_prefix(size_t n_bytes) const {
    if (n_bytes > bytes.size()) {
        throw std::out_of_range("Digest::hex_prefix: more bytes than the digest has");
    }
    static constexpr char kHex[] = "0123456789abcdef";
    std::string out;
    out.reserve(n_bytes * 2);
    for (size_t i = 0; i < n_bytes; ++i) {
        out.push_back(kHex[bytes[i] >> 4]);
        out.push_back(kHex[bytes[i] & 0x0f]);
    }
    return out;
}

std::string Digest::hex() const { return hex_prefix(bytes.size()); }

uint64_t Digest::leading_u64() const {
    uint64_t v = 0;
    for (size_t i = 0; i < 8; ++i) {
        v = (v << 8) | bytes[i];
    }
    return v;
}

}  // namespace skippy::cache
