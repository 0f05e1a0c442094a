// PrefixGhosts: a bounded memory of token paths a cache tier no longer holds (evicted, or
// quarantined as bad), so that a miss can say why: "evicted" (from which tier) or
// "quarantined" instead of "never_seen". Token ids are not kept: each path is remembered as
// 64-bit fingerprints of its prefixes at every `stride` tokens and at its full length (a
// dense entry serves every prefix of itself), chained over the namespace and the tokens.
//
//   PrefixGhosts ghosts;                          // (the caches own one each)
//   ghosts.add(ns, evicted_tokens, GhostCause::Evicted);
//   if (auto g = ghosts.longest(ns, prompt)) { g->len; g->cause; }
//
// Bounded: at most `max_fingerprints` fingerprints (oldest paths forgotten first). A
// fingerprint collision can only mislabel a miss's reason, never serve anything.
//
// Not thread-safe: the owning cache calls it under its own mutex.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <span>
#include <unordered_map>

#include "cache/namespace_id.h"
#include "cache/token.h"

namespace skippy::cache {

enum class GhostCause : uint8_t { Evicted, Quarantined };
const char* to_string(GhostCause cause);

struct GhostMatch {
    size_t len = 0;  // tokens of the query the forgotten path covered
    GhostCause cause = GhostCause::Evicted;
};

class PrefixGhosts {
  public:
    explicit PrefixGhosts(size_t max_fingerprints = size_t{1} << 16, size_t stride = 64)
        : max_(max_fingerprints), stride_(stride == 0 ? 64 : stride) {}

    void add(const NamespaceId& ns, std::span<const Token> tokens, GhostCause cause);
    // The longest prefix of `query` that a forgotten path of `ns` covered (at least
    // `min_len` tokens), if any.
    std::optional<GhostMatch> longest(const NamespaceId& ns, std::span<const Token> query,
                                      size_t min_len = 1) const;
    size_t size() const { return by_print_.size(); }

  private:
    struct Ghost {
        uint32_t len = 0;
        GhostCause cause = GhostCause::Evicted;
        uint64_t generation = 0;
    };
    static uint64_t seed(const NamespaceId& ns);
    static uint64_t step(uint64_t h, Token t);
    void forget_oldest();

    size_t max_;
    size_t stride_;
    uint64_t generation_ = 0;
    std::unordered_map<uint64_t, Ghost> by_print_;
    std::deque<std::pair<uint64_t, uint64_t>> order_;  // (fingerprint, generation), oldest first
    std::map<uint32_t, uint32_t> odd_lengths_;         // full lengths off the stride: count
};

}  // namespace skippy::cache
