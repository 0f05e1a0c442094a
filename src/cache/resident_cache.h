// ResidentCache: bookkeeping for "resident-kv" prefixes that stay in the live llama.cpp
// KV cache under spare sequence ids. No bytes live here, only which sequence holds which
// token path; the runtime performs every seq_cp / seq_rm.
//
//   ResidentCache cache({.seq_id_count = 16, .reserved_seq_ids = {0, 1, 2, 3},  // lanes
//                        .max_entries = 8, .token_budget = 65536});
//
//   // after prefill of a lane: keep its prefix resident
//   ResidentInsertResult r = cache.insert(ns, prompt_prefix);
//   for (int32_t s : r.evicted) runtime.seq_rm(s);                  // 1. drop evicted
//   cache.confirm_dropped(r.evicted);                               // 2. ids reusable
//   if (r.status == ResidentInsertStatus::Inserted &&               // 3. copy the prefix
//       !runtime.seq_cp(lane, r.seq_id, 0, r.stored_len))
//       cache.remove_seq(r.seq_id);          // then seq_rm + confirm_dropped that id too
//
//   // lookup
//   if (std::optional<ResidentHit> hit = cache.acquire_longest(ns, prompt_prefix)) {
//       runtime.seq_cp(hit->seq_id, lane, 0, hit->matched_len);     // lease held meanwhile
//   }
//
//   // before a decode that needs more free KV cells
//   auto ids = cache.evict_tokens(cells_needed);  // seq_rm each, then confirm_dropped(ids)
//
// Sequence ids: the pool is [0, seq_id_count) minus reserved_seq_ids (lane ids are never
// handed out). An evicted id is reported once, to the caller whose call evicted it, and is
// not handed out again until confirm_dropped() says the runtime has removed it; the only
// exception is the seq_id of the same insert result, which may be one of its own evicted
// ids (drop first, then copy).
//
// Bounds: entry count and token budget (sum of stored lengths). Eviction is LRU over
// unleased entries; a leased entry is never evicted or removed. Inserting a path makes
// shorter unleased resident entries on the same path redundant: they are evicted. A path
// already contained in a stored one is not stored twice (AlreadyCovered).
//
// Thread safety: one internal mutex per call; leases release through it and must not
// outlive the cache.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "cache/lease.h"
#include "cache/namespace_id.h"
#include "cache/radix_index.h"
#include "cache/token.h"

namespace skippy::cache {

struct ResidentCacheOptions {
    int32_t seq_id_count = 0;               // the runtime's n_seq_max
    std::vector<int32_t> reserved_seq_ids;  // lanes; never handed out
    size_t max_entries = 64;
    size_t token_budget = 0;  // max sum of stored lengths; 0 = unbounded
};

enum class ResidentInsertStatus : uint8_t {
    Inserted,        // copy the prefix into seq_id
    AlreadyCovered,  // a stored sequence already contains the path (seq_id, stored_len)
    NoCapacity,      // no entry could be evicted to make room (all leased)
    TooLarge,        // longer than the whole token budget
    EmptyKey,
};
const char* to_string(ResidentInsertStatus status);

struct ResidentInsertResult {
    ResidentInsertStatus status = ResidentInsertStatus::Inserted;
    int32_t seq_id = -1;
    size_t stored_len = 0;
    std::vector<int32_t> evicted;  // seq_rm these (before copying into seq_id)
};

struct ResidentPeek {
    int32_t seq_id = -1;
    size_t matched_len = 0;
    size_t stored_len = 0;
};

struct ResidentHit {
    Lease lease;
    int32_t seq_id = -1;
    size_t matched_len = 0;  // copy [0, matched_len) from seq_id
    size_t stored_len = 0;
};

struct ResidentRemoveResult {
    RemoveStatus status = RemoveStatus::NotFound;  // Removed, Leased or NotFound
    int32_t seq_id = -1;                           // to drop, when Removed
};

struct ResidentStats {
    size_t entries = 0;
    size_t tokens = 0;           // sum of stored lengths (what the token budget bounds)
    size_t distinct_tokens = 0;  // shared prefixes counted once: KV cells when copies share them
    size_t free_seq_ids = 0;
    size_t pending_drop = 0;  // evicted, waiting for confirm_dropped
    uint64_t inserts = 0;
    uint64_t hits = 0;
    uint64_t misses = 0;
    uint64_t evictions = 0;
};

class ResidentCache final : public LeaseOwner {
  public:
    explicit ResidentCache(ResidentCacheOptions options);
    ResidentCache(const ResidentCache&) = delete;
    ResidentCache& operator=(const ResidentCache&) = delete;

    ResidentInsertResult insert(const NamespaceId& ns, std::span<const Token> tokens);

    std::optional<ResidentHit> acquire_longest(const NamespaceId& ns, std::span<const Token> query);
    std::optional<ResidentPeek> peek_longest(const NamespaceId& ns,
                                             std::span<const Token> query) const;

    // Evicts LRU unleased entries until at least `tokens` stored tokens are freed (or none
    // is left). Returns the seq ids to drop.
    std::vector<int32_t> evict_tokens(size_t tokens);
    // Evicts every unleased entry.
    std::vector<int32_t> evict_all();

    ResidentRemoveResult remove(const NamespaceId& ns, std::span<const Token> tokens);
    // Removes the entry held in `seq_id` (e.g. its seq_cp failed); the id must be dropped.
    ResidentRemoveResult remove_seq(int32_t seq_id);

    // The runtime has removed these sequences; their ids return to the pool.
    void confirm_dropped(std::span<const int32_t> seq_ids);

    ResidentStats stats() const;
    bool is_reserved(int32_t seq_id) const;
    std::optional<std::string> debug_check() const;

    void release_lease(EntryId entry) noexcept override;

  private:
    void evict_one_locked(const RemovedEntry& removed, std::vector<int32_t>& out);
    int32_t take_seq_id(std::vector<int32_t>& evicted_here);

    const ResidentCacheOptions options_;
    mutable std::mutex mu_;
    RadixIndex index_;
    std::set<int32_t> free_;          // usable now
    std::set<int32_t> pending_drop_;  // evicted, not yet confirmed dropped
    std::set<int32_t> reserved_;
    std::unordered_map<int32_t, EntryId> by_seq_;
    size_t tokens_ = 0;
    ResidentStats counters_;
};

}  // namespace skippy::cache
