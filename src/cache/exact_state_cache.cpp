#include "cache/exact_state_cache.h"

#include <algorithm>
#include <chrono>
#include <map>

#include "cache/block_memory.h"

namespace skippy::cache {

namespace {
int64_t unix_ms_now() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
}
}  // namespace

const char* to_string(Presence presence) {
    switch (presence) {
        case Presence::Present:
            return "present";
        case Presence::Absent:
            return "absent";
        case Presence::Unknown:
            return "unknown";
    }
    return "?";
}

const char* to_string(ExactInsertStatus status) {
    switch (status) {
        case ExactInsertStatus::Inserted:
            return "inserted";
        case ExactInsertStatus::Replaced:
            return "replaced";
        case ExactInsertStatus::AlreadyPresent:
            return "already_present";
        case ExactInsertStatus::Leased:
            return "leased";
        case ExactInsertStatus::InvalidDescriptor:
            return "invalid_descriptor";
        case ExactInsertStatus::EmptyKey:
            return "empty_key";
        case ExactInsertStatus::NoCapacity:
            return "no_capacity";
        case ExactInsertStatus::StoreFailed:
            return "store_failed";
    }
    return "?";
}

const char* to_string(QuarantineStatus status) {
    switch (status) {
        case QuarantineStatus::Removed:
            return "removed";
        case QuarantineStatus::Deferred:
            return "deferred";
        case QuarantineStatus::NotFound:
            return "not_found";
        case QuarantineStatus::PageMismatch:
            return "page_mismatch";
    }
    return "?";
}

namespace {

// Idle block mappings kept after a change (BlockMemory): what the next insert is likely to
// reuse as it is. Declared before the cache's lock guard, so that it runs after the lock
// is released (munmap outside the lock).
struct TrimIdleBlocks {
    TrimIdleBlocks() = default;
    TrimIdleBlocks(const TrimIdleBlocks&) = delete;
    TrimIdleBlocks& operator=(const TrimIdleBlocks&) = delete;
    ~TrimIdleBlocks() { BlockMemory::process().trim_idle(size_t{4} << 20); }
};

}  // namespace

ExactStateCache::ExactStateCache(ExactStateCacheOptions options)
    : options_(std::move(options)), store_(options_.blocks) {}

ExactStateCache::~ExactStateCache() = default;

void ExactStateCache::notify(EntryChange::Kind kind, EntryChange::Cause cause,
                             const NamespaceId& ns, std::span<const Token> tokens,
                             PageId page) const {
    if (options_.on_change) {
        options_.on_change(EntryChange{kind, cause, ns, tokens, page});
    }
}

bool ExactStateCache::over_limits() const {
    return records_.size() > options_.limits.max_entries ||
           store_.stats().physical_bytes > options_.limits.max_physical_bytes;
}

void ExactStateCache::free_record(EntryId entry) {
    auto it = records_.find(entry);
    if (it == records_.end()) {
        return;
    }
    // The record's blocks were validated at insert; a failure here is a bug, and leaving
    // the blocks allocated is the safe outcome.
    (void)store_.release(it->second.payload);
    records_.erase(it);
}

bool ExactStateCache::fits_after_evicting_all(EntryId keep, uint64_t extra_bytes) const {
    // What stays after evicting every evictable entry: `keep` plus leased/hidden entries,
    // and `extra_bytes` of a payload not stored yet (as one more entry when non-zero).
    std::unordered_map<BlockId, size_t> kept_blocks;
    size_t kept_entries = 0;
    for (const auto& [id, rec] : records_) {
        if (id != keep && index_.info(id)->leases == 0) {
            continue;
        }
        ++kept_entries;
        for (BlockId b : rec.payload.blocks) {
            kept_blocks.emplace(b, *store_.block_size(b));
        }
    }
    uint64_t kept_bytes = 0;
    for (const auto& [b, size] : kept_blocks) {
        kept_bytes += size;
    }
    if (extra_bytes > 0) {
        ++kept_entries;
        kept_bytes += extra_bytes;
    }
    return kept_entries <= options_.limits.max_entries &&
           kept_bytes <= options_.limits.max_physical_bytes;
}

