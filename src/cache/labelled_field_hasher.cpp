#include "cache/labelled_field_hasher.h"

#include <array>
#include <stdexcept>

namespace skippy::cache {

void LabelledFieldHasher::raw_u64(uint64_t v) {
    std::array<uint8_t, 8> le{};
    for (size_t i = 0; i < le.size(); ++i) {
        le[i] = static_cast<uint8_t>(v >> (8 * i));
    }
    sha_.update(le);
}

void LabelledFieldHasher::header(std::string_view label, bool present) {
    if (label.size() > UINT32_MAX) {
        throw std::invalid_argument("LabelledFieldHasher: label too long");
    }
    const auto len = static_cast<uint32_t>(label.size());
    std::array<uint8_t, 5> head{static_cast<uint8_t>(len), static_cast<uint8_t>(len >> 8),
                                static_cast<uint8_t>(len >> 16), static_cast<uint8_t>(len >> 24),
                                static_cast<uint8_t>(present ? 1 : 0)};
    // Label first, then presence: write length, label, presence in that order.
    sha_.update(head.data(), 4);
    sha_.update(label.data(), label.size());
    sha_.update(head.data() + 4, 1);
}

void LabelledFieldHasher::bytes(std::string_view label, std::span<const uint8_t> value) {
    header(label, true);
    raw_u64(value.size());
    sha_.update(value);
}

void LabelledFieldHasher::string(std::string_view label, std::string_view value) {
    header(label, true);
    raw_u64(value.size());
    sha_.update(value.data(), value.size());
}

void LabelledFieldHasher::u64(std::string_view label, uint64_t value) {
    header(label, true);
    raw_u64(8);
    raw_u64(value);
}

void LabelledFieldHasher::i64(std::string_view label, int64_t value) {
    u64(label, static_cast<uint64_t>(value));
}

void LabelledFieldHasher::boolean(std::string_view label, bool value) {
    header(label, true);
    raw_u64(1);
    const uint8_t b = value ? 1 : 0;
    sha_.update(&b, 1);
}

void LabelledFieldHasher::absent(std::string_view label) { header(label, false); }

}  // namespace skippy::cache
