// RadixIndex: one compressed radix tree over token ids per namespace. A node may carry a
// resident component and an exact-state component; each component is an entry with an
// EntryId, an opaque 64-bit value, a recency stamp and a lease count.
//
//   RadixIndex index;
//   index.insert(ComponentKind::Exact, ns, tokens_1000, /*value=*/page.value());
//   index.insert(ComponentKind::Resident, ns, tokens_2000, /*value=*/seq_id);
//
//   // Exact: the longest node carrying exact state whose path is a prefix of the query.
//   if (auto m = index.lookup_exact(ns, prompt_prefix)) { m->len; m->value; }
//   // Resident: the longest common prefix with any resident path; the stored sequence may
//   // be longer than the matched part (a sequence copy can take a prefix of it).
//   if (auto m = index.lookup_resident(ns, prompt_prefix)) { m->matched_len; m->stored_len; }
//
//   Lease lease = index.acquire(m->entry);     // not evicted or removed while held
//   while (auto victim = index.evict_lru(ComponentKind::Exact)) free(victim->value);
//
// lookup_* moves the hit to the front of the LRU order (logical clock); peek_* does not.
// Eviction picks the unleased entry of a kind with the smallest (last_used, insert_seq).
// Removing a leased entry either fails (LeasedRemoval::Fail) or hides it at once from
// lookups and frees it when the last lease is released (LeasedRemoval::Defer; release
// then returns the removed entry). After every removal the tree is re-normalized: no
// componentless node with fewer than two children survives, chains are merged.
//
// Not thread-safe: the caches that own an index serialize access with their own mutex.
// Entries with an empty token sequence are rejected.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "cache/lease.h"
#include "cache/namespace_id.h"
#include "cache/token.h"

namespace skippy::cache {

enum class ComponentKind : uint8_t { Resident = 0, Exact = 1 };
// Exact lookups: a stored path that is a prefix of the query, or the longest common prefix
// of the query with any stored path.
enum class PrefixMatch : uint8_t { Stored, Common };
const char* to_string(ComponentKind kind);

struct ExactMatch {
    EntryId entry = kNoEntry;
    uint64_t value = 0;
    size_t len = 0;  // tokens of the stored path == matched tokens
};

struct ResidentMatch {
    EntryId entry = kNoEntry;
    uint64_t value = 0;
    size_t matched_len = 0;  // common prefix of query and stored path (> 0)
    size_t stored_len = 0;   // tokens of the stored path (>= matched_len)
};

// A snapshot of an entry (for predicates, eviction choice and tests).
struct EntryInfo {
    EntryId entry = kNoEntry;
    ComponentKind kind = ComponentKind::Exact;
    NamespaceId ns;
    size_t token_count = 0;
    uint64_t value = 0;
    uint32_t leases = 0;
    bool doomed = false;  // removed while leased; freed at the last release
    uint64_t last_used = 0;
    uint64_t insert_seq = 0;
};

// An entry that left the index; the owner frees whatever `value` refers to.
struct RemovedEntry {
    EntryId entry = kNoEntry;
    ComponentKind kind = ComponentKind::Exact;
    NamespaceId ns;
    size_t token_count = 0;
    uint64_t value = 0;
};

enum class InsertStatus : uint8_t {
    Inserted,        // new entry
    Replaced,        // an unleased entry with another value was there; see `replaced`
    AlreadyPresent,  // same value already there (touched)
    Leased,          // another value is there and leased (or doomed): nothing changed
    EmptyKey,        // tokens.empty(): nothing changed
};
const char* to_string(InsertStatus status);

struct InsertResult {
    InsertStatus status = InsertStatus::Inserted;
    EntryId entry = kNoEntry;  // the entry now at the path (kNoEntry for EmptyKey)
    std::optional<RemovedEntry> replaced;
};

enum class LeasedRemoval : uint8_t { Fail, Defer };

enum class RemoveStatus : uint8_t { Removed, Deferred, Leased, NotFound };
const char* to_string(RemoveStatus status);

struct RemoveResult {
    RemoveStatus status = RemoveStatus::NotFound;
    std::optional<RemovedEntry> removed;  // set iff status == Removed
};

struct RemoveIfResult {
    std::vector<RemovedEntry> removed;
    size_t deferred = 0;        // leased matches hidden now, freed at last release
    size_t leased_skipped = 0;  // leased matches left alone (LeasedRemoval::Fail)
};

class RadixIndex final : public LeaseOwner {
  public:
    RadixIndex();
    ~RadixIndex();
    RadixIndex(const RadixIndex&) = delete;
    RadixIndex& operator=(const RadixIndex&) = delete;

    InsertResult insert(ComponentKind kind, const NamespaceId& ns, std::span<const Token> tokens,
                        uint64_t value);

    std::optional<ExactMatch> peek_exact(const NamespaceId& ns, std::span<const Token> query) const;
    std::optional<ExactMatch> lookup_exact(const NamespaceId& ns, std::span<const Token> query);
    std::optional<ResidentMatch> peek_resident(const NamespaceId& ns,
                                               std::span<const Token> query) const;
    std::optional<ResidentMatch> lookup_resident(const NamespaceId& ns,
                                                 std::span<const Token> query);
    // Either exact lookup, as a ResidentMatch: Stored as peek_exact (stored_len ==
    // matched_len); Common: the longest common prefix of `query` with any exact-state path
    // (the stored path may go on past it), for states whose every prefix is a valid state
    // too (attention KV only): a stored entry serves any prompt sharing a prefix with it.
    std::optional<ResidentMatch> peek_exact(const NamespaceId& ns, std::span<const Token> query,
                                            PrefixMatch match) const;
    std::optional<ResidentMatch> lookup_exact(const NamespaceId& ns, std::span<const Token> query,
                                              PrefixMatch match);

