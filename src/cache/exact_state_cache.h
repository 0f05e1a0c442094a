// ExactStateCache: serialized model state ("full-state" / "kv-recurrent" payloads) keyed
// by namespace + token path, stored in a BlockStore and indexed by a RadixIndex (exact
// components). Bounded by entry count and physical bytes; LRU eviction of unleased entries.
//
//   ExactStateCache cache({.limits = {.max_entries = 256, .max_physical_bytes = 8ull << 30}});
//
//   // record (usually from the RecordQueue worker)
//   ExactInsertResult r = cache.insert(ns, tokens, identity.page_id(), descriptor, bytes);
//
//   // restore
//   if (std::optional<ExactHit> hit = cache.acquire_longest(ns, prompt_prefix)) {
//       ReconstructResult bytes = cache.reconstruct(hit->lease);   // checksum verified
//       if (!bytes.ok() || !import(bytes.bytes.span(), hit->descriptor))
//           cache.quarantine(ns, std::span(prompt_prefix).first(hit->len), hit->page);
//   }                                                              // lease released here
//
//   // request path: never wait for the cache
//   if (cache.try_contains(ns, prefix, page) != Presence::Present) { export + submit }
//   // (Unknown: the lock was busy; the record worker's insert dedupes: AlreadyPresent)
//
// Thread safety: every public member takes one internal std::mutex. It is held for index
// and block-table work and for copying/comparing the bytes of an insert's blocks; payload
// hashing in insert() happens before the lock is taken, and reconstruct() assembles and
// verifies bytes after releasing it. try_* members use try_lock
// and answer "unknown/busy" instead of waiting. Leases release through the same mutex, and
// must not outlive the cache.
//
// Insert keeps the cache within its limits by evicting other unleased entries in LRU
// order; the entry being inserted is never evicted to make room for itself: if it cannot
// fit, the insert is undone and reports NoCapacity (an unleased entry it replaced at the
// same path is gone by then). Quarantine of a leased entry hides it from lookups at once
// and frees its blocks when the last lease is released.
//
// Observer (options.on_change, entry_change.h): called synchronously with the cache mutex
// held, from insert(), quarantine() and remove_namespace(), once per entry that became
// visible or stopped being visible. It must not call back into the cache and must only
// copy what it needs and enqueue it (no I/O, no waiting). Lock order: cache mutex, then the
// observer's queue mutex; whoever owns that queue never calls the cache while holding it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "cache/block_store.h"
#include "cache/entry_change.h"
#include "cache/lease.h"
#include "cache/namespace_id.h"
#include "cache/page_id.h"
#include "cache/payload_descriptor.h"
#include "cache/prefix_ghosts.h"
#include "cache/radix_index.h"
#include "cache/token.h"

