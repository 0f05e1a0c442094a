#include "cache/resident_cache.h"

#include <algorithm>
#include <stdexcept>

namespace skippy::cache {

const char* to_string(ResidentInsertStatus status) {
    switch (status) {
        case ResidentInsertStatus::Inserted:
            return "inserted";
        case ResidentInsertStatus::AlreadyCovered:
            return "already_covered";
        case ResidentInsertStatus::NoCapacity:
            return "no_capacity";
        case ResidentInsertStatus::TooLarge:
            return "too_large";
        case ResidentInsertStatus::EmptyKey:
            return "empty_key";
    }
    return "?";
}

ResidentCache::ResidentCache(ResidentCacheOptions options) : options_(std::move(options)) {
    if (options_.seq_id_count < 0) {
        throw std::invalid_argument("ResidentCache: seq_id_count must be >= 0");
    }
    reserved_.insert(options_.reserved_seq_ids.begin(), options_.reserved_seq_ids.end());
    for (int32_t s = 0; s < options_.seq_id_count; ++s) {
        if (reserved_.count(s) == 0) {
            free_.insert(s);
        }
    }
}

bool ResidentCache::is_reserved(int32_t seq_id) const { return reserved_.count(seq_id) != 0; }

void ResidentCache::evict_one_locked(const RemovedEntry& removed, std::vector<int32_t>& out) {
    const auto seq = static_cast<int32_t>(removed.value);
    by_seq_.erase(seq);
    tokens_ -= removed.token_count;
    pending_drop_.insert(seq);
    out.push_back(seq);
    ++counters_.evictions;
}

int32_t ResidentCache::take_seq_id(std::vector<int32_t>& evicted_here) {
    if (!free_.empty()) {
        const int32_t s = *free_.begin();
        free_.erase(free_.begin());
        return s;
    }
    // Reuse an id evicted by this same call: the caller drops it before copying into it.
    const int32_t s = *std::min_element(evicted_here.begin(), evicted_here.end());
    pending_drop_.erase(s);
    return s;
}

ResidentInsertResult ResidentCache::insert(const NamespaceId& ns, std::span<const Token> tokens) {
    ResidentInsertResult result;
    if (tokens.empty()) {
        result.status = ResidentInsertStatus::EmptyKey;
        return result;
    }
    if (options_.token_budget != 0 && tokens.size() > options_.token_budget) {
        result.status = ResidentInsertStatus::TooLarge;
        return result;
    }
    std::lock_guard lock(mu_);
    if (auto m = index_.peek_resident(ns, tokens); m && m->matched_len == tokens.size()) {
        index_.touch(m->entry);
        result.status = ResidentInsertStatus::AlreadyCovered;
        result.seq_id = static_cast<int32_t>(m->value);
        result.stored_len = m->stored_len;
        return result;
    }
    // Shorter entries on this path are contained in the new one.
    for (const EntryInfo& shorter : index_.entries_on_path(ComponentKind::Resident, ns, tokens)) {
        if (shorter.leases == 0) {
            RemoveResult r = index_.remove(shorter.entry);
            evict_one_locked(*r.removed, result.evicted);
        }
    }
    auto needs_room = [&] {
        return index_.size(ComponentKind::Resident) + 1 > options_.max_entries ||
               (options_.token_budget != 0 && tokens_ + tokens.size() > options_.token_budget) ||
               (free_.empty() && result.evicted.empty());
    };
    while (needs_room()) {
        auto victim = index_.evict_lru(ComponentKind::Resident);
        if (!victim) {
            result.status = ResidentInsertStatus::NoCapacity;
            return result;
        }
        evict_one_locked(*victim, result.evicted);
    }
    const int32_t seq = take_seq_id(result.evicted);
    InsertResult placed =
        index_.insert(ComponentKind::Resident, ns, tokens, static_cast<uint64_t>(seq));
    by_seq_[seq] = placed.entry;
    tokens_ += tokens.size();
    ++counters_.inserts;
    result.status = ResidentInsertStatus::Inserted;
    result.seq_id = seq;
    result.stored_len = tokens.size();
    return result;
}

std::optional<ResidentHit> ResidentCache::acquire_longest(const NamespaceId& ns,
                                                          std::span<const Token> query) {
    std::lock_guard lock(mu_);
    auto m = index_.lookup_resident(ns, query);
    if (!m || !index_.acquire_raw(m->entry)) {
        ++counters_.misses;
        return std::nullopt;
    }
    ++counters_.hits;
    ResidentHit hit;
    hit.lease = Lease(this, m->entry);
    hit.seq_id = static_cast<int32_t>(m->value);
    hit.matched_len = m->matched_len;
    hit.stored_len = m->stored_len;
    return hit;
}

std::optional<ResidentPeek> ResidentCache::peek_longest(const NamespaceId& ns,
                                                        std::span<const Token> query) const {
    std::lock_guard lock(mu_);
    auto m = index_.peek_resident(ns, query);
    if (!m) {
        return std::nullopt;
    }
    return ResidentPeek{static_cast<int32_t>(m->value), m->matched_len, m->stored_len};
}

std::vector<int32_t> ResidentCache::evict_tokens(size_t tokens) {
    std::lock_guard lock(mu_);
    std::vector<int32_t> out;
    size_t freed = 0;
    while (freed < tokens) {
        auto victim = index_.evict_lru(ComponentKind::Resident);
        if (!victim) {
            break;
        }
        freed += victim->token_count;
        evict_one_locked(*victim, out);
    }
    return out;
}

std::vector<int32_t> ResidentCache::evict_all() {
    std::lock_guard lock(mu_);
    std::vector<int32_t> out;
    while (auto victim = index_.evict_lru(ComponentKind::Resident)) {
        evict_one_locked(*victim, out);
    }
    return out;
}

ResidentRemoveResult ResidentCache::remove(const NamespaceId& ns, std::span<const Token> tokens) {
    std::lock_guard lock(mu_);
    ResidentRemoveResult out;
    RemoveResult r = index_.remove(ComponentKind::Resident, ns, tokens);
    out.status = r.status;
    if (r.removed) {
        std::vector<int32_t> ids;
        evict_one_locked(*r.removed, ids);
        out.seq_id = ids.front();
    }
    return out;
}

ResidentRemoveResult ResidentCache::remove_seq(int32_t seq_id) {
    std::lock_guard lock(mu_);
    ResidentRemoveResult out;
    auto it = by_seq_.find(seq_id);
    if (it == by_seq_.end()) {
        return out;
    }
    RemoveResult r = index_.remove(it->second);
    out.status = r.status;
    if (r.removed) {
        std::vector<int32_t> ids;
        evict_one_locked(*r.removed, ids);
        out.seq_id = ids.front();
    }
    return out;
}

void ResidentCache::confirm_dropped(std::span<const int32_t> seq_ids) {
    std::lock_guard lock(mu_);
    for (int32_t s : seq_ids) {
        if (pending_drop_.erase(s) != 0) {
            free_.insert(s);
        }
    }
}

void ResidentCache::release_lease(EntryId entry) noexcept {
    std::lock_guard lock(mu_);
    (void)index_.release_raw(entry);  // resident entries are never removed while leased
}

ResidentStats ResidentCache::stats() const {
    std::lock_guard lock(mu_);
    ResidentStats s = counters_;
    s.entries = index_.size(ComponentKind::Resident);
    s.tokens = tokens_;
    s.distinct_tokens = index_.distinct_token_count();
    s.free_seq_ids = free_.size();
    s.pending_drop = pending_drop_.size();
    return s;
}

std::optional<std::string> ResidentCache::debug_check() const {
    std::lock_guard lock(mu_);
    if (auto err = index_.check_invariants()) {
        return err;
    }
    size_t tokens = 0;
    std::set<int32_t> used;
    for (const EntryInfo& e : index_.entries(ComponentKind::Resident)) {
        const auto seq = static_cast<int32_t>(e.value);
        tokens += e.token_count;
        if (!used.insert(seq).second) {
            return std::string("seq id used by two entries");
        }
        if (reserved_.count(seq) != 0) {
            return std::string("reserved seq id handed out");
        }
        auto it = by_seq_.find(seq);
        if (it == by_seq_.end() || it->second != e.entry) {
            return std::string("seq map inconsistent");
        }
    }
    if (tokens != tokens_) {
        return std::string("token count inconsistent");
    }
    if (by_seq_.size() != used.size()) {
        return std::string("seq map has stale ids");
    }
    const size_t pool = used.size() + free_.size() + pending_drop_.size();
    const size_t expected =
        static_cast<size_t>(options_.seq_id_count) -
        static_cast<size_t>(std::count_if(reserved_.begin(), reserved_.end(), [&](int32_t s) {
            return s >= 0 && s < options_.seq_id_count;
        }));
    if (pool != expected) {
        return std::string("seq ids lost or duplicated");
    }
    for (int32_t s : free_) {
        if (used.count(s) != 0 || pending_drop_.count(s) != 0) {
            return std::string("seq id both free and in use/pending");
        }
    }
    for (int32_t s : pending_drop_) {
        if (used.count(s) != 0) {
            return std::string("seq id both pending and in use");
        }
    }
    if (options_.token_budget != 0 && tokens_ > options_.token_budget) {
        return std::string("token budget exceeded");
    }
    if (used.size() > options_.max_entries) {
        return std::string("entry limit exceeded");
    }
    return std::nullopt;
}

}  // namespace skippy::cache
