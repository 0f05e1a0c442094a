#include "cache/prefix_ghosts.h"

namespace skippy::cache {

const char* to_string(GhostCause cause) {
    return cause == GhostCause::Quarantined ? "quarantined" : "evicted";
}

uint64_t PrefixGhosts::seed(const NamespaceId& ns) {
    uint64_t h = 0x9e3779b97f4a7c15ull;
    for (uint8_t b : ns.digest().bytes) {
        h = (h ^ b) * 0x100000001b3ull;
    }
    return h;
}

uint64_t PrefixGhosts::step(uint64_t h, Token t) {
    // splitmix64 of the chain and the token.
    uint64_t z = h ^ (static_cast<uint64_t>(static_cast<uint32_t>(t)) + 0x9e3779b97f4a7c15ull +
                      (h << 6) + (h >> 2));
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void PrefixGhosts::forget_oldest() {
    const auto [print, generation] = order_.front();
    order_.pop_front();
    auto it = by_print_.find(print);
    if (it == by_print_.end() || it->second.generation != generation) {
        return;  // replaced by a newer ghost of the same prefix
    }
    if (it->second.len % stride_ != 0) {
        auto odd = odd_lengths_.find(it->second.len);
        if (odd != odd_lengths_.end() && --odd->second == 0) {
            odd_lengths_.erase(odd);
        }
    }
    by_print_.erase(it);
}

void PrefixGhosts::add(const NamespaceId& ns, std::span<const Token> tokens, GhostCause cause) {
    if (tokens.empty() || max_ == 0) {
        return;
    }
    ++generation_;
    uint64_t h = seed(ns);
    for (size_t i = 0; i < tokens.size(); ++i) {
        h = step(h, tokens[i]);
        const size_t len = i + 1;
        if (len % stride_ != 0 && len != tokens.size()) {
            continue;
        }
        auto [it, inserted] = by_print_.try_emplace(h);
        if (!inserted && it->second.len % stride_ != 0) {
            auto odd = odd_lengths_.find(it->second.len);
            if (odd != odd_lengths_.end() && --odd->second == 0) {
                odd_lengths_.erase(odd);
            }
        }
        it->second = Ghost{static_cast<uint32_t>(len), cause, generation_};
        if (len % stride_ != 0) {
            ++odd_lengths_[static_cast<uint32_t>(len)];
        }
        order_.emplace_back(h, generation_);
        while (by_print_.size() > max_ || order_.size() > 2 * max_) {
            forget_oldest();
        }
    }
}

std::optional<GhostMatch> PrefixGhosts::longest(const NamespaceId& ns, std::span<const Token> query,
                                                size_t min_len) const {
    if (by_print_.empty()) {
        return std::nullopt;
    }
    std::optional<GhostMatch> best;
    auto odd = odd_lengths_.begin();
    uint64_t h = seed(ns);
    for (size_t i = 0; i < query.size(); ++i) {
        h = step(h, query[i]);
        const size_t len = i + 1;
        while (odd != odd_lengths_.end() && odd->first < len) {
            ++odd;
        }
        const bool probe = len % stride_ == 0 || (odd != odd_lengths_.end() && odd->first == len);
        if (!probe || len < min_len) {
            continue;
        }
        auto it = by_print_.find(h);
        if (it != by_print_.end() && it->second.len == len) {
            best = GhostMatch{len, it->second.cause};
        }
    }
    return best;
}

}  // namespace skippy::cache