namespace skippy::cache {

struct ExactStateLimits {
    size_t max_entries = 256;
    uint64_t max_physical_bytes = uint64_t{8} << 30;
};

struct ExactStateCacheOptions {
    ExactStateLimits limits;
    BlockStoreOptions blocks;
    EntryObserver on_change;  // optional; see "Observer" above
};

// Answer of a non-blocking question.
enum class Presence : uint8_t { Present, Absent, Unknown /* cache busy: not known, don't wait */ };
const char* to_string(Presence presence);

enum class ExactInsertStatus : uint8_t {
    Inserted,
    Replaced,           // an unleased entry with another page id was at the same path
    AlreadyPresent,     // same page id already stored (touched)
    Leased,             // another page is at this path and leased; nothing stored
    InvalidDescriptor,  // descriptor inconsistent with the bytes or the token count
    EmptyKey,
    NoCapacity,   // does not fit even after evicting every unleased entry
    StoreFailed,  // block store failure, see store_error (rolled back)
};
const char* to_string(ExactInsertStatus status);

struct ExactInsertResult {
    ExactInsertStatus status = ExactInsertStatus::Inserted;
    InsertError store_error = InsertError::None;
    std::string invalid_reason;  // for InvalidDescriptor
    InsertReport blocks;         // dedupe/hash report of the stored payload
    std::vector<PageId> evicted;
    // The stored payload's blocks (stored, or already present with the same page): a disk
    // write shares them instead of holding a copy.
    std::optional<PayloadSnapshot> snapshot;
    bool stored() const {
        return status == ExactInsertStatus::Inserted || status == ExactInsertStatus::Replaced;
    }
};

struct ExactPeek {
    PageId page;
    size_t len = 0;  // tokens covered; the hit is query[0, len)
    PayloadDescriptor descriptor;
    uint64_t payload_bytes = 0;
};

struct ExactHit {
    Lease lease;
    PageId page;
    size_t len = 0;         // tokens of the query served: query[0, len)
    size_t stored_len = 0;  // tokens of the entry (> len for a common-prefix hit)
    PayloadDescriptor descriptor;
    uint64_t payload_bytes = 0;
};

struct TryExactPeek {
    bool busy = false;  // lock not taken: "don't know"
    std::optional<ExactPeek> hit;
};

enum class QuarantineStatus : uint8_t {
    Removed,       // removed and blocks released
    Deferred,      // leased: hidden now, blocks released at the last lease release
    NotFound,      // nothing (visible) at this path
    PageMismatch,  // another page is stored at this path; left alone
};
const char* to_string(QuarantineStatus status);

struct ExactStateStats {
    size_t entries = 0;
    size_t hidden_entries = 0;  // quarantined while leased, not yet freed
    size_t leased_entries = 0;  // entries (hidden ones included) with a lease held
    BlockStoreStats blocks;
    uint64_t inserts = 0;
    uint64_t hits = 0;
    uint64_t misses = 0;
    uint64_t evictions = 0;
    uint64_t quarantined = 0;
    uint64_t rejected = 0;  // inserts that stored nothing (except AlreadyPresent)
};

// One entry as inspection shows it (GET /v1/cache): no token ids.
struct ExactEntrySummary {
    NamespaceId ns;
    PageId page;
    size_t tokens = 0;
    uint64_t payload_bytes = 0;
    uint64_t hits = 0;             // restores served from it
    int64_t stored_unix_ms = 0;    // when it was inserted
    int64_t last_hit_unix_ms = 0;  // 0: never
    bool leased = false;
};

class ExactStateCache final : public LeaseOwner {
  public:
    explicit ExactStateCache(ExactStateCacheOptions options = {});
    ~ExactStateCache();
    ExactStateCache(const ExactStateCache&) = delete;
    ExactStateCache& operator=(const ExactStateCache&) = delete;

    // `descriptor.token_end` must equal tokens.size() and `payload_bytes` bytes.size().
    // `cuts`: block boundaries (e.g. token-chunk boundaries of KV pages), see BlockStore.
    ExactInsertResult insert(const NamespaceId& ns, std::span<const Token> tokens, PageId page,
                             const PayloadDescriptor& descriptor, std::span<const uint8_t> bytes,
                             std::span<const size_t> cuts = {});

    // Longest exact entry that is a prefix of `query` (Stored), or that shares the longest
    // common prefix with it (Common: its path may go on past the query; for payloads whose
    // every prefix is valid, attention KV only), leased and moved to LRU front. hit.len is
    // the part of the query served, hit.stored_len the entry's length.
    std::optional<ExactHit> acquire_longest(const NamespaceId& ns, std::span<const Token> query,
                                            PrefixMatch match = PrefixMatch::Stored);
    std::optional<ExactPeek> peek_longest(const NamespaceId& ns, std::span<const Token> query,
                                          PrefixMatch match = PrefixMatch::Stored) const;
    TryExactPeek try_peek_longest(const NamespaceId& ns, std::span<const Token> query,
                                  PrefixMatch match = PrefixMatch::Stored) const;

    // Bytes of a leased entry (MissingBlock if the lease is not from this cache).
    ReconstructResult reconstruct(const Lease& lease, bool verify = true) const;
    // Same, into a caller-owned buffer that can be reused across restores.
    ReconstructError reconstruct_into(const Lease& lease, std::vector<uint8_t>& out,
                                      bool verify = true) const;