ExactInsertResult ExactStateCache::insert(const NamespaceId& ns, std::span<const Token> tokens,
                                          PageId page, const PayloadDescriptor& descriptor,
                                          std::span<const uint8_t> bytes,
                                          std::span<const size_t> cuts) {
    ExactInsertResult result;
    if (tokens.empty()) {
        result.status = ExactInsertStatus::EmptyKey;
    } else if (auto why = descriptor.validate_against(bytes.size())) {
        result.status = ExactInsertStatus::InvalidDescriptor;
        result.invalid_reason = *why;
    } else if (descriptor.token_end != tokens.size()) {
        result.status = ExactInsertStatus::InvalidDescriptor;
        result.invalid_reason = "token_end differs from the token count";
    }
    if (result.status != ExactInsertStatus::Inserted) {
        std::lock_guard lock(mu_);
        ++counters_.rejected;
        return result;
    }

    // Hash outside the lock: prepare() only reads immutable options.
    const PreparedPayload prepared = store_.prepare(bytes, cuts);

    const TrimIdleBlocks trim;  // (after the lock: the evicted blocks' unused mappings)
    std::lock_guard lock(mu_);
    EntryId existing_entry = kNoEntry;
    if (auto existing = index_.find(ComponentKind::Exact, ns, tokens)) {
        const Record& rec = records_.at(*existing);
        if (rec.page == page) {
            index_.touch(*existing);
            result.status = ExactInsertStatus::AlreadyPresent;
            result.snapshot = store_.snapshot(rec.payload);
            return result;
        }
        if (index_.info(*existing)->leases > 0) {
            ++counters_.rejected;
            result.status = ExactInsertStatus::Leased;
            return result;
        }
        existing_entry = *existing;
    }

    // Removals this insert causes, reported after its own Added (entry_change.h), or on
    // its way out when it fails.
    struct Gone {
        EntryChange::Cause cause;
        NamespaceId ns;
        std::vector<Token> tokens;  // empty: the inserted path
        PageId page;
    };
    std::vector<Gone> gone;
    const auto report_gone = [&] {
        for (const Gone& g : gone) {
            notify(EntryChange::Kind::Removed, g.cause, g.ns,
                   g.tokens.empty() ? tokens : std::span<const Token>(g.tokens), g.page);
        }
    };
    // Evicts the least recently used entry other than `keep`; false when none is left.
    const auto evict_one = [&](EntryId keep) {
        std::vector<Token> victim_tokens;
        if (auto next = index_.lru_victim(ComponentKind::Exact, keep)) {
            victim_tokens = index_.tokens_of(next->entry);
            ghosts_.add(next->ns, victim_tokens, GhostCause::Evicted);
        }
        auto victim = index_.evict_lru(ComponentKind::Exact, keep);
        if (!victim) {
            return false;
        }
        if (options_.on_change && victim_tokens.size() == victim->token_count) {
            gone.push_back({EntryChange::Cause::Evicted, victim->ns, std::move(victim_tokens),
                            records_.at(victim->entry).page});
        }
        result.evicted.push_back(records_.at(victim->entry).page);
        free_record(victim->entry);
        ++counters_.evictions;
        return true;
    };

    // Room first, where the whole payload would fit once every evictable entry is gone:
    // the evicted blocks' memory then takes the new blocks (BlockMemory reuses a freed
    // mapping of the same size) instead of sitting idle until the next insert. The loop
    // after the commit stays the authority (dedupe can make the estimate off either way).
    const uint64_t unstored = store_.unstored_bytes(prepared);
    const auto needs_room = [&] {
        const size_t entries = records_.size() + (existing_entry == kNoEntry ? 1 : 0);
        return entries > options_.limits.max_entries ||
               store_.stats().physical_bytes + unstored > options_.limits.max_physical_bytes;
    };
    if (needs_room() && fits_after_evicting_all(existing_entry, prepared.size)) {
        while (needs_room() && evict_one(existing_entry)) {
        }
    }

    InsertOutcome stored = store_.commit(prepared);
    if (!stored.ok()) {
        ++counters_.rejected;
        result.status = ExactInsertStatus::StoreFailed;
        result.store_error = stored.error;
        report_gone();
        return result;
    }
    result.blocks = stored.report;

    InsertResult placed = index_.insert(ComponentKind::Exact, ns, tokens, page.value());
    if (placed.status == InsertStatus::Leased) {  // a doomed (quarantined, leased) entry
        (void)store_.release(stored.payload);
        ++counters_.rejected;
        result.status = ExactInsertStatus::Leased;
        report_gone();
        return result;
    }
    if (placed.replaced) {
        gone.push_back(
            {EntryChange::Cause::Replaced, ns, {}, records_.at(placed.replaced->entry).page});
        free_record(placed.replaced->entry);
        result.status = ExactInsertStatus::Replaced;
    }
    records_[placed.entry] =
        Record{page, descriptor, std::move(stored.payload), 0, unix_ms_now(), 0};

    if (over_limits() && !fits_after_evicting_all(placed.entry, 0)) {
        // Evicting everything evictable would not make room: keep the others.
        (void)index_.remove(placed.entry);
        free_record(placed.entry);
        ++counters_.rejected;
        result.status = ExactInsertStatus::NoCapacity;
        report_gone();
        return result;
    }
    while (over_limits() && evict_one(placed.entry)) {
    }
    if (over_limits()) {
        (void)index_.remove(placed.entry);
        free_record(placed.entry);
        ++counters_.rejected;
        result.status = ExactInsertStatus::NoCapacity;
        report_gone();
        return result;
    }
    ++counters_.inserts;
    notify(EntryChange::Kind::Added, EntryChange::Cause::Inserted, ns, tokens, page);
    report_gone();
    result.snapshot = store_.snapshot(records_.at(placed.entry).payload);
    return result;
}

