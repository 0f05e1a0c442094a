// Feeds labelled, length-prefixed fields into a Sha256 so that no two different field
// sequences produce the same byte stream (used by NamespaceId and PrefixHasher).
//
//   Sha256 h;
//   LabelledFieldHasher f(h);
//   f.string("platform", "x86_64-le");
//   f.absent("namespace_key");
//   Digest d = h.finish();
//
// Encoding of one field, all integers little-endian:
//   u32 label_len | label bytes | u8 presence (0 absent, 1 present) |
//   if present: u64 value_len | value bytes
// Integers are 8-byte two's complement values, booleans one byte 0/1.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "cache/sha256.h"

namespace skippy::cache {

class LabelledFieldHasher {
  public:
    explicit LabelledFieldHasher(Sha256& sha) : sha_(sha) {}

    void bytes(std::string_view label, std::span<const uint8_t> value);
    void string(std::string_view label, std::string_view value);
    void i64(std::string_view label, int64_t value);
    void u64(std::string_view label, uint64_t value);
    void boolean(std::string_view label, bool value);
    void absent(std::string_view label);

  private:
    void header(std::string_view label, bool present);
    void raw_u64(uint64_t v);

    Sha256& sha_;
};

}  // namespace skippy::cache
