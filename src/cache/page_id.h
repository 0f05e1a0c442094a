// PageId: the short printable form of a PrefixIdentity, for logs, metrics and map keys.
//
//   PageId id = identity.page_id();
//   log("page=%s", id.str().c_str());            // 16 lowercase hex chars
//   std::optional<PageId> back = PageId::parse(id.str());
//   std::unordered_map<PageId, Entry, PageIdHash> by_page;
//
// It is the first 64 bits of the SHA-256 identity. That is plenty to name pages within
// one server; code that must prove identity (e.g. a disk tier) compares the full digest.
#pragma once

#include <compare>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace skippy::cache {

class PageId {
  public:
    constexpr PageId() = default;
    constexpr explicit PageId(uint64_t value) : value_(value) {}

    constexpr uint64_t value() const { return value_; }
    // 16 lowercase hex chars.
    std::string str() const;
    // Accepts exactly 16 hex chars (either case).
    static std::optional<PageId> parse(std::string_view text);

    auto operator<=>(const PageId&) const = default;

  private:
    uint64_t value_ = 0;
};

struct PageIdHash {
    size_t operator()(PageId id) const noexcept {
        return static_cast<size_t>(id.value() ^ (id.value() >> 29));
    }
};

}  // namespace skippy::cache