std::optional<ExactHit> ExactStateCache::acquire_locked(EntryId entry, size_t len,
                                                        size_t stored_len) {
    if (!index_.acquire_raw(entry)) {
        ++counters_.misses;
        return std::nullopt;
    }
    ++counters_.hits;
    Record& rec = records_.at(entry);
    ++rec.hits;
    rec.last_hit_unix_ms = unix_ms_now();
    ExactHit hit;
    hit.lease = Lease(this, entry);
    hit.page = rec.page;
    hit.len = len;
    hit.stored_len = stored_len;
    hit.descriptor = rec.descriptor;
    hit.payload_bytes = rec.payload.size;
    return hit;
}

std::optional<ExactHit> ExactStateCache::acquire_longest(const NamespaceId& ns,
                                                         std::span<const Token> query,
                                                         PrefixMatch match) {
    std::lock_guard lock(mu_);
    auto m = index_.lookup_exact(ns, query, match);
    if (!m) {
        ++counters_.misses;
        return std::nullopt;
    }
    return acquire_locked(m->entry, m->matched_len, m->stored_len);
}

std::optional<ExactPeek> ExactStateCache::peek_locked(const NamespaceId& ns,
                                                      std::span<const Token> query,
                                                      PrefixMatch match) const {
    auto m = index_.peek_exact(ns, query, match);
    if (!m) {
        return std::nullopt;
    }
    const Record& rec = records_.at(m->entry);
    return ExactPeek{rec.page, m->matched_len, rec.descriptor, rec.payload.size};
}

std::optional<ExactPeek> ExactStateCache::peek_longest(const NamespaceId& ns,
                                                       std::span<const Token> query,
                                                       PrefixMatch match) const {
    std::lock_guard lock(mu_);
    return peek_locked(ns, query, match);
}

TryExactPeek ExactStateCache::try_peek_longest(const NamespaceId& ns, std::span<const Token> query,
                                               PrefixMatch match) const {
    std::unique_lock lock(mu_, std::try_to_lock);
    TryExactPeek out;
    if (!lock.owns_lock()) {
        out.busy = true;
        return out;
    }
    out.hit = peek_locked(ns, query, match);
    return out;
}

ReconstructResult ExactStateCache::reconstruct(const Lease& lease, bool verify) const {
    std::optional<PayloadSnapshot> snap = snapshot(lease);
    if (!snap) {
        ReconstructResult r;
        r.error = ReconstructError::MissingBlock;
        return r;
    }
    return snap->reconstruct(verify);  // outside the lock
}