    // The blocks of a leased entry, held by the snapshot (nullopt if the lease is not from
    // this cache): read them in place, outside the cache's lock (PayloadSnapshot::verify,
    // parts).
    std::optional<PayloadSnapshot> snapshot(const Lease& lease) const;

    // Removes the entry stored exactly at `tokens` if it is `page` (see QuarantineStatus).
    QuarantineStatus quarantine(const NamespaceId& ns, std::span<const Token> tokens, PageId page);
    // Same for the entry a hit leased (its lease still held or not).
    QuarantineStatus quarantine(const ExactHit& hit);

    bool contains(const NamespaceId& ns, std::span<const Token> tokens, PageId page) const;
    Presence try_contains(const NamespaceId& ns, std::span<const Token> tokens, PageId page) const;

    ExactStateStats stats() const;
    std::optional<ExactStateStats> try_stats() const;

    // Inspection. Entries (of `only` when given), longest first.
    std::vector<ExactEntrySummary> list_entries(const NamespaceId* only = nullptr) const;
    // Removes every entry of the namespace (leased ones hidden now, freed at their last
    // release); returns how many.
    size_t remove_namespace(const NamespaceId& ns);
    // The longest prefix of `query` (>= min_len tokens) that an entry this cache evicted or
    // quarantined covered (PrefixGhosts): why a lookup found nothing.
    std::optional<GhostMatch> forgotten_longest(const NamespaceId& ns, std::span<const Token> query,
                                                size_t min_len) const;
    // The longest common prefix of `query` with an entry of any namespace other than `ns`
    // (at most `max_namespaces` visited): a miss whose prefix another tenant holds. Only the
    // length leaves the cache.
    size_t longest_elsewhere(const NamespaceId& ns, std::span<const Token> query,
                             size_t max_namespaces = 64) const;
    const ExactStateLimits& limits() const { return options_.limits; }

    // Test hooks.
    // Flips one byte of the stored payload at `tokens` (offset within the payload).
    bool debug_corrupt(const NamespaceId& ns, std::span<const Token> tokens, size_t offset);
    // Holds the cache mutex (to show that try_* calls do not wait).
    std::unique_lock<std::mutex> debug_lock() const { return std::unique_lock(mu_); }
    // Index invariants plus block refcounts/bytes against the entries; nullopt if fine.
    std::optional<std::string> debug_check() const;

    void release_lease(EntryId entry) noexcept override;

  private:
    struct Record {
        PageId page;
        PayloadDescriptor descriptor;
        StoredPayload payload;
        uint64_t hits = 0;
        int64_t stored_unix_ms = 0;
        int64_t last_hit_unix_ms = 0;
    };

    bool over_limits() const;
    bool fits_after_evicting_all(EntryId keep, uint64_t extra_bytes) const;
    void notify(EntryChange::Kind kind, EntryChange::Cause cause, const NamespaceId& ns,
                std::span<const Token> tokens, PageId page) const;
    void free_record(EntryId entry);
    QuarantineStatus quarantine_locked(EntryId id, PageId page);
    std::optional<ExactHit> acquire_locked(EntryId entry, size_t len, size_t stored_len);
    ExactStateStats stats_locked() const;
    std::optional<ExactPeek> peek_locked(const NamespaceId& ns, std::span<const Token> query,
                                         PrefixMatch match) const;
    Presence contains_locked(const NamespaceId& ns, std::span<const Token> tokens,
                             PageId page) const;

    const ExactStateCacheOptions options_;
    mutable std::mutex mu_;
    RadixIndex index_;
    BlockStore store_;
    std::unordered_map<EntryId, Record> records_;
    size_t hidden_entries_ = 0;  // quarantined while leased
    ExactStateStats counters_;
    PrefixGhosts ghosts_;  // evicted / quarantined paths (fingerprints only)
};

}  // namespace skippy::cache
