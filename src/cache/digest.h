// A 256-bit digest value (the output of SHA-256) with ordering, hashing and hex form.
//
//   Digest d = ...;
//   std::string s = d.hex();          // 64 lowercase hex chars
//   std::unordered_map<Digest, int, DigestHash> by_digest;
#pragma once

#include <array>
#include <compare>
#include <cstddef>
#include <cstdint>
#include <string>

namespace skippy::cache {

struct Digest {
    std::array<uint8_t, 32> bytes{};

    // Lowercase hex of all 32 bytes.
    std::string hex() const;
    // Lowercase hex of the first `n_bytes` bytes (n_bytes <= 32).
    std::string hex_prefix(size_t n_bytes) const;
    // The first 8 bytes read big-endian (so the hex of this value is the hex prefix).
    uint64_t leading_u64() const;

    auto operator<=>(const Digest&) const = default;
};

struct DigestHash {
    size_t operator()(const Digest& d) const noexcept {
        return static_cast<size_t>(d.leading_u64());
    }
};

}  // namespace skippy::cache