std::optional<PayloadSnapshot> ExactStateCache::snapshot(const Lease& lease) const {
    std::lock_guard lock(mu_);
    auto it = records_.find(lease.entry());
    if (lease.owner() != this || it == records_.end()) {
        return std::nullopt;
    }
    return store_.snapshot(it->second.payload);
}

ReconstructError ExactStateCache::reconstruct_into(const Lease& lease, std::vector<uint8_t>& out,
                                                   bool verify) const {
    std::optional<PayloadSnapshot> snap = snapshot(lease);
    if (!snap) {
        return ReconstructError::MissingBlock;
    }
    return snap->reconstruct_into(out, verify);  // outside the lock
}

QuarantineStatus ExactStateCache::quarantine(const NamespaceId& ns, std::span<const Token> tokens,
                                             PageId page) {
    const TrimIdleBlocks trim;
    std::lock_guard lock(mu_);
    auto id = index_.find(ComponentKind::Exact, ns, tokens);
    if (!id) {
        return QuarantineStatus::NotFound;
    }
    return quarantine_locked(*id, page);
}

QuarantineStatus ExactStateCache::quarantine(const ExactHit& hit) {
    const TrimIdleBlocks trim;
    std::lock_guard lock(mu_);
    auto info = index_.info(hit.lease.entry());
    if (hit.lease.owner() != this || !info || info->doomed) {
        return QuarantineStatus::NotFound;
    }
    return quarantine_locked(hit.lease.entry(), hit.page);
}

QuarantineStatus ExactStateCache::quarantine_locked(EntryId id, PageId page) {
    if (records_.at(id).page != page) {
        return QuarantineStatus::PageMismatch;
    }
    if (auto info = index_.info(id)) {
        const std::vector<Token> path = index_.tokens_of(id);
        ghosts_.add(info->ns, path, GhostCause::Quarantined);
        notify(EntryChange::Kind::Removed, EntryChange::Cause::Quarantined, info->ns, path, page);
    }
    RemoveResult r = index_.remove(id, LeasedRemoval::Defer);
    ++counters_.quarantined;
    if (r.status == RemoveStatus::Removed) {
        free_record(id);
        return QuarantineStatus::Removed;
    }
    ++hidden_entries_;
    return QuarantineStatus::Deferred;
}

void ExactStateCache::release_lease(EntryId entry) noexcept {
    std::lock_guard lock(mu_);
    if (auto removed = index_.release_raw(entry)) {
        free_record(removed->entry);
        --hidden_entries_;
    }
}

Presence ExactStateCache::contains_locked(const NamespaceId& ns, std::span<const Token> tokens,
                                          PageId page) const {
    auto id = index_.find(ComponentKind::Exact, ns, tokens);
    return id && records_.at(*id).page == page ? Presence::Present : Presence::Absent;
}

bool ExactStateCache::contains(const NamespaceId& ns, std::span<const Token> tokens,
                               PageId page) const {
    std::lock_guard lock(mu_);
    return contains_locked(ns, tokens, page) == Presence::Present;
}

Presence ExactStateCache::try_contains(const NamespaceId& ns, std::span<const Token> tokens,
                                       PageId page) const {
    std::unique_lock lock(mu_, std::try_to_lock);
    if (!lock.owns_lock()) {
        return Presence::Unknown;
    }
    return contains_locked(ns, tokens, page);
}

ExactStateStats ExactStateCache::stats_locked() const {
    ExactStateStats s = counters_;
    s.blocks = store_.stats();
    s.entries = records_.size();
    s.hidden_entries = hidden_entries_;
    s.leased_entries = index_.leased_count(ComponentKind::Exact);
    return s;
}

ExactStateStats ExactStateCache::stats() const {
    std::lock_guard lock(mu_);
    return stats_locked();
}

std::optional<ExactStateStats> ExactStateCache::try_stats() const {
    std::unique_lock lock(mu_, std::try_to_lock);
    if (!lock.owns_lock()) {
        return std::nullopt;
    }
    return stats_locked();
}