    // The non-doomed entry of `kind` stored exactly at `tokens`.
    std::optional<EntryId> find(ComponentKind kind, const NamespaceId& ns,
                                std::span<const Token> tokens) const;
    // Non-doomed entries of `kind` whose path is a prefix of `tokens` (including tokens
    // itself), shortest first.
    std::vector<EntryInfo> entries_on_path(ComponentKind kind, const NamespaceId& ns,
                                           std::span<const Token> tokens) const;
    // Moves the entry to the front of the LRU order. False if unknown.
    bool touch(EntryId entry);

    // RAII lease; empty Lease if the entry is unknown or doomed.
    Lease acquire(EntryId entry);
    // Manual lease counting, for owners that wrap their own Lease (e.g. with a mutex).
    bool acquire_raw(EntryId entry);
    // Returns the entry if it was doomed and this was its last lease (it is now gone).
    std::optional<RemovedEntry> release_raw(EntryId entry);
    void release_lease(EntryId entry) noexcept override;

    RemoveResult remove(EntryId entry, LeasedRemoval leased = LeasedRemoval::Fail);
    RemoveResult remove(ComponentKind kind, const NamespaceId& ns, std::span<const Token> tokens,
                        LeasedRemoval leased = LeasedRemoval::Fail);
    // Removes every non-doomed entry of `kind` matching `pred`, in EntryId order.
    RemoveIfResult remove_if(ComponentKind kind, const std::function<bool(const EntryInfo&)>& pred,
                             LeasedRemoval leased = LeasedRemoval::Fail);
    // Removes and returns the least recently used unleased entry of `kind` other than
    // `exclude`; nullopt if there is none.
    std::optional<RemovedEntry> evict_lru(ComponentKind kind, EntryId exclude = kNoEntry);
    // The entry evict_lru(kind, exclude) would remove, without removing it.
    std::optional<EntryInfo> lru_victim(ComponentKind kind, EntryId exclude = kNoEntry) const;

    std::optional<EntryInfo> info(EntryId entry) const;
    std::vector<Token> tokens_of(EntryId entry) const;
    // All entries of `kind` (doomed included), in EntryId order.
    std::vector<EntryInfo> entries(ComponentKind kind) const;

    size_t size(ComponentKind kind) const;  // includes doomed entries
    // Entries of `kind` with at least one lease (doomed ones included).
    size_t leased_count(ComponentKind kind) const;
    size_t size() const { return size(ComponentKind::Resident) + size(ComponentKind::Exact); }
    size_t namespace_count() const { return trees_.size(); }
    // The namespaces that have (or had) a tree, in no particular order.
    std::vector<NamespaceId> namespaces() const;
    // The longest prefix of `query` stored in a namespace other than `ns` (PrefixMatch::Common),
    // looking at `max_namespaces` of them at most: whether another tenant has the prompt
    // (a miss reason; never reveals which tokens).
    size_t longest_elsewhere(const NamespaceId& ns, std::span<const Token> query,
                             size_t max_namespaces) const;
    size_t node_count() const;
    // Tokens on all stored paths, each shared prefix counted once (sum of edge lengths).
    size_t distinct_token_count() const;
    uint64_t clock() const { return clock_; }

    // Structural self-check for tests: nullopt if consistent, else a description.
    std::optional<std::string> check_invariants() const;

  private:
    struct Node;
    struct Tree;
    void for_each_node(const std::function<void(const Node&)>& visit) const;
    struct Entry;
    using LruKey = std::tuple<uint64_t, uint64_t, EntryId>;  // last_used, insert_seq, id

    Tree* tree_for(const NamespaceId& ns) const;
    Node* ensure_node(Tree& tree, std::span<const Token> tokens);
    const Node* find_node(const NamespaceId& ns, std::span<const Token> tokens) const;
    std::optional<ExactMatch> find_exact(const NamespaceId& ns, std::span<const Token> q) const;
    std::optional<ResidentMatch> find_common(ComponentKind kind, const NamespaceId& ns,
                                             std::span<const Token> q) const;
    Entry* entry_ptr(EntryId id);
    const Entry* entry_ptr(EntryId id) const;
    EntryInfo make_info(const Entry& e) const;
    RemovedEntry make_removed(const Entry& e) const;
    void adjust_below(ComponentKind kind, Node* node, int delta);
    void set_last_used(Entry& e, uint64_t stamp);
    // Detaches the component, erases the entry and re-normalizes the tree.
    RemovedEntry erase_entry(EntryId id);
    void normalize(const NamespaceId& ns, Node* node);
    void doom(Entry& e);
    RemoveResult remove_entry(Entry& e, LeasedRemoval leased);

    std::unordered_map<NamespaceId, std::unique_ptr<Tree>, NamespaceIdHash> trees_;
    std::unordered_map<EntryId, Entry> entries_;
    std::set<LruKey> lru_[2];  // unleased entries per kind
    size_t count_[2] = {0, 0};
    uint64_t clock_ = 0;
    uint64_t next_entry_ = 1;
};

}  // namespace skippy::cache