std::vector<ExactEntrySummary> ExactStateCache::list_entries(const NamespaceId* only) const {
    std::lock_guard lock(mu_);
    std::vector<ExactEntrySummary> out;
    for (const EntryInfo& info : index_.entries(ComponentKind::Exact)) {
        if (info.doomed || (only != nullptr && !(info.ns == *only))) {
            continue;
        }
        auto it = records_.find(info.entry);
        if (it == records_.end()) {
            continue;
        }
        const Record& rec = it->second;
        out.push_back(ExactEntrySummary{info.ns, rec.page, info.token_count, rec.payload.size,
                                        rec.hits, rec.stored_unix_ms, rec.last_hit_unix_ms,
                                        info.leases > 0});
    }
    std::sort(out.begin(), out.end(), [](const ExactEntrySummary& a, const ExactEntrySummary& b) {
        return a.tokens > b.tokens;
    });
    return out;
}

size_t ExactStateCache::remove_namespace(const NamespaceId& ns) {
    const TrimIdleBlocks trim;
    std::lock_guard lock(mu_);
    if (options_.on_change) {
        for (const EntryInfo& info : index_.entries(ComponentKind::Exact)) {
            if (!info.doomed && info.ns == ns) {
                notify(EntryChange::Kind::Removed, EntryChange::Cause::NamespaceRemoved, ns,
                       index_.tokens_of(info.entry), records_.at(info.entry).page);
            }
        }
    }
    RemoveIfResult r = index_.remove_if(
        ComponentKind::Exact, [&](const EntryInfo& info) { return info.ns == ns; },
        LeasedRemoval::Defer);
    for (const RemovedEntry& e : r.removed) {
        free_record(e.entry);
    }
    hidden_entries_ += r.deferred;
    return r.removed.size() + r.deferred;
}

std::optional<GhostMatch> ExactStateCache::forgotten_longest(const NamespaceId& ns,
                                                             std::span<const Token> query,
                                                             size_t min_len) const {
    std::lock_guard lock(mu_);
    return ghosts_.longest(ns, query, min_len);
}

size_t ExactStateCache::longest_elsewhere(const NamespaceId& ns, std::span<const Token> query,
                                          size_t max_namespaces) const {
    std::lock_guard lock(mu_);
    return index_.longest_elsewhere(ns, query, max_namespaces);
}

bool ExactStateCache::debug_corrupt(const NamespaceId& ns, std::span<const Token> tokens,
                                    size_t offset) {
    std::lock_guard lock(mu_);
    auto id = index_.find(ComponentKind::Exact, ns, tokens);
    if (!id) {
        return false;
    }
    const StoredPayload& p = records_.at(*id).payload;
    for (BlockId block : p.blocks) {
        const size_t size = *store_.block_size(block);
        if (offset < size) {
            return store_.debug_corrupt_block(block, offset);
        }
        offset -= size;
    }
    return false;
}

std::optional<std::string> ExactStateCache::debug_check() const {
    std::lock_guard lock(mu_);
    if (auto err = index_.check_invariants()) {
        return err;
    }
    if (records_.size() != index_.size(ComponentKind::Exact)) {
        return std::string("record count differs from index entry count");
    }
    size_t doomed = 0;
    for (const EntryInfo& info : index_.entries(ComponentKind::Exact)) {
        doomed += info.doomed ? 1 : 0;
    }
    if (doomed != hidden_entries_) {
        return std::string("hidden entry count differs from the index");
    }
    std::map<BlockId, uint32_t> refs;
    uint64_t logical = 0;
    for (const auto& [id, rec] : records_) {
        if (!index_.info(id)) {
            return std::string("record without index entry");
        }
        for (BlockId b : rec.payload.blocks) {
            ++refs[b];
            logical += *store_.block_size(b);
        }
    }
    const BlockStoreStats s = store_.stats();
    if (logical != s.logical_bytes) {
        return std::string("logical bytes differ from the records");
    }
    uint64_t physical = 0;
    for (BlockId b : store_.block_ids()) {
        auto it = refs.find(b);
        if (it == refs.end() || it->second != *store_.refcount(b)) {
            return std::string("block refcount differs from record references");
        }
        physical += *store_.block_size(b);
    }
    if (refs.size() != s.block_count || physical != s.physical_bytes) {
        return std::string("physical bytes or block count inconsistent");
    }
    return std::nullopt;
}

}  // namespace skippy::cache
